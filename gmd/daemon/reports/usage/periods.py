"""The usage report grouped by day or week (UTC, weeks from Monday), kept apart from the other
groupings as Slurm's sreport keeps its report families: per period its accounted and empty
intervals, active customers, positive GM, the greediest customer, throttled customers and
actions; with one customer, that customer's GM, balance and throttled time per period.

The columns are defined in :mod:`gmd.daemon.reports.usage`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, case, func, select

from gmd.columns import PROJECT, Column
from gmd.common.units import DAY_S, WEEK_S
from gmd.daemon.ledger import lookup, reset_window
from gmd.daemon.reports.usage.common import (
    THROTTLE_NOTE,
    Range,
    Span,
    Steps,
    customer_names,
    last_with_rows,
    range_note,
    raw_and_rolled,
    sql_float,
    sql_int,
    throttle_spans,
    throttled_in,
    utc_datetime,
)
from gmd.ledger_schema.tables import (
    actions as _actions,
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    samples as _samples,
)

# Unix time 0 was a Thursday: shifting by three days makes weeks start on Mondays.
_PERIODS: dict[str, tuple[int, int]] = {"day": (0, DAY_S), "week": (3 * DAY_S, WEEK_S)}


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


@dataclass(frozen=True)
class _Periods:
    """A range cut into days or weeks: each period's index, and its accounted intervals."""

    shift: int
    size: int
    bounds: dict[int, tuple[int, int]]
    """period index → its accounted intervals [first, stop) (every period holding one)"""

    def of(self, start: Any) -> Any:
        """The period index of a start time (a number or an SQL expression)."""
        return (start + self.shift) // self.size

    def start_of(self, index: int) -> int:
        return index * self.size - self.shift

    def label(self, index: int) -> str:
        return utc_datetime(self.start_of(index)).strftime("%Y-%m-%d")


def _periods(rng: Range, unit: str) -> _Periods:
    shift, size = _PERIODS[unit]
    periods = _Periods(shift, size, {})
    for start, *_ in rng.intervals:
        p = (start + shift) // size
        if p not in periods.bounds:
            lo, hi = max(periods.start_of(p), rng.lo), min(periods.start_of(p + 1), rng.hi)
            periods.bounds[p] = (rng.index(lo), rng.index(hi))
    return periods


def by_period(
    conn: Connection, rng: Range, step: Steps, unit: str, customer_id: int | None
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    periods = _periods(rng, unit)
    step("late samples")
    late_period = periods.of(_samples.c.interval_id)
    late_query = (
        select(late_period, func.count())
        .where(*rng.ids(_samples.c.interval_id), _samples.c.late.is_(True))
        .group_by(late_period)
    )
    if customer_id is not None:
        late_query = late_query.where(_samples.c.customer_id == customer_id)
    late = {int(p): int(n) for p, n in conn.execute(late_query)}
    step("throttling")
    spans = throttle_spans(conn, rng, customer_id)
    notes = [range_note(rng, _period_columns(unit, customer_id is not None))]
    if customer_id is not None:
        notes.append(THROTTLE_NOTE)
        step("the customer's rows")
        rows = _customer_periods(conn, rng, periods, unit, customer_id, spans, late)
        notes.append(
            "balance: after the last interval with ledger rows up to the period's end (0 if the"
            " customer had no row there or a reset took effect after it)"
        )
        return _period_columns(unit, True), rows, notes
    step("greediness per customer and period")
    gm, positive, active = _greed_per_period(conn, rng, periods)
    step("actions")
    actions = _actions_per_period(conn, rng, periods)
    names = customer_names(conn)
    rows = []
    for p in sorted(set(periods.bounds) | set(actions)):
        first, stop = periods.bounds.get(p, (0, 0))
        sums = gm.get(p, {})
        greediest = min(sums, key=lambda c: (-sums[c], names.get(c, "")), default=None)
        throttled = sum(1 for s in spans.values() if throttled_in(s, rng, first, stop)[0] > 0)
        rows.append(
            {
                unit: periods.label(p),
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


def _customer_periods(
    conn: Connection,
    rng: Range,
    periods: _Periods,
    unit: str,
    customer_id: int,
    spans: dict[int, list[Span]],
    late: dict[int, int],
) -> list[dict[str, object]]:
    """One customer's rows: per period its GM, its balance at the period's end and its time
    throttled."""
    mine = {
        int(s): (float(g), float(b))
        for s, g, b in conn.execute(
            select(_ledger.c.interval_id, _ledger.c.greediness, _ledger.c.balance).where(
                *rng.ids(_ledger.c.interval_id), _ledger.c.customer_id == customer_id
            )
        )
    }
    before = last_with_rows(conn, rng.lo)
    end_start = None if before is None else before[1]
    end_balance = 0.0
    if before is not None:
        end_balance = sql_float(
            conn.execute(
                select(_ledger.c.balance).where(
                    _ledger.c.interval_id == before[0], _ledger.c.customer_id == customer_id
                )
            ).scalar()
        )
    resets = [e for c, e in reset_window.resets(conn, end_start, rng.hi - 1) if c == customer_id]
    name = customer_names(conn).get(customer_id, str(customer_id))
    project = lookup.display_names(conn).get(customer_id)
    rows: list[dict[str, object]] = []
    for p in sorted(periods.bounds):
        first, stop = periods.bounds[p]
        for k in range(first, stop):
            if rng.rows[k] > 0:
                end_start = rng.starts[k]
                end_balance = mine.get(end_start, (0.0, 0.0))[1]
        period_end = min(periods.start_of(p + 1), rng.hi)
        reset = end_start is not None and any(
            reset_window.counts(e, end_start, period_end - 1) for e in resets
        )
        total = sum(mine.get(rng.starts[k], (0.0, 0.0))[0] for k in range(first, stop))
        seconds, mode = throttled_in(spans.get(customer_id, []), rng, first, stop)
        rows.append(
            {
                unit: periods.label(p),
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
    return rows


def _greed_per_period(
    conn: Connection, rng: Range, periods: _Periods
) -> tuple[dict[int, dict[int, float]], dict[int, float], dict[int, int]]:
    """Per period: each customer's GM sum, the sum of positive GM, the customers with VMs."""
    gm: dict[int, dict[int, float]] = defaultdict(dict)
    positive: dict[int, float] = defaultdict(float)
    active: dict[int, int] = defaultdict(int)
    g = _ledger.c.greediness
    cr = _customer_rollups.c
    raw = select(
        periods.of(_ledger.c.interval_id).label("p"),
        _ledger.c.customer_id.label("cid"),
        g.label("gm"),
        case((g > 0, g), else_=0.0).label("pos"),
        _ledger.c.vms.label("vms"),
    ).where(rng.cover.raw_where(_ledger.c.interval_id))
    rolled = select(
        periods.of(cr.start_s), cr.customer_id, cr.gm_sum, cr.gm_positive, cr.vms_max
    ).where(rng.cover.rolled_where(_customer_rollups))
    for r in raw_and_rolled(
        conn, (raw, rolled), ("p", "cid"), gm=func.sum, pos=func.sum, vms=func.max
    ):
        p = int(r.p)
        gm[p][int(r.cid)] = sql_float(r.gm)
        positive[p] += sql_float(r.pos)
        active[p] += 1 if sql_int(r.vms) > 0 else 0
    return gm, positive, active


def _actions_per_period(conn: Connection, rng: Range, periods: _Periods) -> dict[int, int]:
    """Per period, the actions tied to its intervals and those recorded in it tied to none."""
    actions: dict[int, int] = defaultdict(int)
    action_period = periods.of(_actions.c.interval_id)  # one expression: PostgreSQL compares
    for p, n in conn.execute(
        select(action_period, func.count())
        .where(*rng.ids(_actions.c.interval_id))
        .group_by(action_period)
    ):
        actions[int(p)] += int(n)
    for (at,) in conn.execute(
        select(_actions.c.at).where(
            _actions.c.interval_id.is_(None),
            _actions.c.at >= utc_datetime(rng.lo),
            _actions.c.at < utc_datetime(rng.hi),
        )
    ):
        actions[periods.of(math.floor(at.timestamp()))] += 1
    return actions
