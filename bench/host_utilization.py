"""Time the read route a fairness-aware Nova weigher calls: every host's measured utilisation
(``GET /v1/hosts/utilization``, :func:`gmd.daemon.reports.host_utilization.host_utilization`).

    python bench/host_utilization.py --database postgresql --vms 100000 --hosts 5000

Seeds one interval of the random cloud of ``bench/accounting.py`` as ``bench/ledger_accounting.py``
does, accounts it, then times the query ``--runs`` times beside the physical floor measured in
the same run: a binary COPY of the interval's samples (every column, unparsed), which the
query must at least read. Prints a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from ledger_accounting import INTERVAL_S, START_S, drop_database, postgres_url, read_only, seed

from gmd.daemon.config import parse
from gmd.daemon.ledger import migrate
from gmd.daemon.ledger.accounting import account_next
from gmd.daemon.reports.host_utilization import host_utilization


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--vms", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=5_000)
    parser.add_argument("--customers", type=int, default=2_000)
    parser.add_argument("--orgs", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    admin = name = None
    tmp = tempfile.TemporaryDirectory()
    if args.database == "postgresql":
        url, admin, name = postgres_url(args.url)
    else:
        url = f"sqlite:///{Path(tmp.name) / 'ledger.db'}"
    engine = migrate.engine_for(url)
    try:
        migrate.upgrade(engine)
        interval_id = seed(engine, args.vms, args.hosts, args.customers, args.orgs)
        config = parse({"accounting": {"interval_s": int(INTERVAL_S)}}).accounting
        assert account_next(engine, config) == START_S
        times, hosts = [], 0
        for _ in range(args.runs):
            with engine.connect() as conn:
                t0 = time.perf_counter()
                answer = host_utilization(conn, intervals=3, project="proj-1")
                times.append(time.perf_counter() - t0)
            hosts = len(answer.hosts)
        floor = [read_only(engine, interval_id) for _ in range(args.runs)]
        figures = {
            "benchmark": "host_utilization",
            "database": args.database,
            "vms": args.vms,
            "hosts": hosts,
            "runs": args.runs,
            "seconds_median": round(statistics.median(times), 4),
            "seconds_min": round(min(times), 4),
            "read_samples_seconds_median": round(statistics.median(floor), 4),
            "ratio_to_reading_samples": round(
                statistics.median(times) / statistics.median(floor), 2
            ),
        }
    finally:
        engine.dispose()
        drop_database(admin, name)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
