"""Writing what hosts report back into the enforcement log (``enforcement_actions``).

A host reports only on its own VMs: those the ledger places on it — last reported by it, or
in its latest accounted interval (:func:`~gmd.daemon.enforce.plans.running_vms`), which is
where its plan comes from. A result about any other VM is not recorded (it would land in
another customer's log): it is logged, and named in the receipt's ``ignored``, and the rest
of the report is recorded. Rows are stamped with the daemon's clock when the report arrives.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert, or_, select

from gmd.common.timespec import iso_as_sent
from gmd.daemon.enforce.plans import recent_window, running_vms
from gmd.ledger_schema.kinds import ActionKind, ActionStatus
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import (
    actions as _actions,
    hosts as _hosts,
    vms as _vms,
)
from gmd.wire import Knob, KnobOutcome

log = logging.getLogger(__name__)

RESTORE_ALL = "gmd-agent --restore-all"


@dataclass(frozen=True)
class Recorded:
    """What became of a report: rows written, and the VMs refused as not on the host."""

    rows: int
    ignored: list[str] = field(default_factory=list)


def record_host_report(
    engine: Engine,
    host: str,
    generated_s: int,
    results: Sequence[dict[str, Any]],
    *,
    at_s: float,
    contention_intervals: int,
    restore_all: bool = False,
) -> Recorded:
    """One action row per VM result on the host (kind ``host_apply``/``host_restore``), and
    for ``restore_all`` one ``host_restore`` row for the host itself (no customer, ``after``
    ``{"all": true}``: everything gmd had changed there is back). Failures are logged here
    too, since they mean a customer is not throttled as decided."""
    if not results and not restore_all:
        return Recorded(0)
    at = datetime.fromtimestamp(at_s, UTC)
    with writer(engine).begin() as conn:
        host_id = conn.execute(select(_hosts.c.id).where(_hosts.c.name == host)).scalar()
        owners = _owners_on(conn, host_id, results, contention_intervals)
        ignored = sorted({r["uuid"] for r in results if r["uuid"] not in owners})
        if ignored:
            log.warning(
                "host %s reported on %d VM(s) that do not run on it as far as the ledger"
                " knows, not recorded: %s",
                host,
                len(ignored),
                ", ".join(ignored[:10]) + (" …" if len(ignored) > 10 else ""),
            )
        source = RESTORE_ALL if restore_all else f"plan of {iso_as_sent(generated_s)}"
        rows = [
            _vm_row(r, owners[r["uuid"]], host, host_id, at, source)
            for r in results
            if r["uuid"] in owners
        ]
        if restore_all:
            rows.append(
                {
                    "at": at,
                    "customer_id": None,
                    "host_id": host_id,
                    "kind": ActionKind.host_restore.value,
                    "status": ActionStatus.ok.value,
                    "dry_run": False,
                    "before": None,
                    "after": json.dumps({"all": True}),
                    "reason": f"{RESTORE_ALL} on host {host}: every VM gmd had changed there is"
                    f" back to its original settings ({len(results)} reported)",
                    "knobs": None,
                }
            )
        if rows:
            conn.execute(insert(_actions), rows)
    return Recorded(len(rows), ignored)


def _owners_on(
    conn: Connection, host_id: int | None, results: Sequence[dict[str, Any]], intervals: int
) -> dict[str, int]:
    """VM uuid → its customer id, of the reported VMs the ledger has on the host (or saw running
    there in the last ``intervals`` intervals): a host reports only on its own VMs."""
    if host_id is None or not results:
        return {}
    running = running_vms(recent_window(conn, intervals), host_id).subquery()
    return dict(
        conn.execute(
            select(_vms.c.uuid, _vms.c.customer_id).where(
                _vms.c.uuid.in_([r["uuid"] for r in results]),
                or_(_vms.c.host_id == host_id, _vms.c.id.in_(select(running.c.vm_id))),
            )
        ).all()
    )


def _vm_row(
    r: dict[str, Any], customer_id: int, host: str, host_id: int | None, at: datetime, source: str
) -> dict[str, Any]:
    """The action row of one VM's result (logged when it failed: a customer is then not
    throttled as decided)."""
    verb = r["action"].removeprefix("would_")
    kind = ActionKind.host_apply if verb == "apply" else ActionKind.host_restore
    if not r["ok"]:
        log.warning("host %s could not %s VM %s: %s", host, verb, r["uuid"], r["error"])
    return {
        "at": at,
        "customer_id": customer_id,
        "host_id": host_id,
        "kind": kind.value,
        "status": (ActionStatus.ok if r["ok"] else ActionStatus.failed).value,
        "dry_run": r["action"].startswith("would_"),
        "before": json.dumps({"vm": r["uuid"], **r["before"]}),
        "after": json.dumps({"vm": r["uuid"], **r["after"]}),
        "reason": (r["error"] or _lacking(r)) + f" ({source}, reported by host {host})",
        "knobs": knobs_column(r.get("knobs") or []),
    }


def knobs_column(knobs: Sequence[dict[str, Any]]) -> str | None:
    """A result's knobs as the ``knobs`` column keeps them: ``{"cpu_cap": ["applied", ""]}``."""
    if not knobs:
        return None
    return json.dumps({str(k["knob"]): [str(k["outcome"]), k["detail"]] for k in knobs})


def _lacking(result: dict[str, Any]) -> str:
    """An apply that worked but for knobs the host lacks, in words for the log's reason."""
    lacking = [k for k in result.get("knobs") or [] if k["outcome"] == KnobOutcome.unsupported]
    return "; ".join(
        f"{Knob(k['knob']).words} not supported on this host: {k['detail']}" for k in lacking
    )
