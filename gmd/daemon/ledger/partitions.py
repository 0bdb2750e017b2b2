"""The raw tables' daily partitions on PostgreSQL: made ahead, found, dropped whole.

``samples``, ``batches`` and ``host_intervals`` are partitioned by ``RANGE (interval_id)``, and
an interval's id is its start in Unix seconds, so a UTC day of raw data is one partition of
each (``gmd_partitions.samples_20261125``…). Retention drops a day by detaching and dropping
its partitions, which costs the same whatever the day held, where ``DELETE`` would cost by the
row and leave the table to vacuum. The daemon makes the partitions of the next days ahead; a
batch for a day without one (a replay of old traces, a daemon that was down over midnight)
has its day made first. On SQLite nothing is partitioned and every function here is a no-op.
"""

from __future__ import annotations

import calendar
import logging
import re
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from gmd.common.units import DAY_S
from gmd.ledger_schema.models import PARTITION_PARENT, PARTITION_SCHEMA, PARTITIONED

log = logging.getLogger(__name__)

AHEAD_DAYS = 3
"""Days made ahead of today: the daemon runs :func:`make_ahead` hourly, so a day is ready
long before its first batch."""
_LOCK = int.from_bytes(b"gmd-part", "big", signed=True)
_NAME = re.compile(r"^(?P<table>[a-z_]+)_(?P<day>\d{8})$")


@dataclass(frozen=True, order=True)
class Partition:
    day: int
    """days since the epoch: the partition holds intervals starting in [day, day + 1) × 86400"""
    table: str

    @property
    def name(self) -> str:
        return f"{self.table}_{time.strftime('%Y%m%d', time.gmtime(self.day * DAY_S))}"

    @property
    def parent(self) -> str:
        """The partitioned table that holds it."""
        return PARTITION_PARENT.get(self.table, self.table)

    @property
    def start_s(self) -> int:
        return self.day * DAY_S

    @property
    def end_s(self) -> int:
        return (self.day + 1) * DAY_S


def partitioned(conn: Connection | Engine) -> bool:
    return conn.dialect.name == "postgresql"


def existing(conn: Connection) -> list[Partition]:
    """Every partition of the raw tables, oldest first."""
    if not partitioned(conn):
        return []
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema"
        ),
        {"schema": PARTITION_SCHEMA},
    )
    found = []
    for (name,) in rows:
        match = _NAME.match(name)
        if match and match["table"] in PARTITIONED:
            found.append(Partition(_day_of(match["day"]), match["table"]))
    return sorted(found)


def _day_of(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y%m%d")) // DAY_S


def ensure_days(engine: Engine, days: range | list[int]) -> int:
    """Make the partitions of ``days`` (days since the epoch) that do not exist; returns how
    many were made. One transaction, under an advisory lock so that two daemons (or two
    threads of one) never race to make the same table."""
    if not partitioned(engine):
        return 0
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK})
        have = {(p.day, p.table) for p in existing(conn)}
        made = 0
        for day in days:
            for table in PARTITIONED:
                if (day, table) in have:
                    continue
                p = Partition(day, table)
                conn.execute(
                    text(
                        f"CREATE TABLE IF NOT EXISTS {PARTITION_SCHEMA}.{p.name} PARTITION OF"
                        f" public.{p.parent} FOR VALUES FROM ({p.start_s}) TO ({p.end_s})"
                    )
                )
                made += 1
    if made:
        log.info("made %d raw-data partition(s) for %d day(s)", made, len(days))
    return made


def make_ahead(engine: Engine, now_s: float | None = None) -> int:
    """Today's partitions and those of the next :data:`AHEAD_DAYS` days."""
    today = int(time.time() if now_s is None else now_s) // DAY_S
    return ensure_days(engine, range(today, today + AHEAD_DAYS + 1))


def drop_before(engine: Engine, cutoff_s: int) -> list[Partition]:
    """Detach and drop every partition that ends at or before ``cutoff_s``: whole days of raw
    data past retention. Each table is detached in its own transaction; ``DETACH … CONCURRENTLY``
    is not used because it cannot run in one, and a plain detach holds its lock for
    milliseconds."""
    if not partitioned(engine):
        return []
    with engine.connect() as conn:
        due = [p for p in existing(conn) if p.end_s <= cutoff_s]
    for p in due:
        with engine.begin() as conn:
            conn.execute(
                text(f"ALTER TABLE public.{p.parent} DETACH PARTITION {PARTITION_SCHEMA}.{p.name}")
            )
            conn.execute(text(f"DROP TABLE {PARTITION_SCHEMA}.{p.name}"))
        log.info("dropped partition %s (raw data of intervals before %d)", p.name, p.end_s)
    return due
