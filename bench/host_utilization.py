"""Time the read route a fairness-aware Nova weigher calls: every host's measured utilisation
(``GET /v1/hosts/utilization``, :func:`gmd.daemon.reports.host_utilization.host_utilization`).

    python bench/host_utilization.py --database postgresql --vms 100000 --hosts 5000

Seeds one interval of the random cloud of ``bench/accounting.py`` as ``bench/ledger_accounting.py``
does, accounts it, then times the query ``--runs`` times beside the physical floor measured in
the same run: a binary COPY of the interval's samples (every column, unparsed), which the
query must at least read. Prints a JSON line last.
"""

from __future__ import annotations

import json
import statistics
import time

from ledger_accounting import INTERVAL_S, START_S, cloud_arguments, read_only, seeded_ledger

from gmd.daemon.config import parse
from gmd.daemon.ledger.accounting import account_next
from gmd.daemon.reports.host_utilization import host_utilization


def main() -> None:
    args = cloud_arguments(__doc__.splitlines()[0]).parse_args()
    with seeded_ledger(args) as (engine, interval_id):
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
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
