"""A request body made a :class:`~gmd.daemon.ingest.record.BatchRecord`: the fast reader
first, the wire contract's model where it declines.

The body is parsed by hand rather than by FastAPI, which is several times faster on batches of
hundreds of VMs and lets a refusal name the exact spot. The common case is read by
:mod:`.fast_parse`; anything else by pydantic (:class:`~gmd.wire.SampleBatch`), which accepts
it or words the refusal, so that every refusal reads as the contract says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, cast

import numpy as np
from pydantic import ValidationError

from gmd.daemon.api.errors import json_document, json_media, validation_problem
from gmd.daemon.ingest import fast_parse
from gmd.daemon.ingest.record import BatchRecord, content_digest
from gmd.wire import (
    CAPACITY_FIELDS,
    FLAVOR_FIELDS,
    USAGE_FIELDS,
    SampleBatch,
    canonical_customer,
)


def parse_record(body: bytes, content_type: str | None = "application/json") -> BatchRecord:
    """The batch in a request body, as the ledger stores it, or :class:`Refused` saying what
    is wrong and where. The common case is read by :mod:`.fast_parse`; anything
    else by pydantic, which accepts it or words the refusal."""
    json_media(content_type)
    fast = fast_parse.accept(body)
    if fast is None:
        return record_of(parse_batch(body, content_type))
    vms = fast.vms
    return record_from(
        fast,
        capacity=fast_parse.capacity(fast),
        uuids=[vm.uuid for vm in vms],
        customers=[vm.customer for vm in vms],
        use=fast_parse.use(fast),
        flavor=fast_parse.flavor(fast),
        created_s=[vm.created_s for vm in vms],
        names=dict(fast.customer_names),
        host_cpu_s=fast.host_cpu_s,
    )


def parse_batch(body: bytes, content_type: str | None = "application/json") -> SampleBatch:
    """The batch in a request body, or :class:`Refused` saying what is wrong and where.

    pydantic parses the JSON itself, a third faster than building the document first. A body
    it refuses is parsed again the slow way, so that every refusal reads as it always has:
    malformed JSON (NaN, Infinity) as a 400 naming the character, the rest as a 422 by field.
    The media type is the caller's to check (:func:`parse_record`).
    """
    try:
        return SampleBatch.model_validate_json(body)
    except ValidationError:
        pass
    document = json_document(content_type, body)
    try:
        return SampleBatch.model_validate(document)
    except ValidationError as exc:
        raise validation_problem(exc.errors()) from None


_NO_FLAVOR: Mapping[str, float | None] = {}


class BatchHead(Protocol):
    """What a parsed batch says besides its VMs (a :class:`SampleBatch` or a fast one)."""

    @property
    def key(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def interval_start_s(self) -> int: ...
    @property
    def interval_s(self) -> int: ...


def record_of(batch: SampleBatch) -> BatchRecord:
    """The batch as the ledger store takes it: columns in the order of :data:`RESOURCES`."""
    vms = cast(list[Mapping[str, Any]], batch.vms)
    # Column by column: a list per field is cheaper than a tuple per VM.
    use = np.array([[v[f] for v in vms] for f in USAGE_FIELDS], dtype=np.float64).T.reshape(
        len(vms), len(USAGE_FIELDS)
    )
    flavors = [v.get("flavor", _NO_FLAVOR) for v in vms]
    # None (no amount) becomes NaN.
    flavor = np.array(
        [[f.get(k) for f in flavors] for k in FLAVOR_FIELDS], dtype=np.float64
    ).T.reshape(len(vms), len(FLAVOR_FIELDS))
    return record_from(
        batch,
        capacity=tuple(getattr(batch.capacity, f) for f in CAPACITY_FIELDS),
        uuids=[v["uuid"] for v in vms],
        customers=[v["customer"] for v in vms],
        use=use,
        flavor=flavor,
        created_s=[v.get("created_s") for v in vms],
        names=dict(batch.customer_names),
        host_cpu_s=batch.host_cpu_s,
    )


def record_from(
    head: BatchHead,
    *,
    capacity: tuple[float, ...],
    uuids: list[str],
    customers: list[str],
    use: np.ndarray,
    flavor: np.ndarray,
    created_s: list[int | None],
    names: dict[str, str],
    host_cpu_s: float | None = None,
) -> BatchRecord:
    # One spelling per project (canonical_customer), whatever the host wrote: a project's id
    # spelled otherwise would be another customer, one its members cannot read.
    spelled = {c: canonical_customer(c) for c in {*customers, *names}}
    if any(c != s for c, s in spelled.items()):
        customers = [spelled[c] for c in customers]
        names = {spelled[c]: n for c, n in names.items()}
    record = BatchRecord(
        key=head.key,
        digest="",
        host=head.host,
        interval_start_s=head.interval_start_s,
        interval_s=head.interval_s,
        capacity=capacity,
        vm_uuids=uuids,
        customers=customers,
        use=use,
        flavor=flavor,
        created_s=created_s,
        customer_names=names,
        host_cpu_s=None if host_cpu_s is None else float(host_cpu_s),
    )
    return dataclasses.replace(record, digest=content_digest(record))
