"""Deciding throttle levels after each accounted interval, and auditing every change.

Runs inside the accounting transaction of the interval (so the ledger, the levels and the
audit rows move together, or not at all), with the interval's end as "now": the same ledger
gives the same decisions. The arithmetic is :mod:`gmd.fairness.policy`'s; this module reads
the standings, keeps the per-customer state and writes the audit rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

from sqlalchemy import Connection, insert, select

from gmd.daemon.enforce.settings import EnforcementConfig
from gmd.daemon.ledger.accounting import AfterInterval
from gmd.daemon.ledger.lookup import log_names
from gmd.daemon.ledger.status import level_counts
from gmd.daemon.ledger.step_input import customer_standings
from gmd.fairness.ledger_step import (
    CustomerStanding,
    LevelChange,
    LevelHeld,
    decide_next_levels,
)
from gmd.ledger_schema.kinds import ActionKind, ActionStatus
from gmd.ledger_schema.tables import (
    actions as _actions,
    levels as _levels,
    upsert,
)
from gmd.wire import PlanMode

log = logging.getLogger(__name__)


def decide_after_interval(
    conn: Connection, interval_id: int, end_s: float, config: EnforcementConfig
) -> list[LevelChange]:
    """New levels for every customer with a standing or a level; returns the changes.

    The decision is the pure step's (:func:`gmd.fairness.ledger_step.decide_next_levels`)
    over the standing the interval's rows carry; a customer with a level but no row in this
    interval has no standing left (the ledger is dense while a standing is not negligible),
    so its score is 0.
    """
    if config.mode == PlanMode.off:
        return []
    policy = config.policy
    standing = customer_standings(conn, interval_id)
    if not standing:
        # Nobody reported in this interval (agents or network down): no news, levels held.
        return []
    step = decide_next_levels(standing, levels_held(conn), end_s, policy)
    rows = [
        {
            "customer_id": k.customer_id,
            "level": k.level,
            "since_s": k.since_s,
            "score": k.score,
            "interval_id": interval_id,
        }
        for k in step.kept
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
    changes = list(step.changes)
    if changes:
        _record(conn, interval_id, config, changes, standing)
    return changes


def levels_held(conn: Connection) -> dict[int, LevelHeld]:
    """Every customer's level in force, as the levels table holds it."""
    return {
        r.customer_id: LevelHeld(r.level, r.since_s)
        for r in conn.execute(select(_levels.c.customer_id, _levels.c.level, _levels.c.since_s))
    }


def _record(
    conn: Connection,
    interval_id: int,
    config: EnforcementConfig,
    changes: list[LevelChange],
    standing: Mapping[int, CustomerStanding],
) -> None:
    """Audit the level changes (one action row each) and log them."""
    policy = config.policy
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
                "reason": f"{ch.reason} (balance {_balance(standing, ch.customer_id):.4g},"
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


def _balance(standing: Mapping[int, CustomerStanding], customer_id: int) -> float:
    found = standing.get(customer_id)
    return 0.0 if found is None else found.balance


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
