"""A known host's batch stored by one statement (PostgreSQL): what it stores is what the
general path stores, and every batch it cannot store whole falls to the general path, which
answers it as it always has.

Each test counts SQLAlchemy's statements to know which path a batch took: the one statement
runs on the driver, past SQLAlchemy, so a batch it stored shows none.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from gmd.daemon.ingest.parse import record_of
from gmd.daemon.ingest.record import BatchRecord, CapacityConflict, KeyReused
from gmd.daemon.ingest.store import LedgerStore
from gmd.ledger_schema import migrate
from gmd.wire import SampleBatch
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    batch,
    fresh_postgres_database,
    kill,
    random_vms,
)

HOST = HostSpec("cmp-1")
VMS = 6
OWNERS = ["a", "b", "a", "c", "b", "a"]


@pytest.fixture
def engines(postgres_server_url: str) -> Iterator[tuple[sa.Engine, sa.Engine]]:
    """Two fresh ledgers: one for the stores under test, one for a store that takes the
    general path only."""
    with (
        fresh_postgres_database(postgres_server_url) as one,
        fresh_postgres_database(postgres_server_url) as two,
    ):
        made = [migrate.engine_for(url) for url in (one, two)]
        try:
            for engine in made:
                migrate.upgrade(engine)
            yield made[0], made[1]
        finally:
            for engine in made:
                engine.dispose()


def record(start_s: int, seed: int, host: HostSpec = HOST, key: str | None = None) -> BatchRecord:
    uuids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"{host.name}/{k}")) for k in range(VMS)]
    vms = random_vms(np.random.default_rng(seed), host, uuids, OWNERS)
    body = batch(host, start_s, vms, key=key or f"{host.name}/{start_s}/{seed}")
    body["host_cpu_s"] = 30.0 + seed
    return record_of(SampleBatch.model_validate(body))


class Statements:
    """SQLAlchemy's statements on an engine, counted."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_args: Any) -> None:
        self.count += 1


def general(engine: sa.Engine) -> LedgerStore:
    store = LedgerStore(engine, lambda _host: "operator")
    store.one_statement = None  # the reference: the general path only
    return store


def ledger(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """What the ledger holds, without the ids and times only the database chooses."""
    queries = {
        "batches": "SELECT key, digest, samples, late, state, host_cpu_s, unverified,"
        " interval_id FROM batches ORDER BY key",
        "samples": "SELECT b.key, v.uuid, c.name, s.interval_id, s.late, s.cpu_s,"
        " s.memory_byte_s, s.disk_read_bytes, s.disk_write_bytes, s.network_rx_bytes,"
        " s.network_tx_bytes, s.flavor_vcpus, s.flavor_memory_bytes,"
        " s.flavor_disk_bytes_per_s, s.flavor_network_bytes_per_s"
        " FROM samples s JOIN batches b ON b.id = s.batch_id JOIN vms v ON v.id = s.vm_id"
        " JOIN customers c ON c.id = s.customer_id ORDER BY b.key, v.uuid",
        "host_intervals": "SELECT h.name, i.interval_id, i.cpu_cores, i.memory_bytes,"
        " i.disk_bytes_per_s, i.network_bytes_per_s FROM host_intervals i"
        " JOIN hosts h ON h.id = i.host_id ORDER BY 1, 2",
        "hosts": "SELECT name, last_seen_s FROM hosts ORDER BY name",
    }
    with engine.connect() as conn:
        return {name: [tuple(r) for r in conn.execute(sa.text(q))] for name, q in queries.items()}


def test_a_known_hosts_batch_is_one_statement_storing_what_the_general_path_stores(
    engines: tuple[sa.Engine, sa.Engine],
) -> None:
    steady_engine, general_engine = engines
    store, reference = LedgerStore(steady_engine, lambda _host: "operator"), general(general_engine)
    counted = Statements(steady_engine)
    first, second = aligned_past(4), aligned_past(3)
    # The first batch of each interval makes it (the general path); a second host's batch in
    # the same interval, and the first host's next one, are known hosts' batches.
    other = HostSpec("cmp-2", cpu_cores=32)
    stream = [
        (record(first, 1), 1000.0),
        (record(first, 2, other), 1001.0),
        (record(second, 3, other), 1002.0),
        (record(second, 4), 1003.0),
        (record(second, 5, key="cmp-1/again"), 1004.0),  # a second batch, same interval
    ]
    taken = []
    for rec, now_s in stream:
        before = counted.count
        assert store.ingest(rec, now_s).status == "accepted"
        assert reference.ingest(rec, now_s).status == "accepted"
        taken.append(counted.count - before)
    assert taken[3:] == [0, 0], f"SQLAlchemy statements per batch: {taken}"
    assert min(taken[:3]) > 0
    assert ledger(steady_engine) == ledger(general_engine)
    assert len(ledger(steady_engine)["samples"]) == 5 * VMS


@pytest.fixture
def known(engines: tuple[sa.Engine, sa.Engine]) -> tuple[sa.Engine, LedgerStore, int]:
    """A ledger where host cmp-1 has posted two intervals, a store that remembers it, and the
    start of the later interval (made: a known host's next batch in it is one statement)."""
    engine, _ = engines
    store = LedgerStore(engine, lambda _host: "operator")
    start = aligned_past(3)
    for rec in (record(start - 60, 1), record(start, 2)):
        assert store.ingest(rec).status == "accepted"
    return engine, store, start


def test_a_retry_or_a_reused_key_falls_to_the_general_path(
    known: tuple[sa.Engine, LedgerStore, int],
) -> None:
    engine, store, start = known
    counted = Statements(engine)
    stored = record(start, 4, key="cmp-1/steady")
    assert store.ingest(stored).status == "accepted"
    assert counted.count == 0
    held = ledger(engine)
    assert store.ingest(stored).status == "duplicate"
    with pytest.raises(KeyReused):
        store.ingest(record(start, 5, key=stored.key))
    with pytest.raises(KeyReused):  # the same key for another interval
        store.ingest(record(start - 60, 2, key=stored.key))
    assert ledger(engine) == held


def test_another_capacity_stores_nothing_and_a_rounding_of_it_is_the_same(
    known: tuple[sa.Engine, LedgerStore, int],
) -> None:
    engine, store, start = known
    held = ledger(engine)
    counted = Statements(engine)
    bigger = HostSpec(HOST.name, cpu_cores=HOST.cpu_cores * 2)
    with pytest.raises(CapacityConflict, match="cpu_cores 32 \\(first batch: 16\\)"):
        store.ingest(record(start, 3, bigger))
    assert counted.count > 0  # the general path words it
    assert ledger(engine) == held
    # The same capacity but for the last bits of a float: not the same in SQL, the same to
    # the general path, which stores the batch.
    nudged = HostSpec(HOST.name, cpu_cores=HOST.cpu_cores * (1 + 1e-15))
    assert store.ingest(record(start, 4, nudged)).status == "accepted"
    assert len(ledger(engine)["batches"]) == len(held["batches"]) + 1


def test_a_batch_after_its_interval_closed_is_stored_late(
    known: tuple[sa.Engine, LedgerStore, int],
) -> None:
    engine, store, start = known
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE intervals SET state = 'closed' WHERE id = :s"), {"s": start})
    counted = Statements(engine)
    result = store.ingest(record(start, 3, key="cmp-1/late"))
    assert (result.status, result.samples, result.late) == ("accepted", VMS, VMS)
    assert counted.count == 0
    with engine.connect() as conn:
        late = conn.execute(
            sa.text(
                "SELECT b.late, count(*) FILTER (WHERE s.late) FROM batches b"
                " JOIN samples s ON s.batch_id = b.id WHERE b.key = 'cmp-1/late' GROUP BY 1"
            )
        ).one()
    assert tuple(late) == (True, VMS)


def test_a_dead_pooled_connection_is_dropped_and_the_batch_stored_once(
    known: tuple[sa.Engine, LedgerStore, int],
) -> None:
    engine, store, start = known
    assert kill(engine) >= 1  # every server process of the store's pool
    assert store.ingest(record(start, 3, key="cmp-1/after")).status == "accepted"
    keys = [row[0] for row in ledger(engine)["batches"]]
    assert keys.count("cmp-1/after") == 1


@pytest.fixture
def ledger_engine(database_url: str) -> Iterator[sa.Engine]:
    """A fresh ledger on each database."""
    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine)
        yield engine
    finally:
        engine.dispose()


def test_a_restarted_daemon_recalls_the_hosts_and_stores_their_next_batches_the_same(
    ledger_engine: sa.Engine,
) -> None:
    """Its first batches then cost what a running daemon's cost (one statement on
    PostgreSQL), not a look-up of every VM; a host whose VMs moved since is not recalled."""
    engine = ledger_engine
    first, second = aligned_past(4), aligned_past(3)
    other = HostSpec("cmp-2", cpu_cores=32)
    running = LedgerStore(engine, lambda _host: "operator")
    for rec in (record(first, 1), record(first, 2, other), record(second, 3, other)):
        assert running.ingest(rec).status == "accepted"
    restarted, fresh = (LedgerStore(engine, lambda _host: "operator") for _ in range(2))
    recalled = restarted.recall()
    assert (recalled.hosts, recalled.vms) == (2, 2 * VMS)
    # (Each process checks once that the day's partitions are there.)
    for store in (restarted, fresh):
        assert store.ingest(record(second, 7, other, key=f"cmp-2/{id(store)}")).status == "accepted"
    counted = Statements(engine)
    assert restarted.ingest(record(second, 4, key="cmp-1/recalled")).status == "accepted"
    by_recalled = counted.count
    assert fresh.ingest(record(second, 5, key="cmp-1/fresh")).status == "accepted"
    by_fresh = counted.count - by_recalled
    if engine.dialect.name == "postgresql":
        assert by_recalled == 0
    assert by_recalled < by_fresh
    held = ledger(engine)
    names = {row[0]: row[2] for row in held["samples"]}  # batch key → a customer
    assert names["cmp-1/recalled"] in OWNERS
    recalled_rows = sorted(r[1:3] for r in held["samples"] if r[0] == "cmp-1/recalled")
    fresh_rows = sorted(r[1:3] for r in held["samples"] if r[0] == "cmp-1/fresh")
    assert recalled_rows == fresh_rows and len(recalled_rows) == VMS
    # One of cmp-2's VMs moves to cmp-1: cmp-2's last list is stale, and is not recalled.
    moved = record(second, 6, other)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE vms SET host_id = (SELECT id FROM hosts WHERE name = 'cmp-1')"
                " WHERE uuid = :u"
            ),
            {"u": moved.vm_uuids[0]},
        )
    again = LedgerStore(engine, lambda _host: "operator").recall()
    assert (again.hosts, again.vms) == (1, VMS)


def test_vms_marked_seen_in_an_older_period_are_marked_by_the_next_batch(
    ledger_engine: sa.Engine,
) -> None:
    engine = ledger_engine
    start = aligned_past(3)
    running = LedgerStore(engine, lambda _host: "operator")
    running.ingest(record(start - 60, 1))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE vms SET last_seen_s = last_seen_s - 3 * 86400"))
    restarted = LedgerStore(engine, lambda _host: "operator")
    assert restarted.recall().hosts == 1
    assert restarted.ingest(record(start, 2)).status == "accepted"
    with engine.connect() as conn:
        seen = conn.execute(sa.text("SELECT min(last_seen_s) FROM vms")).scalar_one()
    assert seen == start


def test_the_daemon_imports_without_psycopg() -> None:
    """psycopg comes with the ``postgres`` extra: a SQLite-only installation runs the daemon,
    so the one-statement write, which speaks to psycopg, is imported only for PostgreSQL."""
    code = "import sys; sys.modules['psycopg'] = None; import gmd.daemon.cli, gmd.daemon.api.app"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_statements_are_prepared_on_the_server_only_when_asked(
    engines: tuple[sa.Engine, sa.Engine],
) -> None:
    """A statement run again and again is not prepared (its generic plan, made for the tables
    as they were, would be kept for the connection's life), while the one statement, which
    asks, is (psycopg's ``prepare_threshold=None`` would have refused it too)."""
    engine = engines[0]
    prepared = sa.text("SELECT statement FROM pg_prepared_statements")
    with engine.connect() as conn:
        for _ in range(10):
            conn.execute(sa.text("SELECT id FROM vms WHERE uuid = :u"), {"u": "x"}).all()
        assert conn.execute(prepared).scalars().all() == []
        driver = conn.connection.driver_connection
        assert driver is not None
        for _ in range(2):
            driver.execute("SELECT count(*) FROM vms WHERE id = %s", (1,), prepare=True)
        assert len(conn.execute(prepared).scalars().all()) == 1
