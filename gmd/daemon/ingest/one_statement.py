"""A known host's batch stored by one statement, in one round trip (PostgreSQL).

At the end of every interval each host posts its batch at once, and almost every one of them
is a host the daemon has seen before, listing the VMs it listed last time, in an interval
that exists. Such a batch needs no look-up, only its writes: the batch's row, the host's
capacity for the interval, the host seen, the samples. Sent as a transaction of three
statements and a COPY they cost six round trips and ~1.7 ms of the daemon's CPU under the
interpreter lock that every ingest thread shares (each round trip also waits to take the lock
back); as this one statement, in autocommit, one round trip on the driver, past SQLAlchemy's
execution machinery, which the batch needs nothing of.

The statement stores the batch only if it can store all of it as the general path would, and
otherwise stores nothing and returns no row: the caller then takes the general path
(:mod:`.batch_writer`), which tells a retry from a reused key,
makes a missing interval and words a capacity conflict. So the statement stores the batch
when, in its snapshot:

- the interval exists (locked ``FOR SHARE``, as the general path does: closing it waits), and
  the key is used by no batch;
- the host's capacity for the interval is this batch's: either no batch gave it yet (this one
  inserts it) or one gave exactly the same. A concurrent first batch of the same host and
  interval, which the snapshot cannot see, makes the capacity insert find its row and do
  nothing, and the batch is then not stored here (the general path compares the two).

A batch stored always has its capacity row, and a capacity row inserted always its batch: the
batch's insert has no ``ON CONFLICT``, so a concurrent batch with the same key fails the whole
statement (a unique violation, nothing stored), and the general path answers it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import Engine

from gmd.daemon.ingest.ids import LedgerIds, mark_period
from gmd.daemon.ingest.record import Admit, BatchRecord, IngestResult
from gmd.daemon.ledger import sample_store
from gmd.daemon.ledger.sample_store import BATCH_COLUMNS
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.models import PER_VM, SAMPLE_IDS, sample_batches
from gmd.ledger_schema.tables import batches, host_intervals, hosts, intervals
from gmd.wire import CAPACITY_FIELDS

log = logging.getLogger(__name__)


class _Array:
    """An array already in PostgreSQL's binary form (``sample_store.batch_arrays``), sent as
    one binary parameter."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _Int4Array(_Array):
    pass


class _Float8Array(_Array):
    pass


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        data: bytes = obj.data
        return data


class _Int4ArrayDumper(_ArrayDumper):
    oid = 1007  # int4[] (pg_type)


class _Float8ArrayDumper(_ArrayDumper):
    oid = 1022  # float8[]


_DUMPERS = "gmd.one_statement.dumpers"
"""The key in a pooled connection's ``info`` (SQLAlchemy keeps it for the connection's life)
that says its adapters know the two array classes: they are our own types, so registering them
on the connection changes nothing else it sends."""


def _statement() -> str:
    b, hi, h, i, s = (t.name for t in (batches, host_intervals, hosts, intervals, sample_batches))
    capacity = ", ".join(CAPACITY_FIELDS)
    given = ", ".join(f"%({c})s::float8" for c in CAPACITY_FIELDS)
    same = " AND ".join(f"{c} = %({c})s::float8" for c in CAPACITY_FIELDS)
    row = {
        "interval_id": "%(interval_id)s::int8",
        "batch_id": "id",
        "host_id": "%(host_id)s::int4",
        "late": "late",
        **{c: f"%({c})b::{'int4' if c in SAMPLE_IDS else 'float8'}[]" for c in PER_VM},
    }
    return f"""
WITH fresh AS (
    SELECT id, state <> '{IntervalState.open.value}' AS late FROM {i}
    WHERE id = %(interval_id)s::int8
      AND NOT EXISTS (SELECT FROM {b} WHERE key = %(key)s::text)
    FOR SHARE
), capacity AS (
    INSERT INTO {hi} (interval_id, host_id, organization_id, {capacity})
    SELECT id, %(host_id)s::int4, %(owner_id)s::int4, {given} FROM fresh
    ON CONFLICT DO NOTHING
    RETURNING host_id
), batch AS (
    INSERT INTO {b} (key, digest, host_id, interval_id, samples, late, host_cpu_s, unverified)
    SELECT %(key)s::text, %(digest)s::text, %(host_id)s::int4, id, %(samples)s::int4, late,
           %(host_cpu_s)s::float8, %(unverified)s::bool
    FROM fresh
    WHERE EXISTS (SELECT FROM capacity)
       OR EXISTS (
           SELECT FROM {hi}
           WHERE interval_id = %(interval_id)s::int8 AND host_id = %(host_id)s::int4 AND {same}
       )
    RETURNING id, late
), seen AS (
    UPDATE {h} SET last_seen_s = %(now_s)s::int8
    WHERE id = %(host_id)s::int4 AND EXISTS (SELECT FROM batch)
), stored AS (
    INSERT INTO {s} ({", ".join(BATCH_COLUMNS)})
    SELECT {", ".join(row[c] for c in BATCH_COLUMNS)} FROM batch
)
SELECT id, late FROM batch
"""


STATEMENT = _statement()


def run_statement(
    engine: Engine, scalars: Mapping[str, Any], arrays: Mapping[str, bytes]
) -> tuple[int, bool] | None:
    """Run :data:`STATEMENT` on one of ``engine``'s pooled connections, in autocommit:
    ``scalars`` are its parameters but the arrays, ``arrays`` each :data:`PER_VM` column in
    its binary form. The new batch's id and whether it is late, or None when it stored
    nothing (the caller's general path decides why). A database error, a refused connection
    included, is taken as nothing stored: the general path meets it again and answers it as
    it always has (a connection found dead is dropped from the pool first)."""
    params = {
        **scalars,
        **{c: (_Int4Array if c in SAMPLE_IDS else _Float8Array)(arrays[c]) for c in PER_VM},
    }
    try:
        raw = engine.raw_connection()
    except psycopg.Error:
        # The server refuses or cannot be reached. Taken outside SQLAlchemy's connection, the
        # driver's own error is no SQLAlchemyError, and was answered 500 (issue 44): the
        # general path meets the outage through SQLAlchemy, which answers it 503 and holds
        # the accountant (gmd.daemon.ledger.write_health); it also says it in the log.
        return None
    conn = raw.driver_connection
    assert isinstance(conn, psycopg.Connection)
    try:
        conn.autocommit = True
        try:
            if not raw.info.get(_DUMPERS):  # once per pooled connection, not per batch
                conn.adapters.register_dumper(_Int4Array, _Int4ArrayDumper)
                conn.adapters.register_dumper(_Float8Array, _Float8ArrayDumper)
                raw.info[_DUMPERS] = True
            row = conn.execute(STATEMENT, params, prepare=True).fetchone()
        finally:
            if not conn.closed:
                conn.autocommit = False
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.OperationalError) or conn.closed:
            raw.invalidate()
        if isinstance(exc, psycopg.OperationalError | psycopg.errors.ReadOnlySqlTransaction):
            # the ledger cannot write: the general path answers (503) and says so once
            log.debug("batch %s: its one-statement write failed: %s", scalars.get("key"), exc)
        elif not isinstance(exc, psycopg.errors.UniqueViolation):
            log.warning("batch %s: its one-statement write failed: %s", scalars.get("key"), exc)
        return None
    finally:
        raw.close()
    return None if row is None else (int(row[0]), bool(row[1]))


class OneStatement:
    """A known host's batch by :data:`STATEMENT`: ``writer`` the ledger's engine for writes,
    ``ids`` the ids made and cached, ``partition_for(start_s)`` makes the raw tables'
    partition of an interval's day."""

    def __init__(self, writer: Engine, ids: LedgerIds, partition_for: Callable[[int], None]):
        self.writer, self.ids, self.partition_for = writer, ids, partition_for

    def store(
        self,
        record: BatchRecord,
        now_s: float | None,
        admit: Admit | None,
        unverified: bool,
    ) -> IngestResult | None:
        """Store the batch of a known host that lists the VMs this process remembers it
        listing, all marked seen in this period, in one statement (:data:`STATEMENT`);
        None when it is not such a batch
        or the statement stored nothing, for the general path to decide. ``admit`` is told
        before the write: a batch that ends up not stored here is told again by the general
        path, or not at all (a retry), and the caller keeps only the last claim of a stored
        batch. A batch ``admit`` refuses goes to the general path too, which tells a retry
        (acknowledged, not counted) from a batch over the bound (refused there)."""
        if not record.vm_uuids:
            return None
        owner = self.ids.owner_of(record.host)
        with self.ids.cache.lock:
            org_id = self.ids.cache.organizations.get(owner)
            host = self.ids.cache.hosts.get(record.host)
        if host is None or host[1] != org_id:
            return None
        host_id = host[0]
        known = self.ids.cache.same_vms(host_id, record)
        if known is None or known.period != mark_period(record.host, record.interval_start_s):
            return None
        if not known.named and record.customer_names:
            return None
        self.partition_for(record.interval_start_s)
        if admit is not None:
            try:
                admit(0, 0)
            except Exception:
                # Perhaps a retry, which is not refused: the general path tells.
                return None
        stored = run_statement(
            self.writer,
            {
                "key": record.key,
                "digest": record.digest,
                "host_id": host_id,
                "owner_id": org_id,
                "interval_id": record.interval_start_s,
                "samples": len(record.vm_uuids),
                "host_cpu_s": record.host_cpu_s,
                "unverified": unverified,
                "now_s": int(time.time() if now_s is None else now_s),
                **dict(zip(CAPACITY_FIELDS, record.capacity, strict=True)),
            },
            sample_store.batch_arrays(known.vm_ids, known.customer_ids, record.use, record.flavor),
        )
        if stored is None:
            return None
        n = len(record.vm_uuids)
        return IngestResult("accepted", n, n if stored[1] else 0)
