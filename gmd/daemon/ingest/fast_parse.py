"""The common case of ``POST /v1/samples`` read in a third of pydantic's time.

A 500-VM batch took ~0.8 ms to validate with pydantic, a third of the daemon's CPU per batch,
under the GIL that the ingest threads share. msgspec decodes the same body into structs in
~0.2 ms; the few rules it cannot say (the UUID spelling, visible names, names only of this
batch's customers) are then checked once per batch, not per VM.

This is an acceptor, not a second contract: :class:`gmd.wire.SampleBatch` stays the wire
format, the OpenAPI schema and the source of every refusal. A body this module does not accept
— for any reason, including reasons pydantic would accept — goes to pydantic, which accepts it
or says what is wrong and where. What it accepts, pydantic accepts with the same values: a
property test (``tests/unit/daemon/api/test_fast_batch.py``) holds the two to that, field by
field, on valid and hostile bodies.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import numpy as np
from msgspec import UNSET, Meta, UnsetType

from gmd.wire import (
    CAPACITY_FIELDS,
    FLAVOR_FIELDS,
    MAX_CUSTOMER_NAMES,
    MAX_JSON_INT,
    MAX_NAME,
    USAGE_FIELDS,
    visible_name,
)

_FINITE = 1.7976931348623157e308
Amount = Annotated[float, Meta(ge=0, le=_FINITE)]
Positive = Annotated[float, Meta(gt=0, le=_FINITE)]
UnixTime = Annotated[int, Meta(ge=0, le=MAX_JSON_INT)]
# Length only: visibility is checked once per distinct name, after decoding.
Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]


def _struct(name: str, fields: list[tuple[Any, ...]]) -> Any:
    return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True, gc=False)


# The structs are made from the wire contract's field lists: a resource added to
# gmd.wire.RESOURCES is read here with no change. The checker is shown what the code reads by
# attribute; the amounts are read by name (attrgetter).
if TYPE_CHECKING:

    class FastCapacity(msgspec.Struct): ...

    class FastFlavor(msgspec.Struct): ...

    class FastVm(msgspec.Struct):
        uuid: str
        customer: str
        flavor: FastFlavor | UnsetType
        created_s: int | None

else:
    FastCapacity = _struct("FastCapacity", [(f, Positive) for f in CAPACITY_FIELDS])
    # A missing amount and null mean the same (an equal split), as in gmd.wire.Flavor.
    FastFlavor = _struct("FastFlavor", [(f, Positive | None, None) for f in FLAVOR_FIELDS])
    FastVm = _struct(
        "FastVm",
        [
            ("uuid", str),
            ("customer", Name),
            *[(f, Amount) for f in USAGE_FIELDS],
            # Unset, not None: ``"flavor": null`` is refused by the contract.
            ("flavor", FastFlavor | UnsetType, UNSET),
            ("created_s", UnixTime | None, None),
        ],
    )


class FastBatch(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    host: Name
    interval_start_s: UnixTime
    interval_s: Annotated[int, Meta(gt=0, le=MAX_JSON_INT)]
    capacity: FastCapacity
    vms: list[FastVm]
    customer_names: Annotated[dict[Name, Name], Meta(max_length=MAX_CUSTOMER_NAMES)] = {}
    host_cpu_s: Amount | None = None


_DECODER = msgspec.json.Decoder(FastBatch)
# Python's ``$`` also matches before a final newline, pydantic's does not: whole-string
# matches only. The UUIDs of a batch are matched in one pass over them, one per line.
_KEY = re.compile(r"[!-~]{1,128}")
_UUIDS = re.compile(r"(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\n)*")
_NO_FLAVOR = FastFlavor()
_USAGE = [attrgetter(f) for f in USAGE_FIELDS]
_FLAVOR = [attrgetter(f) for f in FLAVOR_FIELDS]


def accept(body: bytes) -> FastBatch | None:
    """The batch in ``body`` if it is well-formed in the common way, else None (pydantic
    then decides, and words the refusal)."""
    try:
        batch = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not _KEY.fullmatch(batch.key):
        return None
    if not _UUIDS.fullmatch("".join([vm.uuid + "\n" for vm in batch.vms])):
        return None
    customers = {vm.customer for vm in batch.vms}
    if not set(batch.customer_names) <= customers:
        return None
    names = {batch.host, *customers, *batch.customer_names.values()}
    try:
        for name in names:
            visible_name(name)
    except ValueError:
        return None
    return batch


def capacity(batch: FastBatch) -> tuple[float, ...]:
    return tuple(getattr(batch.capacity, f) for f in CAPACITY_FIELDS)


def use(batch: FastBatch) -> np.ndarray:
    """VMs × :data:`~gmd.wire.USAGE_FIELDS`."""
    vms = batch.vms
    return np.array([list(map(get, vms)) for get in _USAGE], dtype=np.float64).T.reshape(
        len(vms), len(USAGE_FIELDS)
    )


def flavor(batch: FastBatch) -> np.ndarray:
    """VMs × :data:`~gmd.wire.FLAVOR_FIELDS`, NaN where the flavor gives no amount."""
    flavors = [_NO_FLAVOR if f is UNSET else f for f in map(attrgetter("flavor"), batch.vms)]
    return np.array([list(map(get, flavors)) for get in _FLAVOR], dtype=np.float64).T.reshape(
        len(flavors), len(FLAVOR_FIELDS)
    )
