"""Time one cloud interval's accounting in the pure core: batched GM + DirectContr update.

    python bench/accounting.py --vms 100000 --hosts 5000

Builds a random but plausible cloud (flavored VMs, overcommitted CPU, customers spread over
hosts, organizations owning hosts), then times ``cloud_greediness`` (flavor endowments),
``normalized_work``, ``directcontr_update`` and the balance decay together. Prints a line per
run and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from gmd.fairness import (
    CloudInterval,
    DirectContrBalances,
    cloud_greediness,
    decayed_balance,
    directcontr_update,
    normalized_work,
)

INTERVAL_S = 60.0
GIB = 2.0**30


def random_cloud(
    n_vms: int, n_hosts: int, n_customers: int, n_orgs: int, seed: int
) -> tuple[CloudInterval, np.ndarray]:
    rng = np.random.default_rng(seed)
    cores = rng.choice([16, 32, 64, 128], n_hosts)
    ram = cores * rng.choice([4, 8], n_hosts) * GIB
    disk_bps = rng.choice([500e6, 1e9, 2e9], n_hosts)
    net_bps = rng.choice([1.25e9, 3.125e9], n_hosts)
    supply = np.column_stack([cores, ram, disk_bps, net_bps]) * INTERVAL_S

    host_of = rng.integers(0, n_hosts, n_vms)
    customer_of = np.minimum(rng.zipf(1.5, n_vms) - 1, n_customers - 1)
    vcpus = rng.choice([1, 2, 4, 8, 16], n_vms)
    configured = np.column_stack(
        [vcpus, vcpus * 4 * GIB, np.full(n_vms, np.nan), np.full(n_vms, np.nan)]
    ) * np.array([INTERVAL_S, INTERVAL_S, 1.0, 1.0])
    load = rng.beta(0.7, 1.5, (n_vms, 4)) * 1.3
    use = load * np.column_stack(
        [configured[:, 0], configured[:, 1], supply[host_of, 2] / 8, supply[host_of, 3] / 8]
    )
    interval = CloudInterval(
        use=use,
        supply=supply,
        host_of_vm=host_of,
        customer_of_vm=customer_of,
        n_customers=n_customers,
        configured=configured,
        resources=["cpu", "memory", "disk", "network"],
    )
    # Accounts: customers first, then organizations; org k owns hosts h with h % n_orgs == k.
    host_owner = n_customers + (np.arange(n_hosts) % n_orgs)
    return interval, host_owner


def account(
    interval: CloudInterval,
    host_owner: np.ndarray,
    balances: np.ndarray,
    contr: DirectContrBalances,
    start_s: float,
) -> tuple[np.ndarray, DirectContrBalances]:
    gm = cloud_greediness(interval, gamma=0.5, endowment="flavor")
    new_balances = decayed_balance(balances, gm.customer_greediness, INTERVAL_S, 7 * 86400.0)
    work = normalized_work(interval.use, gm.share)
    new_contr = directcontr_update(
        contr,
        work,
        interval.customer_of_vm,
        host_owner[interval.host_of_vm],
        interval_start_s=start_s,
        interval_s=INTERVAL_S,
        half_life_s=7 * 86400.0,
    )
    return new_balances, new_contr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=5_000)
    parser.add_argument("--customers", type=int, default=2_000)
    parser.add_argument("--orgs", type=int, default=20)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    interval, host_owner = random_cloud(args.vms, args.hosts, args.customers, args.orgs, args.seed)
    balances = np.zeros(args.customers)
    contr = DirectContrBalances.zeros(args.customers + args.orgs)
    account(interval, host_owner, balances, contr, 0.0)  # warm-up: page in numpy paths

    times = []
    for run in range(args.runs):
        t0 = time.perf_counter()
        balances, contr = account(interval, host_owner, balances, contr, run * INTERVAL_S)
        times.append(time.perf_counter() - t0)
        print(f"run {run + 1}: {times[-1] * 1000:.1f} ms")

    figures = {
        "benchmark": "accounting",
        "vms": args.vms,
        "hosts": args.hosts,
        "customers": args.customers,
        "organizations": args.orgs,
        "runs": args.runs,
        "seconds_median": round(statistics.median(times), 4),
        "seconds_min": round(min(times), 4),
        "seconds_max": round(max(times), 4),
        "target_seconds": 0.2,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
