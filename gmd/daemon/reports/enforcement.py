"""What enforcement would do now: each throttled customer's level and effect, and every
host's plan — read from the ledger, as the daemon serves it to agents, with whether the
level's hard caps apply on the host and why."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Connection, select

from gmd.columns import Column, Unit
from gmd.common.timespec import iso
from gmd.daemon.enforce.plans import host_plan
from gmd.daemon.enforce.settings import EnforcementConfig
from gmd.daemon.ledger.lookup import require_host
from gmd.fairness.policy import CapDecision, CapResource, LevelEffect, caps_wanted
from gmd.ledger_schema.tables import (
    customers as _customers,
    hosts as _hosts,
    levels as _levels,
)

LEVEL_COLUMNS = (
    Column("customer", "Customer", None, "left"),
    Column("level", "Level", None),
    Column("score", "Score", 4),
    Column("since", "Since", None, "left"),
    Column("weight_factor", "Weight ×", 2),
    Column("cpu_cap_fraction", "CPU cap (of vCPUs)", 2),
    Column("quota_steps", "Quota steps", None),
)
PLAN_COLUMNS = (
    Column("host", "Host", None, "left"),
    Column("uuid", "VM", None, "left"),
    Column("customer", "Customer", None, "left"),
    Column("level", "Level", None),
    Column("cpu_weight", "CPU weight", None),
    Column("io_weight", "I/O weight", None),
    Column("cpu_quota_cores", "CPU cap (cores)", 2),
    Column("disk_read_bytes_per_s", "Disk read cap", 0, unit=Unit.bytes_per_s),
    Column("disk_write_bytes_per_s", "Disk write cap", 0, unit=Unit.bytes_per_s),
    Column("caps", "Caps", None, "left"),
)


def caps_words(effect: LevelEffect, caps: Mapping[CapResource, CapDecision]) -> str:
    """Whether the caps a level sets apply on a host, and why: "applied: cpu 91 % ≥ 80 %",
    "not applied: cpu 22 % < 80 %", or "none at level 1" for a level without caps."""
    wanted = caps_wanted(effect)
    if not wanted:
        return f"none at level {effect.level}"
    return "; ".join(caps[r].words() for r in wanted)


def levels(conn: Connection, config: EnforcementConfig) -> list[dict[str, object]]:
    """Customers above level 0, highest level (then score) first."""
    rows = conn.execute(
        select(_customers.c.name, _levels.c.level, _levels.c.score, _levels.c.since_s)
        .join(_customers, _customers.c.id == _levels.c.customer_id)
        .where(_levels.c.level > 0)
    ).all()
    out = []
    for name, level, score, since in rows:
        effect = config.policy.effect(level)
        out.append(
            {
                "customer": name,
                "level": level,
                "score": score,
                "since": iso(since),
                "weight_factor": effect.weight_factor,
                "cpu_cap_fraction": effect.cpu_cap_fraction,
                "quota_steps": effect.quota_steps,
            }
        )
    out.sort(key=lambda r: (-int(r["level"]), -float(r["score"]), str(r["customer"])))
    return out


CAPS_COLUMNS = (
    Column("host", "Host", None, "left"),
    Column("resource", "Resource", None, "left"),
    Column("applied", "Caps apply", None, "left"),
    Column("reason", "Because", None, "left"),
    Column("utilisation", "Used", 3),
    Column("threshold", "Threshold", 2),
    Column("intervals", "Intervals", None),
)


def plans(
    conn: Connection, config: EnforcementConfig, host: str | None = None
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Every host's plan (or one host's): a row per throttled VM, whose ``caps`` says whether
    its level's hard caps apply on the host and why; and, for each host with a throttled VM
    (or the host asked for), a row per cap resource with the figures that decided it.
    :class:`UnknownHost` for a host the ledger has never seen."""
    if host is not None:
        require_host(conn, host)
        names = [host]
    else:
        names = list(conn.execute(select(_hosts.c.name).order_by(_hosts.c.name)).scalars())
    rows: list[dict[str, object]] = []
    decisions: list[dict[str, object]] = []
    for name in names:
        plan = host_plan(conn, name, config)
        for p in plan.vms:
            words = caps_words(config.policy.effect(p.level), plan.caps_of(p.customer))
            rows.append({"host": name, **p.model_dump(), "caps": words})
        if plan.vms or host is not None:
            decisions += [{"host": name, **d.figures()} for d in plan.caps.values()]
    return rows, decisions
