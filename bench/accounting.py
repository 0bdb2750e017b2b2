"""Time one cloud interval's accounting in the pure core: batched GM + DirectContr update.

    python bench/accounting.py --vms 100000 --hosts 5000

Builds a random but plausible cloud (flavored VMs, overcommitted CPU, customers spread over
hosts, organizations owning hosts), then times ``account()``: ``cloud_greediness`` (flavor
endowments), ``normalized_work``, ``directcontr_update`` and the balance decay together, as
accounting calls them.

Against it, in the same run and alternating with it, ``minimal()``: the same math written as
plainly as numpy allows (one whole-array expression per formula, no checks, no dataclasses, no
intermediate results kept), checked to give the same balances and sums. That is what the math
itself costs, so it sets the ceiling: the core may cost at most ``target_over_minimal`` (1.3×)
what ``minimal()`` does, the rest paying for input checks and the per-VM and per-host figures
that ``gmd-admin explain`` shows (issue 33). The ratio, unlike seconds, carries from machine to
machine. (The core can come out below 1: it works one resource column at a time, which keeps
10^6-VM passes in cache, a layout trick the plain version does not play.)

Prints a line per run and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from gmd.fairness.cloud import CloudInterval, cloud_greediness
from gmd.fairness.decay import decayed_balance
from gmd.fairness.directcontr import DirectContrBalances, directcontr_update, normalized_work

INTERVAL_S = 60.0
GIB = 2.0**30
HALF_LIFE_S = 7 * 86400.0


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
    new_balances = decayed_balance(balances, gm.customer_greediness, INTERVAL_S, HALF_LIFE_S)
    work = normalized_work(interval.use, gm.share)
    new_contr = directcontr_update(
        contr,
        work,
        interval.customer_of_vm,
        host_owner.take(np.asarray(interval.host_of_vm)),
        interval_start_s=start_s,
        interval_s=INTERVAL_S,
        half_life_s=HALF_LIFE_S,
    )
    return new_balances, new_contr


def contr_sums(contr: DirectContrBalances) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four DirectContr sums, as ``minimal()`` keeps them."""
    return (
        contr.utility_work,
        contr.utility_moment,
        contr.contribution_work,
        contr.contribution_moment,
    )


def minimal(
    interval: CloudInterval,
    host_owner: np.ndarray,
    balances: np.ndarray,
    sums: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    start_s: float,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``account()``'s math and nothing else, each formula as one plain numpy expression.

    No checks, no intermediate results kept, no dataclasses; ``sums`` are DirectContr's
    (utility work, utility moment, contribution work, contribution moment).
    """
    use, supply = np.asarray(interval.use), np.asarray(interval.supply)
    configured = np.asarray(interval.configured)
    host_of, customer_of = np.asarray(interval.host_of_vm), np.asarray(interval.customer_of_vm)
    n_hosts, m = supply.shape

    def by(index: np.ndarray, x: np.ndarray, size: int) -> np.ndarray:
        return np.column_stack([np.bincount(index, x[:, i], size) for i in range(m)])

    active = np.count_nonzero(np.bincount(customer_of, minlength=len(balances)))
    unit = 1.0 / (m * supply.sum(axis=0) / active)  # 1 / (m · s_i), all weights 1
    per_host = np.maximum(np.bincount(host_of, minlength=n_hosts), 1)
    v = np.where(np.isnan(configured), (supply / per_host[:, None]).take(host_of, 0), configured)
    total = by(host_of, v, n_hosts)
    e = v * (supply / np.maximum(total, supply)).take(host_of, 0)  # min(1, r_i / Σ v)
    diff = use - e
    over, ceded = (
        by(host_of, np.maximum(diff, 0.0), n_hosts),
        by(host_of, np.maximum(-diff, 0.0), n_hosts),
    )
    credit = np.minimum(1.0, over / np.where(ceded > 0.0, ceded, np.inf))
    offsets = np.where(diff >= 0.0, diff, 0.5 * credit.take(host_of, 0) * diff)
    decay = 2.0 ** (-INTERVAL_S / HALF_LIFE_S)
    new_balances = balances * decay + np.bincount(customer_of, offsets @ unit, len(balances))

    work = use @ unit
    moment = work * start_s
    provider = host_owner.take(host_of)
    k = len(sums[0])
    new_sums = (
        sums[0] * decay + np.bincount(customer_of, work, k),
        sums[1] * decay + np.bincount(customer_of, moment, k),
        sums[2] * decay + np.bincount(provider, work, k),
        sums[3] * decay + np.bincount(provider, moment, k),
    )
    return new_balances, new_sums


def check_agree(
    ours: tuple[np.ndarray, DirectContrBalances],
    bare: tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> None:
    """Exit with an error unless ``account()`` and ``minimal()`` computed the same figures."""
    try:
        for got, want in zip((bare[0], *bare[1]), (ours[0], *contr_sums(ours[1])), strict=True):
            # Relative to the largest value: a balance that nets to ~0 differs in rounding only.
            scale = float(np.abs(want).max(initial=0.0))
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * scale)
    except AssertionError as exc:
        sys.exit(f"minimal() and account() disagree: {exc}")


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
    sums = contr_sums(contr)
    # Warm-up (pages in numpy's paths) and the check that both compute the same thing.
    ours = account(interval, host_owner, balances, contr, INTERVAL_S)
    bare = minimal(interval, host_owner, balances, sums, INTERVAL_S)
    check_agree(ours, bare)
    balances, contr = ours

    # Alternate the two, so that whatever else the machine runs weighs on both alike.
    times: list[float] = []
    minimal_times: list[float] = []
    for run in range(args.runs):
        start_s = run * INTERVAL_S
        t0 = time.perf_counter()
        balances, contr = account(interval, host_owner, balances, contr, start_s)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare = minimal(interval, host_owner, bare[0], bare[1], start_s)
        minimal_times.append(time.perf_counter() - t0)
        print(
            f"run {run + 1}: {times[-1] * 1000:.1f} ms (minimal {minimal_times[-1] * 1000:.1f} ms)"
        )

    check_agree((balances, contr), bare)  # and still, after the runs

    median, minimal_median = statistics.median(times), statistics.median(minimal_times)
    figures = {
        "benchmark": "accounting",
        "vms": args.vms,
        "hosts": args.hosts,
        "customers": args.customers,
        "organizations": args.orgs,
        "runs": args.runs,
        "seconds_median": round(median, 4),
        "seconds_min": round(min(times), 4),
        "seconds_max": round(max(times), 4),
        "target_seconds": 0.2,
        "minimal_seconds_median": round(minimal_median, 4),
        "over_minimal": round(median / minimal_median, 3),
        "target_over_minimal": 1.3,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
