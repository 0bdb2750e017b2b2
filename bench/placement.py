"""What Placement's verification costs a batch, and how many requests a cloud makes.

    python bench/placement.py --vms 500 --rounds 2000

Against the real Placement of tests/scripts/openstack.sh (started if ``GMD_TEST_OPENSTACK`` does not
name its cloud.json): one compute host's provider with ``--vms`` servers allocated on it (as
Nova would: a project and user each), then the daemon's Placement view reads it once and
checks a batch of those VMs ``--rounds`` times against the fresh snapshot, in process (what
the ingest thread spends per batch; no HTTP): every VM, and again the same VMs and owners
(what a host's next batch usually is). Then the requests per interval of a cloud of
``--hosts`` hosts under the refresh policy, computed, beside the request latency measured
here. Removes what it created. Prints a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gmd.daemon.placement.settings import PlacementConfig
from gmd.daemon.placement.view import INVENTORY_EVERY, PlacementView
from gmd.openstack.placement import PlacementReader
from tests.support.openstack_support import LEGACY, start
from tests.support.placement_support import PlacementWriteError, RealPlacement

SERVER_RAM_MB = 512
"""each seeded server's memory: a host's inventory holds the bench's VMs"""


def seeded(cloud: str = LEGACY) -> RealPlacement:
    """Providers and allocations written to the real Placement as Nova would, removed by
    ``close``. One write at a time: the test Placement's database is SQLite, which takes one
    writer (about 40 ms a write here)."""
    import openstack

    return RealPlacement(openstack.connect(cloud=cloud, api_timeout=30))


def use_test_cloud() -> None:
    """The test cloud's clouds.yaml for every OpenStack client of this process and its
    children (the cloud started if ``GMD_TEST_OPENSTACK`` does not name it)."""
    os.environ["OS_CLIENT_CONFIG_FILE"] = start()["clouds_yaml"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--refresh-s", type=float, default=PlacementConfig.refresh_s)
    args = parser.parse_args()

    use_test_cloud()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    written = seeded()
    project = uuid.uuid4().hex
    servers = [str(uuid.uuid4()) for _ in range(args.vms)]
    try:
        provider = written.host(name, 128, 1024 * 1024, ratio=16.0)
        for vm in servers:
            written.server(provider, project, vm, ram_mb=SERVER_RAM_MB)
        config = PlacementConfig(verify="on", cloud=LEGACY, refresh_s=args.refresh_s)
        client = PlacementReader(LEGACY, timeout_s=30)
        view = PlacementView(config, client, 0.1)
        capacity = (64.0, 512 * 2.0**30, 1e9, 1e9)
        owners = [project] * len(servers)
        # Each VM's flavor as its agent reads it from the Nova metadata: compared with its
        # allocation (1 VCPU, SERVER_RAM_MB) on every full check.
        flavor = np.tile([1.0, SERVER_RAM_MB * 2.0**20, np.nan, np.nan], (len(servers), 1))
        t0 = time.perf_counter()
        first = view.check(name, capacity, servers, owners, flavor)
        first_s = time.perf_counter() - t0
        assert first.verified, first
        first_calls = client.calls
        latency = []
        for _ in range(20):
            t = time.perf_counter()
            client.consumers_on(provider)
            latency.append(time.perf_counter() - t)
        calls = client.calls
        times, repeats = [], []
        for _ in range(args.rounds):
            # Every VM checked: the host's memory of its last good batch forgotten first.
            view._hosts[name].vouched = None
            t = time.perf_counter()
            verdict = view.check(name, capacity, servers, owners, flavor)
            times.append(time.perf_counter() - t)
            assert verdict.verified
            # The same VMs and owners again, as a host posts them interval after interval.
            t = time.perf_counter()
            verdict = view.check(name, capacity, list(servers), list(owners), flavor.copy())
            repeats.append(time.perf_counter() - t)
        assert verdict.verified and client.calls == calls, "a fresh snapshot asks nothing"
        view.close()
    except PlacementWriteError as exc:
        raise SystemExit(str(exc)) from None
    finally:
        written.close()

    per_interval_refresh = args.hosts * args.interval_s / args.refresh_s
    per_interval_inventory = per_interval_refresh / INVENTORY_EVERY
    result = {
        "vms": args.vms,
        "check_ms_median": round(statistics.median(times) * 1e3, 4),
        "check_ms_p99": round(sorted(times)[int(0.99 * len(times))] * 1e3, 4),
        "check_us_per_vm": round(statistics.median(times) / args.vms * 1e6, 4),
        "same_vms_ms_median": round(statistics.median(repeats) * 1e3, 4),
        "first_sight_s": round(first_s, 3),
        "first_sight_requests": first_calls,
        "request_ms_median": round(statistics.median(latency) * 1e3, 2),
        "hosts": args.hosts,
        "requests_per_interval": round(per_interval_refresh + per_interval_inventory, 1),
        "requests_per_interval_refresh": round(per_interval_refresh, 1),
        "requests_per_interval_inventory": round(per_interval_inventory, 1),
        "request_rate_per_s": round(
            (per_interval_refresh + per_interval_inventory) / args.interval_s, 1
        ),
    }
    print(
        f"check of a {args.vms}-VM batch against a fresh snapshot: median"
        f" {result['check_ms_median']} ms (p99 {result['check_ms_p99']} ms), no request;"
        f" {result['same_vms_ms_median']} ms when the host lists the VMs of its last good batch;"
        f" first sight of the host: {first_calls} requests in {first_s:.2f} s"
    )
    print(
        f"{args.hosts} hosts, {args.interval_s:g} s intervals, refresh_s = {args.refresh_s:g}:"
        f" {result['requests_per_interval']} requests per interval"
        f" ({result['request_rate_per_s']}/s) plus one per server booted;"
        f" one request here takes {result['request_ms_median']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
