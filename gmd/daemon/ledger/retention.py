"""Retention: the ledger forgets raw data, then per-interval rows, on the operator's schedule.

What is kept (``[retention]``, :class:`~gmd.daemon.config.RetentionConfig`):

- **raw** (``raw_days``, a month by default): ``samples``, ``batches``, ``host_intervals`` and
  ``quarantined_samples``. On PostgreSQL the raw tables' daily partitions are dropped whole
  (:mod:`gmd.daemon.ledger.partitions`); on SQLite rows are deleted a chunk at a time, each
  chunk its own short transaction, so that ingest never waits long behind a purge.
- **ledger** (``ledger_days``): ``customer_ledger``, ``customer_resource_ledger`` and
  ``organization_ledger``, deleted a chunk at a time on both.
- **rollups** (``rollup_days``, for ever by default): the hourly and daily rollups, by the
  start of their period.

- **VMs and customers unseen past raw retention**, once the rows above are gone: a VM last
  marked seen (``vms.last_seen_s``, marked once a day) a day before the raw cutoff and before
  the oldest raw row still held, so that no sample of it is left; a customer unseen
  as long that nothing else names: no VM, no per-interval ledger row, no rollup, no
  enforcement-log row, quota original or balance reset (the audit trail), no organization,
  no throttle level above 0. With the default ``rollup_days = 0`` a customer that was ever
  accounted keeps its rollups, and so its row, for ever; what a host may introduce meanwhile
  is bounded by ``[daemon.limits]``. A purged VM or customer that comes back is a new row:
  ingest finds its old id gone when it marks it seen (gmd.daemon.ingest.ids).

Two things are never purged, whatever the configuration: raw rows of an interval that is not
accounted yet (accounting stalled for a month must still find its samples), and the ledger
rows of the latest interval that has any (the current standings). Intervals, hosts,
organizations and the enforcement log are small and kept. Because an interval's id is its
start time, "before the cutoff" is ``interval_id < cutoff`` on every table, answered by the
index that leads with ``interval_id``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Connection, Engine, Table, delete, exists, func, select, text

from gmd.daemon.config import RetentionConfig
from gmd.daemon.ledger import partitions, sample_store
from gmd.daemon.ledger.rollups import ROLLUP_TABLES
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.models import SEEN_PERIOD_S
from gmd.ledger_schema.tables import (
    actions,
    balance_resets,
    batches,
    customer_ledger,
    customer_rollups,
    customers,
    host_intervals,
    intervals,
    levels,
    organization_ledger,
    organizations,
    quarantined_samples,
    quota_originals,
    resource_ledger,
    samples,
    vms,
)

log = logging.getLogger(__name__)

RAW_TABLES: tuple[Table, ...] = (samples, batches, host_intervals, quarantined_samples)
LEDGER_TABLES: tuple[Table, ...] = (customer_ledger, resource_ledger, organization_ledger)
# VMs and customers: purged when unseen past raw retention (``last_seen_s``).
UNSEEN_TABLES: tuple[Table, ...] = (vms, customers)
# Rows that name a customer by its id and are kept for as long as retention keeps them: while
# one is left, so is the customer. (customer_resource_ledger and customer_resource_rollups are
# written beside customer_ledger and customer_rollups rows, so these stand for them.)
NAMING_CUSTOMERS: tuple[Table, ...] = (
    vms,
    customer_ledger,
    customer_rollups,
    actions,
    quota_originals,
    balance_resets,
    organizations,
)

Forget = Callable[[Sequence[str], Sequence[str]], None]
"""Told the uuids of VMs and names of customers purged, so that ingest's caches let go."""


@dataclass
class PurgeReport:
    """What one run removed: rows per table (dropped partitions count their estimated rows
    under the table), and whether it stopped early with more to do."""

    raw_before_s: int | None = None
    ledger_before_s: int | None = None
    unseen_before_s: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)
    unfinished: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    """time spent deleting per table (a table with nothing due too)"""

    def add(self, table: str, n: int, since: float) -> None:
        """``n`` rows of ``table`` deleted in a transaction begun at ``since`` (monotonic)."""
        self.seconds[table] = self.seconds.get(table, 0.0) + time.monotonic() - since
        if n:
            self.rows[table] = self.rows.get(table, 0) + n


@dataclass(frozen=True)
class Cutoffs:
    """Rows of intervals starting before these times are due (None: nothing is)."""

    raw_s: int | None
    ledger_s: int | None
    rollup_s: int | None = None


def cutoffs(conn: Connection, config: RetentionConfig, now_s: float) -> Cutoffs:
    """The configured cutoffs, held back so that nothing unaccounted and not the current
    standings are ever purged."""
    raw = config.cutoff_s(config.raw_days, now_s)
    if raw is not None:
        pending = conn.execute(
            select(func.min(intervals.c.id)).where(intervals.c.state != IntervalState.accounted)
        ).scalar()
        if pending is not None:
            raw = min(raw, int(pending))
    ledger = config.cutoff_s(config.ledger_days, now_s)
    if ledger is not None:
        latest = conn.execute(
            select(func.max(intervals.c.id)).where(intervals.c.ledger_rows > 0)
        ).scalar()
        if latest is not None:
            ledger = min(ledger, int(latest))
    return Cutoffs(raw, ledger, config.cutoff_s(config.rollup_days, now_s))


def unseen_cutoff_s(conn: Connection, raw_s: int | None) -> int | None:
    """VMs and customers last marked seen before this time are unseen past retention: the raw
    cutoff, or the oldest raw row still held if that is older (a partition waits for its
    whole day, a quarantined batch for its release), less the period in which ingest marks
    them once (:data:`SEEN_PERIOD_S`), so that no sample of them is left: one marked at
    ``m`` has samples only of intervals before ``m + SEEN_PERIOD_S`` (its host's later
    batches of that period are not marked), so a mark at exactly the cut is past retention
    too; hence the ``+ 1``."""
    if raw_s is None:
        return None
    cut = raw_s
    for table in (sample_store.stored_table(conn), quarantined_samples):
        oldest = conn.execute(select(func.min(table.c.interval_id))).scalar()
        if oldest is not None:
            cut = min(cut, int(oldest))
    return cut - SEEN_PERIOD_S + 1


def purge(
    engine: Engine,
    config: RetentionConfig,
    now_s: float | None = None,
    forget: Forget | None = None,
    unseen: bool = True,
) -> PurgeReport:
    """Remove what retention says is due, for at most ``config.max_run_s``; ``forget`` is
    told of every VM and customer removed. ``unseen`` False leaves the VMs and customers
    unseen past raw retention (a purge from outside a running daemon: the daemon remembers
    their ids, and only its own run tells it to forget them)."""
    now = time.time() if now_s is None else now_s
    deadline = time.monotonic() + config.max_run_s
    with engine.connect() as conn:
        due = cutoffs(conn, config, now)
    report = PurgeReport(due.raw_s, due.ledger_s)
    if due.raw_s is not None:
        if partitions.partitioned(engine):
            for p in partitions.drop_before(engine, due.raw_s):
                report.partitions.append(p.name)
            # Rows of the current partitions before the cutoff (a cutoff inside a day) wait
            # for their whole day; the small unpartitioned table is purged by the row.
            tables: tuple[Table, ...] = (quarantined_samples,)
        else:
            tables = RAW_TABLES
        for table in tables:
            if not _chunks(engine, table, due.raw_s, config.delete_chunk, deadline, report):
                report.unfinished = True
                return _logged(report)
    if due.ledger_s is not None:
        for table in LEDGER_TABLES:
            if not _chunks(engine, table, due.ledger_s, config.delete_chunk, deadline, report):
                report.unfinished = True
                return _logged(report)
    if due.rollup_s is not None:
        for table in ROLLUP_TABLES:
            key = table.c.start_s
            if not _chunks(engine, table, due.rollup_s, config.delete_chunk, deadline, report, key):
                report.unfinished = True
                return _logged(report)
    if not unseen:
        return _logged(report)
    with engine.connect() as conn:
        report.unseen_before_s = unseen_cutoff_s(conn, due.raw_s)
    if report.unseen_before_s is not None:
        done = _unseen_vms(
            engine, report.unseen_before_s, config.delete_chunk, deadline, report, forget
        )
        if not done or not _unseen_customers(
            engine, report.unseen_before_s, config.delete_chunk, deadline, report, forget
        ):
            report.unfinished = True
    return _logged(report)


def _in_chunks(
    engine: Engine,
    table: Table,
    step: Callable[[Connection], int],
    chunk: int,
    deadline: float,
    report: PurgeReport,
) -> bool:
    """Run ``step`` (one chunk's delete from ``table``, returning the rows it deleted), each
    its own short transaction, until a chunk comes back short; False when the deadline came
    first."""
    while True:
        since = time.monotonic()
        with writer(engine).begin() as conn:
            deleted = step(conn)
        report.add(table.name, deleted, since)
        if deleted < chunk:
            return True
        if time.monotonic() > deadline:
            return False


def _unseen_vms(
    engine: Engine,
    before_s: int,
    chunk: int,
    deadline: float,
    report: PurgeReport,
    forget: Forget | None,
) -> bool:
    """Delete VMs last seen before ``before_s``. The outer condition is checked again on each
    row: a VM that a concurrent batch has just marked seen is left (PostgreSQL re-reads a row
    it waited for)."""
    unseen = vms.c.last_seen_s < before_s
    statement = (
        delete(vms)
        .where(unseen, vms.c.id.in_(select(vms.c.id).where(unseen).limit(chunk)))
        .returning(vms.c.uuid)
    )

    def step(conn: Connection) -> int:
        gone = [str(u) for u in conn.execute(statement).scalars()]
        if gone and forget is not None:
            forget(gone, ())
        return len(gone)

    return _in_chunks(engine, vms, step, chunk, deadline, report)


def _unseen_customers(
    engine: Engine,
    before_s: int,
    chunk: int,
    deadline: float,
    report: PurgeReport,
    forget: Forget | None,
) -> bool:
    """Delete customers last seen before ``before_s`` that nothing kept names, with their
    level-0 row. The candidates are locked, skipping any a concurrent batch is marking seen,
    and read under the lock."""
    unnamed = [~exists().where(t.c.customer_id == customers.c.id) for t in NAMING_CUSTOMERS]
    throttled = exists().where(levels.c.customer_id == customers.c.id, levels.c.level != 0)
    candidates = (
        select(customers.c.id, customers.c.name)
        .where(customers.c.last_seen_s < before_s, ~throttled, *unnamed)
        .limit(chunk)
        .with_for_update(of=customers, skip_locked=True)
    )

    def step(conn: Connection) -> int:
        found = conn.execute(candidates).all()
        if not found:
            return 0
        ids = [int(i) for i, _ in found]
        conn.execute(delete(levels).where(levels.c.customer_id.in_(ids)))
        conn.execute(delete(customers).where(customers.c.id.in_(ids)))
        if forget is not None:
            forget((), [str(n) for _, n in found])
        return len(ids)

    return _in_chunks(engine, customers, step, chunk, deadline, report)


def _chunks(
    engine: Engine,
    table: Table,
    before_s: int,
    chunk: int,
    deadline: float,
    report: PurgeReport,
    key: Column[Any] | None = None,
) -> bool:
    """Delete ``table``'s rows of intervals (or periods: ``key``) before ``before_s``."""
    row = "rowid" if engine.dialect.name == "sqlite" else "ctid"
    column = "interval_id" if key is None else key.name
    statement = text(
        f"DELETE FROM {table.name} WHERE {row} IN"
        f" (SELECT {row} FROM {table.name} WHERE {column} < :before LIMIT :chunk)"
    )
    return _in_chunks(
        engine,
        table,
        lambda conn: conn.execute(statement, {"before": before_s, "chunk": chunk}).rowcount,
        chunk,
        deadline,
        report,
    )


def _logged(report: PurgeReport) -> PurgeReport:
    if report.rows or report.partitions:
        parts = [f"{n} {t}" for t, n in sorted(report.rows.items())]
        if report.partitions:
            parts.append(f"{len(report.partitions)} partition(s)")
        log.info(
            "retention: removed %s in %.1f s%s",
            ", ".join(parts),
            sum(report.seconds.values()),
            "; more next run" if report.unfinished else "",
        )
    return report
