"""Usage reports, like Slurm's ``sreport`` and CloudKitty's summaries: what the ledger says
about a range of time, grouped by customer, organization, host, resource, day or week.

Every number is a sum, count or last value of ledger rows, so that an operator who doubts a
report can get the same number with one SQL query. The definitions:

- **The range** ``[from, to)`` selects the intervals whose *start* is in it; an interval that
  ends after ``to`` counts in full.
- **Accounted intervals** are those of the range that accounting has gone past, with or
  without samples. The ledger is dense (:mod:`gmd.daemon.ledger.accounting`): every customer with a
  standing has a row in every accounted interval that had samples, and intervals without
  any samples have no rows at all. ``gm_mean`` divides ``gm_sum`` by the number of accounted
  intervals, so intervals without a row count as 0.
- **At the end** (balance, utility, priority, contribution) means the rows of the last
  accounted interval with rows that starts before ``to`` (normally inside the range; when the
  range holds only intervals without samples, the standing carried over them), as stored: not
  decayed over later intervals without samples. A customer without a row there has a
  negligible standing: 0. A balance reset (``gmd-admin reset``) taking effect after that
  interval and before ``to`` shows the balance as 0 (as ``gmd-admin standings`` does), and a
  note names the customer.
- **Throttled seconds**: levels change only at interval ends (:mod:`gmd.daemon.enforce.levels`), so
  the level in force during an interval is the one decided last at or before its start — by
  a level action in the range or before it. ``throttled_s`` is the total length of the
  accounted intervals that began at level ≥ 1. Dry-run decisions count as throttling;
  ``throttle_mode`` says what was applied in those intervals, from the hosts' reports
  (:mod:`gmd.daemon.reports.enforced`): ``applied`` (a host throttled one of the customer's
  VMs during the interval), ``dry-run``, ``not applied`` (decided with mode "on", but no
  host applied it), or several joined by ``+``.
- **Quota changes** are ``quota_lower``/``quota_restore`` actions (applied, or decided in
  dry-run; failed attempts excluded) recorded at a time in the range: quota actions belong to
  no interval.
- **Late samples** arrived after their interval closed: they are stored, counted in
  ``late_samples`` and never in the ledger, so a report marks the rows that have some.

Columns (keys of the rows), by grouping:

- ``customer``: gm_sum, gm_mean, balance, gm_<resource> (Σ of that resource's terms; they
  add up to gm_sum), utility, priority, contribution (an organization's that is this
  customer; else 0), throttled_s, throttle_mode, quota_changes, late_samples.
- ``organization``: customer (the customer it is, if any), contribution, utility, priority,
  hosts, customers (served by on-time samples on its hosts), cpu_supplied_core_s (cores ×
  interval length), cpu_used_core_s, late_samples — hosts counted for the organization that
  owned them in each interval.
- ``host``: organization (owner now), vms, customers, samples, cpu_core_s, memory_byte_s,
  disk_bytes (read + written), network_bytes (received + sent), all of on-time samples;
  late_samples.
- ``resource``: gm_sum (Σ terms), over (Σ positive terms: use beyond the endowment), under
  (Σ negative terms: ceded and credited), customers_over (customers with a positive term
  of that resource in at least one interval).
- ``day`` and ``week`` (UTC, weeks from Monday; the key is the period's first day):
  intervals (accounted), empty_intervals (without samples), active_customers (with a VM),
  gm_positive (Σ positive interval greediness), greediest and greediest_gm (the largest GM
  sum of the period), throttled_customers, actions (level decisions by their interval,
  other actions by when they were recorded), late_samples. With one customer: customer,
  intervals, gm_sum, gm_mean, balance (at the period's end), throttled_s, throttle_mode,
  late_samples.

Cost: aggregation is done by the database (GROUP BY). On 2,000 customers × 1,440 intervals
PostgreSQL answers every grouping in under 5 s; SQLite, which sorts every GROUP BY, takes
4-7 s, except for the per-resource terms (four rows per customer and interval) that the
customer and resource groupings sum: ~20 s for all customers. The customer grouping with
``top`` sums them only for the customers kept (~5 s).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    and_,
    case,
    distinct,
    exists,
    func,
    literal,
    or_,
    select,
    union_all,
)

from gmd import OptionError
from gmd.common.timespec import iso
from gmd.daemon.ledger import lookup, reset_window
from gmd.daemon.ledger.models import (
    ActionKind,
    ActionStatus,
    BatchState,
    IntervalState,
)
from gmd.daemon.ledger.rollups import served_peaks
from gmd.daemon.ledger.tables import (
    actions as _actions,
    batches as _batches,
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    customers as _customers,
    host_intervals as _host_intervals,
    host_rollups as _host_rollups,
    hosts as _hosts,
    intervals as _intervals,
    organization_ledger as _org_ledger,
    organization_rollups as _org_rollups,
    organizations as _organizations,
    resource_ledger as _terms,
    resource_rollups as _resource_rollups,
    samples as _samples,
)
from gmd.daemon.reports.columns import PROJECT, Column, Unit
from gmd.daemon.reports.coverage import Coverage, coverage
from gmd.daemon.reports.enforced import Throttling, level_runs, throttling

GROUPS: tuple[str, ...] = ("customer", "organization", "host", "resource", "day", "week")
QUOTA_KINDS: tuple[str, ...] = (ActionKind.quota_lower.value, ActionKind.quota_restore.value)
# Resources in the order the configuration lists them (combined, then split I/O); others A→Z.
RESOURCE_ORDER: tuple[str, ...] = (
    "cpu",
    "memory",
    "disk",
    "disk_read",
    "disk_write",
    "network",
    "network_rx",
    "network_tx",
)
DAY_S = 86400
# Unix time 0 was a Thursday: shifting by three days makes weeks start on Mondays.
_PERIODS: dict[str, tuple[int, int]] = {"day": (0, DAY_S), "week": (3 * DAY_S, 7 * DAY_S)}

LATE_NOTE = "* late samples are stored but not counted (accounting reads on-time samples only)"
THROTTLE_NOTE = (
    "throttled_s: length of the accounted intervals that began at level ≥ 1 (levels change at"
    " interval ends); dry-run decisions count; throttle_mode: what the hosts reported applied"
    " in them (applied, dry-run, not applied)"
)

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called before each step of a report (for a progress bar)."""


@dataclass(frozen=True)
class Report:
    """A report: rows (plain numbers and names, ready for JSON) and the columns to show."""

    group_by: str
    from_s: float
    to_s: float
    columns: tuple[Column, ...]
    rows: list[dict[str, object]]
    notes: list[str] = field(default_factory=list)
    label: str = ""
    """the key of the column that names a row (marked with * in tables when it has late samples)"""
    accounted: int = 0
    """accounted intervals in the range (0: the range is empty)"""

    def emptiness(self) -> str | None:
        """Why there are no rows, for a message; None when there are some."""
        if self.rows:
            return None
        if not self.accounted:
            return self.notes[0]
        return "nothing in the range matched"

    def document(self) -> dict[str, object]:
        return {
            "from": iso(self.from_s),
            "to": iso(self.to_s),
            "group_by": self.group_by,
            "rows": self.rows,
            "notes": self.notes,
        }

    def table_rows(self) -> list[dict[str, object]]:
        """The rows as a table shows them: names of rows with late samples marked with *."""
        shown = []
        for row in self.rows:
            late = row.get("late_samples", 0)
            if self.label and isinstance(late, int) and late > 0:
                row = {**row, self.label: f"{row[self.label]} *"}
            shown.append(row)
        return shown

    def caption(self) -> str:
        return "\n".join(self.notes)


class _Steps:
    """Counts the report's queries for the caller's progress bar."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress

    def __call__(self, what: str) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total, what)
        self.done += 1

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.total, self.total, "done")


@dataclass
class _Range:
    """The intervals of ``[lo, hi)`` and where the standing at the end of it is read."""

    lo: int
    hi: int
    intervals: list[tuple[int, int, bool, int]]
    """(start_s, length_s, accounted, ledger_rows) of every interval in the range, by start"""
    starts: list[int]
    """starts of the accounted intervals, ascending"""
    prefix: list[int]
    """prefix[k] = total length of the first k accounted intervals"""
    rows: list[int]
    """ledger rows of each accounted interval"""
    end_id: int | None
    end_start: int | None
    cover: Coverage

    def ids(self, column: Any) -> list[ColumnElement[bool]]:
        """``column`` (an interval id, i.e. its start) in the range: an index or partition
        range, never a join to ``intervals``."""
        return [column >= self.lo, column < self.hi]

    @property
    def accounted(self) -> int:
        return len(self.starts)

    @property
    def empty(self) -> int:
        return sum(1 for r in self.rows if r == 0)

    def index(self, t: float) -> int:
        """How many accounted intervals start before ``t``."""
        return bisect_left(self.starts, t)


def _load_range(conn: Connection, lo: int, hi: int) -> _Range:
    intervals = [
        (int(r.start_s), int(r.length_s), r.state == IntervalState.accounted, r.ledger_rows or 0)
        for r in conn.execute(
            select(
                _intervals.c.start_s,
                _intervals.c.length_s,
                _intervals.c.state,
                _intervals.c.ledger_rows,
            )
            .where(_intervals.c.start_s >= lo, _intervals.c.start_s < hi)
            .order_by(_intervals.c.start_s)
        )
    ]
    starts, prefix, rows = [], [0], []
    for start, length, accounted, n in intervals:
        if accounted:
            starts.append(start)
            prefix.append(prefix[-1] + length)
            rows.append(int(n))
    end = _last_with_rows(conn, hi)
    return _Range(
        lo,
        hi,
        intervals,
        starts,
        prefix,
        rows,
        None if end is None else end[0],
        None if end is None else end[1],
        coverage(conn, lo, hi),
    )


def _last_with_rows(conn: Connection, before_s: float) -> tuple[int, int] | None:
    """(id, start_s) of the last accounted interval with rows starting before ``before_s``."""
    row = conn.execute(
        select(_intervals.c.id, _intervals.c.start_s)
        .where(
            _intervals.c.state == IntervalState.accounted,
            _intervals.c.ledger_rows > 0,
            _intervals.c.start_s < before_s,
        )
        .order_by(_intervals.c.start_s.desc())
        .limit(1)
    ).first()
    return None if row is None else (int(row.id), int(row.start_s))


# -- throttling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    """Accounted intervals ``[first, stop)`` (indices into _Range.starts) at level ≥ 1, and
    what was applied in each (:class:`~gmd.daemon.reports.enforced.Enforced`, from the
    hosts' reports)."""

    first: int
    stop: int
    modes: tuple[str, ...]


def _throttle_spans(
    conn: Connection, rng: _Range, customer_id: int | None
) -> dict[int, list[_Span]]:
    """Customer id → the spans of accounted intervals it spent at level ≥ 1, from the level
    actions (one decided at the end of interval J is in force from J's end until the next),
    with what its hosts applied in each interval (:mod:`gmd.daemon.reports.enforced`)."""
    ids = None if customer_id is None else [customer_id]
    runs, changes = level_runs(conn, ids, before_s=rng.hi)
    applied = throttling(conn, runs)
    spans: dict[int, list[_Span]] = {}
    for cid, seq in changes.items():
        th = applied.get(cid, Throttling())
        out = []
        for k, (t, level, dry) in enumerate(seq):
            if level < 1:
                continue
            first = rng.index(t)
            stop = rng.index(seq[k + 1][0]) if k + 1 < len(seq) else rng.accounted
            if first < stop:
                modes = tuple(
                    th.mode(rng.starts[i], rng.starts[i] + rng.prefix[i + 1] - rng.prefix[i], dry)
                    for i in range(first, stop)
                )
                out.append(_Span(first, stop, modes))
        if out:
            spans[cid] = out
    return spans


def _throttled(spans: Sequence[_Span], rng: _Range, first: int, stop: int) -> tuple[int, str]:
    """Seconds at level ≥ 1 among accounted intervals ``[first, stop)``, and what was applied
    in them ("applied", "dry-run", "not applied", or several joined by "+")."""
    seconds = 0
    modes: set[str] = set()
    for s in spans:
        a, b = max(s.first, first), min(s.stop, stop)
        if a < b:
            seconds += rng.prefix[b] - rng.prefix[a]
            modes.update(s.modes[a - s.first : b - s.first])
    return seconds, "+".join(sorted(modes))


# -- small helpers --------------------------------------------------------------------------


def _customer_names(conn: Connection) -> dict[int, str]:
    return {int(i): n for i, n in conn.execute(select(_customers.c.id, _customers.c.name))}


def _resource_key(resource: str) -> tuple[int, str]:
    order = RESOURCE_ORDER.index(resource) if resource in RESOURCE_ORDER else len(RESOURCE_ORDER)
    return order, resource


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _only(column: Any, customer_id: int | None) -> list[ColumnElement[bool]]:
    """The condition keeping one customer's rows, if the report is about one."""
    return [] if customer_id is None else [column == customer_id]


def _float(value: Any) -> float:
    """A SQL aggregate as a float: NULL (no rows) is 0."""
    return 0.0 if value is None else float(value)


def _int(value: Any) -> int:
    """A SQL count or sum as an int: NULL (no rows) is 0."""
    return 0 if value is None else int(value)


def _range_note(rng: _Range, columns: Iterable[Column]) -> str:
    """The range's intervals, and what gm_mean divides by when ``columns`` (the table the
    note is under) have gm_mean: a note names no column its table lacks."""
    text = (
        f"{rng.accounted} accounted interval(s) start in [{iso(rng.lo)}, {iso(rng.hi)}),"
        f" {rng.empty} of them without samples"
    )
    mean = any(c.key == "gm_mean" for c in columns)
    return text + (f"; gm_mean divides by {rng.accounted}" if mean else "")


def _end_note(rng: _Range, what: str) -> str:
    if rng.end_start is None:
        return f"{what}: no interval with ledger rows before the end of the range (all 0)"
    return f"{what}: after the interval starting {iso(rng.end_start)}, as stored"


# -- by customer ----------------------------------------------------------------------------

_CUSTOMER_HEAD = (
    Column("customer", "Customer", None, "left"),
    PROJECT,
    Column("gm_sum", "GM sum", 4),
    Column("gm_mean", "GM mean", 6),
    Column("balance", "Balance (end)", 4),
)
_CUSTOMER_TAIL = (
    Column("utility", "Utility (end)", 4),
    Column("priority", "Priority (end)", 4),
    Column("contribution", "Contribution (end)", 4),
    Column("throttled_s", "Throttled s", None),
    Column("throttle_mode", "Mode", None, "left"),
    Column("quota_changes", "Quota changes", None),
    Column("late_samples", "Late samples", None),
)


def _by_customer(
    conn: Connection,
    rng: _Range,
    step: _Steps,
    customer_id: int | None,
    sort: str | None,
    top: int | None,
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    """Customer rows. The per-resource terms are the ledger's biggest table (one row per
    customer, interval and resource), so they are summed last, and with ``top`` only for
    the customers kept — unless the rows are sorted by one of them."""
    only = [] if customer_id is None else [_ledger.c.customer_id == customer_id]
    step("GM sums")
    cr = _customer_rollups.c
    both = union_all(
        select(_ledger.c.customer_id.label("cid"), _ledger.c.greediness.label("gm")).where(
            rng.cover.raw_where(_ledger.c.interval_id), *only
        ),
        select(cr.customer_id, cr.gm_sum).where(
            rng.cover.rolled_where(_customer_rollups), *_only(cr.customer_id, customer_id)
        ),
    ).subquery()
    gm = {
        int(cid): _float(total)
        for cid, total in conn.execute(select(both.c.cid, func.sum(both.c.gm)).group_by(both.c.cid))
    }
    step("standings at the end")
    end: dict[int, tuple[float, float, float]] = {}
    contribution: dict[int, float] = {}
    if rng.end_id is not None:
        end = {
            int(r.customer_id): (float(r.balance), float(r.utility), float(r.priority))
            for r in conn.execute(
                select(
                    _ledger.c.customer_id, _ledger.c.balance, _ledger.c.utility, _ledger.c.priority
                ).where(_ledger.c.interval_id == rng.end_id, *only)
            )
        }
        contribution = {
            int(cid): float(c)
            for cid, c in conn.execute(
                select(_organizations.c.customer_id, _org_ledger.c.contribution)
                .join(_organizations, _organizations.c.id == _org_ledger.c.organization_id)
                .where(
                    _org_ledger.c.interval_id == rng.end_id,
                    _organizations.c.customer_id.is_not(None),
                )
            )
        }
    step("late samples")
    late = _late_by(conn, rng, _samples.c.customer_id, customer_id)
    step("quota changes")
    quota_query = (
        select(_actions.c.customer_id, func.count())
        .where(
            _actions.c.kind.in_(QUOTA_KINDS),
            _actions.c.status != ActionStatus.failed.value,
            _actions.c.customer_id.is_not(None),
            # Tied to an interval: by its start, as every report column; else by when recorded.
            or_(
                and_(*rng.ids(_actions.c.interval_id)),
                and_(
                    _actions.c.interval_id.is_(None),
                    _actions.c.at >= _dt(rng.lo),
                    _actions.c.at < _dt(rng.hi),
                ),
            ),
        )
        .group_by(_actions.c.customer_id)
    )
    if customer_id is not None:
        quota_query = quota_query.where(_actions.c.customer_id == customer_id)
    quota = {int(cid): int(n) for cid, n in conn.execute(quota_query)}
    step("throttling")
    spans = _throttle_spans(conn, rng, customer_id)
    throttled = {cid: _throttled(s, rng, 0, rng.accounted) for cid, s in spans.items()}
    step("resets and names")
    # A reset after the range's last standing, for an interval the range holds, is pending.
    reset = (
        reset_window.reset_customers(conn, rng.end_start, rng.hi - 1)
        if rng.end_start is not None
        else set()
    )
    names = _customer_names(conn)
    shown = lookup.display_names(conn)

    # Standings at the end come from before the range when it has only intervals without
    # samples; a range without any accounted interval lists nobody for them.
    ids = set(gm) | (set(end) if rng.accounted else set()) | set(late) | set(quota)
    ids |= {cid for cid, (seconds, _) in throttled.items() if seconds > 0}
    if customer_id is not None:
        ids &= {customer_id}
    rows: dict[int, dict[str, object]] = {}
    for cid in ids:
        balance, utility, priority = end.get(cid, (0.0, 0.0, 0.0))
        if cid in reset:
            balance = 0.0
        total = gm.get(cid, 0.0)
        seconds, mode = throttled.get(cid, (0, ""))
        rows[cid] = {
            "customer": names.get(cid, str(cid)),
            "name": shown.get(cid),
            "gm_sum": total,
            "gm_mean": total / rng.accounted if rng.accounted else 0.0,
            "balance": balance,
            "utility": utility,
            "priority": priority,
            "contribution": contribution.get(cid, 0.0),
            "throttled_s": seconds,
            "throttle_mode": mode,
            "quota_changes": quota.get(cid, 0),
            "late_samples": late.get(cid, 0),
        }

    step("per-resource terms")
    wanted: set[int] | None = None if customer_id is None else {customer_id}
    by_resource = sort is not None and sort.startswith("gm_") and sort not in ("gm_sum", "gm_mean")
    if top is not None and not by_resource and len(rows) > top:
        order = list(rows.values())
        _sort(order, (*_CUSTOMER_HEAD, *_CUSTOMER_TAIL), sort or "gm_sum")
        kept = {id(r) for r in order[:top]}
        wanted = {cid for cid, r in rows.items() if id(r) in kept}
        rows = {cid: r for cid, r in rows.items() if cid in wanted}
    terms: dict[int, dict[str, float]] = defaultdict(dict)
    resources: set[str] = set()
    if rng.end_id is not None and rng.accounted:
        # The resources of the last interval, so that the columns do not depend on --top.
        resources |= set(
            conn.execute(
                select(_terms.c.resource).distinct().where(_terms.c.interval_id == rng.end_id)
            ).scalars()
        )
    kept_t = [] if wanted is None else [_terms.c.customer_id.in_(sorted(wanted))]
    rr = _resource_rollups.c
    kept_r = [] if wanted is None else [rr.customer_id.in_(sorted(wanted))]
    both_terms = union_all(
        select(
            _terms.c.customer_id.label("cid"), _terms.c.resource, _terms.c.term.label("term")
        ).where(rng.cover.raw_where(_terms.c.interval_id), *kept_t),
        select(rr.customer_id, rr.resource, rr.term_sum).where(
            rng.cover.rolled_where(_resource_rollups), *kept_r
        ),
    ).subquery()
    query = select(both_terms.c.cid, both_terms.c.resource, func.sum(both_terms.c.term)).group_by(
        both_terms.c.cid, both_terms.c.resource
    )
    if wanted != set():
        for cid, resource, total in conn.execute(query):
            terms[int(cid)][str(resource)] = _float(total)
            resources.add(str(resource))
    ordered = sorted(resources, key=_resource_key)
    for cid, row in rows.items():
        row.update({f"gm_{r}": terms.get(cid, {}).get(r, 0.0) for r in ordered})
    columns = (
        *_CUSTOMER_HEAD,
        *(Column(f"gm_{r}", f"GM {r}", 4) for r in ordered),
        *_CUSTOMER_TAIL,
    )
    notes = [
        _range_note(rng, columns),
        _end_note(rng, "balance, utility, priority and contribution (organizations only)"),
        THROTTLE_NOTE,
        "quota_changes: quota lowerings and restorations applied or decided in dry-run"
        " (failed ones excluded), by the interval they were written for (by the time they"
        " were recorded if none)",
        "gm_<resource>: that resource's terms of the GM sum (they add up to it)",
    ]
    shown_reset = sorted(names.get(c, str(c)) for c in reset & set(rows))
    if shown_reset:
        notes.append(f"balance reset after that interval (shown as 0): {', '.join(shown_reset)}")
    return columns, list(rows.values()), notes


def _late_by(
    conn: Connection, rng: _Range, key: ColumnElement[int], customer_id: int | None
) -> dict[int, int]:
    """Late sample rows of the range's intervals, counted per ``key``."""
    query = (
        select(key, func.count())
        .where(*rng.ids(_samples.c.interval_id), _samples.c.late.is_(True))
        .group_by(key)
    )
    if customer_id is not None:
        query = query.where(_samples.c.customer_id == customer_id)
    return {int(k): int(n) for k, n in conn.execute(query)}


# -- by organization ------------------------------------------------------------------------

ORGANIZATION_COLUMNS = (
    Column("organization", "Organization", None, "left"),
    Column("customer", "Is customer", None, "left"),
    Column("contribution", "Contribution (end)", 4),
    Column("utility", "Utility (end)", 4),
    Column("priority", "Priority (end)", 4),
    Column("hosts", "Hosts", None),
    Column("customers", "Customers served", None),
    Column("cpu_supplied_core_s", "CPU supplied core-s", 1),
    Column("cpu_used_core_s", "CPU used core-s", 1),
    Column("late_samples", "Late samples", None),
)


def _by_organization(
    conn: Connection, rng: _Range, step: _Steps
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    step("standings at the end")
    end: dict[int, tuple[float, float, float]] = {}
    if rng.end_id is not None:
        end = {
            int(r.organization_id): (float(r.contribution), float(r.utility), float(r.priority))
            for r in conn.execute(
                select(
                    _org_ledger.c.organization_id,
                    _org_ledger.c.contribution,
                    _org_ledger.c.utility,
                    _org_ledger.c.priority,
                ).where(_org_ledger.c.interval_id == rng.end_id)
            )
        }
    step("hosts and supply")
    hc, hr = _host_intervals.c, _host_rollups.c
    accounted = exists().where(
        _batches.c.interval_id == hc.interval_id,
        _batches.c.host_id == hc.host_id,
        _batches.c.late.is_(False),
        _batches.c.state == BatchState.accepted,
    )
    raw_hosts = (
        select(
            hc.organization_id.label("oid"),
            hc.host_id.label("host"),
            (hc.cpu_cores * _intervals.c.length_s).label("supplied"),
            literal(0.0).label("used"),
        )
        .join(_intervals, _intervals.c.id == hc.interval_id)
        .where(rng.cover.raw_where(hc.interval_id), accounted)
    )
    s_ = _samples.c
    raw_use = (
        select(
            hc.organization_id.label("oid"),
            hc.host_id.label("host"),
            literal(0.0).label("supplied"),
            s_.cpu_s.label("used"),
        )
        .join(
            _host_intervals,
            and_(hc.interval_id == s_.interval_id, hc.host_id == s_.host_id),
        )
        .where(rng.cover.raw_where(s_.interval_id), s_.late.is_(False))
    )
    rolled = select(hr.organization_id, hr.host_id, hr.cpu_supplied_core_s, hr.cpu_s).where(
        rng.cover.rolled_where(_host_rollups)
    )
    both = union_all(raw_hosts, raw_use, rolled).subquery()
    supply = {
        int(r.oid): (int(r.hosts), _float(r.supplied), _float(r.used))
        for r in conn.execute(
            select(
                both.c.oid,
                func.count(distinct(both.c.host)).label("hosts"),
                func.sum(both.c.supplied).label("supplied"),
                func.sum(both.c.used).label("used"),
            ).group_by(both.c.oid)
        )
    }
    step("customers served and late samples")
    served: dict[int, int] = defaultdict(int)
    for a, b in rng.cover.raw:
        for oid, n in served_peaks(conn, a, b):
            served[oid] = max(served[oid], n)
    orc = _org_rollups.c
    for oid, n in conn.execute(
        select(orc.organization_id, func.max(orc.customers_max))
        .where(rng.cover.rolled_where(_org_rollups))
        .group_by(orc.organization_id)
    ):
        served[int(oid)] = max(served[int(oid)], int(n))
    late = {
        int(oid): int(n)
        for oid, n in conn.execute(
            select(hc.organization_id, func.count())
            .select_from(
                _samples.join(
                    _host_intervals,
                    and_(hc.interval_id == s_.interval_id, hc.host_id == s_.host_id),
                )
            )
            .where(*rng.ids(s_.interval_id), s_.late.is_(True))
            .group_by(hc.organization_id)
        )
    }
    orgs = {
        int(r.id): (str(r.name), r.customer_id)
        for r in conn.execute(
            select(_organizations.c.id, _organizations.c.name, _organizations.c.customer_id)
        )
    }
    names = _customer_names(conn)
    rows = []
    for oid in set(end) | set(supply) | set(served) | set(late):
        contribution, utility, priority = end.get(oid, (0.0, 0.0, 0.0))
        hosts, supplied, used = supply.get(oid, (0, 0.0, 0.0))
        customers = served.get(oid, 0)
        name, cid = orgs.get(oid, (str(oid), None))
        rows.append(
            {
                "organization": name,
                "customer": "" if cid is None else names.get(int(cid), str(cid)),
                "contribution": contribution,
                "utility": utility,
                "priority": priority,
                "hosts": hosts,
                "customers": customers,
                "cpu_supplied_core_s": supplied,
                "cpu_used_core_s": used,
                "late_samples": late.get(oid, 0),
            }
        )
    notes = [
        _end_note(rng, "contribution, utility and priority"),
        "hosts, supply and use: the hosts accounted in the range's intervals (an on-time"
        " batch) and their on-time samples, by the organization that owned the host then;"
        " cpu_supplied_core_s = cores × interval length; customers: the most its hosts served"
        " in one interval",
    ]
    return ORGANIZATION_COLUMNS, rows, notes


# -- by host --------------------------------------------------------------------------------

HOST_COLUMNS = (
    Column("host", "Host", None, "left"),
    Column("organization", "Organization", None, "left"),
    Column("vms", "VMs", None),
    Column("customers", "Customers", None),
    Column("samples", "Samples", None),
    Column("cpu_core_s", "CPU core-s", 1),
    Column("memory_byte_s", "Memory", 0, unit=Unit.byte_seconds),
    Column("disk_bytes", "Disk read+written", 0, unit=Unit.bytes),
    Column("network_bytes", "Network in+out", 0, unit=Unit.bytes),
    Column("late_samples", "Late samples", None),
)


def _by_host(
    conn: Connection, rng: _Range, step: _Steps, customer_id: int | None
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    step("samples per host")
    s_ = _samples.c
    # A customer's share of a host is not rolled up: its report reads the samples.
    cover = rng.cover if customer_id is None else Coverage(rng.lo, rng.hi, (), ((rng.lo, rng.hi),))
    mine = [] if customer_id is None else [s_.customer_id == customer_id]
    raw = select(
        s_.host_id.label("host"),
        literal(1, BigInteger).label("samples"),
        s_.cpu_s.label("cpu"),
        s_.memory_byte_s.label("memory"),
        (s_.disk_read_bytes + s_.disk_write_bytes).label("disk"),
        (s_.network_rx_bytes + s_.network_tx_bytes).label("network"),
    ).where(cover.raw_where(s_.interval_id), s_.late.is_(False), *mine)
    hr = _host_rollups.c
    rolled = select(
        hr.host_id, hr.samples, hr.cpu_s, hr.memory_byte_s, hr.disk_bytes, hr.network_bytes
    ).where(cover.rolled_where(_host_rollups))
    both = union_all(raw, rolled).subquery()
    found = {
        int(r.host): r
        for r in conn.execute(
            select(
                both.c.host,
                func.sum(both.c.samples).label("samples"),
                func.sum(both.c.cpu).label("cpu"),
                func.sum(both.c.memory).label("memory"),
                func.sum(both.c.disk).label("disk"),
                func.sum(both.c.network).label("network"),
            ).group_by(both.c.host)
        )
    }
    step("peaks and late samples")
    per_interval = (
        select(
            s_.host_id.label("host"),
            func.count(distinct(s_.vm_id)).label("vms"),
            func.count(distinct(s_.customer_id)).label("customers"),
        )
        .where(cover.raw_where(s_.interval_id), s_.late.is_(False), *mine)
        .group_by(s_.interval_id, s_.host_id)
    )
    peaks_of = union_all(
        per_interval,
        select(hr.host_id, hr.vms_max, hr.customers_max).where(cover.rolled_where(_host_rollups)),
    ).subquery()
    peaks = {
        int(h): (int(v), int(c))
        for h, v, c in conn.execute(
            select(
                peaks_of.c.host, func.max(peaks_of.c.vms), func.max(peaks_of.c.customers)
            ).group_by(peaks_of.c.host)
        )
    }
    late = _late_by(conn, rng, s_.host_id, customer_id)
    step("names")
    hosts = {
        int(r.id): (str(r.name), str(r.org))
        for r in conn.execute(
            select(_hosts.c.id, _hosts.c.name, _organizations.c.name.label("org")).join(
                _organizations, _organizations.c.id == _hosts.c.organization_id
            )
        )
    }
    rows = []
    for hid in set(found) | set(late):
        r = found.get(hid)
        name, org = hosts.get(hid, (str(hid), ""))
        vms, customers = peaks.get(hid, (0, 0))
        rows.append(
            {
                "host": name,
                "organization": org,
                "vms": vms,
                "customers": customers,
                "samples": 0 if r is None else _int(r.samples),
                "cpu_core_s": 0.0 if r is None else _float(r.cpu),
                "memory_byte_s": 0.0 if r is None else _float(r.memory),
                "disk_bytes": 0.0 if r is None else _float(r.disk),
                "network_bytes": 0.0 if r is None else _float(r.network),
                "late_samples": late.get(hid, 0),
            }
        )
    notes = [
        "on-time samples of the intervals starting in the range (late ones counted apart);"
        " disk = read + written, network = received + sent; vms and customers: the most in"
        " one interval; organization: the owner now"
    ]
    return HOST_COLUMNS, rows, notes


# -- by resource ----------------------------------------------------------------------------

RESOURCE_COLUMNS = (
    Column("resource", "Resource", None, "left"),
    Column("gm_sum", "Σ terms", 4),
    Column("over", "Σ positive (over endowment)", 4),
    Column("under", "Σ negative (ceded, credited)", 4),
    Column("customers_over", "Customers over", None),
)


def _by_resource(
    conn: Connection, rng: _Range, step: _Steps, customer_id: int | None
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    step("terms per resource")
    t = _terms.c
    # Per customer first, then per resource: "customers over" needs each customer's terms,
    # and COUNT(DISTINCT …) over every term row would sort them all on PostgreSQL.
    rr = _resource_rollups.c
    terms = union_all(
        select(
            t.customer_id.label("cid"),
            t.resource,
            t.term.label("total"),
            case((t.term > 0, t.term), else_=0.0).label("over"),
            case((t.term < 0, t.term), else_=0.0).label("under"),
            t.term.label("top"),
        ).where(rng.cover.raw_where(t.interval_id), *_only(t.customer_id, customer_id)),
        select(
            rr.customer_id, rr.resource, rr.term_sum, rr.term_over, rr.term_under, rr.term_max
        ).where(rng.cover.rolled_where(_resource_rollups), *_only(rr.customer_id, customer_id)),
    ).subquery()
    inner = (
        select(
            terms.c.resource,
            func.sum(terms.c.total).label("total"),
            func.sum(terms.c.over).label("over"),
            func.sum(terms.c.under).label("under"),
            func.max(terms.c.top).label("top"),
        )
        .group_by(terms.c.resource, terms.c.cid)
        .subquery()
    )
    query = select(
        inner.c.resource,
        func.sum(inner.c.total).label("total"),
        func.sum(inner.c.over).label("over"),
        func.sum(inner.c.under).label("under"),
        func.sum(case((inner.c.top > 0, 1), else_=0)).label("customers"),
    ).group_by(inner.c.resource)
    rows = [
        {
            "resource": str(r.resource),
            "gm_sum": _float(r.total),
            "over": _float(r.over),
            "under": _float(r.under),
            "customers_over": _int(r.customers),
        }
        for r in conn.execute(query)
    ]
    rows.sort(key=lambda r: _resource_key(str(r["resource"])))
    notes = [
        _range_note(rng, RESOURCE_COLUMNS),
        "terms are per customer and interval: positive where it took more than its endowment,"
        " negative where it ceded what others used (credited γ·κ); they add up to the GM sums;"
        " customers_over: customers with a positive term in some interval",
    ]
    return RESOURCE_COLUMNS, rows, notes


# -- by day or week -------------------------------------------------------------------------


def _period_columns(unit: str, one_customer: bool) -> tuple[Column, ...]:
    head = Column(unit, "Day (UTC)" if unit == "day" else "Week of (Monday, UTC)", None, "left")
    if one_customer:
        return (
            head,
            Column("customer", "Customer", None, "left"),
            PROJECT,
            Column("intervals", "Intervals", None),
            Column("gm_sum", "GM sum", 4),
            Column("gm_mean", "GM mean", 6),
            Column("balance", "Balance (end)", 4),
            Column("throttled_s", "Throttled s", None),
            Column("throttle_mode", "Mode", None, "left"),
            Column("late_samples", "Late samples", None),
        )
    return (
        head,
        Column("intervals", "Intervals", None),
        Column("empty_intervals", "Without samples", None),
        Column("active_customers", "Active customers", None),
        Column("gm_positive", "Σ positive GM", 4),
        Column("greediest", "Greediest", None, "left"),
        Column("greediest_gm", "Its GM sum", 4),
        Column("throttled_customers", "Throttled customers", None),
        Column("actions", "Actions", None),
        Column("late_samples", "Late samples", None),
    )


def _by_period(
    conn: Connection, rng: _Range, step: _Steps, unit: str, customer_id: int | None
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    shift, size = _PERIODS[unit]

    def period(start: Any) -> Any:
        return (start + shift) // size

    def start_of(index: int) -> int:
        return index * size - shift

    # Every period holding an interval of the range; its accounted intervals [first, stop).
    bounds: dict[int, tuple[int, int]] = {}
    for start, *_ in rng.intervals:
        p = (start + shift) // size
        if p not in bounds:
            lo, hi = max(start_of(p), rng.lo), min(start_of(p + 1), rng.hi)
            bounds[p] = (rng.index(lo), rng.index(hi))
    step("late samples")
    late_period = period(_samples.c.interval_id)
    late_query = (
        select(late_period, func.count())
        .where(*rng.ids(_samples.c.interval_id), _samples.c.late.is_(True))
        .group_by(late_period)
    )
    if customer_id is not None:
        late_query = late_query.where(_samples.c.customer_id == customer_id)
    late = {int(p): int(n) for p, n in conn.execute(late_query)}
    step("throttling")
    spans = _throttle_spans(conn, rng, customer_id)
    label = {p: _dt(start_of(p)).strftime("%Y-%m-%d") for p in bounds}
    notes = [_range_note(rng, _period_columns(unit, customer_id is not None))]
    if customer_id is not None:
        notes.append(THROTTLE_NOTE)

    if customer_id is not None:
        step("the customer's rows")
        mine = {
            int(s): (float(g), float(b))
            for s, g, b in conn.execute(
                select(_ledger.c.interval_id, _ledger.c.greediness, _ledger.c.balance).where(
                    *rng.ids(_ledger.c.interval_id), _ledger.c.customer_id == customer_id
                )
            )
        }
        before = _last_with_rows(conn, rng.lo)
        end_start = None if before is None else before[1]
        end_balance = 0.0
        if before is not None:
            end_balance = _float(
                conn.execute(
                    select(_ledger.c.balance).where(
                        _ledger.c.interval_id == before[0], _ledger.c.customer_id == customer_id
                    )
                ).scalar()
            )
        resets = [
            e for c, e in reset_window.resets(conn, end_start, rng.hi - 1) if c == customer_id
        ]
        name = _customer_names(conn).get(customer_id, str(customer_id))
        project = lookup.display_names(conn).get(customer_id)
        rows: list[dict[str, object]] = []
        for p in sorted(bounds):
            first, stop = bounds[p]
            for k in range(first, stop):
                if rng.rows[k] > 0:
                    end_start = rng.starts[k]
                    end_balance = mine.get(end_start, (0.0, 0.0))[1]
            period_end = min(start_of(p + 1), rng.hi)
            reset = end_start is not None and any(
                reset_window.counts(e, end_start, period_end - 1) for e in resets
            )
            total = sum(mine.get(rng.starts[k], (0.0, 0.0))[0] for k in range(first, stop))
            seconds, mode = _throttled(spans.get(customer_id, []), rng, first, stop)
            rows.append(
                {
                    unit: label[p],
                    "customer": name,
                    "name": project,
                    "intervals": stop - first,
                    "gm_sum": total,
                    "gm_mean": total / (stop - first) if stop > first else 0.0,
                    "balance": 0.0 if reset else end_balance,
                    "throttled_s": seconds,
                    "throttle_mode": mode,
                    "late_samples": late.get(p, 0),
                }
            )
        notes.append(
            "balance: after the last interval with ledger rows up to the period's end (0 if the"
            " customer had no row there or a reset took effect after it)"
        )
        return _period_columns(unit, True), rows, notes

    step("greediness per customer and period")
    gm: dict[int, dict[int, float]] = defaultdict(dict)
    positive: dict[int, float] = defaultdict(float)
    active: dict[int, int] = defaultdict(int)
    g = _ledger.c.greediness
    cr = _customer_rollups.c
    both = union_all(
        select(
            period(_ledger.c.interval_id).label("p"),
            _ledger.c.customer_id.label("cid"),
            g.label("gm"),
            case((g > 0, g), else_=0.0).label("pos"),
            _ledger.c.vms.label("vms"),
        ).where(rng.cover.raw_where(_ledger.c.interval_id)),
        select(period(cr.start_s), cr.customer_id, cr.gm_sum, cr.gm_positive, cr.vms_max).where(
            rng.cover.rolled_where(_customer_rollups)
        ),
    ).subquery()
    for r in conn.execute(
        select(
            both.c.p,
            both.c.cid.label("customer_id"),
            func.sum(both.c.gm).label("gm"),
            func.sum(both.c.pos).label("pos"),
            func.max(both.c.vms).label("vms"),
        ).group_by(both.c.p, both.c.cid)
    ):
        p = int(r.p)
        gm[p][int(r.customer_id)] = _float(r.gm)
        positive[p] += _float(r.pos)
        active[p] += 1 if _int(r.vms) > 0 else 0
    step("actions")
    actions: dict[int, int] = defaultdict(int)
    action_period = period(_actions.c.interval_id)  # one expression: PostgreSQL compares them
    for p, n in conn.execute(
        select(action_period, func.count())
        .where(*rng.ids(_actions.c.interval_id))
        .group_by(action_period)
    ):
        actions[int(p)] += int(n)
    for (at,) in conn.execute(
        select(_actions.c.at).where(
            _actions.c.interval_id.is_(None),
            _actions.c.at >= _dt(rng.lo),
            _actions.c.at < _dt(rng.hi),
        )
    ):
        actions[(math.floor(at.timestamp()) + shift) // size] += 1
    names = _customer_names(conn)
    rows = []
    for p in sorted(set(bounds) | set(actions)):
        first, stop = bounds.get(p, (0, 0))
        sums = gm.get(p, {})
        greediest = min(sums, key=lambda c: (-sums[c], names.get(c, "")), default=None)
        throttled = sum(1 for s in spans.values() if _throttled(s, rng, first, stop)[0] > 0)
        rows.append(
            {
                unit: label.get(p) or _dt(start_of(p)).strftime("%Y-%m-%d"),
                "intervals": stop - first,
                "empty_intervals": sum(1 for k in range(first, stop) if rng.rows[k] == 0),
                "active_customers": active.get(p, 0),
                "gm_positive": positive.get(p, 0.0),
                "greediest": "" if greediest is None else names.get(greediest, str(greediest)),
                "greediest_gm": 0.0 if greediest is None else sums[greediest],
                "throttled_customers": throttled,
                "actions": actions.get(p, 0),
                "late_samples": late.get(p, 0),
            }
        )
    notes.append(
        "gm_positive: the sum of customers' positive interval greediness; throttled_customers:"
        " customers that began an interval at level ≥ 1 (dry-run decisions count); actions:"
        " actions tied to an interval by its start, others by the time they were recorded"
    )
    return _period_columns(unit, False), rows, notes


# -- the entry point ------------------------------------------------------------------------

# Queries after the range's intervals, per grouping (day and week: one fewer for a customer).
_STEPS = {"customer": 7, "organization": 3, "host": 2, "resource": 1, "day": 4, "week": 4}
_DEFAULT_SORT = {
    "customer": "gm_sum",
    "organization": "contribution",
    "host": "cpu_core_s",
    "resource": None,
    "day": None,
    "week": None,
}


def report(
    conn: Connection,
    group_by: str,
    from_s: float,
    to_s: float,
    *,
    customer: str | None = None,
    sort: str | None = None,
    top: int | None = None,
    progress: Progress | None = None,
) -> Report:
    """The report of the intervals starting in ``[from_s, to_s)``, grouped by ``group_by``.

    Rows are sorted by ``sort`` (numbers greatest first, names A→Z) or by default: customers
    by GM sum, organizations by contribution, hosts by CPU core-seconds, resources in the
    configuration's order, days and weeks chronologically; ``top`` keeps the first rows.
    ValueError for an unknown grouping or sort column, or a ``customer`` with a grouping it
    does not apply to; UnknownCustomer for a customer the ledger has never seen.

    Intervals start on whole seconds, so the range is taken as ``[⌈from_s⌉, ⌈to_s⌉)`` and the
    report (its ``from_s``/``to_s``, document and notes) shows that one range: a title, a
    heading and a note cannot show two different "now"s for one ``--to now``.
    """
    if group_by not in GROUPS:
        raise OptionError(f"cannot group by {group_by!r}; choose one of {', '.join(GROUPS)}")
    if to_s <= from_s:
        raise OptionError(f"--from {iso(from_s)} is not before --to {iso(to_s)}")
    if customer is not None and group_by == "organization":
        raise OptionError("--customer applies to customer, host, resource, day and week reports")
    if top is not None and top < 1:
        raise OptionError("--top must be at least 1")
    periodic = group_by in ("day", "week")
    steps = _Steps(1 + _STEPS[group_by] - (periodic and customer is not None), progress)
    steps("intervals of the range")
    customer_id = None if customer is None else lookup.customer_id(conn, customer)
    from_s, to_s = math.ceil(from_s), math.ceil(to_s)
    rng = _load_range(conn, from_s, to_s)
    if group_by == "customer":
        columns, rows, notes = _by_customer(conn, rng, steps, customer_id, sort, top)
    elif group_by == "organization":
        columns, rows, notes = _by_organization(conn, rng, steps)
    elif group_by == "host":
        columns, rows, notes = _by_host(conn, rng, steps, customer_id)
    elif group_by == "resource":
        columns, rows, notes = _by_resource(conn, rng, steps, customer_id)
    else:
        columns, rows, notes = _by_period(conn, rng, steps, group_by, customer_id)
    steps.finish()
    if not rng.accounted:
        notes.insert(0, f"no accounted interval starts in [{iso(from_s)}, {iso(to_s)})")
    key = sort if sort is not None else _DEFAULT_SORT[group_by]
    if key is not None:
        _sort(rows, columns, key)
    if top is not None:
        del rows[top:]
    if any(_int(r.get("late_samples")) > 0 for r in rows):
        notes.append(LATE_NOTE)
    return Report(group_by, from_s, to_s, columns, rows, notes, group_by, rng.accounted)


def _sort(rows: list[dict[str, object]], columns: Iterable[Column], key: str) -> None:
    keys = [c.key for c in columns]
    if key not in keys:
        raise OptionError(f"cannot sort by {key!r}; choose one of {', '.join(keys)}")
    name = keys[0]
    numeric = [r for r in rows if isinstance(r.get(key), int | float)]
    if len(numeric) == len(rows):
        rows.sort(key=lambda r: (-_float(r[key]), str(r[name])))
    else:
        rows.sort(key=lambda r: (str(r.get(key, "")), str(r[name])))
