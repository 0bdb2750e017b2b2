"""Customers by name: every command and route that takes a customer's name turns it into the
ledger's id here, and refuses a name the ledger has never seen the same way.

A customer is named by its project uuid (the ledger's key, however spelled: with or without
dashes, in any case) or, where the ledger knows it, by
the project's name (``customers.display_name``, from Keystone or the Nova metadata): people
know their projects by name. The uuid wins when a string is both; a project name that two
customers share (projects in different domains) is refused, naming their uuids.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import Connection, select

from gmd import GmdError
from gmd.ledger_schema.tables import customers as _customers, hosts as _hosts
from gmd.wire import canonical_customer


class UnknownCustomer(GmdError, LookupError):
    """Customers the ledger has never seen (their names in ``names``)."""

    def __init__(self, *names: str, detail: str | None = None) -> None:
        self.names = names
        listed = ", ".join(repr(n) for n in names)
        verb = "is" if len(names) == 1 else "are"
        super().__init__(
            detail or f"customer{'s' * (len(names) != 1)} {listed} {verb} not in the ledger"
        )


def customer_id(conn: Connection, name: str) -> int:
    """The id of customer ``name`` (uuid or project name); :class:`UnknownCustomer` if the
    ledger has never seen it."""
    return customer_ids(conn, [name])[name]


class UnknownHost(GmdError, LookupError):
    """A host the ledger has never had a batch from."""


def require_host(conn: Connection, name: str) -> None:
    """:class:`UnknownHost` unless the ledger knows host ``name``."""
    found = conn.execute(select(_hosts.c.id).where(_hosts.c.name == name)).first()
    if found is None:
        raise UnknownHost(f"host {name!r} is not in the ledger (no batch came from it)")


def customer_uuid(conn: Connection, name: str) -> str:
    """The uuid (the ledger's name) of customer ``name``, given as uuid or project name;
    :class:`UnknownCustomer` if the ledger has never seen it."""
    cid = customer_id(conn, name)
    return str(conn.execute(select(_customers.c.name).where(_customers.c.id == cid)).scalar_one())


def customer_ids(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    """Name → id for each name; :class:`UnknownCustomer` naming every name not found."""
    if not names:
        return {}
    # A project id however spelled (dashes, upper case) is the ledger's one spelling.
    spelled = {n: canonical_customer(n) for n in names}
    wanted = set(names)
    rows = conn.execute(
        select(_customers.c.name, _customers.c.id).where(
            _customers.c.name.in_(wanted | set(spelled.values()))
        )
    )
    stored = {str(name): int(cid) for name, cid in rows}
    found = {}
    for n in wanted:
        cid = stored.get(n, stored.get(spelled[n]))
        if cid is not None:
            found[n] = cid
    rest = wanted - found.keys()
    if rest:
        by_project: dict[str, list[tuple[str, int]]] = {}
        for uuid, shown, cid in conn.execute(
            select(_customers.c.name, _customers.c.display_name, _customers.c.id).where(
                _customers.c.display_name.in_(rest)
            )
        ):
            by_project.setdefault(str(shown), []).append((str(uuid), int(cid)))
        for shown, matches in by_project.items():
            if len(matches) > 1:
                uuids = ", ".join(sorted(u for u, _ in matches))
                raise UnknownCustomer(
                    shown,
                    detail=f"project name {shown!r} names {len(matches)} customers ({uuids});"
                    " give the uuid",
                )
            found[shown] = matches[0][1]
    missing = [n for n in dict.fromkeys(names) if n not in found]
    if missing:
        raise UnknownCustomer(*missing)
    return {n: found[n] for n in names}


def display_names(conn: Connection) -> dict[int, str]:
    """Customer id → project name, for the customers whose name the ledger knows."""
    return {
        int(cid): str(shown)
        for cid, shown in conn.execute(
            select(_customers.c.id, _customers.c.display_name).where(
                _customers.c.display_name.is_not(None)
            )
        )
    }


def log_names(conn: Connection, ids: Collection[int]) -> dict[int, str]:
    """How the daemon's log names customers ``ids``: by project name where the ledger knows
    it, with the uuid beside it (project names may repeat across domains), else by uuid."""
    if not ids:
        return {}
    rows = conn.execute(
        select(_customers.c.id, _customers.c.name, _customers.c.display_name).where(
            _customers.c.id.in_(set(ids))
        )
    )
    return {
        int(cid): str(uuid) if shown is None else f"{shown} ({uuid})" for cid, uuid, shown in rows
    }
