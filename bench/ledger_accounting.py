"""Time accounting one interval from the database, end to end: read samples, compute, write rows.

    python bench/ledger_accounting.py --database postgresql --vms 100000 --hosts 5000

Seeds a fresh ledger with the random cloud of ``bench/accounting.py`` (bulk inserts, not the
API: this measures accounting, not ingest), then times :func:`account_next` on the interval,
``--runs`` times (the interval is reopened and its rows deleted between runs), and splits one
run into read / compute / write. Without ``--url``, PostgreSQL is the test cluster that
``tests/scripts/postgres.sh`` starts. Prints a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from accounting import INTERVAL_S, random_cloud

from gmd.daemon.config import parse
from gmd.daemon.ledger import partitions
from gmd.daemon.ledger.accounting import account_next, compute_rows, write_rows
from gmd.daemon.ledger.sample_store import write_batches
from gmd.ledger_schema import migrate
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.models import Batch, Customer, Host, HostInterval, Interval, Organization, Vm

REPO = Path(__file__).resolve().parents[1]
# Ten minutes into an hour: an interval that does not end an hour, so what is timed is the
# accounting of every interval, not the hour's rollup that one in sixty intervals adds.
START_S = 1_800_000_000 - 1_800_000_000 % 3600 + 600


def postgres_url(given: str | None) -> tuple[str, sa.Engine | None, str | None]:
    """A fresh database: on ``given`` or the test cluster; returns url, admin engine, name."""
    server = (
        given
        or subprocess.run(
            ["bash", str(REPO / "tests" / "scripts" / "postgres.sh")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    name = f"gmd_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return server.rsplit("/", 1)[0] + f"/{name}", admin, name


def drop_database(admin: sa.Engine | None, name: str | None) -> None:
    """Drop the database :func:`postgres_url` made (nothing when none was)."""
    if admin is None:
        return
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def seed(engine: sa.Engine, n_vms: int, n_hosts: int, n_customers: int, n_orgs: int) -> int:
    interval, host_owner = random_cloud(n_vms, n_hosts, n_customers, n_orgs, seed=1)
    supply = np.asarray(interval.supply) / INTERVAL_S
    use = np.asarray(interval.use)
    flavor = np.asarray(interval.configured) / INTERVAL_S
    host_of = np.asarray(interval.host_of_vm)
    customer_of = np.asarray(interval.customer_of_vm)
    partitions.ensure_days(engine, [START_S // partitions.DAY_S])
    with engine.begin() as conn:
        conn.execute(
            sa.insert(Organization.__table__),
            [{"id": o + 1, "name": f"org-{o}"} for o in range(n_orgs)],
        )
        conn.execute(
            sa.insert(Customer.__table__),
            [{"id": c + 1, "name": f"proj-{c}"} for c in range(n_customers)],
        )
        owner_org = host_owner - n_customers + 1
        conn.execute(
            sa.insert(Host.__table__),
            [
                {"id": h + 1, "name": f"cmp-{h}", "organization_id": int(owner_org[h])}
                for h in range(n_hosts)
            ],
        )
        conn.execute(
            sa.insert(Vm.__table__),
            [
                {
                    "id": j + 1,
                    "uuid": f"vm-{j}",
                    "customer_id": int(customer_of[j]) + 1,
                    "host_id": int(host_of[j]) + 1,
                }
                for j in range(n_vms)
            ],
        )
        interval_id = conn.execute(
            sa.insert(Interval.__table__)
            .values(
                id=START_S, start_s=START_S, length_s=int(INTERVAL_S), state=IntervalState.closed
            )
            .returning(Interval.__table__.c.id)
        ).scalar_one()
        conn.execute(
            sa.insert(HostInterval.__table__),
            [
                {
                    "interval_id": interval_id,
                    "host_id": h + 1,
                    "organization_id": int(owner_org[h]),
                    "cpu_cores": float(supply[h, 0]),
                    "memory_bytes": float(supply[h, 1]),
                    "disk_bytes_per_s": float(supply[h, 2]),
                    "network_bytes_per_s": float(supply[h, 3]),
                }
                for h in range(n_hosts)
            ],
        )
        conn.execute(
            sa.insert(Batch.__table__),
            [
                {
                    "id": h + 1,
                    "key": f"cmp-{h}:{START_S}",
                    "digest": "seeded",
                    "host_id": h + 1,
                    "interval_id": interval_id,
                    "samples": 0,
                }
                for h in range(n_hosts)
            ],
        )
        n = len(host_of)
        write_batches(
            conn,
            {
                "interval_id": np.full(n, interval_id),
                "vm_id": np.arange(1, n + 1),
                "host_id": host_of + 1,
                "customer_id": customer_of + 1,
                "batch_id": host_of + 1,
                "cpu_s": use[:, 0],
                "memory_byte_s": use[:, 1],
                "disk_read_bytes": use[:, 2] / 2,
                "disk_write_bytes": use[:, 2] / 2,
                "network_rx_bytes": use[:, 3] / 2,
                "network_tx_bytes": use[:, 3] / 2,
                "flavor_vcpus": flavor[:, 0],
                "flavor_memory_bytes": flavor[:, 1],
                "flavor_disk_bytes_per_s": np.full(n, np.nan),
                "flavor_network_bytes_per_s": np.full(n, np.nan),
                "late": np.zeros(n, dtype=bool),
            },
        )
    return interval_id


def reopen(engine: sa.Engine, interval_id: int) -> None:
    with engine.begin() as conn:
        for table in ("customer_resource_ledger", "customer_ledger", "organization_ledger"):
            conn.execute(sa.text(f"DELETE FROM {table} WHERE interval_id = :i"), {"i": interval_id})
        conn.execute(
            sa.text("UPDATE intervals SET state = 'closed' WHERE id = :i"), {"i": interval_id}
        )


def read_only(
    engine: sa.Engine, interval_id: int, copy: bool = True, table: str = "samples"
) -> float:
    """The floor under accounting: the time to merely read the interval's samples, every
    column: as rows fetched by the driver (``copy`` False), or on PostgreSQL as a binary COPY
    into memory, unparsed (the lowest there is), of the samples' rows (``table`` samples, the
    view) or of the stored batches (``sample_batches``: the arrays as stored)."""
    with engine.connect() as conn:
        t0 = time.perf_counter()
        if engine.dialect.name == "postgresql" and copy:
            raw = conn.connection.driver_connection
            with (
                raw.cursor() as cursor,
                cursor.copy(
                    f"COPY (SELECT * FROM {table} WHERE interval_id = {interval_id})"
                    " TO STDOUT (FORMAT binary)"
                ) as copy,
            ):
                size = sum(len(block) for block in copy)
            assert size > 0
        else:
            conn.exec_driver_sql(
                f"SELECT * FROM samples WHERE interval_id = {interval_id}"
            ).fetchall()
        return time.perf_counter() - t0


def cloud_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark on the seeded random cloud (this one, host_utilization.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--vms", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=5_000)
    parser.add_argument("--customers", type=int, default=2_000)
    parser.add_argument("--orgs", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    return parser


@contextmanager
def seeded_ledger(args: argparse.Namespace) -> Iterator[tuple[sa.Engine, int]]:
    """A fresh ledger on ``args.database`` holding one closed interval of the random cloud
    (:func:`seed`), and that interval's id; dropped on exit."""
    admin = name = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.database == "postgresql":
            url, admin, name = postgres_url(args.url)
        else:
            url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        engine = migrate.engine_for(url)
        try:
            migrate.upgrade(engine)
            t0 = time.perf_counter()
            interval_id = seed(engine, args.vms, args.hosts, args.customers, args.orgs)
            print(f"seeded {args.vms} samples in {time.perf_counter() - t0:.1f} s")
            yield engine, interval_id
        finally:
            engine.dispose()
            drop_database(admin, name)


def main() -> None:
    args = cloud_arguments(__doc__.splitlines()[0]).parse_args()
    with seeded_ledger(args) as (engine, interval_id):
        config = parse({"accounting": {"interval_s": int(INTERVAL_S)}}).accounting

        times = []
        for run in range(args.runs):
            t0 = time.perf_counter()
            assert account_next(engine, config) == START_S
            times.append(time.perf_counter() - t0)
            print(f"run {run + 1}: {times[-1]:.3f} s")
            reopen(engine, interval_id)

        read_times = [read_only(engine, interval_id) for _ in range(args.runs)]
        row_times = [read_only(engine, interval_id, copy=False) for _ in range(args.runs)]
        stored_times = (
            [read_only(engine, interval_id, table="sample_batches") for _ in range(args.runs)]
            if engine.dialect.name == "postgresql"
            else None
        )
        with migrate.writer(engine).begin() as conn:
            t0 = time.perf_counter()
            rows = compute_rows(conn, interval_id, config)
            t1 = time.perf_counter()
            write_rows(conn, interval_id, rows)
            t2 = time.perf_counter()
        figures = {
            "benchmark": "ledger_accounting",
            "database": args.database,
            "vms": args.vms,
            "hosts": args.hosts,
            "customers": args.customers,
            "runs": args.runs,
            "seconds_median": round(statistics.median(times), 3),
            "seconds_min": round(min(times), 3),
            "seconds_max": round(max(times), 3),
            "read_and_compute_seconds": round(t1 - t0, 3),
            "write_seconds": round(t2 - t1, 3),
            "rows_written": len(rows.customers) + len(rows.resources) + len(rows.organizations),
            "read_samples_seconds": round(statistics.median(read_times), 3),
            "over_read": round(statistics.median(times) / statistics.median(read_times), 2),
            "read_stored_seconds": None
            if stored_times is None
            else round(statistics.median(stored_times), 3),
            "over_read_stored": None
            if stored_times is None
            else round(statistics.median(times) / statistics.median(stored_times), 2),
            "fetch_rows_seconds": round(statistics.median(row_times), 3),
            "over_fetch": round(statistics.median(times) / statistics.median(row_times), 2),
            "target_over_read": 1.5,
            "target_seconds": 5.0,
            "cpus": os.cpu_count(),
        }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
