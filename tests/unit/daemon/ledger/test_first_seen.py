"""A batch naming VMs and customers this process has not seen (the general path's look-up),
on both databases: each kind is looked up once, before anything is made, and ``admit`` told
how many rows the batch would make; the rows it makes are made named and seen, not looked up,
named or marked again; the rows the ledger had are found, named and marked, not made."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from gmd.daemon.ingest.parse import record_of
from gmd.daemon.ingest.record import BatchRecord
from gmd.daemon.ingest.store import LedgerStore
from gmd.ledger_schema import migrate
from gmd.wire import SampleBatch
from tests.support.daemon_support import HostSpec, aligned_past, batch, random_vms

HOST = HostSpec("cmp-new")
UUIDS = [f"vm-{k}" for k in range(6)]
OWNERS = ["a", "b", "a", "c", "b", "a"]
NAMES = {"a": "Project A", "c": "Project C"}


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    made = migrate.engine_for(database_url)
    migrate.upgrade(made)
    yield made
    made.dispose()


class Statements:
    """SQLAlchemy's statements on an engine, as sent."""

    def __init__(self, engine: sa.Engine) -> None:
        self.sent: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self.sent.append(" ".join(statement.split()))

    def count(self, pattern: str) -> int:
        return sum(1 for s in self.sent if re.match(pattern, s, re.IGNORECASE))


def record(start_s: int, seed: int) -> BatchRecord:
    vms = random_vms(np.random.default_rng(seed), HOST, UUIDS, OWNERS)
    body = batch(HOST, start_s, vms, key=f"{HOST.name}/{start_s}")
    body["customer_names"] = NAMES
    return record_of(SampleBatch.model_validate(body))


def ingest_anew(engine: sa.Engine, start_s: int, seed: int) -> tuple[list[Any], Statements]:
    """The batch of ``start_s`` stored by a new store (a process that has cached nothing):
    what ``admit`` was told, and the statements sent."""
    told: list[tuple[int, int]] = []
    statements = Statements(engine)
    result = LedgerStore(engine, lambda _host: "operator").ingest(
        record(start_s, seed), admit=lambda c, v: told.append((c, v))
    )
    assert result.status == "accepted"
    return told, statements


def test_a_new_hosts_batch_looks_each_kind_up_once_and_makes_its_rows_named_and_seen(
    engine: sa.Engine,
) -> None:
    start_s = aligned_past(3)
    told, statements = ingest_anew(engine, start_s, 1)
    assert told == [(3, 6)]
    assert statements.count(r"SELECT .* FROM vms\b") == 1
    assert statements.count(r"SELECT .* FROM customers\b") == 1
    assert statements.count(r"INSERT INTO (vms|customers)\b.* RETURNING") == 2
    # made named and seen: nothing to update
    assert statements.count(r"UPDATE (vms|customers)\b") == 0, statements.sent
    with engine.connect() as conn:
        customers = conn.execute(
            sa.text(
                "SELECT name, display_name, display_source, last_seen_s FROM customers"
                " ORDER BY name"
            )
        ).all()
        vms = conn.execute(sa.text("SELECT last_seen_s FROM vms")).scalars().all()
    assert [tuple(c) for c in customers] == [
        ("a", "Project A", "nova", start_s),
        ("b", None, None, start_s),
        ("c", "Project C", "nova", start_s),
    ]
    assert vms == [start_s] * len(UUIDS)


def test_a_new_process_finds_the_rows_the_ledger_has_and_makes_none(engine: sa.Engine) -> None:
    start_s = aligned_past(3)
    LedgerStore(engine, lambda _host: "operator").ingest(record(start_s, 1))
    with engine.begin() as conn:  # renamed in Nova since; seen long ago
        conn.execute(sa.text("UPDATE customers SET display_name = 'old', last_seen_s = 0"))
        conn.execute(sa.text("UPDATE vms SET last_seen_s = 0"))
        ids = dict(conn.execute(sa.text("SELECT uuid, id FROM vms")).all())
    later = aligned_past(2)
    told, statements = ingest_anew(engine, later, 2)
    assert told == [(0, 0)]
    assert statements.count(r"INSERT INTO (vms|customers)\b") == 0, statements.sent
    assert statements.count(r"SELECT .* FROM vms\b") == 1
    with engine.connect() as conn:
        customers = conn.execute(
            sa.text("SELECT name, display_name, last_seen_s FROM customers ORDER BY name")
        ).all()
        vms = dict(conn.execute(sa.text("SELECT uuid, id FROM vms")).all())
        seen = conn.execute(sa.text("SELECT DISTINCT last_seen_s FROM vms")).scalars().all()
    assert vms == ids
    assert [tuple(c) for c in customers] == [
        ("a", "Project A", later),
        ("b", "old", later),
        ("c", "Project C", later),
    ]
    assert seen == [later]
