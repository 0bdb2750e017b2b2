"""``gmd-admin db usage``: what the ledger holds, table by table, and what retention drops next.

Rows and bytes per table (on PostgreSQL summed over a partitioned table's partitions, rows as
the planner's estimate unless ``exact``, bytes with indexes and TOAST; on SQLite exact rows and
bytes from the ``dbstat`` table where SQLite was built with it), the oldest interval each
interval-keyed table holds, how long it is kept, and when its oldest rows are due. Cheap on a
ledger of any size: no count of a big table unless asked, and "oldest" is the first entry of
the index that leads with ``interval_id``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, Table, func, select, text
from sqlalchemy.exc import OperationalError

from gmd.common.timespec import iso
from gmd.common.units import DAY_S
from gmd.daemon.config import RetentionConfig
from gmd.daemon.ledger import partitions, sample_store
from gmd.daemon.ledger.retention import (
    LEDGER_TABLES,
    RAW_TABLES,
    UNSEEN_TABLES,
    cutoffs,
    unseen_cutoff_s,
)
from gmd.ledger_schema.models import SEEN_PERIOD_S, Base
from gmd.ledger_schema.tables import customers, samples
from gmd.render import Column, Unit

COLUMNS = (
    Column("table", "Table", None, "left"),
    Column("rows", "Rows", None),
    Column("bytes", "Size", None, unit=Unit.bytes),
    Column("oldest", "Oldest interval", None, "left"),
    Column("kept_days", "Kept (days)", None),
    Column("next_purge", "Oldest due", None, "left"),
)


@dataclass(frozen=True)
class Usage:
    rows: list[dict[str, object]]
    exact: bool
    partitions: int
    notes: list[str]

    def document(self) -> dict[str, object]:
        return {"tables": self.rows, "exact_rows": self.exact, "partitions": self.partitions}


def _kept(table: Table, retention: RetentionConfig) -> float | None:
    """Days ``table`` is kept (0: for ever), None for tables retention does not touch."""
    if table in RAW_TABLES or table in UNSEEN_TABLES:
        return retention.raw_days
    if table in LEDGER_TABLES:
        return retention.ledger_days
    return None


def usage(
    conn: Connection, retention: RetentionConfig, *, exact: bool = False, now_s: float | None = None
) -> Usage:
    now = time.time() if now_s is None else now_s
    postgres = conn.dialect.name == "postgresql"
    sizes = _postgres_sizes(conn) if postgres else _sqlite_sizes(conn)
    due = cutoffs(conn, retention, now)
    unseen_s = unseen_cutoff_s(conn, due.raw_s)
    rows = []
    for table in Base.metadata.sorted_tables:
        # On PostgreSQL the samples are stored a batch to a row (``samples`` is a view): the
        # size and the oldest interval are the stored table's, the rows are samples.
        stored = sample_store.stored_table(conn) if table is samples else table
        count, size = sizes.get(stored.name, (None, None))
        if stored is not table and count is not None and not exact:
            count = sample_store.estimated_samples(conn, count)
        if exact or count is None:
            count = int(conn.execute(select(func.count()).select_from(table)).scalar_one())
        kept = _kept(table, retention)
        oldest = None
        next_purge = None
        if kept is not None:
            unseen = table in UNSEEN_TABLES
            # For VMs and customers, the oldest interval in which one was last seen.
            key = table.c.last_seen_s if unseen else stored.c.interval_id
            first = conn.execute(select(func.min(key))).scalar()
            oldest = None if first is None else int(first)
            if oldest is not None and kept:
                whole_days = (
                    postgres and table in RAW_TABLES and table.name != "quarantined_samples"
                )
                if unseen:  # its last sample may have come up to a marking period later
                    end = oldest + SEEN_PERIOD_S
                elif whole_days:
                    end = (oldest // DAY_S + 1) * DAY_S
                else:
                    end = oldest
                cutoff = unseen_s if unseen else due.raw_s if table in RAW_TABLES else due.ledger_s
                when = end + kept * DAY_S
                if when > now:
                    next_purge = iso(when)
                elif cutoff is not None and end <= cutoff:
                    next_purge = "now"
                elif unseen:
                    next_purge = "held: raw rows of that day are still kept"
                else:
                    next_purge = "held: not accounted yet, or the current standings"
                if table is customers:
                    next_purge += " (once nothing else names it)"
        rows.append(
            {
                "table": table.name,
                "rows": count,
                "bytes": size,
                "oldest": None if oldest is None else iso(oldest),
                "kept_days": None if kept is None else (_days(kept) or "for ever"),
                "next_purge": next_purge,
            }
        )
    notes = []
    notes.append(
        "vms, customers: 'Oldest interval' is the oldest last seen; a customer goes only once"
        " no VM, ledger row, rollup or audit row names it"
    )
    if postgres and not exact:
        notes.append("rows: PostgreSQL's estimates (as of the last ANALYZE); --exact counts")
    if not postgres and all(r["bytes"] is None for r in rows):
        notes.append("bytes: this SQLite has no dbstat table")
    n_partitions = len(partitions.existing(conn))
    return Usage(rows, exact or not postgres, n_partitions, notes)


def _days(days: float) -> float | int:
    return int(days) if days == int(days) else days


def _postgres_sizes(conn: Connection) -> dict[str, tuple[int | None, int | None]]:
    """Estimated rows and total bytes per table, partitions added to their parent."""
    found: dict[str, tuple[int | None, int | None]] = {}
    for name, rows, size in conn.execute(
        text(
            "SELECT c.relname, CASE WHEN c.relkind = 'p' THEN"
            " (SELECT sum(greatest(p.reltuples, 0))::bigint FROM pg_partition_tree(c.oid) t"
            "  JOIN pg_class p ON p.oid = t.relid WHERE t.isleaf)"
            " ELSE greatest(c.reltuples, 0)::bigint END,"
            " CASE WHEN c.relkind = 'p' THEN (SELECT sum(pg_total_relation_size(t.relid))::bigint"
            "  FROM pg_partition_tree(c.oid) t WHERE t.isleaf)"
            " ELSE pg_total_relation_size(c.oid) END"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
        )
    ):
        never_analyzed = rows == 0 and size is not None and size > 16384
        found[str(name)] = (None if never_analyzed else rows, size)
    return found


def _sqlite_sizes(conn: Connection) -> dict[str, tuple[int | None, int | None]]:
    """Bytes per table with its indexes, from dbstat (rows are counted by the caller)."""
    try:
        rows = conn.execute(
            text(
                "SELECT m.tbl_name, sum(d.pgsize) FROM dbstat d"
                " JOIN sqlite_master m ON m.name = d.name GROUP BY m.tbl_name"
            )
        ).all()
    except OperationalError:  # SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
        return {}
    return {str(name): (None, int(size)) for name, size in rows}
