"""Which parts of a report's range are read from rollups, and which from per-interval rows.

A report over ``[lo, hi)`` sums the intervals that start in it. Where a whole UTC day (or
else a whole hour) of the range is rolled up, its rollup row stands for its intervals; the
rest (the ragged ends, the hours not rolled up yet) is read from the per-interval rows. The
two never overlap, so a sum over both is the sum over the intervals, and the cost is one
rollup row per day or hour instead of one row per interval. Since an interval's id is its
start, both parts are ranges of an index: nothing outside ``[lo, hi)`` is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, false, or_, select

from gmd.common.units import DAY_S, HOUR_S
from gmd.ledger_schema.tables import rollup_periods as _periods


@dataclass(frozen=True)
class Coverage:
    lo: int
    hi: int
    rolled: tuple[tuple[int, int, int], ...]
    """(period_s, first start, end) of each run of consecutive rolled-up periods"""
    raw: tuple[tuple[int, int], ...]
    """[start, end) of each stretch read from the per-interval rows"""

    def raw_where(self, column: Any) -> ColumnElement[bool]:
        """``column`` (an interval id) in the stretches read from per-interval rows."""
        if not self.raw:
            return false()
        return or_(*(and_(column >= a, column < b) for a, b in self.raw))

    def rolled_where(self, table: Any) -> ColumnElement[bool]:
        """A rollup ``table``'s rows that stand for the rolled-up parts."""
        if not self.rolled:
            return false()
        return or_(
            *(
                and_(table.c.period_s == p, table.c.start_s >= a, table.c.start_s < b)
                for p, a, b in self.rolled
            )
        )

    @property
    def rolled_seconds(self) -> int:
        return sum(b - a for _, a, b in self.rolled)


def coverage(
    conn: Connection, lo: int, hi: int, periods: tuple[int, ...] = (DAY_S, HOUR_S)
) -> Coverage:
    """Whole days rolled up, then whole hours of the other days, within ``[lo, hi)``;
    ``periods`` limits which period lengths may stand for intervals (a plot picks one)."""
    done = conn.execute(
        select(_periods.c.period_s, _periods.c.start_s).where(
            _periods.c.start_s >= lo,
            _periods.c.start_s < hi,
            _periods.c.period_s.in_(periods),
        )
    ).all()
    days = sorted(int(s) for p, s in done if p == DAY_S and s + DAY_S <= hi)
    in_days = set(days)
    hours = sorted(
        int(s) for p, s in done if p == HOUR_S and s + HOUR_S <= hi and s - s % DAY_S not in in_days
    )
    runs = _runs(DAY_S, days) + _runs(HOUR_S, hours)
    runs.sort(key=lambda r: r[1])
    raw = []
    at = lo
    for _, a, b in runs:
        if a > at:
            raw.append((at, a))
        at = max(at, b)
    if at < hi:
        raw.append((at, hi))
    return Coverage(lo, hi, tuple(runs), tuple(raw))


def _runs(period_s: int, starts: list[int]) -> list[tuple[int, int, int]]:
    """Consecutive starts joined into (period_s, first, end) runs."""
    runs: list[tuple[int, int, int]] = []
    for s in starts:
        if runs and runs[-1][2] == s:
            runs[-1] = (period_s, runs[-1][1], s + period_s)
        else:
            runs.append((period_s, s, s + period_s))
    return runs
