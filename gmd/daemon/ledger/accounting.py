"""Closing intervals and accounting them: samples → engine → ledger rows, one transaction each.

An interval is accounted strictly after the one before it (balances carry over), from its
on-time samples only, so that accounting it again gives the same rows. Each interval is one
transaction: a crash leaves it closed and unaccounted, never half written, and the next run
picks it up. On PostgreSQL every transaction first takes an advisory lock, so that of several
daemons exactly one accounts at a time; on SQLite the writer lock does the same for the one
daemon SQLite supports.

The ledger is dense for customers with a standing: every accounted interval that had samples
holds a row for each customer whose balance, utility or priority is not yet negligible, so
a customer's standing at any interval is one row. Intervals in which no host reported
anything (all agents or the daemon down) are accounted with no rows; the balances that carry
over them decay by the time elapsed, exactly as if zeros had been written.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    delete,
    func,
    insert,
    literal_column,
    select,
    text,
    update,
)

from gmd import GmdError
from gmd.daemon.config import AccountingConfig
from gmd.daemon.ledger import reset_window, rollups, sample_store
from gmd.daemon.ledger.binary_copy import binary_rows
from gmd.daemon.ledger.quarantine import Quarantined, bad_data, isolate
from gmd.fairness.directcontr import Utility
from gmd.fairness.interval import (
    Accounts,
    IntervalResult,
    IntervalUse,
    Standing,
    account_interval,
)
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.models import (
    FLAVOR_COLUMNS,
    USE_COLUMNS,
    BatchState,
    IntervalState,
)
from gmd.ledger_schema.tables import (
    batches as _batches,
    customer_ledger as _customer_ledger,
    host_intervals as _host_intervals,
    intervals as _intervals,
    organization_ledger as _organization_ledger,
    organizations as _organizations,
    resource_ledger as _resource_ledger,
    samples as _samples,
    vms as _vms,
)
from gmd.wire import CAPACITY_FIELDS, RESOURCES

log = logging.getLogger(__name__)

# "gmd-acct" as a big-endian signed 64-bit integer: the advisory lock every daemon agrees on.
ACCOUNTING_LOCK = int.from_bytes(b"gmd-acct", "big", signed=True)
# A standing this small is forgotten (after ~45 half-lives of silence) to bound the ledger.
NEGLIGIBLE = 1e-12


@dataclass(frozen=True)
class LedgerRows:
    """What accounting one interval writes: lists of row dicts, keyed like the tables."""

    customers: list[dict[str, Any]]
    resources: list[dict[str, Any]]
    organizations: list[dict[str, Any]]


def take_lock(conn: Connection) -> bool:
    """The accountant's lock for this transaction: PostgreSQL advisory; SQLite's BEGIN
    IMMEDIATE already made this the only writer."""
    if conn.dialect.name != "postgresql":
        return True
    return bool(
        conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": ACCOUNTING_LOCK}).scalar()
    )


def close_due(conn: Connection, now_s: float, grace_s: float, limit: int | None = None) -> int:
    """Close every interval whose grace period is over, creating the ones nobody reported.

    From the first interval ever seen up to the last one due, every interval exists
    afterwards, so that the ledger shows a gap as an interval without samples rather than as
    nothing. With ``limit``, only the next ``limit`` intervals are considered (created or
    closed), so that a catch-up proceeds in bounded steps; call again for the rest. Returns how
    many intervals were closed.
    """
    lengths = conn.execute(
        select(_intervals.c.length_s, func.min(_intervals.c.start_s)).group_by(
            _intervals.c.length_s
        )
    ).all()
    if not lengths:
        return 0
    length_s = max(lengths, key=lambda r: r[1])[0]  # the current interval length
    last_open = conn.execute(
        select(func.max(_intervals.c.start_s)).where(_intervals.c.state != IntervalState.open)
    ).scalar_one()
    first = conn.execute(select(func.min(_intervals.c.start_s))).scalar_one()
    due_end = math.floor(now_s - grace_s)
    start = first if last_open is None else last_open + length_s
    if limit is not None:
        due_end = min(due_end, start + limit * length_s)
    existing = set(
        conn.execute(
            select(_intervals.c.start_s).where(
                _intervals.c.start_s >= start, _intervals.c.start_s + length_s <= due_end
            )
        ).scalars()
    )
    gap_starts = [s for s in range(start, due_end - length_s + 1, length_s) if s not in existing]
    gaps = [
        {"id": s, "start_s": s, "length_s": length_s, "state": IntervalState.closed}
        for s in gap_starts
    ]
    if gaps:
        conn.execute(insert(_intervals), gaps)
        log.warning(
            "no samples at all for %d interval(s) from %s: accounted as empty",
            len(gaps),
            _when(gap_starts[0]),
        )
    closed = conn.execute(
        update(_intervals)
        .where(
            _intervals.c.state == IntervalState.open,
            _intervals.c.start_s + _intervals.c.length_s + grace_s <= now_s,
            _intervals.c.start_s + _intervals.c.length_s <= due_end,
        )
        .values(state=IntervalState.closed)
    ).rowcount
    return closed + len(gaps)


def _when(start_s: int) -> str:
    return datetime.fromtimestamp(start_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class IntervalData:
    """One interval as the ledger holds it, ready for the pure step
    (:func:`gmd.fairness.interval.account_interval`): the arrays, the accounts, the standing
    it starts from, and the ledger ids behind each row (for explain's names)."""

    start_s: int
    length_s: int
    accounts: Accounts
    use: IntervalUse
    standing: Standing
    reset: np.ndarray
    vm_ids: np.ndarray
    """per VM row: ``vms.id``"""
    host_ids: np.ndarray
    """per host row: ``hosts.id``"""


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


def read_interval(
    conn: Connection,
    interval_id: int,
    config: AccountingConfig,
    batch_ids: Sequence[int] | None = None,
) -> IntervalData | None:
    """The interval (:func:`read_raw_interval`) with the standing after the previous interval
    with rows, as the ledger holds it; None when it has no samples. Reads only."""
    raw = read_raw_interval(conn, interval_id, config, batch_ids)
    if raw is None:
        return None
    prev = previous_standing(conn, raw.start_s)
    if prev is None:
        return assemble(raw, config, None, {}, {}, set())
    prev_customers = {
        r.customer_id: r
        for r in conn.execute(
            select(_customer_ledger).where(_customer_ledger.c.interval_id == prev.id)
        )
    }
    prev_orgs = {
        r.organization_id: r
        for r in conn.execute(
            select(_organization_ledger).where(_organization_ledger.c.interval_id == prev.id)
        )
    }
    reset = reset_window.reset_customers(conn, prev.start_s, raw.start_s)
    return assemble(raw, config, prev.start_s, prev_customers, prev_orgs, reset)


def assemble(
    raw: RawInterval,
    config: AccountingConfig,
    prev_start_s: int | None,
    prev_customers: Mapping[int, Any],
    prev_orgs: Mapping[int, Any],
    reset: set[int],
) -> IntervalData:
    """The interval's arrays and accounts, starting from a standing: ``prev_customers`` (id →
    anything with ``balance``, ``utility_work``, ``utility_moment``, as a ledger row) and
    ``prev_orgs`` (id → ``contribution_work``, ``contribution_moment``) after the interval that
    started at ``prev_start_s``; the balances of ``reset`` customers start from 0."""
    data, host_table = raw.samples, raw.hosts
    host_ids = data[:, SAMPLE_HOST].astype(np.int64)
    customer_ids = data[:, SAMPLE_CUSTOMER].astype(np.int64)
    # Both tables are ordered by id (the hosts by read_raw_interval), so each VM's host row and
    # customer account are found by bisection, without a Python step per VM.
    table_hosts = host_table[:, 0].astype(np.int64)
    host_of_vm = np.searchsorted(table_hosts, host_ids)
    found = host_of_vm < len(table_hosts)
    found[found] = table_hosts[host_of_vm[found]] == host_ids[found]
    if not found.all():
        missing = np.unique(host_ids[~found]).tolist()
        raise LookupError(
            f"interval {_when(raw.start_s)}: samples from hosts {missing} without a capacity row"
        )
    host_org = host_table[:, 1].astype(np.int64)
    sample_customers, customer_index = unique_ids(customer_ids)
    accounts = Accounts.layout(
        sample_customers.tolist(),
        np.unique(host_org).tolist(),
        prev_customers,
        prev_orgs,
        raw.customer_of_organization,
    )
    settings = config.interval_settings()
    empty = Standing.empty(accounts, settings)
    standing = Standing(prev_start_s, empty.balance, empty.directcontr)
    before = standing.directcontr
    for c, i in accounts.account_of_customer.items():
        row = prev_customers.get(c)
        if row is not None:
            standing.balance[i] = row.balance
            before.utility_work[i] = row.utility_work
            before.utility_moment[i] = row.utility_moment
    for o, a in accounts.account_of_org.items():
        row = prev_orgs.get(o)
        if row is not None:
            before.contribution_work[a] = row.contribution_work
            before.contribution_moment[a] = row.contribution_moment
    supply, configured = supply_and_flavor(
        config, host_table[:, 2:], data[:, SAMPLE_FLAVOR], raw.length_s
    )
    use = IntervalUse(
        start_s=raw.start_s,
        length_s=raw.length_s,
        use=use_amounts(config, data[:, SAMPLE_USE]),
        supply=supply,
        configured=configured,
        host_of_vm=host_of_vm.astype(np.intp),
        customer_of_vm=accounts.of_customers(sample_customers.tolist())[customer_index],
        organization_of_host=accounts.of_organizations(host_org.tolist()),
        release_s=data[:, SAMPLE_EXTRA] if data.shape[1] > SAMPLE_EXTRA else None,
    )
    was_reset = np.array([c in reset for c in accounts.customers], dtype=bool)
    return IntervalData(
        raw.start_s,
        raw.length_s,
        accounts,
        use,
        standing,
        was_reset,
        data[:, SAMPLE_VM].astype(np.int64),
        host_table[:, 0].astype(np.int64),
    )


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


def previous_standing(conn: Connection, start_s: int) -> Any:
    """The last accounted interval with rows before ``start_s`` (id, start_s), or None: the
    standing an interval starts from."""
    return conn.execute(
        select(_intervals.c.id, _intervals.c.start_s)
        .where(
            _intervals.c.start_s < start_s,
            _intervals.c.state == IntervalState.accounted,
            _intervals.c.ledger_rows > 0,
        )
        .order_by(_intervals.c.start_s.desc())
        .limit(1)
    ).first()


def organization_customers(conn: Connection) -> dict[int, int]:
    """Organization id → the customer it is, for the organizations that are customers."""
    return dict(
        conn.execute(
            select(_organizations.c.id, _organizations.c.customer_id).where(
                _organizations.c.customer_id.is_not(None)
            )
        ).all()
    )


def compute_rows(
    conn: Connection,
    interval_id: int,
    config: AccountingConfig,
    batch_ids: Sequence[int] | None = None,
) -> LedgerRows:
    """The rows accounting writes for an interval (:func:`read_interval`, then the pure step).
    Reads only; :func:`account_next` writes."""
    # A batch holding numbers beyond float range overflows here; the engine then refuses the
    # non-finite result by name, which is what isolates the batch (numpy need not warn too).
    with np.errstate(over="ignore", invalid="ignore"):
        data = read_interval(conn, interval_id, config, batch_ids)
        if data is None:
            return LedgerRows([], [], [])
        result = account_interval(
            data.use, data.standing, config.interval_settings(), data.accounts, data.reset
        )
    return ledger_rows(interval_id, data.accounts, result, config.resources)


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


def ledger_rows(
    interval_id: int, accounts: Accounts, result: IntervalResult, resources: Sequence[str]
) -> LedgerRows:
    """The ledger rows of one interval's result: a row per customer with VMs or a standing not
    yet negligible, its terms per resource when it had VMs, a row per organization."""
    g = result.greediness
    after = result.directcontr
    priority = result.priority
    customer_rows: list[dict[str, object]] = []
    resource_rows: list[dict[str, object]] = []
    for i, c in enumerate(accounts.customers):
        active = result.vms[i] > 0
        standing = (result.balance[i], after.utility_work[i], after.utility_moment[i], priority[i])
        if not active and all(abs(v) < NEGLIGIBLE for v in standing):
            continue
        customer_rows.append(
            {
                "interval_id": interval_id,
                "customer_id": c,
                "greediness": float(g.customer_greediness[i]),
                "balance": float(result.balance[i]),
                "utility_work": float(after.utility_work[i]),
                "utility_moment": float(after.utility_moment[i]),
                "utility": float(result.utility[i]),
                "priority": float(priority[i]),
                "vms": int(result.vms[i]),
            }
        )
        if active:
            resource_rows.extend(
                {
                    "interval_id": interval_id,
                    "customer_id": c,
                    "resource": r,
                    "term": float(g.customer_terms[i, k]),
                }
                for k, r in enumerate(resources)
            )
    org_rows = [
        {
            "interval_id": interval_id,
            "organization_id": o,
            "contribution_work": float(after.contribution_work[a]),
            "contribution_moment": float(after.contribution_moment[a]),
            "contribution": float(result.contribution[a]),
            "utility": float(result.utility[a]),
            "priority": float(priority[a]),
        }
        for o, a in accounts.account_of_org.items()
    ]
    return LedgerRows(customer_rows, resource_rows, org_rows)


AfterInterval = Callable[[Connection, int, int, int], object]


class AccountingStuck(GmdError, RuntimeError):
    """An interval cannot be accounted, and leaving out batches does not help: a bug or a
    broken standing, not bad input. Accounting stops at that interval until it is fixed."""


def unverified_in(conn: Connection, interval_id: int) -> int:
    """How many on-time batches of the interval Placement has yet to vouch for."""
    return int(
        conn.execute(
            select(func.count())
            .select_from(_batches)
            .where(
                _batches.c.unverified.is_(True),
                _batches.c.interval_id == interval_id,
                _batches.c.late.is_(False),
                _batches.c.state == BatchState.accepted,
            )
        ).scalar_one()
    )


def unverified_ids(conn: Connection, interval_id: int) -> list[int]:
    """The on-time batches of the interval Placement has yet to vouch for."""
    return list(
        conn.execute(
            select(_batches.c.id).where(
                _batches.c.unverified.is_(True),
                _batches.c.interval_id == interval_id,
                _batches.c.late.is_(False),
                _batches.c.state == BatchState.accepted,
            )
        ).scalars()
    )


def _batches_late(conn: Connection, interval_id: int, batch_ids: Sequence[int]) -> None:
    """Make ``batch_ids`` of the interval late batches: in no accounting, kept for reports."""
    if not batch_ids:
        return
    conn.execute(
        update(_batches)
        .where(_batches.c.interval_id == interval_id, _batches.c.id.in_(list(batch_ids)))
        .values(late=True)
    )
    sample_store.mark_late(conn, interval_id, batch_ids)


@dataclass(frozen=True)
class Waiting:
    """Accounting waits for an interval's unverified batches (``[placement] wait_s``)."""

    start_s: int
    batches: int
    until_s: float


def account_next(
    engine: Engine,
    config: AccountingConfig,
    after: AfterInterval | None = None,
    on_quarantine: Callable[[list[Quarantined]], object] | None = None,
    *,
    now_s: float | None = None,
    unverified_wait_s: float | None = None,
    on_wait: Callable[[Waiting], object] | None = None,
) -> int | None:
    """Account the earliest closed interval, if this process holds the lock and its turn has
    come. Returns its start, or None when there was nothing to do (or another daemon is at it).

    The hour (and day) the interval completes is rolled up in the same transaction.
    ``after(conn, interval_id, start_s, length_s)`` runs in it too once the rows
    are written (the daemon decides throttle levels there), so both land or neither.

    One bad batch must not stop accounting for good (intervals are accounted in order): when
    the interval fails with its data, the batches that make it fail are found, quarantined
    (``on_quarantine`` hears of them) and the interval is accounted without them, all in this
    transaction. :class:`AccountingStuck` when no batch explains the failure.

    With ``unverified_wait_s`` (``[placement] wait_s``, Placement verifies batches), an
    interval that still has batches accepted while Placement could not be reached is not
    accounted until they are verified or quarantined, or until ``unverified_wait_s`` after its
    grace period: ``on_wait`` hears of it and None is returned. Past the wait the interval is
    accounted without them, and they become late batches (kept for reports, in no accounted
    interval), whatever Placement says of them later: an outage of Placement cannot frame
    anyone, even for one interval; what it costs is the use of those batches, counted for
    nobody. A warning says so.
    """
    with writer(engine).begin() as conn:
        if not take_lock(conn):
            return None
        row = conn.execute(
            select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s)
            .where(_intervals.c.state == IntervalState.closed)
            .order_by(_intervals.c.start_s)
            .limit(1)
            .with_for_update()
        ).first()
        if row is None:
            return None
        interval_id, start_s = int(row.id), int(row.start_s)
        if unverified_wait_s is not None:
            pending = unverified_in(conn, interval_id)
            if pending:
                now = time.time() if now_s is None else now_s
                until = start_s + int(row.length_s) + config.grace_s + unverified_wait_s
                if now < until:
                    if on_wait is not None:
                        on_wait(Waiting(start_s, pending, until))
                    return None
                unverified = unverified_ids(conn, interval_id)
                _batches_late(conn, interval_id, unverified)
                log.warning(
                    "interval %s: accounted without %d batch(es) Placement has not verified"
                    " after waiting [placement] wait_s = %g s; they are kept as late ones,"
                    " their use counted for nobody",
                    _when(start_s),
                    len(unverified),
                    unverified_wait_s,
                )

        def account(batch_ids: Sequence[int] | None = None, *, keep: bool = True) -> None:
            with conn.begin_nested() as savepoint:
                write_rows(conn, interval_id, compute_rows(conn, interval_id, config, batch_ids))
                if not keep:
                    savepoint.rollback()

        try:
            account()
        except Exception as exc:
            if not bad_data(exc):
                raise
            found = isolate(conn, interval_id, lambda ids: account(ids, keep=False), exc)
            if not found:
                raise AccountingStuck(
                    f"interval {_when(start_s)} cannot be accounted and no batch of it explains"
                    f" why: {exc}"
                ) from exc
            log.error(
                "interval %s: %d batch(es) quarantined, accounted without them: %s",
                _when(start_s),
                len(found),
                "; ".join(f"{q.key} from {q.host}: {q.error}" for q in found),
            )
            if on_quarantine is not None:
                on_quarantine(found)
            try:
                account()
            except Exception as again:
                raise AccountingStuck(
                    f"interval {_when(start_s)} still cannot be accounted without its"
                    f" quarantined batches: {again}"
                ) from again
        rollups.after_interval(conn, start_s, int(row.length_s))
        if after is not None:
            after(conn, interval_id, start_s, int(row.length_s))
        return start_s


def write_rows(conn: Connection, interval_id: int, rows: LedgerRows) -> None:
    """Replace the interval's ledger rows and mark it accounted."""
    for table in (_customer_ledger, _resource_ledger, _organization_ledger):
        conn.execute(delete(table).where(table.c.interval_id == interval_id))
    for table, values in (
        (_customer_ledger, rows.customers),
        (_resource_ledger, rows.resources),
        (_organization_ledger, rows.organizations),
    ):
        if values:
            _insert_rows(conn, table, values)
    conn.execute(
        update(_intervals)
        .where(_intervals.c.id == interval_id)
        .values(
            state=IntervalState.accounted,
            accounted_at=datetime.now(UTC),
            ledger_rows=len(rows.customers),
        )
    )


def _insert_rows(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys): by COPY on PostgreSQL, where an INSERT per
    row cost 0.1 s of an interval's 0.35 s at 2,000 customers."""
    if conn.dialect.name != "postgresql":
        conn.execute(insert(table), rows)
        return
    columns = list(rows[0])
    raw = conn.connection.driver_connection
    assert raw is not None, "a connection in use has a driver connection"
    statement = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row([row[c] for c in columns])


@dataclass(frozen=True)
class RunReport:
    closed: int
    accounted: list[int]
    seconds: list[float]
    quarantined: list[Quarantined] = field(default_factory=list)
    stopped: bool = False
    """the run ended early because it was asked to stop (``should_stop``)"""
    waiting: Waiting | None = None
    """accounting waits for this interval's unverified batches"""


# How many intervals one transaction creates at most while catching up: bounds its memory and
# how long ingest waits for it (a day of 60 s intervals).
CLOSE_CHUNK = 1440


def close_chunk(engine: Engine, now_s: float, grace_s: float) -> int:
    """Close (and create) the next :data:`CLOSE_CHUNK` due intervals in a transaction of their
    own, if this process holds the accounting lock. Returns how many it closed."""
    with writer(engine).begin() as conn:
        return close_due(conn, now_s, grace_s, CLOSE_CHUNK) if take_lock(conn) else 0


def close_all_due(engine: Engine, now_s: float, grace_s: float) -> int:
    """Close every interval due at ``now_s``, a chunk per transaction. Returns how many."""
    total = 0
    while newly := close_chunk(engine, now_s, grace_s):
        total += newly
    return total


def account_due(
    engine: Engine,
    config: AccountingConfig,
    now_s: float | None = None,
    budget_s: float = 60.0,
    after: AfterInterval | None = None,
    should_stop: Callable[[], bool] | None = None,
    close: bool = True,
    unverified_wait_s: float | None = None,
) -> RunReport:
    """One accountant run: close what is due (unless ``close`` is False: the ledger's writes
    are failing, see :mod:`.write_health`) and account closed intervals in order, until
    none is left, ``budget_s`` has passed (a long catch-up continues at the next run) or
    ``should_stop()`` says so (the daemon is stopping: each interval is its own transaction,
    so stopping between two loses nothing).

    Intervals are closed (and gaps created) at most :data:`CLOSE_CHUNK` at a time, each chunk
    its own short transaction, so that a catch-up over days neither holds the writer lock nor
    builds its list of intervals in memory all at once. ``unverified_wait_s``: see
    :func:`account_next`."""
    now = time.time() if now_s is None else now_s
    closed = close_chunk(engine, now, config.grace_s) if close else 0
    accounted: list[int] = []
    seconds: list[float] = []
    quarantined: list[Quarantined] = []
    began = time.monotonic()
    stopped = False
    waiting: list[Waiting] = []
    while time.monotonic() - began < budget_s:
        if should_stop is not None and should_stop():
            stopped = True
            break
        t0 = time.monotonic()
        start = account_next(
            engine,
            config,
            after,
            quarantined.extend,
            now_s=now,
            unverified_wait_s=unverified_wait_s,
            on_wait=waiting.append,
        )
        if waiting:
            break
        if start is None:
            newly = close_chunk(engine, now, config.grace_s) if close else 0
            closed += newly
            if not newly:
                break
            continue
        accounted.append(start)
        seconds.append(time.monotonic() - t0)
        log.info("accounted interval %s in %.3f s", _when(start), seconds[-1])
    return RunReport(
        closed, accounted, seconds, quarantined, stopped, waiting[-1] if waiting else None
    )
