"""Reading an interval's on-time samples and hosts from the ledger as arrays: the input of the
pure interval step (:mod:`gmd.fairness.ledger_step`), in the configured resources.

Accounting, explain and a what-if read an interval here alike, so that each steps the same
arrays. Reads only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, func, literal_column, select

from gmd.common.timespec import iso
from gmd.daemon.config import AccountingConfig
from gmd.daemon.ledger import sample_store
from gmd.daemon.ledger.binary_copy import binary_rows
from gmd.fairness.directcontr import Utility
from gmd.fairness.ledger_step import SampledInterval
from gmd.ledger_schema.kinds import BatchState
from gmd.ledger_schema.models import FLAVOR_COLUMNS, USE_COLUMNS
from gmd.ledger_schema.tables import (
    batches as _batches,
    host_intervals as _host_intervals,
    intervals as _intervals,
    organizations as _organizations,
    samples as _samples,
    vms as _vms,
)
from gmd.wire import CAPACITY_FIELDS, RESOURCES


@dataclass(frozen=True)
class RawInterval:
    """An interval's on-time samples and hosts as the ledger holds them (no standing)."""

    start_s: int
    length_s: int
    samples: np.ndarray
    """:func:`read_samples`' array"""
    hosts: np.ndarray
    """per accounted host: id, owner organization id, then ``CAPACITY_FIELDS``"""
    customer_of_organization: dict[int, int]


def read_raw_interval(
    conn: Connection,
    interval_id: int,
    config: AccountingConfig,
    batch_ids: Sequence[int] | None = None,
    *,
    span: tuple[int, int] | None = None,
    customer_of_organization: dict[int, int] | None = None,
) -> RawInterval | None:
    """The interval's on-time samples and accounted hosts; None when it has no samples.

    ``batch_ids`` restricts the interval to those batches (and their hosts): how accounting
    finds which batches it cannot account. A reader of many intervals (a what-if) gives what
    it knows already: the interval's ``span`` (start, length) and the organizations that are
    customers (:func:`organization_customers`)."""
    if span is None:
        span = conn.execute(
            select(_intervals.c.start_s, _intervals.c.length_s).where(
                _intervals.c.id == interval_id
            )
        ).one()
    start_s, length_s = span
    # Only ψ′ needs when each VM was created (a join to vms); the other utilities do not.
    created = (_vms.c.created_s,) if config.utility == Utility.psi_prime else ()
    data = read_samples(conn, interval_id, batch_ids, created)
    if not len(data):
        return None
    host_table = float_rows(
        conn,
        select(
            _host_intervals.c.host_id,
            _host_intervals.c.organization_id,
            *(_host_intervals.c[c] for c in CAPACITY_FIELDS),
        ).where(
            _host_intervals.c.interval_id == interval_id, accounted_hosts(interval_id, batch_ids)
        ),
        2 + len(CAPACITY_FIELDS),
    )
    host_table = host_table[np.argsort(host_table[:, 0], kind="stable")]
    org_customer = customer_of_organization
    if org_customer is None:
        org_customer = organization_customers(conn)
    return RawInterval(start_s, length_s, data, host_table, org_customer)


# The columns of read_samples' array: host, VM, customer, the usage fields, the flavor fields,
# then the extra columns asked for.
SAMPLE_HOST, SAMPLE_VM, SAMPLE_CUSTOMER = 0, 1, 2
SAMPLE_USE = slice(3, 3 + len(USE_COLUMNS))
SAMPLE_FLAVOR = slice(SAMPLE_USE.stop, SAMPLE_USE.stop + len(FLAVOR_COLUMNS))
SAMPLE_EXTRA = SAMPLE_FLAVOR.stop


def accounted_hosts(interval_id: int, batch_ids: Sequence[int] | None = None) -> Any:
    """The condition on ``host_intervals.host_id`` that keeps the hosts an interval is
    accounted with: those with an on-time batch still accepted (of ``batch_ids``, if given).

    A host whose only batches came late, or were quarantined, is not part of the interval, so
    a late batch that created a host's capacity row changes nothing accounted."""
    query = select(_batches.c.host_id).where(
        _batches.c.interval_id == interval_id,
        _batches.c.late.is_(False),
        _batches.c.state == BatchState.accepted,
    )
    if batch_ids is not None:
        query = query.where(_batches.c.id.in_(list(batch_ids)))
    return _host_intervals.c.host_id.in_(query)


def read_samples(
    conn: Connection,
    interval_id: int,
    batch_ids: Sequence[int] | None = None,
    extra: Sequence[Any] = (),
) -> np.ndarray:
    """The interval's on-time samples, one row per VM and host, as floats: see ``SAMPLE_*``
    for the columns; ``extra`` are more numeric columns of ``samples`` or ``vms``.

    Each batch has rows of its own; a VM reported by two batches of its host (an agent that
    restarted mid-interval) is one row here, its use added up and its owner and flavor those
    of the latest batch. Ordered by host and VM (sorted here, :func:`host_vm_batch_order`:
    PostgreSQL's sort of 100,000 rows spills to disk at the default work_mem). Read from the
    stored batches' arrays on PostgreSQL (:func:`.sample_store.read_on_time`), else, and with
    ``extra`` columns, by :func:`float_rows`."""
    width = SAMPLE_EXTRA + len(extra)
    stored = None if extra else sample_store.read_on_time(conn, interval_id, batch_ids)
    if stored is not None:
        hosts, batches, counts, values = stored
        # Column-major: each column is written whole (0.03 s at 1M samples, 0.2 s by rows);
        # the reorder below hands back rows.
        data = np.empty((int(counts.sum()), width + 1), dtype=np.float64, order="F")
        data[:, SAMPLE_HOST] = np.repeat(hosts, counts)
        data[:, SAMPLE_VM] = values["vm_id"]
        data[:, SAMPLE_CUSTOMER] = values["customer_id"]
        for k, c in enumerate((*USE_COLUMNS, *FLAVOR_COLUMNS)):
            data[:, SAMPLE_USE.start + k] = values[c]
        data[:, width] = np.repeat(batches, counts)
        return merge_vm_rows(data[host_vm_batch_order(data, width), :width])
    columns = (
        _samples.c.host_id,
        _samples.c.vm_id,
        _samples.c.customer_id,
        *(_samples.c[c] for c in USE_COLUMNS),
        *(_samples.c[c] for c in FLAVOR_COLUMNS),
        *extra,
        _samples.c.batch_id,
    )
    query = select(*columns).where(
        _samples.c.interval_id == interval_id, _samples.c.late.is_(False)
    )
    if any(c.table is _vms for c in extra):
        query = query.join(_vms, _vms.c.id == _samples.c.vm_id)
    if batch_ids is not None:
        query = query.where(_samples.c.batch_id.in_(list(batch_ids)))
    data = float_rows(conn, query, width + 1)
    return merge_vm_rows(data[host_vm_batch_order(data, width), :width])


def host_vm_batch_order(data: np.ndarray, batch: int) -> np.ndarray:
    """The order of ``data``'s rows by host, VM, then the batch in column ``batch``.

    The rows arrive nearly in that order already (a batch is one host's, written at once), so
    one stable sort on a single integer key (host, VM) runs in about linear time, where a
    three-key ``lexsort`` cost 0.76 s at 1M samples. Only when a VM has two rows on a host (an
    agent restarted mid-interval) does the batch decide, and the full sort runs."""
    host, vm = data[:, SAMPLE_HOST], data[:, SAMPLE_VM]
    if not len(data):
        return np.arange(0)
    span = float(vm.max()) + 1
    if float(host.max()) * span + span < 2.0**53:
        key = host.astype(np.int64) * np.int64(span) + vm.astype(np.int64)
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        if not (ordered[1:] == ordered[:-1]).any():
            return order
    return np.lexsort((data[:, batch], vm, host))


def float_rows(conn: Connection, query: Any, width: int) -> np.ndarray:
    """``query``'s rows (``width`` numeric columns) as a float64 array; NULL becomes NaN.

    On PostgreSQL each row becomes its columns as big-endian float8s (``float8send``) and
    ``string_agg`` joins the rows: one bytea crosses the wire and numpy reads it in place (ids
    are exact in a double below 2^53). Building 100,000 Python rows and tuples cost three times
    the query itself, and a binary COPY costs twice this, since psycopg hands it over a row at
    a time (0.38 s against 0.17 s at 100,000 samples). A bytea holds at most 1 GB: ~10 million
    samples of 13 columns in one interval."""
    if conn.dialect.name != "postgresql":
        # The driver's tuples, not SQLAlchemy's rows (a third of the fetch at 100,000 samples);
        # numpy makes a None NaN itself (a Python step per value had cost as much again).
        result = conn.execute(query)
        try:
            rows = result.cursor.fetchall()
        finally:
            result.close()
        return np.array(rows, dtype=np.float64).reshape(len(rows), width)
    inner = query.subquery("sampled")
    packed = func.string_agg(
        literal_column(
            " || ".join(
                f"float8send(coalesce(CAST({inner.name}.{c.name} AS float8), 'NaN'))"
                for c in inner.c
            )
        ),
        literal_column("''::bytea"),
    )
    packed_rows = binary_rows(conn, select(packed).select_from(inner))
    buffer = b"" if not packed_rows or packed_rows[0][0] is None else packed_rows[0][0]
    return np.frombuffer(buffer, dtype=">f8").reshape(-1, width).astype(np.float64)


def merge_vm_rows(data: np.ndarray) -> np.ndarray:
    """``data`` (ordered by host, VM, batch) with each VM's rows on a host made one: usage
    summed, every other column from its last row. Returns ``data`` itself when no VM has
    two rows, the common case."""
    if len(data) < 2:
        return data
    same = (data[1:, SAMPLE_HOST] == data[:-1, SAMPLE_HOST]) & (
        data[1:, SAMPLE_VM] == data[:-1, SAMPLE_VM]
    )
    if not same.any():
        return data
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    ends = np.concatenate((starts[1:], [len(data)])) - 1
    merged = data[ends].copy()
    merged[:, SAMPLE_USE] = np.add.reduceat(data[:, SAMPLE_USE], starts, axis=0)
    return merged


def supply_and_flavor(
    config: AccountingConfig, capacity: np.ndarray, flavor: np.ndarray, length_s: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-second capacities and flavors → amounts per interval in the configured resources.

    With ``split_io`` the disk bandwidth bounds reads and writes each, and the link speed
    received and sent bytes each (full duplex).
    """
    if config.split_io:
        capacity = capacity[:, _SPLIT_SOURCE]
        flavor = flavor[:, _SPLIT_SOURCE]
    return capacity * length_s, flavor * length_s


def use_amounts(config: AccountingConfig, raw: np.ndarray) -> np.ndarray:
    """Raw usage (VMs × the wire's usage fields) → amounts in the configured resources: as
    posted with ``split_io``, else each resource's fields summed (reads + writes, rx + tx)."""
    if config.split_io:
        return raw
    return np.add.reduceat(raw, _COMBINED_STARTS, axis=1)


# Per usage field, the resource it belongs to; and where each resource's fields begin.
_SPLIT_SOURCE = [i for i, r in enumerate(RESOURCES) for _ in r.batch_fields]
_COMBINED_STARTS = np.cumsum([0] + [len(r.batch_fields) for r in RESOURCES[:-1]])


def unique_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for non-negative integer ids: by a table of the
    ids present when they are dense enough (a ledger's ids count up from 1), ten times faster
    than the sort at 1M samples; by the sort otherwise."""
    if not len(ids) or int(ids.min()) < 0 or int(ids.max()) > 4 * len(ids) + 1_000_000:
        unique, inverse = np.unique(ids, return_inverse=True)
        return unique, inverse.reshape(-1)
    present = np.zeros(int(ids.max()) + 1, dtype=bool)
    present[ids] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1)[ids]


def organization_customers(conn: Connection) -> dict[int, int]:
    """Organization id → the customer it is, for the organizations that are customers."""
    return dict(
        conn.execute(
            select(_organizations.c.id, _organizations.c.customer_id).where(
                _organizations.c.customer_id.is_not(None)
            )
        ).all()
    )


def sampled_interval(raw: RawInterval, config: AccountingConfig) -> SampledInterval:
    """The interval's arrays in the configured resources, each VM's host row and customer
    found by bisection (both tables are ordered by id), without a Python step per VM."""
    data, host_table = raw.samples, raw.hosts
    host_ids = data[:, SAMPLE_HOST].astype(np.int64)
    table_hosts = host_table[:, 0].astype(np.int64)
    host_of_vm = np.searchsorted(table_hosts, host_ids)
    found = host_of_vm < len(table_hosts)
    found[found] = table_hosts[host_of_vm[found]] == host_ids[found]
    if not found.all():
        missing = np.unique(host_ids[~found]).tolist()
        raise LookupError(
            f"interval {iso(raw.start_s)}: samples from hosts {missing} without a capacity row"
        )
    vm_customers, customer_of_vm = unique_ids(data[:, SAMPLE_CUSTOMER].astype(np.int64))
    supply, configured = supply_and_flavor(
        config, host_table[:, 2:], data[:, SAMPLE_FLAVOR], raw.length_s
    )
    return SampledInterval(
        start_s=raw.start_s,
        length_s=raw.length_s,
        use=use_amounts(config, data[:, SAMPLE_USE]),
        supply=supply,
        configured=configured,
        host_of_vm=host_of_vm.astype(np.intp),
        vm_customers=vm_customers,
        customer_of_vm=customer_of_vm,
        host_organizations=host_table[:, 1].astype(np.int64),
        release_s=data[:, SAMPLE_EXTRA] if data.shape[1] > SAMPLE_EXTRA else None,
    )
