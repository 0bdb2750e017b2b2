"""Resetting a customer's balance to zero, the way Slurm's ``sacctmgr … RawUsage=0`` does.

Ledger rows are an audit trail and are never rewritten. A reset is therefore a row of its own
(``balance_resets``) that accounting reads: the first interval not yet accounted when the
reset was made starts the customer from a zero balance instead of its previous standing
(:func:`gmd.daemon.ledger.accounting.compute_rows`). Re-accounting that interval later gives the
same rows, since the reset is part of the ledger. The reset is also an ``enforcement_actions`` row
(kind ``reset``), so ``gmd-admin actions`` shows it beside what gmd did on its own.

The reset takes the accountant's lock (waiting for it, unlike a daemon's accountant): an
interval being accounted at that moment either finishes first, and the reset applies from the
next one, or starts after, and sees the reset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, insert, select, text

from gmd.daemon.ledger import lookup
from gmd.daemon.ledger.accounting import ACCOUNTING_LOCK
from gmd.ledger_schema.kinds import ActionKind, ActionStatus, IntervalState
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import (
    actions as _actions,
    balance_resets as _resets,
    customer_ledger as _ledger,
    intervals as _intervals,
)


@dataclass(frozen=True)
class ResetResult:
    customer: str
    previous_balance: float
    """the balance after the latest interval with a row for the customer (0 if none)"""
    previous_start_s: int | None
    """start of that interval"""
    effective_start_s: int
    """the first interval accounted from a zero balance"""
    recorded: bool = True
    """False when nothing was done: a reset was already pending from the same interval, or the
    balance already was 0 (a second reset must not log the dropped balance again)"""

    def document(self) -> dict[str, object]:
        return {
            "customer": self.customer,
            "previous_balance": self.previous_balance,
            "previous_interval_start_s": self.previous_start_s,
            "effective_interval_start_s": self.effective_start_s,
        }


def _wait_for_accountant(conn: Connection) -> None:
    """Block until no accountant is in a transaction (SQLite: BEGIN IMMEDIATE already did)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ACCOUNTING_LOCK})


def first_unaccounted_start(conn: Connection) -> int:
    """Start of the earliest interval not accounted yet (one that does not exist yet counts)."""
    pending = conn.execute(
        select(func.min(_intervals.c.start_s)).where(_intervals.c.state != IntervalState.accounted)
    ).scalar()
    if pending is not None:
        return int(pending)
    last = conn.execute(
        select(_intervals.c.start_s, _intervals.c.length_s)
        .order_by(_intervals.c.start_s.desc())
        .limit(1)
    ).first()
    return 0 if last is None else int(last.start_s + last.length_s)


def reset_balance(engine: Engine, customer: str, reason: str, requested_by: str) -> ResetResult:
    """Record a reset of ``customer``'s balance; accounting applies it. UnknownCustomer if the
    ledger has never seen the customer; ValueError for an empty reason."""
    if not reason.strip():
        raise ValueError("a reset needs a reason (it is kept in the enforcement log)")
    with writer(engine).begin() as conn:
        _wait_for_accountant(conn)
        customer_id = lookup.customer_id(conn, customer)
        latest = conn.execute(
            select(_ledger.c.balance, _intervals.c.start_s, _intervals.c.id)
            .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
            .where(_ledger.c.customer_id == customer_id)
            .order_by(_intervals.c.start_s.desc())
            .limit(1)
        ).first()
        effective = first_unaccounted_start(conn)
        previous = 0.0 if latest is None else float(latest.balance)
        pending = conn.execute(
            select(_resets.c.previous_balance).where(
                _resets.c.customer_id == customer_id, _resets.c.effective_start_s == effective
            )
        ).first()
        if pending is not None or previous == 0.0:
            return ResetResult(
                customer,
                0.0 if pending is None else float(pending.previous_balance),
                None if latest is None else int(latest.start_s),
                effective,
                recorded=False,
            )
        conn.execute(
            insert(_resets).values(
                customer_id=customer_id,
                effective_start_s=effective,
                previous_balance=previous,
                requested_by=requested_by,
                reason=reason,
            )
        )
        conn.execute(
            insert(_actions).values(
                interval_id=None if latest is None else latest.id,
                customer_id=customer_id,
                kind=ActionKind.reset.value,
                status=ActionStatus.ok.value,
                dry_run=False,
                before=json.dumps({"balance": previous}),
                after=json.dumps({"balance": 0.0, "from_interval_start_s": effective}),
                reason=f"balance reset by {requested_by}: {reason}",
            )
        )
    return ResetResult(
        customer, previous, None if latest is None else int(latest.start_s), effective
    )
