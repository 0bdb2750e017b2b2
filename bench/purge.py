"""What purging VMs and customers unseen past retention costs, and what marking them seen
costs ingest at the turn of a UTC day (schema 0010).

    python bench/purge.py --database postgresql --hosts 200 --vms-per-host 500 --customers 10000

Through the ledger store (the API's own write path, no HTTP), every host posts one batch on
each of three intervals: the first creates the VMs and customers of a day 40 days ago, the
second is later the same day (nothing to mark), the third the next day (each VM and customer
marked seen once). The batches' median times are compared, with the marking statement alone
for one batch's VMs beside them. Then raw retention drops the samples'
partitions and the purge times how long it takes to delete every VM and customer, now all
unseen past retention, against the ceiling measured in the same run: one plain ``DELETE`` of
as many rows from copies of the two tables with their indexes and no key pointing at them.

What the foreign key 0010 dropped would have cost: each deleted VM made PostgreSQL look for
samples of it with no index to use; ``fk_scan_s_per_vm_per_million_samples`` is the time of
that look-up over this run's samples, scaled to a million of them (a 100,000-VM cloud keeps
4.3 billion at one-minute intervals and ``raw_days = 31``). Prints a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from ledger_accounting import drop_database, postgres_url

from gmd.daemon.config import RetentionConfig
from gmd.daemon.ingest.record import BatchRecord
from gmd.daemon.ingest.store import LedgerStore
from gmd.daemon.ledger import partitions
from gmd.daemon.ledger.retention import purge
from gmd.ledger_schema import migrate
from gmd.ledger_schema.tables import vms

INTERVAL_S = 300
DAY_S = 86400


def post_round(
    store: LedgerStore, start_s: int, hosts: int, per_host: int, customers: int
) -> list[float]:
    """Every host's batch for the interval at ``start_s``; the seconds each took."""
    rng = np.random.default_rng(start_s)
    took = []
    for h in range(hosts):
        uuids = [f"vm-{h}-{j}" for j in range(per_host)]
        record = BatchRecord(
            key=f"h{h}:{start_s}",
            digest="bench",
            host=f"h{h}",
            interval_start_s=start_s,
            interval_s=INTERVAL_S,
            capacity=(64.0, 256e9, 1e9, 1.25e9),
            vm_uuids=uuids,
            customers=[f"proj-{(h * per_host + j) % customers}" for j in range(per_host)],
            use=rng.uniform(0, 1, (per_host, 6)) * [60, 8e9, 1e6, 1e6, 1e5, 1e5],
            flavor=np.tile([2.0, 4e9, np.nan, np.nan], (per_host, 1)),
            created_s=[None] * per_host,
        )
        t = time.perf_counter()
        store.ingest(record, now_s=start_s + INTERVAL_S)
        took.append(time.perf_counter() - t)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--vms-per-host", type=int, default=500)
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=10_000, help="[retention] delete_chunk")
    args = parser.parse_args()

    admin = name = None
    if args.database == "postgresql":
        url, admin, name = postgres_url(args.url)
    else:
        url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'ledger.db'}"
    engine = migrate.engine_for(url)
    try:
        migrate.upgrade(engine)
        now = int(time.time())
        old = now - now % DAY_S - 40 * DAY_S
        store = LedgerStore(engine, lambda _h: "operator")
        n_vms = args.hosts * args.vms_per_host
        post_round(store, old, args.hosts, args.vms_per_host, args.customers)
        same_day = post_round(
            store, old + INTERVAL_S, args.hosts, args.vms_per_host, args.customers
        )
        next_day = post_round(store, old + DAY_S, args.hosts, args.vms_per_host, args.customers)
        with engine.begin() as conn:
            ids = conn.execute(sa.text("SELECT id FROM vms ORDER BY id")).scalars().all()
            n = args.vms_per_host
            marks = []
            for k in range(5):
                # A host's VMs as the third round left them: marked seen a day after the first.
                one_batch = list(ids[k * n : (k + 1) * n])
                t = time.perf_counter()
                store.ids.mark_seen(conn, vms, one_batch, old + 2 * DAY_S)
                marks.append(time.perf_counter() - t)
            # The rows must stay as ingest left them for the purge below.
            conn.rollback()
        # What a foreign key on samples.vm_id would do per deleted VM: look for its samples.
        with engine.connect() as conn:
            samples = conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one()
            scans = []
            for _ in range(3):
                t = time.perf_counter()
                conn.execute(sa.text("SELECT 1 FROM samples WHERE vm_id = -1 LIMIT 1")).all()
                scans.append(time.perf_counter() - t)
        fk_scan = statistics.median(scans) / samples * 1e6

        # Every interval accounted (nothing holds raw retention back), the raw days dropped.
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE intervals SET state = 'accounted', ledger_rows = 0"))
        retention = RetentionConfig(
            raw_days=31, ledger_days=400, delete_chunk=args.chunk, max_run_s=3600
        )
        if partitions.partitioned(engine):
            partitions.drop_before(engine, now - 31 * DAY_S)
        # The ceiling: plain deletes of as many rows, from copies nothing points at.
        with engine.begin() as conn:
            for table in ("vms", "customers"):
                if engine.dialect.name == "postgresql":
                    conn.execute(sa.text(f"CREATE TABLE {table}_copy (LIKE {table} INCLUDING ALL)"))
                else:
                    ddl = conn.execute(
                        sa.text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": table}
                    ).scalar_one()
                    conn.execute(sa.text(ddl.replace(table, f"{table}_copy", 1)))
                conn.execute(sa.text(f"INSERT INTO {table}_copy SELECT * FROM {table}"))
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                conn.execute(sa.text("ANALYZE"))
                conn.commit()
        t = time.perf_counter()
        with engine.begin() as conn:
            plain = sum(
                conn.execute(sa.text(f"DELETE FROM {table}_copy")).rowcount
                for table in ("vms", "customers")
            )
        ceiling_s = time.perf_counter() - t
        t = time.perf_counter()
        report = purge(engine, retention, now_s=now)
        purge_s = time.perf_counter() - t
        with engine.connect() as conn:
            left = conn.execute(sa.text("SELECT count(*) FROM vms")).scalar_one()
        assert left == 0, f"{left} VMs left"
        figures = {
            "benchmark": "purge_unseen",
            "database": engine.dialect.name,
            "vms": n_vms,
            "customers": args.customers,
            "hosts": args.hosts,
            "batch_same_day_ms": round(statistics.median(same_day) * 1e3, 2),
            "batch_marking_ms": round(statistics.median(next_day) * 1e3, 2),
            "mark_alone_ms": round(statistics.median(marks) * 1e3, 2),
            "purge_s": round(purge_s, 3),
            "purge_vms_s": round(report.seconds.get("vms", 0.0), 3),
            "purge_customers_s": round(report.seconds.get("customers", 0.0), 3),
            "purged_vms": report.rows.get("vms", 0),
            "purged_customers": report.rows.get("customers", 0),
            "plain_delete_s": round(ceiling_s, 3),
            "plain_delete_rows": plain,
            "purge_vs_plain": round(purge_s / ceiling_s, 2) if ceiling_s else None,
            "samples_scanned": samples,
            "fk_scan_s_per_vm_per_million_samples": round(fk_scan, 4),
        }
        print(json.dumps(figures))
    finally:
        engine.dispose()
        drop_database(admin, name)


if __name__ == "__main__":
    main()
