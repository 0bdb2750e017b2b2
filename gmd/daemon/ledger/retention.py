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

Two things are never purged, whatever the configuration: raw rows of an interval that is not
accounted yet (accounting stalled for a month must still find its samples), and the ledger
rows of the latest interval that has any (the current standings). Intervals, customers,
hosts, VMs and the enforcement log are small and kept. Because an interval's id is its start
time, "before the cutoff" is ``interval_id < cutoff`` on every table, answered by the index
that leads with ``interval_id``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Connection, Engine, Table, func, select, text

from gmd.daemon.config import RetentionConfig
from gmd.daemon.ledger import partitions
from gmd.daemon.ledger.migrate import writer
from gmd.daemon.ledger.models import IntervalState
from gmd.daemon.ledger.rollups import ROLLUP_TABLES
from gmd.daemon.ledger.tables import (
    batches,
    customer_ledger,
    host_intervals,
    intervals,
    organization_ledger,
    quarantined_samples,
    resource_ledger,
    samples,
)

log = logging.getLogger(__name__)

RAW_TABLES: tuple[Table, ...] = (samples, batches, host_intervals, quarantined_samples)
LEDGER_TABLES: tuple[Table, ...] = (customer_ledger, resource_ledger, organization_ledger)


@dataclass
class PurgeReport:
    """What one run removed: rows per table (dropped partitions count their estimated rows
    under the table), and whether it stopped early with more to do."""

    raw_before_s: int | None = None
    ledger_before_s: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)
    unfinished: bool = False

    def add(self, table: str, n: int) -> None:
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


def purge(engine: Engine, config: RetentionConfig, now_s: float | None = None) -> PurgeReport:
    """Remove what retention says is due, for at most ``config.max_run_s``."""
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
                break
    return _logged(report)


def _chunks(
    engine: Engine,
    table: Table,
    before_s: int,
    chunk: int,
    deadline: float,
    report: PurgeReport,
    key: Column[Any] | None = None,
) -> bool:
    """Delete ``table``'s rows of intervals (or periods: ``key``) before ``before_s``,
    ``chunk`` rows a transaction; False when the deadline came first."""
    row = "rowid" if engine.dialect.name == "sqlite" else "ctid"
    column = "interval_id" if key is None else key.name
    statement = text(
        f"DELETE FROM {table.name} WHERE {row} IN"
        f" (SELECT {row} FROM {table.name} WHERE {column} < :before LIMIT :chunk)"
    )
    while True:
        with writer(engine).begin() as conn:
            deleted = conn.execute(statement, {"before": before_s, "chunk": chunk}).rowcount
        report.add(table.name, deleted)
        if deleted < chunk:
            return True
        if time.monotonic() > deadline:
            return False


def _logged(report: PurgeReport) -> PurgeReport:
    if report.rows or report.partitions:
        parts = [f"{n} {t}" for t, n in sorted(report.rows.items())]
        if report.partitions:
            parts.append(f"{len(report.partitions)} partition(s)")
        log.info(
            "retention: removed %s%s",
            ", ".join(parts),
            "; more next run" if report.unfinished else "",
        )
    return report
