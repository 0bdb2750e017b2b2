"""Every host and what it can hold a VM to, as its agent last said (``gmd-admin hosts``,
``GET /v1/hosts``): the operators' view of where throttling works and, where it does not, why.

A host the ledger knows that never said anything (an agent older than its knobs, or one that
does not enforce) is listed with its knobs unknown; a host that said something and sent no
batch yet is listed too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from gmd.columns import Column
from gmd.common.timespec import iso
from gmd.daemon.ledger.capabilities import every_host
from gmd.ledger_schema.tables import hosts as _hosts, organizations as _orgs
from gmd.wire import Knob, KnobSupport

_MARK = {KnobSupport.supported: "yes", KnobSupport.unsupported: "no", KnobSupport.unknown: "?"}

HOST_COLUMNS = (
    Column("host", "Host", None, "left"),
    Column("owner", "Owner", None, "left"),
    Column("last_seen", "Last batch", None, "left"),
    Column("backend", "Backend", None, "left"),
    Column("cgroup", "Cgroup", None, "left"),
    Column("disks", "Disks", None, "left"),
    *(Column(k.value, k.words, None, "left") for k in Knob),
    Column("missing", "Why not", None, "left"),
    Column("reported", "Said", None, "left"),
)


def hosts(conn: Connection, host: str | None = None) -> list[dict[str, Any]]:
    """One row per host (``host``: that one only), by name: its owner and last batch from the
    ledger, and per knob ``yes``, ``no`` or ``?`` with the reasons of the missing ones; the
    whole of what it said under ``capabilities`` (None: nothing)."""
    query = select(_hosts.c.name, _hosts.c.last_seen_s, _orgs.c.name.label("owner")).join(
        _orgs, _orgs.c.id == _hosts.c.organization_id
    )
    if host is not None:
        query = query.where(_hosts.c.name == host)
    known = {r.name: r for r in conn.execute(query)}
    said = every_host(conn, host)
    rows = []
    for name in sorted(set(known) | set(said)):
        seen, word = known.get(name), said.get(name)
        row: dict[str, Any] = {
            "host": name,
            "owner": seen.owner if seen is not None else None,
            "last_seen": iso(seen.last_seen_s) if seen is not None and seen.last_seen_s else None,
        }
        if word is None:
            row.update(backend=None, cgroup=None, disks="", missing="", reported=None)
            row.update({k.value: "?" for k in Knob})
            row["capabilities"] = None
        else:
            caps = word.capabilities
            row.update(
                backend=caps.backend,
                cgroup=caps.cgroup,
                disks=", ".join(f"{d} [{s}]" for d, s in caps.schedulers.items()),
                missing="; ".join(
                    f"{k.knob.value}: {k.reason}"
                    for k in caps.knobs
                    if k.reason and k.support != KnobSupport.supported
                ),
                reported=iso(word.reported_at.timestamp()),
            )
            row.update({k.value: _MARK[caps.support(k).support] for k in Knob})
            row["capabilities"] = caps.model_dump(mode="json")
        rows.append(row)
    return rows
