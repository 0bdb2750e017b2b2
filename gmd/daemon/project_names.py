"""Customers' project names, read from Keystone and kept in the ledger beside their uuids.

A customer is an OpenStack project, keyed by its uuid (what the Nova metadata of a domain
names); people know projects by name. The daemon reads every project's name from Keystone on
its own schedule (``[enforcement.quota] names_every_s``) and stores it in
``customers.display_name``; gmd-admin shows it from the ledger, so reports need no Keystone
round trip and still show names when the cloud is away. A project renamed in Keystone is
renamed at the next refresh; a name an agent reported from the Nova metadata
(``display_source`` "nova") is replaced by Keystone's, never the other way round.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy import Engine, select, update

from gmd.ledger_schema.kinds import NameSource
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import customers as _customers
from gmd.openstack.client import (
    MalformedAnswer,
    OpenStackClient,
    OpenStackError,
    OpenStackErrorKind,
    checked,
)
from gmd.wire import canonical_customer

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger(__name__)


class ProjectNames(OpenStackClient):
    """Lists the cloud's projects (id → name) with the clouds.yaml account of the quotas."""

    subject = "project names"
    of = "of "
    hints: ClassVar[dict[OpenStackErrorKind, str]] = {
        OpenStackErrorKind.forbidden: "not allowed by Keystone's policy: listing every project"
        " needs a reader or admin role",
    }

    def projects(self) -> dict[str, str]:
        def read(conn: Connection) -> dict[str, str]:
            names: dict[str, str] = {}
            url: str | None = "/projects"
            while url:
                body = checked(conn.identity.get(url))
                items = body.get("projects") if isinstance(body, dict) else None
                if not isinstance(items, list):
                    raise MalformedAnswer("Keystone's answer has no list 'projects'")
                for item in items:
                    if isinstance(item, dict) and item.get("id") and item.get("name"):
                        names[str(item["id"]).lower()] = str(item["name"])[:255]
                links = body.get("links") if isinstance(body, dict) else None
                url = links.get("next") if isinstance(links, dict) else None
            return names

        return self.call("list", "every project", read)


def store_names(
    engine: Engine, names: dict[str, str], source: NameSource = NameSource.keystone
) -> int:
    """Write the names of customers whose uuid is among ``names``; returns how many changed.

    A Nova-metadata name never replaces one from Keystone.
    """
    with engine.connect() as conn:
        customers = conn.execute(
            select(
                _customers.c.id,
                _customers.c.name,
                _customers.c.display_name,
                _customers.c.display_source,
            )
        ).all()
    changes = []
    for cid, name, shown, shown_source in customers:
        wanted = names.get(canonical_customer(name)) or names.get(name)
        if wanted is None or (wanted == shown and source == shown_source):
            continue
        if source == NameSource.nova and shown_source == NameSource.keystone:
            continue
        changes.append((cid, wanted))
    if changes:
        with writer(engine).begin() as conn:
            for cid, wanted in changes:
                conn.execute(
                    update(_customers)
                    .where(_customers.c.id == cid)
                    .values(display_name=wanted, display_source=source)
                )
    return len(changes)


class NameRefresher:
    """The daemon's job: Keystone's project names into the ledger, failures logged, not raised."""

    def __init__(self, engine: Engine, client: ProjectNames) -> None:
        self.engine, self.client = engine, client

    def run(self) -> int:
        try:
            names = self.client.projects()
        except OpenStackError as exc:
            log.warning("project names not refreshed: %s", exc)
            return 0
        changed = store_names(self.engine, names)
        if changed:
            log.info("project names: %d customer(s) named from Keystone", changed)
        return changed

    def close(self) -> None:
        self.client.close()
