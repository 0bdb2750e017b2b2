"""What each host said it can set (``host_capabilities``): kept whole, one row a host, for the
plans (which plan with what works there), ``gmd-admin hosts`` and the read API.

A host's word is its own: it says what its kernel and libvirt let it set, which nothing
central can check, and which only ever makes its plans gentler (a knob it says it lacks is
replaced by one it has, or left out). Its size is bounded by the wire model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, delete, insert, select

from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import host_capabilities as _caps
from gmd.wire import HostCapabilities


@dataclass(frozen=True)
class Said:
    """A host's latest word on its knobs, and when the daemon heard it."""

    host: str
    capabilities: HostCapabilities
    reported_at: datetime


def record(engine: Engine, host: str, caps: HostCapabilities, at_s: float) -> bool:
    """Keep ``caps`` as ``host``'s; whether it differs from what the host said before
    (the probe time aside)."""
    document = caps.model_dump_json()
    with writer(engine).begin() as conn:
        before = conn.execute(select(_caps.c.document).where(_caps.c.host == host)).scalar()
        changed = before is None or _knobs_of(before) != _knobs_of(document)
        conn.execute(delete(_caps).where(_caps.c.host == host))
        conn.execute(
            insert(_caps).values(
                host=host,
                reported_at=datetime.fromtimestamp(at_s, UTC),
                probed_s=caps.probed_s,
                document=document,
            )
        )
    return changed


def _knobs_of(document: str) -> object:
    doc = json.loads(document)
    doc.pop("probed_s", None)
    return doc


def _parse(host: str, document: str, at: datetime) -> Said | None:
    try:
        return Said(host, HostCapabilities.model_validate_json(document), at)
    except ValidationError:
        return None  # written by another version of gmd: as if the host had said nothing


def of_host(conn: Connection, host: str) -> Said | None:
    """What ``host`` last said, or None."""
    return every_host(conn, host).get(host)


def every_host(conn: Connection, host: str | None = None) -> dict[str, Said]:
    """Every host's last word, by host name (``host``: that one's only)."""
    query = select(_caps.c.host, _caps.c.document, _caps.c.reported_at)
    if host is not None:
        query = query.where(_caps.c.host == host)
    out = {}
    for row in conn.execute(query):
        said = _parse(row.host, row.document, row.reported_at)
        if said is not None:
            out[row.host] = said
    return out
