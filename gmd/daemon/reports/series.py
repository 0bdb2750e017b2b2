"""Customers' standings over time, read from the ledger as arrays: balances, levels, terms.

``gmd-admin plot`` draws these; ``report`` and ``explain`` can read the same series, so that a
number on a picture, in a report and in an explanation come from one query each.

**The time axis** is a :class:`Timeline`: the accounted intervals that *have ledger rows*,
oldest first. An interval belongs to a range ``[from_s, to_s)`` when it starts in it (as
``gmd-admin actions`` selects by ``[from, to)``). A customer's standing after an interval
belongs to the interval's *end*, which is also when the throttle level decided from it takes
effect; plots put both there. Intervals in which no host reported anything are accounted
without rows (see :mod:`gmd.daemon.ledger.accounting`): the balances carrying over them only decay,
and they are not on the timeline.

**Missing rows are zeros.** The ledger is dense for customers with a standing: in an interval
with rows, a customer without a row has a negligible balance, utility and priority, and no VM
(so no per-resource terms either). The series hold 0 there; ``present`` says where a row was.

**Levels** are step functions rebuilt from the ``level`` rows of ``enforcement_actions`` (one
per change, with the level before and after as JSON), each taking effect at the end of the
interval it was decided after. Dry-run levels are levels too: they are what gmd decided, only
not applied, and every change says which it was.

Everything is filtered by customer and time range in SQL, with one query per series, so that a
few customers over 10,000 intervals of a 2,000-customer ledger read only their own rows
(``customer_ledger`` is indexed by customer). The queries are plain SQLAlchemy Core and run on
SQLite and PostgreSQL alike. Nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from sqlalchemy import Connection, Select, select

from gmd import GmdError
from gmd.common.timespec import iso
from gmd.common.units import DAY_S, HOUR_S
from gmd.daemon.ledger.lookup import customer_ids, display_names
from gmd.daemon.reports.actions import level_changes
from gmd.daemon.reports.coverage import Coverage, coverage
from gmd.daemon.reports.enforced import Enforced, Throttling, level_runs, throttling
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.tables import (
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    customers as _customers,
    intervals as _intervals,
    levels as _levels,
    resource_ledger as _resource_ledger,
    resource_rollups as _resource_rollups,
    rollup_periods as _periods,
)
from gmd.wire import RESOURCES_COMBINED, RESOURCES_SPLIT

# Resources in the order the configuration lists them; any other name follows, A→Z.
RESOURCE_ORDER: tuple[str, ...] = tuple(dict.fromkeys(RESOURCES_COMBINED + RESOURCES_SPLIT))


class EmptyRange(GmdError, LookupError):
    """No accounted interval with ledger rows starts in the range asked for."""


@dataclass(frozen=True)
class Timeline:
    """Accounted intervals with ledger rows, oldest first (parallel int64 arrays); or, over a
    range with more than ``MAX_POINTS`` of them, the rolled-up hours or days that stand for
    them (``period_s`` > 0, ``interval_id`` their start) and the intervals of the stretches
    not rolled up (``period_s`` 0)."""

    interval_id: np.ndarray
    start_s: np.ndarray
    length_s: np.ndarray
    from_s: float | None = None
    """the range asked for (None: unbounded), to say what an empty timeline covered"""
    to_s: float | None = None
    period_s: np.ndarray | None = None
    """per point: 0 for an interval, else the rollup period it stands for (None: all 0)"""
    cover: Coverage | None = None
    """which stretches the rolled-up points stand for (None: every point is an interval)"""

    @property
    def resolution_s(self) -> int:
        """The longest period a point stands for: 0 when every point is an interval."""
        if self.period_s is None or not self.period_s.size:
            return 0
        return int(self.period_s.max())

    def rolled(self) -> np.ndarray:
        return np.zeros(len(self), dtype=bool) if self.period_s is None else self.period_s > 0

    @property
    def end_s(self) -> np.ndarray:
        """When each interval's standing holds (and its level decision takes effect)."""
        return self.start_s + self.length_s

    def __len__(self) -> int:
        return int(self.interval_id.size)

    def index_of(self, interval_ids: np.ndarray) -> np.ndarray:
        """Column of each interval id on this timeline, -1 for ids not on it."""
        ids = np.asarray(interval_ids, dtype=np.int64)
        if not len(self):
            return np.full(ids.shape, -1, dtype=np.intp)
        order = np.argsort(self.interval_id, kind="stable")
        sorted_ids = self.interval_id[order]
        pos = np.clip(np.searchsorted(sorted_ids, ids), 0, sorted_ids.size - 1)
        return np.where(sorted_ids[pos] == ids, order[pos], -1).astype(np.intp)

    def describe(self) -> str:
        """The range in words, for messages and titles."""
        start = "the beginning" if self.from_s is None else iso(self.from_s)
        end = "now" if self.to_s is None else iso(self.to_s)
        return f"{start} to {end}"


@dataclass(frozen=True)
class BalanceSeries:
    """Standings per customer (rows, in ``customers`` order) and interval (columns)."""

    customers: tuple[str, ...]
    timeline: Timeline
    balance: np.ndarray
    """decayed sum of greediness after each interval (what the thresholds compare)"""
    greediness: np.ndarray
    """the interval's own GM (what the per-resource terms sum to)"""
    priority: np.ndarray
    """DirectContr priority, contribution − utility (enters the score with priority_weight)"""
    present: np.ndarray
    """bool: the customer had a ledger row there (elsewhere the values are zeros)"""

    def row(self, customer: str) -> int:
        return self.customers.index(customer)

    def scores(self, priority_weight: float) -> np.ndarray:
        """What the throttle policy compares with ``enter``/``leave``: the balance, less
        ``priority_weight`` × priority (as :func:`gmd.fairness.policy.scores`)."""
        if priority_weight == 0:
            return self.balance.copy()
        return self.balance - priority_weight * self.priority

    def final(self) -> np.ndarray:
        """Each customer's balance after the last interval of the range."""
        if not len(self.timeline):
            return np.zeros(len(self.customers))
        return self.balance[:, -1].copy()


@dataclass(frozen=True)
class LevelSteps:
    """One customer's throttle level as a step function of time.

    ``initial`` holds from the start of the range until ``change_s[0]``; ``level[k]`` from
    ``change_s[k]`` on. ``dry_run[k]`` says whether change k was only decided (dry-run).
    ``applied``: what the hosts reported applied in the range's intervals at level ≥ 1
    (:class:`~gmd.daemon.reports.enforced.Enforced` values), whatever the decisions said.
    """

    customer: str
    initial: int
    change_s: np.ndarray
    level: np.ndarray
    dry_run: np.ndarray
    applied: frozenset[str] = frozenset()

    def at(self, t_s: object) -> np.ndarray:
        """The level in force at each time (a change counts from its own instant on)."""
        t = np.asarray(t_s, dtype=np.float64)
        values = np.concatenate([[self.initial], self.level]).astype(np.int64)
        return values[np.searchsorted(self.change_s, t, side="right")]

    def steps(self, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Corner points for a "steps-post" plot from ``start_s`` to ``end_s``: times and
        levels, the last level repeated at ``end_s`` so that it is drawn to the end."""
        inside = (self.change_s > start_s) & (self.change_s < end_s)
        t = np.concatenate([[start_s], self.change_s[inside], [end_s]])
        lv = np.concatenate([[self.at(start_s)], self.level[inside], [self.at(end_s)]])
        return t.astype(np.float64), lv.astype(np.int64)

    @property
    def any_dry_run(self) -> bool:
        return bool(self.dry_run.any())

    @property
    def mark(self) -> str:
        """What a legend adds to the customer's name: nothing when every throttled interval
        was applied, else what was (" (dry-run)", " (not applied)", " (applied+dry-run)")."""
        if not self.applied or self.applied == {Enforced.applied.value}:
            return ""
        return f" ({'+'.join(sorted(self.applied))})"

    @property
    def highest(self) -> int:
        return int(max(self.initial, *self.level.tolist()) if self.level.size else self.initial)


@dataclass(frozen=True)
class ResourceSeries:
    """Per-resource terms of each customer's interval greediness (they sum to it).

    ``terms[c, r, t]``: customer ``customers[c]``, resource ``resources[r]``, interval t of the
    timeline; 0 where the customer ran no VM (no rows are written then).
    """

    customers: tuple[str, ...]
    resources: tuple[str, ...]
    timeline: Timeline
    terms: np.ndarray

    def of(self, customer: str) -> np.ndarray:
        """``resources × intervals`` for one customer."""
        return self.terms[self.customers.index(customer)]


@dataclass(frozen=True)
class CustomerSeries:
    """Everything ``gmd-admin plot`` draws, for the customers it chose, in their order."""

    customers: tuple[str, ...]
    timeline: Timeline
    balances: BalanceSeries
    levels: tuple[LevelSteps, ...]
    resources: ResourceSeries
    top: int | None
    """the N of ``--top N`` when the customers were chosen by their final balance; None when
    the operator named them. Fewer than N are chosen when fewer have a standing at the end."""
    names: dict[str, str] = field(default_factory=dict)
    """customer → how the plot names it (:func:`plot_labels`), where the ledger knows its
    project name"""

    @property
    def chosen_by(self) -> str:
        """ "customer" when named by the operator, else "top N" (N as asked, not as found)."""
        return "customer" if self.top is None else f"top {self.top}"

    def label(self, customer: str) -> str:
        """How a customer is named on the plot and in ``gmd-admin plot``'s listing: its
        project name (with its uuid's start where the name is not unique), else its uuid."""
        return self.names.get(customer, customer)


UUID_SHOWN = 8
"""Characters of a uuid shown beside a project name that several customers share"""


def plot_labels(conn: Connection, ids: dict[str, int]) -> dict[str, str]:
    """customer → its label, for the customers ``ids`` (uuid → id) whose project name the
    ledger knows. Project names repeat across domains: a name that several customers of the
    ledger bear gets the start of each one's uuid, "web (4f2a9c1e)", as long as it takes to
    tell them apart, so that no two legend entries read alike and a label names the same
    customer in every plot, whichever others are drawn beside it."""
    shown = display_names(conn)
    names = {shown[cid] for cid in ids.values() if cid in shown}
    bearers: dict[str, list[str]] = {}
    for uuid, name in conn.execute(
        select(_customers.c.name, _customers.c.display_name).where(
            _customers.c.display_name.in_(names)
        )
    ):
        bearers.setdefault(str(name), []).append(str(uuid))
    labels: dict[str, str] = {}
    for uuid, cid in ids.items():
        name = shown.get(cid)
        if name is None:
            continue
        alike = bearers.get(name, [uuid])
        if len(alike) == 1:
            labels[uuid] = name
            continue
        n = UUID_SHOWN
        while len({u[:n] for u in alike}) < len(alike) and n < max(map(len, alike)):
            n += 1
        labels[uuid] = f"{name} ({uuid[:n]})"
    return labels


MAX_POINTS = 2000
"""Points per series beyond which a plot reads rollups: a month of minutes is 43,200
intervals, more than a picture can show and slow to read; its 720 hours are not."""


def downsampled(conn: Connection, line: Timeline, max_points: int = MAX_POINTS) -> Timeline:
    """``line`` with its rolled-up stretches as hours, or as days when even the hours are
    too many; the same line when it is short enough or nothing is rolled up."""
    if len(line) <= max_points:
        return line
    lo = int(line.start_s[0])
    hi = int(line.start_s[-1]) + 1
    for period in (HOUR_S, DAY_S):
        cover = coverage(conn, lo, hi, (period,))
        if cover.rolled_seconds // period <= max_points:
            break
    if not cover.rolled:
        return line
    p = _periods.c
    rolled = _tuples(
        conn,
        select(p.start_s, p.start_s, p.period_s, p.period_s)
        .where(cover.rolled_where(_periods), p.with_rows > 0)
        .order_by(p.start_s),
    )
    raw_ends = np.zeros(len(line), dtype=bool)
    for a, b in cover.raw:
        raw_ends |= (line.start_s >= a) & (line.start_s < b)
    raw = [
        (int(i), int(s), int(n), 0)
        for i, s, n in zip(
            line.interval_id[raw_ends], line.start_s[raw_ends], line.length_s[raw_ends], strict=True
        )
    ]
    points = np.array(sorted(raw + rolled, key=lambda r: r[1]), dtype=np.int64).reshape(-1, 4)
    return Timeline(
        points[:, 0].copy(),
        points[:, 1].copy(),
        points[:, 2].copy(),
        line.from_s,
        line.to_s,
        points[:, 3].copy(),
        cover,
    )


def timeline(conn: Connection, from_s: float | None = None, to_s: float | None = None) -> Timeline:
    """The accounted intervals with ledger rows that start in ``[from_s, to_s)``."""
    query = (
        select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s)
        .where(_intervals.c.state == IntervalState.accounted, _intervals.c.ledger_rows > 0)
        .order_by(_intervals.c.start_s)
    )
    if from_s is not None:
        query = query.where(_intervals.c.start_s >= from_s)
    if to_s is not None:
        query = query.where(_intervals.c.start_s < to_s)
    data = np.array(_tuples(conn, query), dtype=np.int64).reshape(-1, 3)
    return Timeline(data[:, 0].copy(), data[:, 1].copy(), data[:, 2].copy(), from_s, to_s)


def top_customers(conn: Connection, line: Timeline, n: int) -> list[str]:
    """The ``n`` customers with the greatest balance after the timeline's last interval
    (ties A→Z). Only customers with a row there can be chosen: the others stand at ~0."""
    if n < 1 or not len(line):
        return []
    last = int(line.interval_id[-1])
    if line.rolled()[-1]:
        c = _customer_rollups.c
        period = int(line.length_s[-1])
        return list(
            conn.execute(
                select(_customers.c.name)
                .join(_customer_rollups, c.customer_id == _customers.c.id)
                .where(c.period_s == period, c.start_s == last)
                .order_by(c.balance_end.desc(), _customers.c.name)
                .limit(n)
            ).scalars()
        )
    return list(
        conn.execute(
            select(_customers.c.name)
            .join(_ledger, _ledger.c.customer_id == _customers.c.id)
            .where(_ledger.c.interval_id == last)
            .order_by(_ledger.c.balance.desc(), _customers.c.name)
            .limit(n)
        ).scalars()
    )


def _tuples(conn: Connection, query: Select[Any]) -> list[tuple[Any, ...]]:
    """The rows as plain tuples: numpy reads those at C speed, whereas it probes each SQLAlchemy
    Row for mapping keys first (~40 µs a row: a second for 5 customers × 5,000 intervals)."""
    return list(map(tuple, conn.execute(query).all()))


def _interval_ids(line: Timeline) -> Select[Any]:
    """The ids of the timeline's intervals, as a subquery (no list of 10,000 parameters).

    Ledger queries select ``interval_id IN (this) AND customer_id IN (…)``, which both engines
    answer with seeks on the tables' primary keys, (interval, customer[, resource]):
    ``customer_resource_ledger`` has no index on the customer alone, and a join with
    ``intervals`` led SQLite to scan all of it.
    """
    query = select(_intervals.c.id).where(
        _intervals.c.state == IntervalState.accounted, _intervals.c.ledger_rows > 0
    )
    if line.from_s is not None:
        query = query.where(_intervals.c.id >= line.from_s)
    if line.to_s is not None:
        query = query.where(_intervals.c.id < line.to_s)
    if line.cover is not None:
        query = query.where(line.cover.raw_where(_intervals.c.id))
    return query


def balances(conn: Connection, ids: dict[str, int], line: Timeline) -> BalanceSeries:
    """Balance, interval GM and priority of each customer (``ids``: name → id, in the order
    wanted) on each interval of ``line``; zeros where a customer has no row."""
    names = tuple(ids)
    shape = (len(names), len(line))
    out = {k: np.zeros(shape) for k in ("balance", "greediness", "priority")}
    present = np.zeros(shape, dtype=bool)
    if names and len(line):
        query = select(
            _ledger.c.customer_id,
            _ledger.c.interval_id,
            _ledger.c.balance,
            _ledger.c.greediness,
            _ledger.c.priority,
        ).where(
            _ledger.c.interval_id.in_(_interval_ids(line)),
            _ledger.c.customer_id.in_(list(ids.values())),
        )
        rows = _tuples(conn, query)
        if line.cover is not None:
            c = _customer_rollups.c
            rows += _tuples(
                conn,
                select(c.customer_id, c.start_s, c.balance_end, c.gm_sum, c.priority_end).where(
                    line.cover.rolled_where(_customer_rollups),
                    c.customer_id.in_(list(ids.values())),
                ),
            )
        if rows:
            data = np.array(rows, dtype=np.float64)
            row_of = {cid: i for i, cid in enumerate(ids.values())}
            r = np.array([row_of[int(c)] for c in data[:, 0]], dtype=np.intp)
            col = line.index_of(data[:, 1].astype(np.int64))
            keep = col >= 0
            r, col = r[keep], col[keep]
            for k, key in enumerate(("balance", "greediness", "priority"), start=2):
                out[key][r, col] = data[keep, k]
            present[r, col] = True
    return BalanceSeries(names, line, out["balance"], out["greediness"], out["priority"], present)


def levels(conn: Connection, ids: dict[str, int], line: Timeline) -> tuple[LevelSteps, ...]:
    """Each customer's throttle level over the range, in ``ids`` order.

    The level at the start is the one set by the customer's last change decided before the
    range (0 if none); then every change decided after an interval of the range, at that
    interval's end. A customer with a level in ``customer_levels`` but no change recorded at
    all (a ledger whose log was pruned) gets that level from its ``since_s`` on (whether it
    was a dry-run level is then unknown: it is reported as not).
    """
    if not ids:
        return ()
    rows = level_changes(conn, customer_ids=ids.values(), before_s=line.to_s)
    changes: dict[int, list[tuple[float, int, bool]]] = {c: [] for c in ids.values()}
    initial: dict[int, int] = dict.fromkeys(ids.values(), 0)
    seen: set[int] = set()
    dry: dict[int, bool] = dict.fromkeys(ids.values(), False)
    for cid, start_s, length_s, after, dry_run in rows:
        seen.add(cid)
        level = int(json.loads(after)["level"]) if after else 0
        if line.from_s is not None and start_s < line.from_s:
            initial[cid], dry[cid] = level, bool(dry_run)
        else:
            changes[cid].append((float(start_s + length_s), level, bool(dry_run)))
    unlogged = [c for c in ids.values() if c not in seen]
    if unlogged and len(line):
        # Effect times are interval ends, so a change at or before the first interval's start
        # was decided before the range, one at or before the last interval's end within it.
        first, last = float(line.start_s[0]), float(line.end_s[-1])
        for cid, level, since_s in conn.execute(
            select(_levels.c.customer_id, _levels.c.level, _levels.c.since_s).where(
                _levels.c.customer_id.in_(unlogged), _levels.c.level > 0
            )
        ):
            if line.from_s is not None and since_s <= first:
                initial[cid] = int(level)
            elif line.to_s is None or since_s <= last:
                changes[cid].append((float(since_s), int(level), False))
    runs, _ = level_runs(conn, list(ids.values()), before_s=line.to_s)
    reported = throttling(conn, runs)
    out = []
    for name, cid in ids.items():
        ch = changes[cid]
        steps = LevelSteps(
            customer=name,
            initial=initial[cid],
            change_s=np.array([c[0] for c in ch], dtype=np.float64),
            level=np.array([c[1] for c in ch], dtype=np.int64),
            dry_run=np.array([c[2] for c in ch], dtype=bool),
        )
        out.append(replace(steps, applied=_applied(steps, line, reported.get(cid), dry[cid])))
    return tuple(out)


def _applied(
    steps: LevelSteps, line: Timeline, reported: Throttling | None, initial_dry: bool
) -> frozenset[str]:
    """What was applied in the timeline's intervals at level ≥ 1 (the level in force at an
    interval's start, decided in dry-run or not), from the hosts' reports."""
    if not len(line):
        return frozenset()
    starts, ends = line.start_s.astype(np.float64), line.end_s.astype(np.float64)
    k = np.searchsorted(steps.change_s, starts, side="right") - 1
    dry = np.where(
        k >= 0, steps.dry_run[np.maximum(k, 0)] if steps.dry_run.size else False, initial_dry
    )
    th = reported or Throttling()
    return frozenset(
        th.mode(float(a), float(b), bool(d)).value
        for a, b, d, lv in zip(starts, ends, dry, steps.at(starts), strict=True)
        if lv >= 1
    )


def resource_terms(conn: Connection, ids: dict[str, int], line: Timeline) -> ResourceSeries:
    """Per-resource greediness terms of each customer (``ids`` order) on each interval."""
    names = tuple(ids)
    rows = []
    if names and len(line):
        query = select(
            _resource_ledger.c.customer_id,
            _resource_ledger.c.interval_id,
            _resource_ledger.c.resource,
            _resource_ledger.c.term,
        ).where(
            _resource_ledger.c.interval_id.in_(_interval_ids(line)),
            _resource_ledger.c.customer_id.in_(list(ids.values())),
        )
        rows = _tuples(conn, query)
        if line.cover is not None:
            t = _resource_rollups.c
            rows += _tuples(
                conn,
                select(t.customer_id, t.start_s, t.resource, t.term_sum).where(
                    line.cover.rolled_where(_resource_rollups),
                    t.customer_id.in_(list(ids.values())),
                ),
            )
    customer, interval, resource, term = zip(*rows, strict=True) if rows else ((), (), (), ())
    found = set(resource)
    resources = tuple(r for r in RESOURCE_ORDER if r in found) + tuple(
        sorted(found - set(RESOURCE_ORDER))
    )
    terms = np.zeros((len(names), len(resources), len(line)))
    if rows:
        row_of = {cid: i for i, cid in enumerate(ids.values())}
        res_of = {r: i for i, r in enumerate(resources)}
        c = np.array([row_of[x] for x in customer], dtype=np.intp)
        k = np.array([res_of[x] for x in resource], dtype=np.intp)
        col = line.index_of(np.array(interval, dtype=np.int64))
        keep = col >= 0
        terms[c[keep], k[keep], col[keep]] = np.array(term, dtype=np.float64)[keep]
    return ResourceSeries(names, resources, line, terms)


def collect(
    conn: Connection,
    *,
    customers: Sequence[str] = (),
    top: int = 5,
    from_s: float | None = None,
    to_s: float | None = None,
) -> CustomerSeries:
    """The series of the named customers (or, with none named, of the ``top`` greatest final
    balances) over the accounted intervals starting in ``[from_s, to_s)``.

    Raises :class:`~gmd.daemon.ledger.lookup.UnknownCustomer` for names the ledger has never
    seen and :class:`EmptyRange` when no interval with ledger rows starts in the range. A known
    customer without rows in the range is kept: its standing there was negligible, and shows
    as zeros.
    """
    line = downsampled(conn, timeline(conn, from_s, to_s))
    ids = customer_ids(conn, customers) if customers else {}
    if not len(line):
        raise EmptyRange(f"no accounted interval with ledger rows from {line.describe()}")
    if not customers:
        ids = customer_ids(conn, top_customers(conn, line, top))
    return CustomerSeries(
        customers=tuple(ids),
        timeline=line,
        balances=balances(conn, ids, line),
        levels=levels(conn, ids, line),
        resources=resource_terms(conn, ids, line),
        top=None if customers else top,
        names=plot_labels(conn, ids),
    )
