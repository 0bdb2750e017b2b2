"""What every grouping of the usage reports shares: the range of intervals a report reads
(:class:`Range`, :func:`load_range`), the spans a customer spent throttled in it, the steps
counted for a progress bar, the notes, the sort, and small SQL helpers; one module that the
grouping modules import, so that they never import each other nor the package's dispatcher.

The definitions of every number (the range, accounted intervals, the standing at the end,
throttled seconds, late samples) are in the package's docstring, :mod:`gmd.daemon.reports.usage`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, func, select, union_all

from gmd import OptionError
from gmd.columns import Column
from gmd.common.timespec import iso
from gmd.daemon.reports.coverage import Coverage, coverage
from gmd.daemon.reports.enforced import Throttling, level_runs, throttling
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.tables import (
    customers as _customers,
    intervals as _intervals,
    samples as _samples,
)

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
THROTTLE_NOTE = (
    "throttled_s: length of the accounted intervals that began at level ≥ 1 (levels change at"
    " interval ends); dry-run decisions count; throttle_mode: what the hosts reported applied"
    " in them (applied, dry-run, not applied)"
)

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called before each step of a report (for a progress bar)."""


class Steps:
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
class Range:
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


def load_range(conn: Connection, lo: int, hi: int) -> Range:
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
    end = last_with_rows(conn, hi)
    return Range(
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


def last_with_rows(conn: Connection, before_s: float) -> tuple[int, int] | None:
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
class Span:
    """Accounted intervals ``[first, stop)`` (indices into Range.starts) at level ≥ 1, and
    what was applied in each (:class:`~gmd.daemon.reports.enforced.Enforced`, from the
    hosts' reports)."""

    first: int
    stop: int
    modes: tuple[str, ...]


def throttle_spans(conn: Connection, rng: Range, customer_id: int | None) -> dict[int, list[Span]]:
    """Customer id → the spans of accounted intervals it spent at level ≥ 1, from the level
    actions (one decided at the end of interval J is in force from J's end until the next),
    with what its hosts applied in each interval (:mod:`gmd.daemon.reports.enforced`)."""
    ids = None if customer_id is None else [customer_id]
    runs, changes = level_runs(conn, ids, before_s=rng.hi)
    applied = throttling(conn, runs)
    spans: dict[int, list[Span]] = {}
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
                out.append(Span(first, stop, modes))
        if out:
            spans[cid] = out
    return spans


def throttled_in(spans: Sequence[Span], rng: Range, first: int, stop: int) -> tuple[int, str]:
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


def customer_names(conn: Connection) -> dict[int, str]:
    return {int(i): n for i, n in conn.execute(select(_customers.c.id, _customers.c.name))}


def resource_key(resource: str) -> tuple[int, str]:
    order = RESOURCE_ORDER.index(resource) if resource in RESOURCE_ORDER else len(RESOURCE_ORDER)
    return order, resource


def utc_datetime(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def only_customer(column: Any, customer_id: int | None) -> list[ColumnElement[bool]]:
    """The condition keeping one customer's rows, if the report is about one."""
    return [] if customer_id is None else [column == customer_id]


def sql_float(value: Any) -> float:
    """A SQL aggregate as a float: NULL (no rows) is 0."""
    return 0.0 if value is None else float(value)


def sql_int(value: Any) -> int:
    """A SQL count or sum as an int: NULL (no rows) is 0."""
    return 0 if value is None else int(value)


def range_note(rng: Range, columns: Iterable[Column]) -> str:
    """The range's intervals, and what gm_mean divides by when ``columns`` (the table the
    note is under) have gm_mean: a note names no column its table lacks."""
    text = (
        f"{rng.accounted} accounted interval(s) start in [{iso(rng.lo)}, {iso(rng.hi)}),"
        f" {rng.empty} of them without samples"
    )
    mean = any(c.key == "gm_mean" for c in columns)
    return text + (f"; gm_mean divides by {rng.accounted}" if mean else "")


def end_note(rng: Range, what: str) -> str:
    if rng.end_start is None:
        return f"{what}: no interval with ledger rows before the end of the range (all 0)"
    return f"{what}: after the interval starting {iso(rng.end_start)}, as stored"


def late_by(
    conn: Connection, rng: Range, key: ColumnElement[int], customer_id: int | None
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


def sort_rows(rows: list[dict[str, object]], columns: Iterable[Column], key: str) -> None:
    keys = [c.key for c in columns]
    if key not in keys:
        raise OptionError(f"cannot sort by {key!r}; choose one of {', '.join(keys)}")
    name = keys[0]
    numeric = [r for r in rows if isinstance(r.get(key), int | float)]
    if len(numeric) == len(rows):
        rows.sort(key=lambda r: (-sql_float(r[key]), str(r[name])))
    else:
        rows.sort(key=lambda r: (str(r.get(key, "")), str(r[name])))


def raw_and_rolled(
    conn: Connection,
    parts: Sequence[Select[Any]],
    by: Sequence[str],
    **aggregates: Callable[[Any], Any],
) -> list[Any]:
    """The rows of ``parts`` (selects of the same columns, by the first one's labels: what the
    raw ledger holds for the range's raw spans and what its rollups hold for the rolled ones)
    grouped by the columns ``by``, each column of ``aggregates`` aggregated by its function
    (``gm=func.sum``): the shape of every grouping's totals over a range, written once."""
    both = union_all(*parts).subquery()
    keys = [both.c[k] for k in by]
    figures = [aggregate(both.c[name]).label(name) for name, aggregate in aggregates.items()]
    return list(conn.execute(select(*keys, *figures).group_by(*keys)))
