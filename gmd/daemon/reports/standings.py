"""Standings, like Slurm's ``sshare``: where every customer stands after the latest interval.

Read from the latest accounted interval that has ledger rows (the ledger is dense there: every
customer with a standing has a row). When intervals accounted since had no samples at all,
the standings say so rather than pretending they are current.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, func, or_, select

from gmd.common.timespec import iso
from gmd.daemon.enforce.settings import EnforcementConfig
from gmd.daemon.ledger import reset_window
from gmd.daemon.reports.enforced import enforced_now
from gmd.daemon.reports.standings_columns import SORT_KEYS
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.tables import (
    customer_ledger as _ledger,
    customers as _customers,
    intervals as _intervals,
    levels as _levels,
)
from gmd.wire import PlanMode


@dataclass(frozen=True)
class Standings:
    as_of_s: int | None
    interval_s: int | None
    latest_accounted_s: int | None
    rows: list[dict[str, object]]
    reset: tuple[str, ...] = ()
    """customers reset since (shown at 0; their next accounted interval starts from 0)"""

    def caption(self) -> str:
        if self.as_of_s is None:
            return "The ledger has no accounted interval yet."
        text = f"After the interval starting {iso(self.as_of_s)} ({self.interval_s} s)."
        if self.latest_accounted_s is not None and self.latest_accounted_s > self.as_of_s:
            text += f" No samples in the intervals up to {iso(self.latest_accounted_s)}."
        if self.reset:
            text += f" Balance reset since (shown as 0): {', '.join(self.reset)}."
        return text

    def document(self) -> dict[str, object]:
        return {
            "as_of": None if self.as_of_s is None else iso(self.as_of_s),
            "as_of_s": self.as_of_s,
            "interval_s": self.interval_s,
            "latest_accounted_s": self.latest_accounted_s,
            "customers": self.rows,
            "reset_since": list(self.reset),
        }


def standings(
    conn: Connection,
    *,
    sort: str = "balance",
    reverse: bool = False,
    everyone: bool = False,
    customers: Sequence[str] = (),
    enforcement: EnforcementConfig | None = None,
) -> Standings:
    """Rows sorted by ``sort``: numbers greatest first, names A→Z; ``reverse`` flips that.

    ``everyone`` lists customers without a standing too (with zeros). ``customers`` are
    project uuids or names (none: all). ``enforcement`` (the daemon's ``[enforcement]``; none:
    mode "off") for the Enforced column: what a level above 0 does now, from what the hosts
    report (:func:`~gmd.daemon.reports.enforced.enforced_now`): ``applied`` only while a host
    reports one of the customer's running VMs throttled.
    """
    if sort not in SORT_KEYS:
        raise ValueError(f"cannot sort by {sort!r}; choose one of {', '.join(SORT_KEYS)}")
    latest = conn.execute(
        select(func.max(_intervals.c.start_s)).where(_intervals.c.state == IntervalState.accounted)
    ).scalar_one()
    row = conn.execute(
        select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s)
        .where(_intervals.c.state == IntervalState.accounted, _intervals.c.ledger_rows > 0)
        .order_by(_intervals.c.start_s.desc())
        .limit(1)
    ).first()
    if row is None:
        return Standings(None, None, latest, [])
    query = (
        select(
            _customers.c.name.label("customer"),
            _customers.c.display_name.label("name"),
            _ledger.c.balance,
            _ledger.c.greediness,
            _ledger.c.utility,
            _ledger.c.priority,
            _ledger.c.vms,
            func.coalesce(_levels.c.level, 0).label("level"),
        )
        .join(_customers, _customers.c.id == _ledger.c.customer_id)
        .outerjoin(_levels, _levels.c.customer_id == _ledger.c.customer_id)
        .where(_ledger.c.interval_id == row.id)
    )
    if customers:
        query = query.where(
            or_(_customers.c.name.in_(customers), _customers.c.display_name.in_(customers))
        )
    rows = [dict(r._mapping) for r in conn.execute(query)]
    reset_ids = reset_window.pending(conn, row.start_s)
    reset_names = set(
        conn.execute(select(_customers.c.name).where(_customers.c.id.in_(reset_ids))).scalars()
    )
    for r in rows:
        if r["customer"] in reset_names:
            r["balance"] = 0.0
    if everyone:
        rows += _without_standing(conn, {str(r["customer"]) for r in rows}, customers)
    _add_enforced(conn, rows, enforcement or EnforcementConfig(mode=PlanMode.off))
    if sort in ("customer", "name"):
        rows.sort(key=lambda r: (str(r[sort] or ""), str(r["customer"])))
    else:
        rows.sort(key=lambda r: (-float(r[sort]), str(r["customer"])))
    if reverse:
        rows.reverse()
    shown = {str(r["customer"]) for r in rows}
    return Standings(row.start_s, row.length_s, latest, rows, tuple(sorted(reset_names & shown)))


def _without_standing(
    conn: Connection, listed: set[str], customers: Sequence[str]
) -> list[dict[str, object]]:
    """Zero rows for the customers (of ``customers``, if any) not ``listed``: those without a
    standing, at the level they hold."""
    names = conn.execute(
        select(
            _customers.c.name, _customers.c.display_name, func.coalesce(_levels.c.level, 0)
        ).outerjoin(_levels, _levels.c.customer_id == _customers.c.id)
    ).all()
    return [
        {
            "customer": n,
            "name": shown,
            "balance": 0.0,
            "greediness": 0.0,
            "utility": 0.0,
            "priority": 0.0,
            "vms": 0,
            "level": level,
        }
        for n, shown, level in names
        if n not in listed and (not customers or n in customers or shown in customers)
    ]


def _add_enforced(
    conn: Connection, rows: list[dict[str, object]], config: EnforcementConfig
) -> None:
    """Each row's Enforced column: what its level above 0 does now, and why."""
    throttled = any(r["level"] != 0 for r in rows)
    now = enforced_now(conn, config.mode, config.contention.intervals) if throttled else {}
    ids = dict(conn.execute(select(_customers.c.name, _customers.c.id)).all()) if now else {}
    for r in rows:
        state = now.get(ids.get(r["customer"], -1)) if r["level"] != 0 else None
        r["enforced"] = None if state is None else state.word.value
        r["enforced_why"] = None if state is None else state.why()
