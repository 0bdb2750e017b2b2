"""Ingest over connections the database server dropped.

The engine does not ping a pooled connection before use (a round trip per batch at the end of
every interval); instead a batch whose connection turns out to be dead is retried on a new
one. These tests kill the daemon's server connections for real, between batches and in the
middle of one, and count what the ledger holds afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from gmd.daemon.ingest.parse import record_of
from gmd.daemon.ingest.store import LedgerStore, retryable
from gmd.ledger_schema import migrate
from gmd.wire import SampleBatch
from tests.support.daemon_support import HostSpec, aligned_past, batch, kill, random_vms

HOST = HostSpec("cmp-1")
VMS = [str(uuid.UUID(int=k + 1)) for k in range(5)]


@pytest.fixture
def engine(postgres_server_url: str) -> Iterator[sa.Engine]:
    """The daemon's engine on a fresh PostgreSQL database."""
    name = f"gmd_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = migrate.engine_for(postgres_server_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        migrate.upgrade(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def record(start_s: int, seed: int) -> Any:
    body = batch(HOST, start_s, random_vms(np.random.default_rng(seed), HOST, VMS, ["a"] * 5))
    body["key"] = f"{HOST.name}/{start_s}/{seed}"
    return record_of(SampleBatch.model_validate(body))


def stored(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (
            conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one(),
            conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one(),
        )


def test_a_batch_after_the_servers_connections_died_is_stored(engine: sa.Engine) -> None:
    store = LedgerStore(engine, lambda _host: "operator")
    assert store.ingest(record(aligned_past(3), 1)).status == "accepted"
    assert kill(engine) >= 1  # the pooled connection, idle, is gone
    assert store.ingest(record(aligned_past(2), 2)).status == "accepted"
    assert stored(engine) == (2, 10)


def test_a_connection_lost_in_the_middle_of_a_batch_is_retried_once_whole(
    engine: sa.Engine,
) -> None:
    store = LedgerStore(engine, lambda _host: "operator")
    assert store.ingest(record(aligned_past(3), 1)).status == "accepted"
    killed: list[int] = []

    # The samples travel by COPY, which SQLAlchemy does not see: the connection dies after the
    # statement before them (the host's capacity), so that the COPY is what finds it dead.
    @sa.event.listens_for(engine, "after_cursor_execute")
    def drop_before_the_samples(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "INSERT INTO host_intervals" in statement and not killed:
            killed.append(kill(engine, conn.connection.driver_connection.info.backend_pid))

    result = store.ingest(record(aligned_past(2), 2))
    assert killed == [1]  # the batch row was written, then the connection died
    assert (result.status, result.samples) == ("accepted", 5)
    assert stored(engine) == (2, 10)  # the retry stored it once, whole


def test_which_database_errors_are_retried() -> None:
    class Orig(Exception):
        def __init__(self, message: str, sqlstate: str | None = None) -> None:
            super().__init__(message)
            self.sqlstate = sqlstate

    def error(orig: Exception, invalidated: bool = False) -> DBAPIError:
        return DBAPIError("INSERT …", {}, orig, connection_invalidated=invalidated)

    assert retryable(error(Orig("server closed the connection unexpectedly"), True))
    assert retryable(error(Orig("deadlock detected", "40P01")))
    assert retryable(error(Orig("could not serialize access", "40001")))
    assert retryable(error(Orig("database is locked")))
    assert not retryable(error(Orig("value too long for type", "22001")))
