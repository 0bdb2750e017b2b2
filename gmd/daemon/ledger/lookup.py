"""Customers by name: every command and route that takes a customer's name turns it into the
ledger's id here, and refuses a name the ledger has never seen the same way."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, select

from gmd.daemon.ledger.tables import customers as _customers


class UnknownCustomer(LookupError):
    """Customers the ledger has never seen (their names in ``names``)."""

    def __init__(self, *names: str) -> None:
        self.names = names
        listed = ", ".join(repr(n) for n in names)
        verb = "is" if len(names) == 1 else "are"
        super().__init__(f"customer{'s' * (len(names) != 1)} {listed} {verb} not in the ledger")


def customer_id(conn: Connection, name: str) -> int:
    """The id of customer ``name``; :class:`UnknownCustomer` if the ledger has never seen it."""
    cid = conn.execute(select(_customers.c.id).where(_customers.c.name == name)).scalar()
    if cid is None:
        raise UnknownCustomer(name)
    return int(cid)


def customer_ids(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    """Name → id for each name; :class:`UnknownCustomer` naming every name not found."""
    if not names:
        return {}
    rows = conn.execute(
        select(_customers.c.name, _customers.c.id).where(_customers.c.name.in_(set(names)))
    )
    found = {str(name): int(cid) for name, cid in rows}
    missing = [n for n in dict.fromkeys(names) if n not in found]
    if missing:
        raise UnknownCustomer(*missing)
    return {n: found[n] for n in names}
