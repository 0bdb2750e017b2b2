"""Time gmd's Nova weigher per request (1,000 candidate hosts) beside Nova's stock weighers.

    python bench/nova_weigher.py --candidates 1000 --cluster-hosts 5000 --runs 20

One request is Nova weighing ``--candidates`` hosts for one RequestSpec. gmd's side, timed
wherever this runs (numpy only, no Nova):

- ``rank_warm_s``: :func:`gmd.nova.ranking.rank` with the cluster already read (the weigher's
  cache is warm): the candidates (the first of the cluster's hosts) inside a cluster of
  ``--cluster-hosts`` hosts gmd measured;
- ``refresh_parse_s``: what a cache refresh costs the weigher itself, ``json.loads`` of the
  route's bytes then :func:`~gmd.nova.ranking.read_cluster` and ``read_project``; beside it
  ``json_loads_s``, the ``json.loads`` alone, the floor measured in the same run.

The answer is random (seeded by ``--seed``) in the exact shape of gmd's
``GET /v1/hosts/utilization`` (:meth:`HostUtilization.document`), serialised as FastAPI does.

Nova's side, through ``nova.scheduler.weights.HostWeightHandler().get_weighed_objects`` (what
the scheduler calls: each weigher, its normalisation and its multiplier per host) on
``HostState`` objects of the same hosts: ``stock_weighers_s`` (Nova's default
``all_weighers``), ``gmd_weigher_s`` (``FairnessWeigher`` alone, warm cache; of which
``gmd_weigh_objects_s`` is its own ``weigh_objects``, the rest Nova's handler),
``gmd_weigher_refresh_s`` (the same with an empty cache: a fresh ``Source`` whose fetch gives
``json.loads`` of the bytes, so parse, ``read_cluster``, the worker thread's hop and the
ranking), and ``stock_and_gmd_s`` (the stock weighers and gmd's together: what an operator who
adds gmd's to the defaults pays). The HTTP route itself is not included: bench/host_utilization.py
times it (0.21 s for 5,000 hosts on PostgreSQL), and gmd's ``[gmd] cache_time`` pays it once
per 30 s, not per request. Nova is not a dependency of gmd: when ``nova`` is not importable
here, this part runs as a subprocess under ``var/nova/venv/bin/python`` (the Nova that
tests/scripts/nova_cloud.sh installs; Nova's scheduler runs on native threads by default, as
here, not eventlet) and, without that venv, the figures say ``"nova": null`` and why.

Medians over ``--runs``; prints a JSON line last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gmd, from Nova's venv too

import numpy as np

from gmd.nova.ranking import Candidate, Request, rank, read_cluster, read_project

REPO = Path(__file__).resolve().parents[1]
NOVA_PYTHON = REPO / "var" / "nova" / "venv" / "bin" / "python"
UNUSED_ENDPOINT = "http://127.0.0.1:9"
"""The weigher's ``[gmd] endpoint_override``: never asked (its Source is replaced)."""
MIB = 1 << 20
GIB = 1 << 30
FLAVOR = {"vcpus": 1, "memory_mb": 512, "root_gb": 1, "ephemeral_gb": 0, "swap": 0}


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=1000, help="hosts Nova weighs")
    parser.add_argument(
        "--cluster-hosts", type=int, default=5000, help="hosts in gmd's answer (≥ candidates)"
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--project", default="8f0e5c6f0e5c4d2a9a4c3b2a1f0e9d8c")
    parser.add_argument(
        "--nova-part",
        action="store_true",
        help="time Nova's side only and print its JSON line (run under Nova's venv)",
    )
    return parser


def utilization_document(hosts: int, seed: int, project: str) -> dict[str, Any]:
    """A random answer of ``GET /v1/hosts/utilization`` for ``hosts`` hosts, as the daemon
    gives it (:meth:`gmd.daemon.reports.host_utilization.HostUtilization.document`)."""
    rng = np.random.default_rng(seed)
    cores = rng.choice([32, 48, 64, 96, 128], hosts).astype(float)
    memory = rng.choice([128, 256, 384, 512, 768, 1024], hosts) * float(GIB)
    disk = rng.choice([5e8, 1e9, 2e9], hosts)
    network = rng.choice([1.25e9, 3.125e9], hosts)
    use = np.column_stack(
        [
            rng.beta(2, 5, hosts),
            rng.beta(4, 3, hosts),
            rng.beta(1, 9, hosts),
            rng.beta(1, 12, hosts),
        ]
    )
    start = 1_800_000_000
    return {
        "resources": ["cpu", "memory", "disk", "network"],
        "intervals": [start, start - 60, start - 120],
        "hosts": {
            f"compute-{i:05d}": {
                "capacity": {
                    "cpu_cores": c,
                    "memory_bytes": m,
                    "disk_bytes_per_s": d,
                    "network_bytes_per_s": n,
                },
                "utilization": dict(zip(("cpu", "memory", "disk", "network"), u, strict=True)),
            }
            for i, (c, m, d, n, u) in enumerate(
                zip(
                    cores.tolist(),
                    memory.tolist(),
                    disk.tolist(),
                    network.tolist(),
                    use.tolist(),
                    strict=True,
                )
            )
        },
        "project": {"id": project, "level": 1, "cpu_cap_fraction": 0.5},
    }


def answer_bytes(document: dict[str, Any]) -> bytes:
    """The route's body: FastAPI's JSONResponse rendering."""
    return json.dumps(
        document, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def nova_view(document: dict[str, Any], candidates: int, seed: int) -> list[dict[str, Any]]:
    """Nova's own view of the first ``candidates`` hosts (their allocations, not gmd's
    measurement): what a HostState holds, seeded apart from the measurement."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for name, entry in list(document["hosts"].items())[:candidates]:
        cores = int(entry["capacity"]["cpu_cores"])
        ram_mb = int(entry["capacity"]["memory_bytes"] // MIB) - 4096  # reserved_host_memory
        disk_gb = int(rng.choice([960, 1920, 3840]))
        instances = int(rng.integers(0, 40))
        out.append(
            {
                "host": name,
                "vcpus_total": cores,
                "vcpus_used": int(rng.integers(0, cores * 4 * 0.9)),
                "total_usable_ram_mb": ram_mb,
                "free_ram_mb": int(ram_mb * rng.uniform(0.05, 1.0)),
                "total_usable_disk_gb": disk_gb,
                "free_disk_mb": int(disk_gb * 1024 * rng.uniform(0.1, 1.0)),
                "num_instances": instances,
                "num_io_ops": int(rng.integers(0, min(instances, 8) + 1)),
                "failed_builds": int(rng.random() < 0.01),
                "hypervisor_version": int(rng.choice([8_000_000, 9_000_000, 10_000_000])),
            }
        )
    return out


def median(times: list[float]) -> float:
    return round(statistics.median(times), 6)


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def gmd_part(args: argparse.Namespace, document: dict[str, Any], raw: bytes) -> dict[str, Any]:
    """The weigher's arithmetic alone: a warm ranking, and a cache refresh's parse."""
    cluster = read_cluster(document)
    project = read_project(document, args.project)
    assert cluster.size == args.cluster_hosts and project.level == 1
    candidates = [
        Candidate(
            h["host"],
            h["host"],
            h["vcpus_total"],
            h["vcpus_used"],
            h["total_usable_ram_mb"],
            h["free_ram_mb"],
        )
        for h in nova_view(document, args.candidates, args.seed)
    ]
    request = Request(FLAVOR["vcpus"], FLAVOR["memory_mb"])
    ranked = rank(cluster, candidates, request, project)  # once untimed: imports, caches
    assert all(ranked.measured) and len(ranked.ranked) == args.candidates

    def refresh() -> None:
        parsed = json.loads(raw)
        read_cluster(parsed)
        read_project(parsed, args.project)

    loads, parse, warm = [], [], []
    for _ in range(args.runs):
        loads.append(timed(lambda: json.loads(raw)))
        parse.append(timed(refresh))
        warm.append(timed(lambda: rank(cluster, candidates, request, project)))
    return {
        "answer_bytes": len(raw),
        "rank_warm_s": median(warm),
        "refresh_parse_s": median(parse),
        "json_loads_s": median(loads),
        "refresh_parse_to_json_loads": round(
            statistics.median(parse) / statistics.median(loads), 3
        ),
    }


def nova_part(args: argparse.Namespace, document: dict[str, Any], raw: bytes) -> dict[str, Any]:
    """Nova's handler over HostStates: its stock weighers, gmd's (warm and refreshing), both."""
    from importlib.metadata import version

    import nova.conf
    from nova import objects
    from nova.pci.stats import PciDeviceStats
    from nova.scheduler import host_manager, weights

    objects.register_all()
    from gmd.nova.source import Source
    from gmd.nova.weigher import FairnessWeigher  # registers [gmd] on Nova's CONF

    conf = nova.conf.CONF
    conf([], project="nova", default_config_files=[], default_config_dirs=[])
    conf.set_override("endpoint_override", UNUSED_ENDPOINT, group="gmd")

    cell = str(uuid.UUID(int=1))
    hosts = []
    for i, view in enumerate(nova_view(document, args.candidates, args.seed)):
        state = host_manager.HostState(view["host"], view["host"], cell)
        for key, value in view.items():
            setattr(state, key, value)
        state.uuid = str(uuid.UUID(int=1000 + i))
        state.disk_mb_used = state.total_usable_disk_gb * 1024 - state.free_disk_mb
        state.cpu_allocation_ratio = 4.0
        state.ram_allocation_ratio = 1.0
        state.disk_allocation_ratio = 1.0
        state.metrics = objects.MonitorMetricList(objects=[])
        state.pci_stats = PciDeviceStats(None)
        state.numa_topology = None
        state.aggregates = []
        state.instances = {}
        hosts.append(state)
    spec = objects.RequestSpec(
        flavor=objects.Flavor(**FLAVOR, extra_specs={}),
        project_id=args.project,
        user_id=uuid.uuid4().hex,
        image=objects.ImageMeta.from_dict({"properties": {"hw_machine_type": "q35"}}),
        instance_group=None,
        num_instances=1,
        requested_destination=None,
        scheduler_hints={},
        availability_zone=None,
        is_bfv=False,
    )
    handler = weights.HostWeightHandler()

    stock, left_out = [], []
    for cls in handler.get_matching_classes(["nova.scheduler.weights.all_weighers"]):
        try:
            weigher = cls()
            handler.get_weighed_objects([weigher], hosts, spec)
        except Exception as exc:  # a weigher that cannot run on synthetic hosts
            print(f"{cls.__name__} left out: {type(exc).__name__}: {exc}", file=sys.stderr)
            left_out.append(cls.__name__)
            continue
        stock.append(weigher)

    gmd = FairnessWeigher()
    gmd.source.close()  # its keystoneauth fetcher is never asked

    def fresh_source(fetch: Callable[[str], object]) -> Source:
        return Source(fetch, timeout_s=60.0, cache_s=1e9)

    warm = fresh_source(lambda project, hosts: document)
    gmd.source = warm
    assert warm.view(args.project) is not None, "the warm cache could not be primed"
    weighed = handler.get_weighed_objects([gmd], hosts, spec)
    assert len({w.weight for w in weighed}) > 1, "gmd's weigher weighed every host alike"
    wrapped = [handler.object_class(h, 0.0) for h in hosts]
    handler.get_weighed_objects([*stock, gmd], hosts, spec)

    def refreshing() -> None:
        gmd.source = fresh_source(lambda project, hosts: json.loads(raw))
        handler.get_weighed_objects([gmd], hosts, spec)
        counters = gmd.source.counters
        assert (counters.fetches, counters.ranked, counters.neutral) == (1, 1, 0), counters
        gmd.source.close()

    times: dict[str, list[float]] = {
        "stock_weighers_s": [],
        "gmd_weigher_s": [],
        "gmd_weigh_objects_s": [],
        "stock_and_gmd_s": [],
        "gmd_weigher_refresh_s": [],
    }
    for _ in range(args.runs):
        gmd.source = warm
        times["stock_weighers_s"].append(
            timed(lambda: handler.get_weighed_objects(stock, hosts, spec))
        )
        times["gmd_weigher_s"].append(
            timed(lambda: handler.get_weighed_objects([gmd], hosts, spec))
        )
        times["gmd_weigh_objects_s"].append(timed(lambda: gmd.weigh_objects(wrapped, spec)))
        times["stock_and_gmd_s"].append(
            timed(lambda: handler.get_weighed_objects([*stock, gmd], hosts, spec))
        )
        times["gmd_weigher_refresh_s"].append(timed(refreshing))
    c = warm.counters
    assert c.neutral == 0 and c.fetches == 1 and c.ranked == 3 * args.runs + 2, c
    warm.close()
    return {
        "nova_version": version("nova"),
        "python": sys.version.split()[0],
        "stock_weighers": [type(w).__name__ for w in stock],
        "stock_left_out": left_out,
        **{key: median(values) for key, values in times.items()},
    }


def nova_elsewhere(argv: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """The Nova part run under Nova's venv: its figures, or None and why not."""
    if not NOVA_PYTHON.exists():
        return None, (
            f"nova is not importable by {sys.executable} and {NOVA_PYTHON} does not exist"
            " (tests/scripts/nova_cloud.sh installs it)"
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        # -P: bench/'s scripts are named like libraries (placement.py; Nova's venv has a
        # `placement` package), so bench/ is kept off the subprocess's path.
        [str(NOVA_PYTHON), "-P", str(Path(__file__).resolve()), *argv, "--nova-part"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    sys.stderr.write(out.stderr)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"the Nova part failed under {NOVA_PYTHON} ({out.returncode}): {tail}"
    return json.loads(lines[-1]), None


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if not 1 <= args.candidates <= args.cluster_hosts or args.runs < 1:
        parser.error("need 1 ≤ --candidates ≤ --cluster-hosts and --runs ≥ 1")
    document = utilization_document(args.cluster_hosts, args.seed, args.project)
    raw = answer_bytes(document)
    if args.nova_part:
        print(json.dumps(nova_part(args, document, raw)))
        return

    figures: dict[str, Any] = {
        "benchmark": "nova_weigher",
        "candidates": args.candidates,
        "cluster_hosts": args.cluster_hosts,
        "runs": args.runs,
        **gmd_part(args, document, raw),
    }
    nova: dict[str, Any] | None
    if importlib.util.find_spec("nova") is not None:
        nova, reason = nova_part(args, document, raw), None
    else:
        nova, reason = nova_elsewhere(sys.argv[1:])
    figures["nova"] = nova
    if nova is None:
        figures["nova_reason"] = reason
        figures["gmd_to_stock"] = figures["stock_and_gmd_to_stock"] = None
    else:
        figures["gmd_to_stock"] = round(nova["gmd_weigher_s"] / nova["stock_weighers_s"], 3)
        figures["stock_and_gmd_to_stock"] = round(
            nova["stock_and_gmd_s"] / nova["stock_weighers_s"], 3
        )
        print(
            f"{args.candidates} candidates: Nova's {len(nova['stock_weighers'])} stock weighers"
            f" {nova['stock_weighers_s'] * 1e3:.2f} ms, gmd's {nova['gmd_weigher_s'] * 1e3:.2f}"
            f" ms warm, {nova['gmd_weigher_refresh_s'] * 1e3:.2f} ms refreshing a"
            f" {args.cluster_hosts}-host answer"
        )
    print(
        f"gmd alone: rank {figures['rank_warm_s'] * 1e3:.2f} ms, refresh parse"
        f" {figures['refresh_parse_s'] * 1e3:.2f} ms (json.loads alone"
        f" {figures['json_loads_s'] * 1e3:.2f} ms of {len(raw) / 1e6:.2f} MB)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
