"""The federation's standings and history, as this cloud's gmd-broker filed them in the ledger
(docs/federation.md): ``gmd-admin federation`` and ``GET /v1/federation``. Neither reads
ZooKeeper: the broker copies the standings into the ledger every few seconds (``as_of`` says
when), so that the readers of a cloud's figures need nothing but its ledger."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from gmd.columns import Column
from gmd.common.timespec import iso
from gmd.ledger_schema.tables import (
    federation_events as _events,
    federation_standings as _standings,
)

STANDING_COLUMNS = (
    Column("org", "Organization", None, "left"),
    Column("contributed", "Lent (core·s)", 1),
    Column("used", "Borrowed (core·s)", 1),
    Column("priority", "Priority", 1),
    Column("queued", "Queued", None),
    Column("running", "Running", None),
    Column("lent", "Lent now", None),
    Column("borrowed", "Borrowed now", None),
    Column("sites", "Sites", None),
)
EVENT_COLUMNS = (
    Column("at", "At", None, "left"),
    Column("site", "Site", None, "left"),
    Column("choice", "Decision", None, "left"),
    Column("request", "Request", None, "left"),
    Column("org", "Organization", None, "left"),
    Column("request_site", "From site", None, "left"),
    Column("node", "Node", None, "left"),
    Column("cores", "Cores", 2),
    Column("core_seconds", "Core·s", 1),
    Column("counted", "Counted", None, "left"),
)


def standings(conn: Connection) -> dict[str, Any]:
    """Every organisation by priority, highest first, with when the broker read them."""
    rows = [
        dict(r._mapping)
        for r in conn.execute(
            select(_standings).order_by(_standings.c.priority.desc(), _standings.c.org)
        )
    ]
    as_of = max((float(r.pop("as_of_s")) for r in rows), default=None)
    observers = sorted({str(r.pop("observer")) for r in rows})
    return {
        "as_of": None if as_of is None else iso(as_of),
        "as_of_s": as_of,
        "observer": observers[0] if observers else None,
        "organizations": rows,
    }


def events(
    conn: Connection,
    *,
    from_s: float | None = None,
    to_s: float | None = None,
    org: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The broker's decisions in ``[from_s, to_s)``, oldest first; with ``limit``, the newest
    ``limit`` of them; ``org``: only requests of that organisation."""
    query = select(_events).order_by(_events.c.at_s.desc(), _events.c.id.desc())
    if from_s is not None:
        query = query.where(_events.c.at_s >= from_s)
    if to_s is not None:
        query = query.where(_events.c.at_s < to_s)
    if org is not None:
        query = query.where(_events.c.org == org)
    if limit is not None:
        query = query.limit(limit)
    out = []
    for r in conn.execute(query):
        row = dict(r._mapping)
        row.pop("id")
        row.pop("seq")
        row["at"] = iso(float(row.pop("at_s")))
        out.append(row)
    out.reverse()
    return out
