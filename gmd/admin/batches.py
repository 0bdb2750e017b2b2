"""The batches agents sent, and those accounting set aside: ``gmd-admin batches``.

Accounting quarantines a batch it cannot account (see :mod:`gmd.daemon.ledger.quarantine`);
this is where the operator finds them and why, newest first, before releasing or dropping
them. Listing by state reads only the batches that are not simply accepted (a partial index),
never the millions that are.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from gmd.common.timespec import iso
from gmd.ledger_schema.kinds import BatchState
from gmd.ledger_schema.tables import batches as _batches, hosts as _hosts, intervals as _intervals
from gmd.render import Column

COLUMNS = (
    Column("key", "Key", None, "left"),
    Column("host", "Host", None, "left"),
    Column("interval", "Interval", None, "left"),
    Column("received", "Received", None, "left"),
    Column("state", "State", None, "left"),
    Column("late", "Late", None, "left"),
    Column("samples", "VMs", None),
    Column("error", "Error", None, "left"),
)


def batch_rows(
    conn: Connection,
    *,
    states: tuple[BatchState, ...] | None = None,
    host: str | None = None,
    from_s: float | None = None,
    to_s: float | None = None,
    limit: int | None = 100,
) -> list[dict[str, Any]]:
    """Batches for intervals in ``[from_s, to_s)``, newest interval first, in ``states``
    (None: any), of ``host``."""
    query = (
        select(
            _batches.c.key,
            _hosts.c.name.label("host"),
            _intervals.c.start_s,
            _batches.c.received_at,
            _batches.c.state,
            _batches.c.late,
            _batches.c.samples,
            _batches.c.error,
        )
        .join(_hosts, _hosts.c.id == _batches.c.host_id)
        .join(_intervals, _intervals.c.id == _batches.c.interval_id)
        .order_by(_intervals.c.start_s.desc(), _batches.c.id.desc())
    )
    if states is not None:
        query = query.where(_batches.c.state.in_([str(s) for s in states]))
    if host is not None:
        query = query.where(_hosts.c.name == host)
    if from_s is not None:
        query = query.where(_intervals.c.start_s >= from_s)
    if to_s is not None:
        query = query.where(_intervals.c.start_s < to_s)
    if limit is not None:
        query = query.limit(limit)
    return [
        {
            "key": r.key,
            "host": r.host,
            "interval": iso(r.start_s),
            "received": r.received_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "state": str(r.state),
            "late": "yes" if r.late else "no",
            "samples": int(r.samples),
            "error": r.error,
        }
        for r in conn.execute(query)
    ]
