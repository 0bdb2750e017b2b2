"""Writing what hosts report back into the enforcement log (``enforcement_actions``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, insert, select

from gmd.daemon.ledger.migrate import writer
from gmd.daemon.ledger.models import ActionKind, ActionStatus
from gmd.daemon.ledger.tables import (
    actions as _actions,
    hosts as _hosts,
    vms as _vms,
)

log = logging.getLogger(__name__)


def record_host_report(
    engine: Engine, host: str, generated_s: int, results: Sequence[dict[str, Any]]
) -> int:
    """One action row per VM result (kind ``host_apply``/``host_restore``); failures are
    logged here too, since they mean a customer is not throttled as decided."""
    if not results:
        return 0
    with writer(engine).begin() as conn:
        host_id = conn.execute(select(_hosts.c.id).where(_hosts.c.name == host)).scalar()
        owners = dict(
            conn.execute(
                select(_vms.c.uuid, _vms.c.customer_id).where(
                    _vms.c.uuid.in_([r["uuid"] for r in results])
                )
            ).all()
        )
        rows = []
        for r in results:
            dry = r["action"].startswith("would_")
            verb = r["action"].removeprefix("would_")
            kind = ActionKind.host_apply if verb == "apply" else ActionKind.host_restore
            if not r["ok"]:
                log.warning("host %s could not %s VM %s: %s", host, verb, r["uuid"], r["error"])
            rows.append(
                {
                    "customer_id": owners.get(r["uuid"]),
                    "host_id": host_id,
                    "kind": kind.value,
                    "status": (ActionStatus.ok if r["ok"] else ActionStatus.failed).value,
                    "dry_run": dry,
                    "before": json.dumps({"vm": r["uuid"], **r["before"]}),
                    "after": json.dumps({"vm": r["uuid"], **r["after"]}),
                    "reason": (r["error"] or "")
                    + f" (plan of {generated_s}, reported by host {host})",
                }
            )
        conn.execute(insert(_actions), rows)
    return len(rows)
