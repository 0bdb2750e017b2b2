"""The usage report grouped by day or week (UTC, weeks from Monday), kept apart from the other
groupings as Slurm's sreport keeps its report families: per period its accounted and empty
intervals, active customers, positive GM, the greediest customer, throttled customers and
actions; with one customer, that customer's GM, balance and throttled time per period.

The columns are defined in :mod:`gmd.daemon.reports.usage`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, case, func, select, union_all

from gmd.columns import PROJECT, Column
from gmd.common.units import DAY_S, WEEK_S
from gmd.daemon.ledger import lookup, reset_window
from gmd.daemon.reports.usage.common import (
    THROTTLE_NOTE,
    Range,
    Steps,
    customer_names,
    last_with_rows,
    range_note,
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


def by_period(
    conn: Connection, rng: Range, step: Steps, unit: str, customer_id: int | None
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
    spans = throttle_spans(conn, rng, customer_id)
    label = {p: utc_datetime(start_of(p)).strftime("%Y-%m-%d") for p in bounds}
    notes = [range_note(rng, _period_columns(unit, customer_id is not None))]
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
        resets = [
            e for c, e in reset_window.resets(conn, end_start, rng.hi - 1) if c == customer_id
        ]
        name = customer_names(conn).get(customer_id, str(customer_id))
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
            seconds, mode = throttled_in(spans.get(customer_id, []), rng, first, stop)
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
        gm[p][int(r.customer_id)] = sql_float(r.gm)
        positive[p] += sql_float(r.pos)
        active[p] += 1 if sql_int(r.vms) > 0 else 0
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
            _actions.c.at >= utc_datetime(rng.lo),
            _actions.c.at < utc_datetime(rng.hi),
        )
    ):
        actions[(math.floor(at.timestamp()) + shift) // size] += 1
    names = customer_names(conn)
    rows = []
    for p in sorted(set(bounds) | set(actions)):
        first, stop = bounds.get(p, (0, 0))
        sums = gm.get(p, {})
        greediest = min(sums, key=lambda c: (-sums[c], names.get(c, "")), default=None)
        throttled = sum(1 for s in spans.values() if throttled_in(s, rng, first, stop)[0] > 0)
        rows.append(
            {
                unit: label.get(p) or utc_datetime(start_of(p)).strftime("%Y-%m-%d"),
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
