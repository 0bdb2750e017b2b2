"""A batch stored by the general path: one transaction that makes what is new.

A batch either lands whole or not at all. Its key makes a retry count once; its digest tells a
retry from a different batch that reuses the key. Its samples are rows of its own (so that
accounting can leave one batch out), and the host's capacity for the interval is the one its
first batch gave: another batch may not change what an interval is, or was, accounted from.

Concurrency: the batch takes a shared lock on its interval's row, and closing an interval
takes an exclusive one, so a batch is either in before the interval closes (on time) or sees
it closed and is stored as late.

Round trips: the common case (a known host, VMs and customers, an interval that exists) is
three statements between BEGIN and COMMIT. The batch's row is inserted first, in one statement
that also locks the interval and reads whether it is still open, and that inserts nothing when
the key is already used in any interval; only then does ingest look at why (a retry, a reused
key, or an interval that does not exist yet). The host's capacity for the interval is inserted
unless a batch already gave it, and read back only then; on PostgreSQL the same statement
records that the host was seen. The samples are the third: on PostgreSQL one row of arrays, by
binary COPY (:mod:`~gmd.daemon.ledger.sample_store`). A known host's batch usually takes none
of this: :mod:`.one_statement` stores it in one round trip.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

from sqlalchemy import (
    Boolean,
    Connection,
    Double,
    Engine,
    Integer,
    String,
    bindparam,
    exists,
    func,
    select,
    update,
)
from sqlalchemy.sql.dml import Insert

from gmd.daemon.ingest.ids import Found, HostVms, LedgerIds, mark_period
from gmd.daemon.ingest.record import (
    DIGEST_PREFIX,
    Admit,
    BatchRecord,
    BeforeOrigin,
    CapacityConflict,
    IngestResult,
    KeyReused,
)
from gmd.daemon.ledger import sample_store
from gmd.daemon.ledger.quarantine import quarantine
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.models import ID64
from gmd.ledger_schema.tables import (
    batches as _batches,
    dialect_insert,
    host_intervals as _host_intervals,
    hosts as _hosts,
    intervals as _intervals,
    upsert,
)
from gmd.wire import CAPACITY_FIELDS


@dataclass(frozen=True)
class _Statements:
    """The hot path's statements, built once per dialect: built per batch, SQLAlchemy would
    compute each one's cache key again every time."""

    batch: Insert
    """the batch's row, if its interval exists and its key is unused: (id, late)"""
    capacity: Insert
    """the host's capacity for the interval, unless a batch gave it: a row if it was new"""


@cache
def _statements(dialect_name: str) -> _Statements:
    open_state = bindparam("open_state", IntervalState.open.value, String())
    # FOR SHARE OF intervals: closing the interval (an UPDATE) waits for this transaction, and
    # this one for a close that began first. The key is looked up in every interval, not only
    # this one, so that a key reused for another interval is refused (the unique constraint
    # holds per interval only: batches are partitioned by interval).
    fresh = (
        select(
            bindparam("key", type_=String()),
            bindparam("digest", type_=String()),
            bindparam("host_id", type_=Integer()),
            _intervals.c.id,
            bindparam("samples", type_=Integer()),
            (_intervals.c.state != open_state).label("late"),
            bindparam("host_cpu_s", type_=Double()),
            bindparam("unverified", type_=Boolean()),
        )
        .where(
            _intervals.c.id == bindparam("interval_id", type_=ID64),
            ~exists().where(_batches.c.key == bindparam("key")),
        )
        .with_for_update(read=True, of=_intervals)
    )
    batch = (
        dialect_insert(dialect_name, _batches)
        .from_select(
            [
                "key",
                "digest",
                "host_id",
                "interval_id",
                "samples",
                "late",
                "host_cpu_s",
                "unverified",
            ],
            fresh,
        )
        .on_conflict_do_nothing(index_elements=["key", "interval_id"])
        .returning(_batches.c.id, _batches.c.late)
    )
    capacity = (
        dialect_insert(dialect_name, _host_intervals)
        .values(
            interval_id=bindparam("interval_id"),
            host_id=bindparam("host_id"),
            organization_id=bindparam("owner_id"),
            **{c: bindparam(c) for c in CAPACITY_FIELDS},
        )
        .on_conflict_do_nothing()
        .returning(_host_intervals.c.host_id)
    )
    if dialect_name == "postgresql":
        # A statement of its own would cost a round trip per batch; PostgreSQL runs an UPDATE
        # in a WITH whether or not the statement reads it (SQLite has no round trips). No
        # parameter may be named as a column of hosts: the UPDATE would SET it too.
        seen = (
            update(_hosts)
            .where(_hosts.c.id == bindparam("host_id"))
            .values(last_seen_s=bindparam("now_s"))
            .cte("seen")
        )
        capacity = capacity.add_cte(seen)
    return _Statements(batch, capacity)


class BatchWriter:
    """The general path: ``writer`` the ledger's engine for writes, ``ids`` the ids made and
    cached, ``partition_for(start_s)`` makes the raw tables' partition of an interval's day."""

    def __init__(self, writer: Engine, ids: LedgerIds, partition_for: Callable[[int], None]):
        self.writer, self.ids, self.partition_for = writer, ids, partition_for

    def write(
        self,
        record: BatchRecord,
        now_s: float,
        admit: Admit | None = None,
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        aside: str | None = None,
    ) -> IngestResult:
        """Store one batch in one transaction, or recognize it as a retry (the arguments are
        :meth:`~gmd.daemon.ingest.store.LedgerStore.ingest`'s). Raises :class:`KeyReused`,
        :class:`CapacityConflict` or :class:`BeforeOrigin`; a database error rolls it all
        back (the caller retries what can be)."""
        self.partition_for(record.interval_start_s)
        n = len(record.vm_uuids)
        found = Found()
        period = mark_period(record.host, record.interval_start_s)
        with self.ids.cache.lock:
            generation = self.ids.cache.generation
        known: HostVms | None = None
        marked: tuple[list[int], list[int]] = ([], [])
        with self.writer.begin() as conn:
            host_id, org_id = self.ids.host_id(conn, record.host, found.hosts)
            stored = self._insert_batch(conn, record, host_id, unverified)
            if stored is None:
                result = IngestResult("duplicate", n, 0)
            else:
                batch_id, on_time = stored
                self._fix_capacity(conn, record, host_id, org_id, now_s)
                known = self.ids.cache.same_vms(host_id, record)
                if known is not None and not known.named and record.customer_names:
                    self.ids.name_customers(conn, record.customer_names)
                    known = replace(known, named=True)
                if known is not None and known.period != period:
                    known, marked = self.ids.still_there(conn, record, known)
                if known is None:
                    known, marked = self.ids.look_up(
                        conn,
                        record,
                        host_id,
                        generation,
                        found,
                        unverified,
                        hold,
                        admit,
                    )
                elif admit is not None:
                    admit(0, 0)
                if n:
                    self._write_samples(
                        conn, record, host_id, batch_id, known.vm_ids, known.customer_ids, on_time
                    )
                if aside is not None:
                    quarantine(
                        conn,
                        {batch_id: aside},
                        cause="Placement contradicts these VMs of the host's batch",
                        by="placement",
                    )
                    known = None  # not the host's roster: its next batch is not compared to it
                result = IngestResult("accepted", n, 0 if on_time else n)
        self.ids.cache.learn(found, host_id, known, record.interval_start_s, marked)
        return result

    def interval(self, conn: Connection, start_s: int, length_s: int) -> tuple[int, bool]:
        """The interval's id and whether it still takes on-time samples (locked FOR SHARE)."""
        query = (
            select(_intervals.c.id, _intervals.c.state)
            .where(_intervals.c.start_s == start_s)
            .with_for_update(read=True)
        )
        row = conn.execute(query).first()
        if row is None:
            frontier = conn.execute(
                select(func.max(_intervals.c.start_s)).where(
                    _intervals.c.state != IntervalState.open
                )
            ).scalar_one()
            # Before the closed frontier, an interval is history already: accounting has gone
            # past it, so its samples can only be late ones.
            behind = frontier is not None and start_s < frontier
            if behind:
                origin = conn.execute(select(func.min(_intervals.c.start_s))).scalar_one()
                if start_s < origin:
                    raise BeforeOrigin(
                        f"interval {start_s} is before the ledger's first interval ({origin}),"
                        " and accounting has begun: there is nothing to add it to"
                    )
            conn.execute(
                upsert(conn, _intervals)
                .values(
                    id=start_s,
                    start_s=start_s,
                    length_s=length_s,
                    state=IntervalState.accounted if behind else IntervalState.open,
                    ledger_rows=0 if behind else None,
                )
                .on_conflict_do_nothing()
            )
            row = conn.execute(query).one()
        return row.id, row.state == IntervalState.open

    def _insert_batch(
        self, conn: Connection, record: BatchRecord, host_id: int, unverified: bool = False
    ) -> tuple[int, bool] | None:
        """The new batch's id and whether it is on time; ``None`` for a retry of a stored
        batch. Raises :class:`KeyReused` for a key used by another batch, and
        :class:`BeforeOrigin` (from :meth:`_interval`) for an interval that cannot be made."""
        params = {
            "key": record.key,
            "digest": record.digest,
            "host_id": host_id,
            "interval_id": record.interval_start_s,
            "samples": len(record.vm_uuids),
            "host_cpu_s": record.host_cpu_s,
            "unverified": unverified,
        }
        statement = _statements(conn.dialect.name).batch
        for _ in range(2):
            row = conn.execute(statement, params).first()
            if row is not None:
                return row.id, not row.late
            seen = conn.execute(
                select(_batches.c.interval_id, _batches.c.digest)
                .where(_batches.c.key == record.key)
                .limit(1)
            ).first()
            if seen is not None:
                if seen.interval_id != record.interval_start_s or not _same_content(
                    seen.digest, record.digest
                ):
                    raise KeyReused(
                        f"batch key {record.key!r} was already used for a different batch;"
                        f" a retry must resend the same content (host {record.host},"
                        f" interval {record.interval_start_s})"
                    )
                return None
            # Neither the key nor the interval: the first batch of the interval makes it.
            self.interval(conn, record.interval_start_s, record.interval_s)
        raise AssertionError(f"interval {record.interval_start_s} was made but is not there")

    def _fix_capacity(
        self, conn: Connection, record: BatchRecord, host_id: int, org_id: int, now_s: float
    ) -> None:
        """Record the host's capacity for the interval, unless a batch already did: then it must
        be the same (raises :class:`CapacityConflict`), since accounting may have used it. The
        host is seen now (on PostgreSQL by the same statement)."""
        cap = dict(zip(CAPACITY_FIELDS, record.capacity, strict=True))
        inserted = conn.execute(
            _statements(conn.dialect.name).capacity,
            {
                "interval_id": record.interval_start_s,
                "host_id": host_id,
                "owner_id": org_id,
                "now_s": int(now_s),
                **cap,
            },
        ).first()
        if conn.dialect.name != "postgresql":
            conn.execute(
                update(_hosts).where(_hosts.c.id == host_id).values(last_seen_s=int(now_s))
            )
        if inserted is not None:
            return
        stored = conn.execute(
            select(*(_host_intervals.c[c] for c in CAPACITY_FIELDS)).where(
                _host_intervals.c.interval_id == record.interval_start_s,
                _host_intervals.c.host_id == host_id,
            )
        ).one()
        differ = [
            f"{c} {theirs:g} (first batch: {ours:g})"
            for c, ours, theirs in zip(CAPACITY_FIELDS, stored, record.capacity, strict=True)
            if not math.isclose(ours, theirs, rel_tol=1e-12)
        ]
        if differ:
            raise CapacityConflict(
                f"batch {record.key} gives host {record.host} another capacity for interval"
                f" {record.interval_start_s} than its first batch did: {', '.join(differ)};"
                " a host's capacity is fixed for an interval by its first batch"
            )

    def _write_samples(
        self,
        conn: Connection,
        record: BatchRecord,
        host_id: int,
        batch_id: int,
        vm_ids: list[int],
        customer_ids: list[int],
        on_time: bool,
    ) -> None:
        # A second batch for the same VM, host and interval (an agent restarted mid-interval)
        # gets samples of its own; accounting adds them up.
        sample_store.write_batch(
            conn,
            interval_id=record.interval_start_s,
            batch_id=batch_id,
            host_id=host_id,
            late=not on_time,
            vm_ids=vm_ids,
            customer_ids=customer_ids,
            use=record.use,
            flavor=record.flavor,
        )


def _same_content(stored: str, digest: str) -> bool:
    """Whether a stored batch's digest and a new one's say the same content. A digest of the
    first kind (before :data:`DIGEST_PREFIX`) cannot be compared: a batch that reuses its key
    for the same interval is taken as the retry it almost surely is (an agent retrying across
    the daemon's upgrade), not refused."""
    return stored == digest or not stored.startswith(DIGEST_PREFIX)
