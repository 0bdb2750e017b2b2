"""Deciding throttle levels after each accounted interval, and auditing every change.

Runs inside the accounting transaction of the interval (so the ledger, the levels and the
audit rows move together, or not at all), with the interval's end as "now": the same ledger
gives the same decisions. The arithmetic is :mod:`gmd.fairness.policy`'s; this module reads
the standings, keeps the per-customer state and writes the audit rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select

from gmd.daemon.enforce.settings import EnforcementConfig
from gmd.daemon.ledger.accounting import AfterInterval
from gmd.daemon.ledger.lookup import log_names
from gmd.daemon.ledger.status import level_counts
from gmd.fairness.policy import decide_customers
from gmd.ledger_schema.models import ActionKind, ActionStatus
from gmd.ledger_schema.tables import (
    actions as _actions,
    customer_ledger as _ledger,
    levels as _levels,
    upsert,
)
from gmd.wire import PlanMode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LevelChange:
    customer_id: int
    before: int
    after: int
    score: float
    reason: str


def decide_after_interval(
    conn: Connection, interval_id: int, end_s: float, config: EnforcementConfig
) -> list[LevelChange]:
    """New levels for every customer with a standing or a level; returns the changes.

    A customer with a level but no row in this interval has no standing left (the ledger is
    dense while a standing is not negligible), so its score is 0.
    """
    if config.mode == PlanMode.off:
        return []
    policy = config.policy
    standing = {
        r.customer_id: (r.balance, r.priority)
        for r in conn.execute(
            select(_ledger.c.customer_id, _ledger.c.balance, _ledger.c.priority).where(
                _ledger.c.interval_id == interval_id
            )
        )
    }
    if not standing:
        # Nobody reported in this interval (agents or network down): no news, levels held.
        return []
    state = {
        r.customer_id: (r.level, r.since_s)
        for r in conn.execute(select(_levels.c.customer_id, _levels.c.level, _levels.c.since_s))
    }
    step = decide_customers(standing, state, end_s, policy)
    decision = step.decision
    rows = [
        {
            "customer_id": c,
            "level": int(decision.level[i]),
            "since_s": float(decision.since_s[i]),
            "score": float(decision.score[i]),
            "interval_id": interval_id,
        }
        for i, c in enumerate(step.customers)
        if step.kept[i]
    ]
    if rows:
        stmt = upsert(conn, _levels)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["customer_id"],
                set_={k: stmt.excluded[k] for k in ("level", "since_s", "score", "interval_id")},
            ),
            rows,
        )
    changes = [
        LevelChange(
            c,
            int(step.before[i]),
            int(decision.level[i]),
            float(decision.score[i]),
            decision.reason[i],
        )
        for i, c in enumerate(step.customers)
        if decision.changed[i]
    ]
    if changes:
        conn.execute(
            insert(_actions),
            [
                {
                    "interval_id": interval_id,
                    "customer_id": ch.customer_id,
                    "kind": ActionKind.level.value,
                    "status": ActionStatus.decided.value,
                    "dry_run": config.mode == PlanMode.dry_run,
                    "before": json.dumps({"level": ch.before}),
                    "after": json.dumps({"level": ch.after, **_effect(config, ch.after)}),
                    "reason": f"{ch.reason} (balance {standing.get(ch.customer_id, (0.0,))[0]:.4g},"
                    f" enter {list(policy.enter)}, leave {list(policy.leave)})",
                }
                for ch in changes
            ],
        )
        names = log_names(conn, [ch.customer_id for ch in changes])
        for ch in changes:
            log.info(
                "customer %s: level %d → %d%s: %s",
                names.get(ch.customer_id, f"#{ch.customer_id}"),
                ch.before,
                ch.after,
                " (dry-run)" if config.mode == PlanMode.dry_run else "",
                ch.reason,
            )
    return changes


def _effect(config: EnforcementConfig, level: int) -> dict[str, object]:
    e = config.policy.effect(level)
    return {
        "weight_factor": e.weight_factor,
        "cpu_cap_fraction": e.cpu_cap_fraction,
        "disk_bytes_per_s": e.disk_bytes_per_s,
        "quota_steps": e.quota_steps,
    }


def after_interval(
    config: EnforcementConfig, on_levels: Callable[[dict[int, int]], None] | None = None
) -> AfterInterval:
    """The accountant's hook: decide levels at the end of each interval it accounts, then tell
    ``on_levels`` how many customers each level above 0 holds."""

    def hook(conn: Connection, interval_id: int, start_s: int, length_s: int) -> None:
        decide_after_interval(conn, interval_id, start_s + length_s, config)
        if on_levels is not None and config.mode != PlanMode.off:
            on_levels(level_counts(conn))

    return hook
