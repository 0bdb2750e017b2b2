"""How the ledger grows over weeks, and whether the operators' queries stay fast as it does.

    python bench/ledger_growth.py --vms 1000 --days 30 --interval 300 --raw-days 7

Builds a ledger of ``--vms`` VMs of ``--customers`` customers on ``--hosts`` hosts of a few
organizations over ``--days`` simulated days that end now (so that ``report --from now-1d`` is
the last simulated day), a day at a time:

1. The day's raw data (intervals, batches, host capacities, samples) is written directly:
   ``COPY`` on PostgreSQL, ``executemany`` on SQLite. This is the one shortcut: ingest has
   benchmarks of its own (``bench/ingest.py``), and a month of 1,000 VMs
   through the HTTP API would take most of the run. The use is random but not noise: every VM
   has its own level that drifts from day to day, a daily rhythm, quieter weekends; some VMs
   are batch jobs that run flat out for hours and then idle; a tenth of the customers are
   greedy all along and others turn greedy for a few days at a time. Each host's VMs never
   use more than the host has, as the daemon's plausibility check demands.
2. Everything else is gmd's own code, as the daemon runs it: ``account_due`` closes the day's
   intervals and accounts them in order, with the throttle-level decisions of
   ``gmd.daemon.enforce.levels`` in each interval's transaction, and the hourly and daily
   rollups with them. So the ledger rows, rollups, levels and the enforcement log are exactly
   what gmd would hold.
3. Retention (``purge``) runs at the end of each simulated day with the simulated time: the
   raw tables stop growing once ``--raw-days`` is reached (on PostgreSQL whole daily
   partitions are dropped), the per-interval ledger is kept ``--ledger-days``.

At the end of day 1, day 7 and the last day it reports the database's size, rows and bytes per
table (``gmd.admin.db_usage``) and bytes per VM-day, and times (median of ``--runs``, in
process, through the functions ``gmd-admin`` calls): ``report`` by customer over the last day,
by host, by day and by customer over the last 30 days, the plot's data (``series.collect``,
top 5 over 30 days) and the plot drawn and saved as PNG, and ``explain`` of the customer with
the greatest balance for its latest interval. Before the timings PostgreSQL is vacuumed and
analyzed: a month simulated in minutes gives autovacuum no time to keep up as it would over a
real month, and planning on stale statistics would measure that, not the queries.

Targets (printed, never asserted): ``report --group-by customer --from now-1d`` costs at most
1.2 times on the last day what it cost on day 1 (a report of a day must not grow with the
ledger), ``report --group-by host`` and ``--group-by day`` over 30 days under 1 s each, the
plot (data, drawing and saving) under 2 s.

Intervals are 300 s by default, not the daemon's 60 s: accounting is sequential, one
transaction per interval (~20-30 ms each at 1,000 VMs here), so a month of 60 s intervals
(43,200) would take about half an hour on two cores; 300 s gives 8,640 intervals with the same
rows per interval, and the defaults run in about 6.5 minutes (4.5 of them accounting). The
ledger's rows and the samples grow with the number of intervals, so a 60 s ledger holds five
times the rows and bytes per day reported here.
``--raw-days`` defaults to 7 so that the flattening shows within a month; a ``gmd.toml`` with
the default ``[daemon] max_late_s`` (7 days) needs ``raw_days`` above 8, which matters only
for late batches, and here none is late.

Without ``--url``, PostgreSQL is ``$GMD_TEST_POSTGRES_URL`` or the test cluster that
``tests/scripts/postgres.sh`` starts; a database is created on it and dropped at the end. Progress
goes to stderr; the last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import sqlalchemy as sa
from ledger_accounting import drop_database, postgres_url

from gmd.admin.db_usage import usage
from gmd.common.timespec import iso
from gmd.daemon.config import Config, RetentionConfig, parse
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger import partitions
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.retention import LEDGER_TABLES, RAW_TABLES, purge
from gmd.daemon.ledger.rollups import ROLLUP_TABLES
from gmd.daemon.ledger.sample_store import write_batches
from gmd.daemon.reports import plot as plotting
from gmd.daemon.reports.explain import explain
from gmd.daemon.reports.series import collect
from gmd.daemon.reports.usage import report
from gmd.ledger_schema import migrate
from gmd.ledger_schema.kinds import BatchState, IntervalState, NameSource
from gmd.ledger_schema.models import USE_COLUMNS, Base
from gmd.ledger_schema.tables import (
    actions as _actions,
    batches as _batches,
    customer_ledger as _ledger,
    customers as _customers,
    hosts as _hosts,
    intervals as _intervals,
    levels as _levels,
    organizations as _organizations,
    vms as _vms,
)

DAY_S = 86400
GIB = 2**30
T = TypeVar("T")

SAMPLE_TYPES: dict[str, str] = {
    "interval_id": ">i8",
    "vm_id": ">i4",
    "host_id": ">i4",
    "customer_id": ">i4",
    "batch_id": ">i8",
    "cpu_s": ">f8",
    "memory_byte_s": ">f8",
    "disk_read_bytes": ">f8",
    "disk_write_bytes": ">f8",
    "network_rx_bytes": ">f8",
    "network_tx_bytes": ">f8",
    "flavor_vcpus": ">f8",
    "flavor_memory_bytes": ">f8",
    "late": "?",
}
"""The samples columns written, with their types; the flavor's disk and network stay NULL, as
agents send them."""
COLUMN_BYTES = sum(np.dtype(t).itemsize for t in SAMPLE_TYPES.values()) + 2 * 8
"""A sample's figures bare: every column of ``samples`` at its width, the two NULL flavor
figures included (109 bytes), against which the stored bytes per sample are compared."""
BATCH_COLUMNS = (
    "id",
    "key",
    "digest",
    "host_id",
    "interval_id",
    "received_at",
    "samples",
    "late",
    "state",
)
HOST_INTERVAL_COLUMNS = (
    "interval_id",
    "host_id",
    "organization_id",
    "cpu_cores",
    "memory_bytes",
    "disk_bytes_per_s",
    "network_bytes_per_s",
)
ORGANIZATIONS = ("operator", "lab", "physics", "partner-dc", "archive", "genomics")
"""Names for the organizations; ``lab`` is also a customer, as in the demo."""


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Cloud:
    """The simulated cloud and the state its use carries from one day to the next.

    Indices are 0-based; database ids are index + 1. VMs neither migrate nor resize: what
    varies is how much they use."""

    vm_host: np.ndarray
    vm_customer: np.ndarray
    vm_vcpus: np.ndarray
    vm_memory: np.ndarray
    host_org: np.ndarray
    host_capacity: np.ndarray
    """hosts × (cores, memory bytes, disk bytes/s, network bytes/s)"""
    customer_names: list[str]
    lab_customer: int
    greedy: np.ndarray
    """customers greedy all along"""
    base: np.ndarray
    amplitude: np.ndarray
    phase: np.ndarray
    memory_fraction: np.ndarray
    disk_rate: np.ndarray
    network_rate: np.ndarray
    read_share: np.ndarray
    batch_vm: np.ndarray
    level: np.ndarray
    """each VM's level today: a random walk, one step a day"""
    running: np.ndarray
    """batch VMs: running a job now"""
    spell: np.ndarray
    """customers: days left of a greedy spell"""
    rng: np.random.Generator

    @property
    def n_vms(self) -> int:
        return len(self.vm_host)

    @property
    def n_hosts(self) -> int:
        return len(self.host_org)


def make_cloud(vms: int, hosts: int, customers: int, orgs: int, seed: int) -> Cloud:
    """A cloud like a mid-sized private one: customers of very different sizes (Zipf), hosts
    of three sizes overcommitted on CPU, flavors from 1 to 8 vCPUs with 4 GiB each."""
    rng = np.random.default_rng(seed)
    size = 1.0 / np.arange(1, customers + 1) ** 0.8
    vm_customer = np.concatenate(
        [
            np.arange(min(vms, customers)),
            rng.choice(customers, max(0, vms - customers), p=size / size.sum()),
        ]
    )
    rng.shuffle(vm_customer)
    vm_host = rng.permutation(np.arange(vms) % hosts)
    vm_vcpus = rng.choice([1, 2, 4, 8], vms, p=[0.2, 0.35, 0.3, 0.15]).astype(np.float64)
    host_org = np.where(rng.random(hosts) < 0.6, 0, rng.integers(1, max(orgs, 2), hosts))
    host_org = np.minimum(host_org, orgs - 1)
    cores = rng.choice([32.0, 48.0, 64.0], hosts)
    capacity = np.column_stack(
        [cores, cores * 8 * GIB, np.full(hosts, 2e9), np.full(hosts, 1.25e9)]
    )
    greedy = np.zeros(customers, dtype=bool)
    greedy[rng.choice(customers, max(1, customers // 10), replace=False)] = True
    return Cloud(
        vm_host=vm_host,
        vm_customer=vm_customer,
        vm_vcpus=vm_vcpus,
        vm_memory=vm_vcpus * 4 * GIB,
        host_org=host_org,
        host_capacity=capacity,
        customer_names=[
            uuid.uuid5(uuid.NAMESPACE_DNS, f"proj-{c}.gmd").hex for c in range(customers)
        ],
        lab_customer=min(1, customers - 1),
        greedy=greedy,
        base=rng.beta(2, 5, vms),
        amplitude=rng.uniform(0.1, 0.6, vms),
        phase=rng.uniform(0, 1, vms),
        memory_fraction=rng.uniform(0.3, 0.9, vms),
        disk_rate=rng.lognormal(np.log(1e6), 1.2, vms),
        network_rate=rng.lognormal(np.log(5e5), 1.5, vms),
        read_share=rng.uniform(0.2, 0.8, vms),
        batch_vm=rng.random(vms) < 0.15,
        level=np.ones(vms),
        running=rng.random(vms) < 0.5,
        spell=np.zeros(customers, dtype=np.int64),
        rng=rng,
    )


def day_use(cloud: Cloud, first_s: int, n: int, interval_s: int) -> np.ndarray:
    """What every VM used in each of the ``n`` intervals from ``first_s``: intervals × VMs ×
    (cpu_s, memory_byte_s, disk read, disk written, network received, sent), in the units of
    the samples table, each host's VMs together within what the host has."""
    rng = cloud.rng
    cloud.level = np.clip(cloud.level * rng.lognormal(0, 0.25, cloud.n_vms), 0.3, 2.5)
    starting = (cloud.spell == 0) & (rng.random(len(cloud.spell)) < 0.03)
    cloud.spell = np.maximum(cloud.spell - 1, 0)
    cloud.spell[starting] = rng.integers(2, 6, int(starting.sum()))
    greedy_vm = (cloud.greedy | (cloud.spell > 0))[cloud.vm_customer]

    start = first_s + interval_s * np.arange(n)
    daily = 1 + cloud.amplitude * np.sin(2 * np.pi * (start[:, None] / DAY_S + cloud.phase))
    weekday = ((start // DAY_S + 3) % 7 < 5)[:, None]  # 1970-01-01 was a Thursday
    util = cloud.base * cloud.level * daily * np.where(weekday, 1.0, 0.7)
    util *= rng.lognormal(0, 0.2, util.shape)
    # Batch VMs: jobs of ~6 h, ~12 h idle in between, a Markov chain interval by interval.
    stop_p, start_p = interval_s / (6 * 3600), interval_s / (12 * 3600)
    running = np.empty(util.shape, dtype=bool)
    state = cloud.running
    for t in range(n):
        flip = rng.random(cloud.n_vms) < np.where(state, stop_p, start_p)
        state = state ^ flip
        running[t] = state
    cloud.running = state
    util = np.where(cloud.batch_vm, np.where(running, 0.97, 0.02), util)
    util = np.where(greedy_vm, np.maximum(util, rng.uniform(0.8, 1.0, util.shape)), util)
    util = np.clip(util, 0.0, 1.0)

    io = (0.2 + util) * rng.lognormal(0, 0.5, util.shape) * np.where(greedy_vm, 4.0, 1.0)
    disk = cloud.disk_rate * io * interval_s
    network = cloud.network_rate * io * interval_s
    use = np.stack(
        [
            util * cloud.vm_vcpus * interval_s,
            cloud.memory_fraction * (0.9 + 0.1 * util) * cloud.vm_memory * interval_s,
            disk * cloud.read_share,
            disk * (1 - cloud.read_share),
            # another VM's share: what a VM receives is not tied to what it reads from disk
            network * cloud.read_share[::-1],
            network * (1 - cloud.read_share[::-1]),
        ],
        axis=2,
    )
    # Never more than the host has (0.95 of it): scale the host's VMs down where they would.
    on_host = np.zeros((cloud.n_vms, cloud.n_hosts))
    on_host[np.arange(cloud.n_vms), cloud.vm_host] = 1.0
    per_host = np.einsum("tvr,vh->thr", use, on_host)
    limit = cloud.host_capacity[:, [0, 1, 2, 2, 3, 3]] * interval_s * 0.95
    limit[:, 2:] /= 2  # reads and writes (received and sent) share the bandwidth
    scale = np.minimum(1.0, limit / np.maximum(per_host, 1e-9))
    return use * scale[:, cloud.vm_host, :]


@dataclass(frozen=True)
class DayRows:
    intervals: list[dict[str, Any]]
    batches: list[tuple[Any, ...]]
    host_intervals: list[tuple[Any, ...]]
    samples: dict[str, np.ndarray]
    """one array per column of :data:`SAMPLE_TYPES`"""

    @property
    def n_samples(self) -> int:
        return len(self.samples["vm_id"])


def day_rows(cloud: Cloud, first_s: int, n: int, interval_s: int, first_batch: int) -> DayRows:
    """The day's raw rows as ingest would have stored them: one batch per host and interval,
    received a few seconds after the interval ended, its samples one row per VM."""
    use = day_use(cloud, first_s, n, interval_s)
    hosts = cloud.n_hosts
    vms_on = np.bincount(cloud.vm_host, minlength=hosts).tolist()
    starts = [first_s + t * interval_s for t in range(n)]
    batches: list[tuple[Any, ...]] = []
    host_intervals: list[tuple[Any, ...]] = []
    delay = cloud.rng.uniform(0.5, 8.0, (n, hosts)).tolist()
    capacity = cloud.host_capacity.tolist()
    orgs = (cloud.host_org + 1).tolist()
    for t, start in enumerate(starts):
        for h in range(hosts):
            key = f"cmp-{h:04d}:{start}"
            received = datetime.fromtimestamp(start + interval_s + delay[t][h], UTC)
            batches.append(
                (
                    first_batch + t * hosts + h,
                    key,
                    hashlib.sha256(key.encode()).hexdigest(),
                    h + 1,
                    start,
                    received,
                    vms_on[h],
                    False,
                    BatchState.accepted.value,
                )
            )
            host_intervals.append((start, h + 1, orgs[h], *capacity[h]))
    v = cloud.n_vms
    host_col = np.tile(cloud.vm_host + 1, n)
    flat = use.reshape(n * v, 6)
    samples = {
        "interval_id": np.repeat(np.array(starts, dtype=np.int64), v),
        "vm_id": np.tile(np.arange(1, v + 1), n),
        "host_id": host_col,
        "customer_id": np.tile(cloud.vm_customer + 1, n),
        "batch_id": first_batch + np.repeat(np.arange(n), v) * hosts + host_col - 1,
        **{c: flat[:, k] for k, c in enumerate(USE_COLUMNS)},
        "flavor_vcpus": np.tile(cloud.vm_vcpus, n),
        "flavor_memory_bytes": np.tile(cloud.vm_memory, n),
        "late": np.zeros(n * v, dtype=bool),
    }
    intervals = [
        {"id": s, "start_s": s, "length_s": interval_s, "state": IntervalState.open} for s in starts
    ]
    return DayRows(intervals, batches, host_intervals, samples)


def store_day(engine: sa.Engine, rows: DayRows) -> None:
    """Write the raw rows in one transaction, the fast way each database offers."""
    sample_columns = ", ".join(SAMPLE_TYPES)
    with engine.begin() as conn:
        conn.execute(sa.insert(_intervals), rows.intervals)
        if engine.dialect.name == "postgresql":
            raw = conn.connection.driver_connection
            assert raw is not None
            with raw.cursor() as cur:
                for table, columns, data in (
                    ("batches", BATCH_COLUMNS, rows.batches),
                    ("host_intervals", HOST_INTERVAL_COLUMNS, rows.host_intervals),
                ):
                    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                        for row in data:
                            copy.write_row(row)
            # As ingest stores them: a row of arrays per batch, by binary COPY.
            unreported = np.full(rows.n_samples, np.nan)
            write_batches(
                conn,
                {
                    **rows.samples,
                    "flavor_disk_bytes_per_s": unreported,
                    "flavor_network_bytes_per_s": unreported,
                },
            )
        else:
            conn.execute(
                sa.insert(_batches),
                [dict(zip(BATCH_COLUMNS, b, strict=True)) for b in rows.batches],
            )
            conn.exec_driver_sql(
                f"INSERT INTO host_intervals ({', '.join(HOST_INTERVAL_COLUMNS)})"
                f" VALUES ({', '.join('?' for _ in HOST_INTERVAL_COLUMNS)})",
                rows.host_intervals,
            )
            conn.exec_driver_sql(
                f"INSERT INTO samples ({sample_columns})"
                f" VALUES ({', '.join('?' for _ in SAMPLE_TYPES)})",
                list(zip(*(rows.samples[c].tolist() for c in SAMPLE_TYPES), strict=True)),
            )
        last = max(r["start_s"] for r in rows.intervals)
        conn.execute(sa.update(_hosts).values(last_seen_s=last))


def seed_cloud(engine: sa.Engine, cloud: Cloud, orgs: int, first_s: int) -> None:
    """Organizations, customers (with the project names Nova's metadata would give), hosts and
    VMs, as ingest creates them on first sight."""
    names = [ORGANIZATIONS[o] if o < len(ORGANIZATIONS) else f"org-{o}" for o in range(orgs)]
    with engine.begin() as conn:
        conn.execute(
            sa.insert(_customers),
            [
                {
                    "id": c + 1,
                    "name": name,
                    "display_name": f"project-{c:03d}",
                    "display_source": NameSource.nova.value,
                }
                for c, name in enumerate(cloud.customer_names)
            ],
        )
        conn.execute(
            sa.insert(_organizations),
            [
                {
                    "id": o + 1,
                    "name": name,
                    "customer_id": cloud.lab_customer + 1 if name == "lab" else None,
                }
                for o, name in enumerate(names)
            ],
        )
        conn.execute(
            sa.insert(_hosts),
            [
                {"id": h + 1, "name": f"cmp-{h:04d}", "organization_id": int(org) + 1}
                for h, org in enumerate(cloud.host_org)
            ],
        )
        created = first_s - cloud.rng.integers(0, 90 * DAY_S, cloud.n_vms)
        conn.execute(
            sa.insert(_vms),
            [
                {
                    "id": j + 1,
                    "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"vm-{j}.gmd")),
                    "customer_id": int(cloud.vm_customer[j]) + 1,
                    "host_id": int(cloud.vm_host[j]) + 1,
                    "created_s": int(created[j]),
                }
                for j in range(cloud.n_vms)
            ],
        )


def timed(runs: int, call: Callable[[], T]) -> tuple[float, T]:
    """The median wall time of ``runs`` calls, and the last call's result."""
    seconds = []
    result: T
    for _ in range(runs):
        t0 = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - t0)
    return round(statistics.median(seconds), 4), result


def database_bytes(conn: sa.Connection) -> dict[str, int]:
    if conn.dialect.name == "postgresql":
        size = conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one()
        return {"database_bytes": int(size)}
    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    page = int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
    pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
    free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
    return {"database_bytes": page * pages, "database_free_bytes": page * free}


def days_held(conn: sa.Connection, table: sa.Table, now_s: int, simulated_days: int) -> float:
    """How many days of the run ``table``'s rows cover: for what retention trims (raw data,
    the per-interval ledger, rollups), from its oldest interval or period to now; every other
    table holds the whole run."""
    if table in RAW_TABLES or table in LEDGER_TABLES:
        key = table.c.interval_id
    elif table in ROLLUP_TABLES:
        key = table.c.start_s
    else:
        return float(simulated_days)
    oldest = conn.execute(sa.select(sa.func.min(key))).scalar()
    if oldest is None:
        return 0.0
    return min(float(simulated_days), (now_s - int(oldest)) / DAY_S)


def measure(
    engine: sa.Engine,
    config: Config,
    retention: RetentionConfig,
    now_s: int,
    day: int,
    n_vms: int,
    runs: int,
    png: Path,
) -> dict[str, Any]:
    """Sizes and query latencies of the ledger as it stands at the end of simulated ``day``."""
    t0 = time.perf_counter()
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    vacuum_s = time.perf_counter() - t0
    figures: dict[str, Any] = {
        "day": day,
        "now": iso(now_s),
        "vacuum_analyze_s": round(vacuum_s, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    with engine.connect() as conn:
        figures.update(database_bytes(conn))
        figures["database_bytes_per_vm_day"] = round(figures["database_bytes"] / (n_vms * day), 1)
        found = usage(conn, retention, exact=True, now_s=now_s)
        tables = {t.name: t for t in Base.metadata.sorted_tables}
        per_table: dict[str, dict[str, Any]] = {}
        for row in found.rows:
            name = str(row["table"])
            held = days_held(conn, tables[name], now_s, day)
            size = row["bytes"]
            per_table[name] = {
                "rows": row["rows"],
                "bytes": size,
                "days_held": round(held, 2),
                "bytes_per_vm_day": (
                    None
                    if not isinstance(size, int) or held <= 0
                    else round(size / (n_vms * held), 1)
                ),
            }
        figures["tables"] = per_table
        stored = per_table["samples"]
        if stored["rows"] and isinstance(stored["bytes"], int):
            figures["samples_bytes_per_row"] = round(stored["bytes"] / stored["rows"], 1)
            figures["samples_column_bytes_per_row"] = COLUMN_BYTES
            figures["samples_over_columns"] = round(
                figures["samples_bytes_per_row"] / COLUMN_BYTES, 2
            )
        figures["partitions"] = found.partitions
        for kind, group in (
            ("raw", RAW_TABLES),
            ("ledger", LEDGER_TABLES),
            ("rollup", ROLLUP_TABLES),
        ):
            figures[f"{kind}_bytes"] = sum(per_table[t.name]["bytes"] or 0 for t in group)
        top = conn.execute(
            sa.select(_customers.c.name)
            .join(_ledger, _ledger.c.customer_id == _customers.c.id)
            .where(
                _ledger.c.interval_id
                == sa.select(sa.func.max(_ledger.c.interval_id)).scalar_subquery()
            )
            .order_by(_ledger.c.balance.desc())
            .limit(1)
        ).scalar_one()
        figures["customers_by_level"] = {
            str(level): int(n)
            for level, n in conn.execute(
                sa.select(_levels.c.level, sa.func.count()).group_by(_levels.c.level)
            )
        }
        figures["level_actions"] = int(
            conn.execute(sa.select(sa.func.count()).select_from(_actions)).scalar_one()
        )

    def reading(query: Callable[[sa.Connection], T]) -> Callable[[], T]:
        def run() -> T:
            with engine.connect() as conn:
                return query(conn)

        return run

    month, last_day = now_s - 30 * DAY_S, now_s - DAY_S
    latency: dict[str, float] = {}
    rows: dict[str, int] = {}
    for label, group, from_s in (
        ("report_customer_1d", "customer", last_day),
        ("report_host_30d", "host", month),
        ("report_day_30d", "day", month),
        ("report_customer_30d", "customer", month),
    ):
        latency[label], result = timed(
            runs, reading(partial(report, group_by=group, from_s=from_s, to_s=now_s))
        )
        rows[label] = len(result.rows)
    latency["series_collect_30d"], data = timed(
        runs, reading(lambda c: collect(c, top=5, from_s=month, to_s=now_s))
    )

    def draw_and_save() -> None:
        figure = plotting.draw(data, config.enforcement.policy, config.enforcement.mode)
        plotting.save(figure, png, "png")

    latency["plot_draw_save"], _ = timed(runs, draw_and_save)

    def whole_plot() -> None:
        with engine.connect() as conn:
            series = collect(conn, top=5, from_s=month, to_s=now_s)
        figure = plotting.draw(series, config.enforcement.policy, config.enforcement.mode)
        plotting.save(figure, png, "png")

    latency["plot_total_30d"], _ = timed(runs, whole_plot)
    latency["explain_latest"], explained = timed(runs, reading(lambda c: explain(c, config, top)))
    figures["latency_s"] = latency
    figures["report_rows"] = rows
    figures["plot_intervals"] = len(data.timeline)
    figures["explain_customer"] = top
    figures["explain_interval"] = iso(explained.start_s)
    figures["explain_vms"] = sum(len(h.vms) for h in explained.hosts)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--vms", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--interval", type=int, default=300, help="interval length, seconds")
    parser.add_argument("--customers", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--orgs", type=int, default=4)
    parser.add_argument("--raw-days", type=float, default=7.0)
    parser.add_argument("--ledger-days", type=float, default=400.0)
    parser.add_argument("--runs", type=int, default=3, help="runs per timed query (median)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if DAY_S % args.interval:
        parser.error("--interval must divide a day (86400 s)")
    if not 1 <= args.orgs <= args.hosts or args.customers < 2 or args.days < 1:
        parser.error("need 1 ≤ --orgs ≤ --hosts, --customers ≥ 2 and --days ≥ 1")

    began = time.perf_counter()
    per_day = DAY_S // args.interval
    end_s = int(time.time()) // args.interval * args.interval
    first_s = end_s - args.days * DAY_S
    checkpoints = sorted({d for d in (1, 7, args.days) if d <= args.days})

    admin = name = None
    tmp = tempfile.TemporaryDirectory()
    if args.database == "postgresql":
        url, admin, name = postgres_url(args.url or os.environ.get("GMD_TEST_POSTGRES_URL"))
    else:
        url = f"sqlite:///{Path(tmp.name) / 'ledger.db'}"
    engine = migrate.engine_for(url)
    config = parse({"database": {"url": url}, "accounting": {"interval_s": args.interval}})
    retention = RetentionConfig(raw_days=args.raw_days, ledger_days=args.ledger_days)
    config = dataclasses.replace(config, retention=retention)
    hook = after_interval(config.enforcement)
    png = Path(tmp.name) / "standings.png"
    timings: dict[str, list[float]] = {"generate": [], "store": [], "account": [], "purge": []}
    accounted = 0
    measured: dict[str, Any] = {}
    try:
        migrate.upgrade(engine)
        cloud = make_cloud(args.vms, args.hosts, args.customers, args.orgs, args.seed)
        seed_cloud(engine, cloud, args.orgs, first_s)
        progress(
            f"ledger_growth: {args.vms} VMs, {args.customers} customers, {args.hosts} hosts,"
            f" {args.days} days of {args.interval} s intervals ({per_day} a day) from"
            f" {iso(first_s)} to {iso(end_s)} on {args.database}"
        )
        next_batch = 1
        for day in range(1, args.days + 1):
            day_start = first_s + (day - 1) * DAY_S
            day_end = day_start + DAY_S
            partitions.ensure_days(engine, range(day_start // DAY_S, (day_end - 1) // DAY_S + 1))
            t0 = time.perf_counter()
            rows = day_rows(cloud, day_start, per_day, args.interval, next_batch)
            next_batch += per_day * args.hosts
            t1 = time.perf_counter()
            store_day(engine, rows)
            t2 = time.perf_counter()
            run = account_due(
                engine,
                config.accounting,
                now_s=day_end + config.accounting.grace_s,
                budget_s=float("inf"),
                after=hook,
            )
            t3 = time.perf_counter()
            if len(run.accounted) != per_day:
                raise RuntimeError(f"day {day}: accounted {len(run.accounted)} of {per_day}")
            accounted += len(run.accounted)
            done = purge(engine, retention, now_s=day_end)
            t4 = time.perf_counter()
            for key, seconds in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                timings[key].append(round(seconds, 2))
            progress(
                f"day {day}/{args.days}: generated {t1 - t0:.1f} s, stored {rows.n_samples}"
                f" samples {t2 - t1:.1f} s, accounted {per_day} intervals {t3 - t2:.1f} s"
                f" (median {statistics.median(run.seconds) * 1000:.0f} ms), purge {t4 - t3:.1f} s"
                + (f" ({len(done.partitions)} partitions dropped)" if done.partitions else "")
            )
            if day in checkpoints:
                figures = measure(engine, config, retention, day_end, day, args.vms, args.runs, png)
                measured[str(day)] = figures
                progress(
                    f"day {day}: database {figures['database_bytes'] / 1e6:.0f} MB;"
                    + ", ".join(f" {k} {v:.3f} s" for k, v in figures["latency_s"].items())
                )
    finally:
        engine.dispose()
        drop_database(admin, name)
        tmp.cleanup()

    first, last = measured[str(checkpoints[0])], measured[str(checkpoints[-1])]
    ratio = last["latency_s"]["report_customer_1d"] / first["latency_s"]["report_customer_1d"]
    final = last["latency_s"]
    figures_out = {
        "benchmark": "ledger_growth",
        "database": args.database,
        "vms": args.vms,
        "customers": args.customers,
        "hosts": args.hosts,
        "organizations": args.orgs,
        "days": args.days,
        "interval_s": args.interval,
        "intervals_accounted": accounted,
        "raw_days": args.raw_days,
        "ledger_days": args.ledger_days,
        "runs": args.runs,
        "seconds_by_day": timings,
        "accounting_seconds": round(sum(timings["account"]), 1),
        "accounting_ms_per_interval": round(sum(timings["account"]) / accounted * 1000, 1),
        "database_mb": {d: round(m["database_bytes"] / 1e6, 1) for d, m in measured.items()},
        "raw_mb": {d: round(m["raw_bytes"] / 1e6, 1) for d, m in measured.items()},
        "ledger_mb": {d: round(m["ledger_bytes"] / 1e6, 1) for d, m in measured.items()},
        "rollup_mb": {d: round(m["rollup_bytes"] / 1e6, 1) for d, m in measured.items()},
        "latency_s": {d: m["latency_s"] for d, m in measured.items()},
        "checkpoints": measured,
        "report_customer_1d_ratio_last_to_first": round(ratio, 3),
        "samples_bytes_per_row": last.get("samples_bytes_per_row"),
        "samples_column_bytes_per_row": COLUMN_BYTES,
        "samples_over_columns": last.get("samples_over_columns"),
        "targets": {
            "samples_over_columns": {
                "value": last.get("samples_over_columns"),
                "max": 1.3,
                "met": (last.get("samples_over_columns") or 99) <= 1.3,
            },
            "report_customer_1d_ratio": {"value": round(ratio, 3), "max": 1.2, "met": ratio <= 1.2},
            "report_host_30d_s": {
                "value": final["report_host_30d"],
                "max": 1.0,
                "met": final["report_host_30d"] < 1.0,
            },
            "report_day_30d_s": {
                "value": final["report_day_30d"],
                "max": 1.0,
                "met": final["report_day_30d"] < 1.0,
            },
            "plot_total_30d_s": {
                "value": final["plot_total_30d"],
                "max": 2.0,
                "met": final["plot_total_30d"] < 2.0,
            },
        },
        "wall_seconds": round(time.perf_counter() - began, 1),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(figures_out))


if __name__ == "__main__":
    main()
