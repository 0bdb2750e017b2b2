"""What a what-if costs: a week of 1,000 VMs replayed with one override, beside its bound.

    python bench/whatif.py --database postgresql --vms 1000 --days 7 --interval 300

Builds a ledger as ``bench/ledger_growth.py`` does (its cloud, its raw rows written directly,
then gmd's own accountant with the level decisions), ``--days`` of ``--interval`` intervals
(7 days of 300 s: 2,016 intervals, about 2 million samples at 1,000 VMs). Then, on that
ledger, in the same run:

- **the bound**: reading every replayed interval's raw samples alone (``read_samples``, what
  accounting reads), and the same with the hosts' capacities (``read_raw_interval``, what the
  replay reads);
- **the what-if**: ``gmd.daemon.reports.whatif.replay`` of the whole range with ``--set``
  (default ``accounting.gamma=0.3``), which reads the same and steps every interval and level
  decision in memory.

Target (printed, never asserted): the what-if within 2× of reading its samples alone. Without
``--url``, PostgreSQL is ``$GMD_TEST_POSTGRES_URL`` or the test cluster that
``tests/scripts/postgres.sh`` starts; a database is created and dropped. Progress on stderr; the
last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from ledger_accounting import drop_database, postgres_url
from ledger_growth import DAY_S, day_rows, make_cloud, progress, seed_cloud, store_day

from gmd.daemon.config import parse
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger import partitions
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.interval_samples import read_raw_interval, read_samples
from gmd.daemon.reports.whatif import indicators, replay, with_overrides
from gmd.ledger_schema import migrate
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.tables import intervals as _intervals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--vms", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--interval", type=int, default=300, help="interval length, seconds")
    parser.add_argument("--customers", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--orgs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--set", dest="sets", action="append", default=None)
    args = parser.parse_args()
    if DAY_S % args.interval:
        parser.error("--interval must divide a day (86400 s)")
    if not 1 <= args.orgs <= args.hosts or args.customers < 2 or args.days < 1:
        parser.error("need 1 ≤ --orgs ≤ --hosts, --customers ≥ 2 and --days ≥ 1")
    sets = args.sets or ["accounting.gamma=0.3"]

    per_day = DAY_S // args.interval
    end_s = int(time.time()) // args.interval * args.interval
    first_s = end_s - args.days * DAY_S
    admin = name = None
    tmp = tempfile.TemporaryDirectory()
    if args.database == "postgresql":
        url, admin, name = postgres_url(args.url or os.environ.get("GMD_TEST_POSTGRES_URL"))
    else:
        url = f"sqlite:///{Path(tmp.name) / 'ledger.db'}"
    document = {"database": {"url": url}, "accounting": {"interval_s": args.interval}}
    config = parse(document)
    engine = migrate.engine_for(url)
    try:
        migrate.upgrade(engine)
        cloud = make_cloud(args.vms, args.hosts, args.customers, args.orgs, args.seed)
        seed_cloud(engine, cloud, args.orgs, first_s)
        progress(
            f"whatif: building {args.days} days of {args.vms} VMs ({per_day} intervals a day)"
            f" on {args.database}"
        )
        built = time.perf_counter()
        next_batch = 1
        for day in range(args.days):
            day_start = first_s + day * DAY_S
            partitions.ensure_days(
                engine, range(day_start // DAY_S, (day_start + DAY_S - 1) // DAY_S + 1)
            )
            store_day(engine, day_rows(cloud, day_start, per_day, args.interval, next_batch))
            next_batch += per_day * args.hosts
            account_due(
                engine,
                config.accounting,
                now_s=day_start + DAY_S + config.accounting.grace_s,
                budget_s=float("inf"),
                after=after_interval(config.enforcement),
            )
            progress(f"  day {day + 1}: stored and accounted")
        build_s = time.perf_counter() - built
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text("VACUUM ANALYZE"))
        with engine.connect() as conn:
            ids = (
                conn.execute(
                    sa.select(_intervals.c.id)
                    .where(_intervals.c.state == IntervalState.accounted)
                    .order_by(_intervals.c.start_s)
                )
                .scalars()
                .all()
            )
            progress(f"whatif: timing {len(ids)} intervals")
            t0 = time.perf_counter()
            samples = sum(len(read_samples(conn, i)) for i in ids)
            read_samples_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in ids:
                read_raw_interval(conn, i, config.accounting)
            read_raw_s = time.perf_counter() - t0
            changed = with_overrides(config, sets)
            t0 = time.perf_counter()
            result = replay(conn, changed, first_s, end_s, sets)
            whatif_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            same = replay(conn, config, first_s, end_s)
            same_s = time.perf_counter() - t0
        figures = {
            "database": args.database,
            "vms": args.vms,
            "intervals": len(ids),
            "samples": samples,
            "sets": sets,
            "build_s": round(build_s, 1),
            "read_samples_s": round(read_samples_s, 3),
            "read_raw_interval_s": round(read_raw_s, 3),
            "whatif_s": round(whatif_s, 3),
            "whatif_no_override_s": round(same_s, 3),
            "whatif_over_read_samples": round(whatif_s / read_samples_s, 2),
            "target_ratio": 2.0,
            "indicators": indicators(result),
            "customers": len(result.customers),
            "no_override_indicators": indicators(same),
        }
        print(json.dumps(figures))
    finally:
        engine.dispose()
        if admin is not None and name is not None:
            drop_database(admin, name)
        tmp.cleanup()


if __name__ == "__main__":
    main()
