"""A batch as ingest takes it: the columns the parsers make (:mod:`.parse`,
:mod:`.fast_parse`), the checks read (:mod:`.checks`) and the store writes (:mod:`.store`),
with the digest that tells a retry from a reused key, and what storing it can answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import orjson

from gmd import GmdError
from gmd.wire import BatchStatus

DIGEST_PREFIX = "v2:"
"""Marks a batch digest taken over the parsed columns (see :func:`content_digest`)."""


class KeyReused(GmdError, ValueError):
    """A batch key arrived again with different content: a bug or a clash between agents."""


class CapacityConflict(GmdError, ValueError):
    """A batch gives its host another capacity than the host's first batch for the interval:
    accepting it would change what the interval is (or was) accounted from."""


class BeforeOrigin(GmdError, ValueError):
    """A batch for an interval before the first one of a ledger that has begun accounting:
    there is no standing to add it to."""


@dataclass(frozen=True)
class BatchRecord:
    """One host's interval, columnar: ``use`` is VMs × :data:`gmd.wire.USAGE_FIELDS`,
    ``flavor`` VMs × :data:`gmd.wire.FLAVOR_FIELDS` with NaN where the flavor gives no
    amount."""

    key: str
    digest: str
    host: str
    interval_start_s: int
    interval_s: int
    capacity: tuple[float, ...]  # one per CAPACITY_FIELDS
    vm_uuids: list[str]
    customers: list[str]
    use: np.ndarray
    flavor: np.ndarray
    created_s: list[int | None]
    customer_names: dict[str, str] = field(default_factory=dict)
    """customer → its project's name from the Nova metadata, where the agent read one"""
    host_cpu_s: float | None = None
    """the host's busy CPU seconds in the interval (:attr:`gmd.wire.SampleBatch.host_cpu_s`)"""


Admit = Callable[[int, int], None]
"""Told, of a new batch, the customers and VMs new to the ledger it would create; raises to
refuse it."""


@dataclass(frozen=True)
class IngestResult:
    status: BatchStatus
    samples: int
    late: int


def content_digest(record: BatchRecord) -> str:
    """A hash of what the batch says, to tell a retry (same content) from a reused key.

    Taken over the parsed values, not the body: a retry that spells the same batch otherwise
    (keys in another order, ``1`` for ``1.0``) is the same batch, and hashing the columns
    costs a tenth of serializing the document again. Prefixed with ``v2:``, which no digest of
    the first kind (64 hex digits of the document's SHA-256) has.
    """
    head = orjson.dumps(
        [
            record.key,
            record.host,
            record.interval_start_s,
            record.interval_s,
            record.capacity,
            record.created_s,
            sorted(record.customer_names.items()),
            # Only when given: a batch without it keeps the digest it had before the field.
            *([] if record.host_cpu_s is None else [record.host_cpu_s]),
        ]
    )
    h = hashlib.sha256(head)
    h.update("\0".join(record.vm_uuids).encode())
    h.update(b"\1")
    h.update("\0".join(record.customers).encode())
    h.update(record.use.tobytes())
    h.update(record.flavor.tobytes())
    return DIGEST_PREFIX + h.hexdigest()[: 64 - len(DIGEST_PREFIX)]
