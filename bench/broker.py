"""gmd-broker (CloudShare, issue 32) on a real ZooKeeper ensemble: claims per second,
publish-to-start latency, and ZooKeeper's data per organisation after a simulated month.

    python bench/broker.py --requests 10000 --brokers 3 --probes 100

Three parts (``--parts``), each under a fresh path of its own (``/gmd-bench/<uuid>``, removed
afterwards), each beside its physical ceiling measured in the same run on the same ensemble:

- **claims**: ``--requests`` requests published to the queue (:meth:`Federation.publish`, from
  ``--publish-threads`` threads on one client), then ``--brokers`` *processes* (no shared GIL),
  each a :class:`~gmd.broker.coordination.Federation` on a KazooClient of its own, claim and
  consume (:meth:`~Federation.claim`, :meth:`~Federation.consume`) until the queue is empty.
  A broker lists the queue (names only: the data reads of ``Broker._take`` are the latency
  part's subject) and walks the list: a lost claim goes on to the next name, a request gone
  (the list is stale) lists again. ``--order same``: every broker walks the same order (the
  choice rule gives every broker the same one), so they contend; ``spread``: each starts at its
  own offset, so they do not. A round for each order given. Claims/s overall and per broker,
  the ZooKeeper requests sent per request consumed (by kind), the claim nodes left behind, and
  a check that every request was consumed exactly once (the running nodes are the published
  ones, each once, each at the site that consumed it: a correctness check, not a timing). The
  ceiling: as many bare 4-op transactions (check + delete + create + delete, the shape of
  ``consume``'s) from as many processes, one at a time each, on nodes prepared beforehand; and
  ZooKeeper's raw create rate (pipelined creates of the same bytes).
- **latency**: ``--brokers`` live :class:`~gmd.broker.broker.Broker` objects, each in a process
  of its own with a tiny in-process handler (``start`` stamps the time; a request finishes at
  the broker's next look), and ``--queued-behind`` requests waiting in the queue that no broker
  can take (each asks more cores than a broker offers), so the queue keeps its size. Probes of
  the organisation with the highest priority are published one at a time; the latency is from
  just before the publish to the handler's ``start()`` (CLOCK_MONOTONIC, shared by the
  processes). At most ``--probes`` per size, or fewer once ``--probe-budget-s`` has passed.
  Beside it: ``Federation.queued()`` timed alone on the idle ensemble (what the broker's
  ``_take`` reads before every take: one ``get`` per queued request, one at a time; best of
  ``--reads``) and the same nodes read pipelined; what the idle brokers cost meanwhile (their
  CPU, the requests ZooKeeper receives: the ensemble may be shared, others' count too); and
  the ceiling, ZooKeeper's watch round trip: a node created by one client seen by another's
  children watch.
- **month**: ``--orgs`` organisations with ``--sites-per-org`` sites each; ``--requests-per-day``
  requests a simulated day for ``--days`` days, each published by a site of its organisation,
  claimed and consumed by a site of another, and completed (:meth:`~Federation.complete`, what
  grows the summaries). The month is simulated by the requests' ``submitted_s`` and ``used_s``,
  not wall time. At ``--checkpoints`` days: the nodes and bytes (each node's
  ``stat.dataLength``, and its path's length) under the root, by kind and per organisation.

Progress goes to stderr; the figures as one JSON line last. Without ``--zookeeper``, the
ensemble is ``$GMD_TEST_ZOOKEEPER`` or the tests' shared one (``tests/scripts/zookeeper.sh``
starts it, or finds it running, and leaves it running).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.zookeeper

import numpy as np
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError
from procstat import cpu_s

from gmd.broker.broker import Broker, BrokerSettings
from gmd.broker.coordination import Federation, Request
from gmd.broker.handlers import Finished
from tests.support.zookeeper import Ensemble, four_letters

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "zookeeper.sh"
RETRY = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}
"""gmd-broker's reconnect policy (gmd/broker/cli.py)."""
T = TypeVar("T")
CALL_TIMEOUT_S = 30.0
IN_FLIGHT = 2000
"""Pipelined calls at most in flight at once (set-up, reading, removal)."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def zk_client(hosts: str, timeout_s: float = 10.0) -> KazooClient:
    zk = KazooClient(hosts=hosts, timeout=timeout_s, connection_retry=dict(RETRY))
    zk.start(timeout=30)
    return zk


def zookeeper_hosts(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("GMD_TEST_ZOOKEEPER"):
        return os.environ["GMD_TEST_ZOOKEEPER"]
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"tests/scripts/zookeeper.sh could not start ZooKeeper:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def request_bytes(request: Request) -> bytes:
    """A queue node's data, exactly as :meth:`Federation.publish` writes it."""
    return json.dumps(asdict(request), separators=(",", ":"), sort_keys=True).encode()


def percentiles_ms(values_s: list[float]) -> dict[str, float | None]:
    if not values_s:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.array(values_s) * 1e3
    return {
        "p50": round(float(np.percentile(a, 50)), 2),
        "p90": round(float(np.percentile(a, 90)), 2),
        "p99": round(float(np.percentile(a, 99)), 2),
        "max": round(float(a.max()), 2),
    }


# -- what the ensemble spends ----------------------------------------------------------------


def ensemble_pids(hosts: str) -> list[int]:
    """The JVMs of the tests' shared ensemble when ``hosts`` is it (their CPU is read from
    /proc); else none."""
    ensemble = Ensemble.load(REPO / "var" / "zookeeper")
    if ensemble is None or ensemble.hosts != hosts:
        return []
    return list(ensemble.pids.values())


def zookeeper_cpu_s(pids: list[int]) -> float | None:
    return sum(cpu_s(pid) for pid in pids) if pids else None


def packets_received(hosts: str) -> int | None:
    """Requests the ensemble's nodes received so far (``mntr``), when they are on this machine.
    The ensemble may be shared: others' requests count too."""
    total = 0
    for host in hosts.split("/")[0].split(","):
        name, _, port = host.rpartition(":")
        if name not in ("127.0.0.1", "localhost"):
            return None
        answer = four_letters(int(port), "mntr") or ""
        values = dict(line.split("\t", 1) for line in answer.splitlines() if "\t" in line)
        if "zk_packets_received" not in values:
            return None
        total += int(values["zk_packets_received"])
    return total


# -- pipelined calls, for set-up, reading and removal ----------------------------------------


def pipelined(call: Callable[[T], Any], items: Iterable[T]) -> list[Any]:
    """``call(item)``'s result (or its exception) for each item: kazoo's ``*_async`` calls, at
    most IN_FLIGHT in flight."""
    out: list[Any] = []
    batch: list[Any] = []

    def drain() -> None:
        for pending in batch:
            try:
                out.append(pending.get(timeout=CALL_TIMEOUT_S))
            except Exception as exc:  # kept: the caller decides
                out.append(exc)
        batch.clear()

    for item in items:
        batch.append(call(item))
        if len(batch) >= IN_FLIGHT:
            drain()
    drain()
    return out


def tree(zk: KazooClient, root: str) -> list[list[str]]:
    """Every node under ``root`` (itself included), by depth."""
    levels = [[root]]
    while levels[-1]:
        parents = levels[-1]
        answers = pipelined(zk.get_children_async, parents)
        levels.append(
            [
                f"{parent}/{child}"
                for parent, children in zip(parents, answers, strict=True)
                if isinstance(children, list)
                for child in children
            ]
        )
    return levels[:-1]


def remove_tree(zk: KazooClient, root: str) -> None:
    """``root`` and everything under it, deepest first, pipelined (kazoo's recursive delete
    is one round trip per node)."""
    for level in reversed(tree(zk, root)):
        for result in pipelined(zk.delete_async, level):
            if isinstance(result, NotEmptyError):  # a node created meanwhile: the slow way
                zk.delete(root, recursive=True)
                return
    with contextlib.suppress(NoNodeError):
        zk.delete(root, recursive=True)


def create_all(zk: KazooClient, items: list[tuple[str, bytes]], sequence: bool = False) -> float:
    """Create ``items`` (path, data) pipelined; the seconds it took."""
    started = time.perf_counter()
    results = pipelined(lambda item: zk.create_async(*item, sequence=sequence), items)
    seconds = time.perf_counter() - started
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"{len(failed)} creates failed, the first: {failed[0]!r}")
    return seconds


# -- part 1: claims per second ---------------------------------------------------------------


def count_requests(zk: KazooClient) -> Counter[str]:
    """Count every request this client sends to ZooKeeper, by kind (kazoo's one way out)."""
    counts: Counter[str] = Counter()
    send = zk._call

    def counted(request: Any, async_object: Any) -> Any:
        counts[type(request).__name__] += 1
        return send(request, async_object)

    zk._call = counted
    return counts


def claim_worker(
    hosts: str,
    root: str,
    site: str,
    mode: str,
    order: str,
    index: int,
    brokers: int,
    names: list[str],
    barrier: Any,
    out: Any,
) -> None:
    """One broker's process. ``claims``: claim and consume from the queue until it is empty,
    walking it in the shared order (or from this broker's own offset); ``ceiling``: the bare
    4-op transaction on each of ``names``, one at a time."""
    zk = zk_client(hosts)
    try:
        counts = count_requests(zk)
        federation = Federation(zk, site, f"org-{site}", root=root)
        consumed: list[str] = []
        lost = refused = failed = 0
        barrier.wait(timeout=120)
        zk.sync(root)  # this client's server has every request published before the barrier
        counts.clear()
        started, cpu = time.monotonic(), time.process_time()
        if mode == "claims":

            def listing() -> list[str]:
                queue = sorted(zk.get_children_async(federation.path("queue")).get(CALL_TIMEOUT_S))
                k = len(queue) * index // brokers if order == "spread" else 0
                return queue[k:] + queue[:k]

            queue, i = listing(), 0
            while queue:
                if i == len(queue):  # walked to the end: look again
                    queue, i = listing(), 0
                    continue
                name, i = queue[i], i + 1
                claim = federation.claim(name)
                if claim is None:  # another broker's claim came first: the next one
                    lost += 1
                    continue
                if federation.consume(claim) is None:  # gone: this listing is stale
                    refused += 1
                    queue, i = listing(), 0
                    continue
                consumed.append(name)
        else:
            for name in names:
                tx = zk.transaction()
                tx.check(f"{root}/c/{name}", 0)
                tx.delete(f"{root}/q/{name}")
                tx.create(f"{root}/r/{name}", b"")
                tx.delete(f"{root}/c/{name}")
                results = tx.commit_async().get(CALL_TIMEOUT_S)
                if any(isinstance(r, Exception) for r in results):
                    failed += 1
                else:
                    consumed.append(name)
        ended = time.monotonic()
        out.put(
            {
                "site": site,
                "consumed": consumed,
                "claims_lost": lost,
                "consume_refused": refused,
                "failed": failed,
                "started": started,
                "ended": ended,
                "cpu_s": time.process_time() - cpu,
                "requests": dict(counts),
            }
        )
    finally:
        zk.stop()
        zk.close()


def run_workers(
    hosts: str,
    root: str,
    mode: str,
    order: str,
    brokers: int,
    slices: list[list[str]],
    zk_pids: list[int],
) -> tuple[list[dict[str, Any]], float, float | None]:
    """Run ``brokers`` worker processes together; their reports, the wall time from the first
    start to the last end, and the ensemble's CPU meanwhile."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(brokers + 1)
    out = ctx.Queue()
    processes = [
        ctx.Process(
            target=claim_worker,
            args=(hosts, root, f"b{i}", mode, order, i, brokers, slices[i], barrier, out),
        )
        for i in range(brokers)
    ]
    for p in processes:
        p.start()
    try:
        barrier.wait(timeout=120)
        zk_before = zookeeper_cpu_s(zk_pids)
        reports = [out.get(timeout=3600) for _ in processes]
        zk_after = zookeeper_cpu_s(zk_pids)
    finally:
        for p in processes:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
    wall = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    zk_cpu = None if zk_before is None or zk_after is None else zk_after - zk_before
    return sorted(reports, key=lambda r: r["site"]), wall, zk_cpu


def the_requests(n: int) -> list[Request]:
    return [Request(f"r{k}", f"org-{k % 5}", "publisher", 1.0, 600.0, float(k)) for k in range(n)]


def claims_round(
    zk: KazooClient, hosts: str, root: str, order: str, args: argparse.Namespace, zk_pids: list[int]
) -> dict:
    """Publish ``--requests``, then the brokers claim and consume them all, in ``order``."""
    n, brokers = args.requests, args.brokers
    publisher = Federation(zk, "publisher", "org-publisher", root=root)
    publisher.ensure()
    say(f"claims ({order}): publishing {n:,} requests from {args.publish_threads} threads")
    started = time.perf_counter()
    with ThreadPoolExecutor(args.publish_threads) as pool:
        published = list(pool.map(publisher.publish, the_requests(n)))
    publish_s = time.perf_counter() - started
    say(f"claims ({order}): published in {publish_s:.1f} s; {brokers} broker processes take them")
    reports, claim_s, zk_cpu = run_workers(
        hosts, root, "claims", order, brokers, [[] for _ in range(brokers)], zk_pids
    )
    say(f"claims ({order}): queue emptied in {claim_s:.1f} s; checking each request ran once")
    consumed = [(name, r["site"]) for r in reports for name in r["consumed"]]
    zk.sync(root)  # the brokers wrote through other servers: read after all their writes
    running = sorted(zk.get_children(publisher.path("running")))
    answers = pipelined(zk.get_async, [publisher.path("running", name) for name in running])
    running_site = {
        name: json.loads(data[0])["site"] for name, data in zip(running, answers, strict=True)
    }
    claimed_by = dict(consumed)
    exactly_once = (
        len(consumed) == len(claimed_by) == n
        and set(claimed_by) == set(published) == set(running)
        and running_site == claimed_by
    )
    queue_left = len(zk.get_children(publisher.path("queue")))
    claims_left = tree(zk, publisher.path("claims"))
    total: Counter[str] = Counter()
    for r in reports:
        total.update(r["requests"])
    remove_tree(zk, root)
    figures = {
        "publish_s": round(publish_s, 2),
        "publish_per_s": round(n / publish_s, 1),
        "claim_s": round(claim_s, 2),
        "claims_per_s": round(n / claim_s, 1),
        "per_broker": {
            r["site"]: {
                "consumed": len(r["consumed"]),
                "claims_per_s": round(len(r["consumed"]) / (r["ended"] - r["started"]), 1),
                "claims_lost": r["claims_lost"],
                "consume_refused": r["consume_refused"],
                "cpu_s": round(r["cpu_s"], 2),
            }
            for r in reports
        },
        "zookeeper_requests_per_request": round(sum(total.values()) / n, 2),
        "zookeeper_requests_per_request_by_kind": {
            k: round(v / n, 2) for k, v in sorted(total.items())
        },
        "zookeeper_cpu_s": None if zk_cpu is None else round(zk_cpu, 2),
        "exactly_once": exactly_once,
        "consumed": len(consumed),
        "running_nodes": len(running),
        "duplicates": len(consumed) - len(claimed_by),
        "queue_left": queue_left,
        "claims_nodes_left": sum(len(level) for level in claims_left[1:]),
    }
    say(
        f"claims ({order}): {n / claim_s:,.0f}/s, {figures['zookeeper_requests_per_request']}"
        f" ZooKeeper requests each; exactly once: {exactly_once};"
        f" {figures['claims_nodes_left']} claim nodes left behind"
    )
    return figures


def claims_part(zk: KazooClient, hosts: str, base: str, args: argparse.Namespace) -> dict:
    n, brokers = args.requests, args.brokers
    zk_pids = ensemble_pids(hosts)
    orders = {
        order: claims_round(zk, hosts, f"{base}/claims-{order}", order, args, zk_pids)
        for order in args.order
    }
    say(f"claims: the ceiling, {n:,} bare 4-op transactions from {brokers} processes")
    ceiling = f"{base}/ceiling"
    for d in ("q", "c", "r"):
        zk.ensure_path(f"{ceiling}/{d}")
    names = [f"req-{k:010d}" for k in range(n)]
    data = [request_bytes(r) for r in the_requests(n)]
    create_s = create_all(zk, [(f"{ceiling}/q/{m}", d) for m, d in zip(names, data, strict=True)])
    create_all(zk, [(f"{ceiling}/c/{m}", b"b0") for m in names])
    slices = [names[i::brokers] for i in range(brokers)]
    reports, ceiling_s, ceiling_zk_cpu = run_workers(
        hosts, ceiling, "ceiling", "same", brokers, slices, zk_pids
    )
    done = sum(len(r["consumed"]) for r in reports)
    remove_tree(zk, ceiling)
    ceiling_per_s = done / ceiling_s
    for order, figures in orders.items():
        figures["claims_over_ceiling"] = round(figures["claims_per_s"] / ceiling_per_s, 3)
        say(f"claims ({order}): {figures['claims_over_ceiling']:.1%} of the ceiling")
    say(f"claims: ceiling {ceiling_per_s:,.0f} transactions/s")
    return {
        "requests": n,
        "brokers": brokers,
        "workers": "processes",
        "publish_threads": args.publish_threads,
        "exactly_once": all(f["exactly_once"] for f in orders.values()),
        "orders": orders,
        "raw_create_per_s_pipelined": round(n / create_s, 1),
        "ceiling_tx_s": round(ceiling_s, 2),
        "ceiling_tx_per_s": round(ceiling_per_s, 1),
        "ceiling_tx_failed": sum(r["failed"] for r in reports),
        "ceiling_zookeeper_cpu_s": None if ceiling_zk_cpu is None else round(ceiling_zk_cpu, 2),
    }


# -- part 2: publish-to-start latency --------------------------------------------------------


@dataclass
class InstantHandler:
    """A handler in the broker's process: ``start`` stamps the time (for the bench to read), and
    a request finishes at the broker's next look (so that the broker completes it)."""

    site: str
    cores: float
    started: Any
    """a multiprocessing queue of (request id, site, CLOCK_MONOTONIC at start())"""
    _running: dict[str, Request] = field(default_factory=dict)

    def free_cores(self) -> float:
        return self.cores - sum(r.cores for r in self._running.values())

    def capacity_cores(self) -> float:
        return self.cores

    def start(self, name: str, request: Request) -> None:
        self.started.put((request.id, self.site, time.monotonic()))
        self._running[name] = request

    def stop(self, name: str) -> None:
        self._running.pop(name, None)

    def running(self) -> set[str]:
        return set(self._running)

    def finished(self) -> list[Finished]:
        done = [Finished(name, r.run_s, True) for name, r in self._running.items()]
        self._running.clear()
        return done

    def close(self) -> None:
        self._running.clear()


def broker_worker(
    hosts: str,
    root: str,
    site: str,
    cores: float,
    tick_s: float,
    started: Any,
    stop: Any,
    ready: Any,
) -> None:
    """One live broker in its own process, until ``stop`` is set."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("kazoo.client").setLevel(logging.ERROR)
    zk = zk_client(hosts)
    try:
        handler = InstantHandler(site, cores, started)
        broker = Broker(
            zk, BrokerSettings(site, f"org-{site}", 1.0, root=root, tick_s=tick_s), handler
        )
        broker.start()
        ready.put((site, os.getpid()))
        stop.wait()
        broker.stop()
    finally:
        zk.stop()
        zk.close()


def watch_round_trips(hosts: str, path: str, n: int) -> list[float]:
    """A node created by one client, seen by another's children watch: seconds, ``n`` times."""
    writer, watcher = zk_client(hosts), zk_client(hosts)
    out = []
    try:
        writer.ensure_path(path)
        # Each client may talk to another server of the ensemble, and ZooKeeper orders reads
        # per client only: a follower behind the writer's would answer NoNode for the path.
        watcher.sync(path)
        for _ in range(n):
            seen = threading.Event()
            at: list[float] = []

            def fired(_event: Any, at: list[float] = at, seen: threading.Event = seen) -> None:
                at.append(time.monotonic())
                seen.set()

            watcher.get_children(path, watch=fired)
            started = time.monotonic()
            writer.create(f"{path}/n-", b"", ephemeral=True, sequence=True)
            if not seen.wait(10):
                raise RuntimeError("a watch did not fire in 10 s")
            out.append(at[0] - started)
    finally:
        for zk in (writer, watcher):
            zk.stop()
            zk.close()
    return out


def latency_at(
    zk: KazooClient, hosts: str, root: str, size: int, args: argparse.Namespace, rng: random.Random
) -> dict:
    prober = Federation(zk, "prober", "org-probe", root=root)
    reads, pipelined_reads = [], []
    for _ in range(args.reads):  # the brokers are not started yet: ZooKeeper is idle
        started = time.perf_counter()
        waiting = prober.queued()
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        names = sorted(zk.get_children(prober.path("queue")))
        pipelined(zk.get_async, [prober.path("queue", m) for m in names])
        pipelined_reads.append(time.perf_counter() - started)
    queued_read_s, pipelined_read_s = min(reads), min(pipelined_reads)
    say(
        f"latency: {size:,} queued behind; Federation.queued() alone {queued_read_s:.3f} s"
        f" ({len(waiting)} requests), the same gets pipelined {pipelined_read_s:.3f} s"
        f" (best of {args.reads})"
    )
    ctx = multiprocessing.get_context("spawn")
    starts, ready, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    processes = [
        ctx.Process(
            target=broker_worker,
            args=(hosts, root, f"b{i}", args.broker_cores, args.tick_s, starts, stop, ready),
        )
        for i in range(args.brokers)
    ]
    for p in processes:
        p.start()
    latencies: list[float] = []
    by_site: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    try:
        pids = [ready.get(timeout=120)[1] for _ in processes]
        time.sleep(2 * args.tick_s + queued_read_s)  # the brokers' first looks at the queue
        deadline = time.monotonic() + args.probe_budget_s
        for i in range(args.probes):
            if i and time.monotonic() > deadline:
                break
            time.sleep(rng.uniform(0, args.tick_s))  # land anywhere in the brokers' loops
            probe = Request(f"probe-{size}-{i}", "org-probe", "prober", 1.0, 1.0, float(i))
            published = time.monotonic()
            prober.publish(probe)
            prober.published(probe)
            while True:
                rid, site, at = starts.get(timeout=args.probe_timeout_s)
                seen[rid] += 1
                if rid == probe.id:
                    break
            latencies.append(at - published)
            by_site[site] += 1
        cpu_before = {pid: cpu_s(pid) for pid in pids}
        packets_before, idle_started = packets_received(hosts), time.monotonic()
        time.sleep(args.idle_window_s)
        idle_s = time.monotonic() - idle_started
        packets_after = packets_received(hosts)
        broker_cpu = sum(cpu_s(pid) - cpu_before[pid] for pid in pids)
    finally:
        stop.set()
        for p in processes:
            p.join(120)
            if p.is_alive():
                p.kill()
                p.join()
    with contextlib.suppress(Exception):
        while True:
            rid, _site, _at = starts.get(timeout=0.5)
            seen[rid] += 1
    lat = percentiles_ms(latencies)
    say(
        f"latency: {size:,} queued behind: {len(latencies)} probes, p50 {lat['p50']} ms,"
        f" p99 {lat['p99']} ms; idle brokers {broker_cpu / idle_s:.2f} CPU"
    )
    return {
        "queued_behind": size,
        "probes": len(latencies),
        "latency_ms": lat,
        "started_by": dict(sorted(by_site.items())),
        "each_probe_started_once": all(v == 1 for v in seen.values())
        and len(seen) == len(latencies),
        "queued_read_s": round(queued_read_s, 4),
        "queued_read_pipelined_s": round(pipelined_read_s, 4),
        "idle_brokers_cpu_per_s": round(broker_cpu / idle_s, 3),
        "idle_zookeeper_requests_per_s": None
        if packets_before is None or packets_after is None
        else round((packets_after - packets_before) / idle_s, 1),
    }


def latency_part(zk: KazooClient, hosts: str, base: str, args: argparse.Namespace) -> dict:
    root = f"{base}/latency"
    prober = Federation(zk, "prober", "org-probe", root=root)
    prober.ensure()
    say(f"latency: the watch round trip, {args.probes} times")
    watch = watch_round_trips(hosts, f"{base}/watch", args.probes)
    # The probes' organisation lent much and used nothing: the highest priority there is.
    zk.create(prober.path("summaries", "org-probe"), b'{"contributed":1e12,"used":0.0}')
    for k in range(5):
        zk.create(prober.path("summaries", f"org-bg{k}"), b'{"contributed":0.0,"used":1e6}')
    rng = random.Random(args.seed)
    have = 0
    sizes = []
    for size in sorted(set(args.queued_behind)):
        behind = [
            # more cores than any broker offers: it waits for ever, the queue keeps its size
            Request(f"bg{k}", f"org-bg{k % 5}", "elsewhere", args.broker_cores + 1, 3600.0, k)
            for k in range(have, size)
        ]
        create_all(zk, [(prober.path("queue", "req-"), request_bytes(r)) for r in behind], True)
        have = size
        sizes.append(latency_at(zk, hosts, root, size, args, rng))
    return {
        "brokers": args.brokers,
        "workers": "processes",
        "broker_cores": args.broker_cores,
        "tick_s": args.tick_s,
        "watch_round_trip_ms": percentiles_ms(watch),
        "watch_round_trips": len(watch),
        "sizes": sizes,
    }


# -- part 3: ZooKeeper's data after a simulated month ----------------------------------------


def data_size(zk: KazooClient, root: str, site_org: dict[str, str]) -> dict:
    """Nodes and bytes under ``root``: by kind (the root's children), and per organisation (its
    summary, its sites' nodes, its requests queued or running)."""
    paths = [p for level in tree(zk, root)[1:] for p in level]
    answers = pipelined(zk.get_async, paths)
    by_kind: dict[str, dict[str, int]] = {}
    per_org = {o: {"nodes": 0, "data_bytes": 0} for o in sorted(set(site_org.values()))}
    summaries: dict[str, dict[str, Any]] = {}
    for path, answer in zip(paths, answers, strict=True):
        if isinstance(answer, Exception):
            continue
        data, stat = answer
        parts = path[len(root) + 1 :].split("/")
        kind = by_kind.setdefault(
            parts[0], {"nodes": 0, "data_bytes": 0, "path_bytes": 0, "largest_bytes": 0}
        )
        kind["nodes"] += 1
        kind["data_bytes"] += stat.dataLength
        kind["path_bytes"] += len(path.encode())
        kind["largest_bytes"] = max(kind["largest_bytes"], stat.dataLength)
        org = None
        if len(parts) == 2 and parts[0] == "summaries":
            org = parts[1]
            doc = json.loads(data)
            summaries[org] = {
                "bytes": stat.dataLength,
                "contributed": round(doc["contributed"], 1),
                "used": round(doc["used"], 1),
                "version": stat.version,
            }
        elif len(parts) == 2 and parts[0] in ("queue", "running"):
            doc = json.loads(data)
            org = (doc.get("request") or doc).get("org")
        elif len(parts) == 2:  # a node of a site's own (members/<site>, sites/<site>)
            org = site_org.get(parts[1])
        if org in per_org:
            per_org[org]["nodes"] += 1
            per_org[org]["data_bytes"] += stat.dataLength
    return {
        "nodes": sum(k["nodes"] for k in by_kind.values()),
        "data_bytes": sum(k["data_bytes"] for k in by_kind.values()),
        "path_bytes": sum(k["path_bytes"] for k in by_kind.values()),
        "by_kind": dict(sorted(by_kind.items())),
        "per_org": per_org,
        "summaries": dict(sorted(summaries.items())),
    }


def month_part(zk: KazooClient, base: str, args: argparse.Namespace) -> dict:
    root = f"{base}/month"
    orgs = [f"org-{i}" for i in range(args.orgs)]
    sites = {o: [f"{o}-site-{j}" for j in range(args.sites_per_org)] for o in orgs}
    site_org = {s: o for o in orgs for s in sites[o]}
    federations = {s: Federation(zk, s, o, root=root) for s, o in site_org.items()}
    next(iter(federations.values())).ensure()
    top = len(zk.get_children(root))
    rng = random.Random(args.seed)
    checkpoints = sorted({d for d in args.checkpoints if 1 <= d <= args.days} | {args.days})
    expected = 0.0

    def flow(request: Request, runner: str, started_s: float, used_s: float) -> None:
        name = federations[request.site].publish(request)
        if name is None:
            raise RuntimeError(f"{request.id} was published before")
        federations[request.site].published(request)  # as its broker does once it knows
        claim = federations[runner].claim(name)
        running = None if claim is None else federations[runner].consume(claim, started_s)
        done = federations[runner].complete(name, used_s) if running else None
        if done is None:
            raise RuntimeError(f"{request.id} was not claimed, consumed and completed")

    snapshots = {}
    started = time.perf_counter()
    with ThreadPoolExecutor(args.month_threads) as pool:
        for day in range(1, args.days + 1):
            work = []
            for k in range(args.requests_per_day):
                org = rng.choice(orgs)
                submitted = (day - 1) * 86400 + rng.uniform(0, 86400)
                request = Request(
                    f"d{day}-{k}",
                    org,
                    rng.choice(sites[org]),
                    float(rng.randint(1, 8)),
                    rng.expovariate(1 / 3600),
                    submitted,
                )
                runner = rng.choice([s for o in orgs if o != org for s in sites[o]])
                expected += request.cores * request.run_s
                work.append((request, runner, submitted + rng.uniform(0, 600), request.run_s))
            list(pool.map(lambda w: flow(*w), work))
            if day in checkpoints:
                snapshots[day] = data_size(zk, root, site_org)
                say(
                    f"month: day {day}: {snapshots[day]['nodes']} nodes,"
                    f" {snapshots[day]['data_bytes']} bytes of data under the root"
                )
    month_s = time.perf_counter() - started
    remove_tree(zk, root)
    last = snapshots[checkpoints[-1]]
    contributed = sum(s["contributed"] for s in last["summaries"].values())
    used = sum(s["used"] for s in last["summaries"].values())
    # Bounded: nothing per completion stays. At most the layout's top nodes, one summary per
    # organisation, one record per site and one parent of each site's publish markers (none
    # queued, running or claimed between days, no marker left once its publish is known).
    bound = top + len(orgs) + 2 * len(site_org)
    largest = max(k["largest_bytes"] for s in snapshots.values() for k in s["by_kind"].values())
    completed = args.days * args.requests_per_day
    return {
        "orgs": args.orgs,
        "sites": len(site_org),
        "days": args.days,
        "requests_per_day": args.requests_per_day,
        "requests_completed": completed,
        "threads": args.month_threads,
        "seconds": round(month_s, 2),
        "requests_per_s": round(completed / month_s, 1),
        "summaries_match_completions": abs(used - expected) <= 1e-6 * expected + 1
        and abs(contributed - expected) <= 1e-6 * expected + 1,
        "node_bound": bound,
        "nodes_by_day": {str(d): snapshots[d]["nodes"] for d in checkpoints},
        "data_bytes_by_day": {str(d): snapshots[d]["data_bytes"] for d in checkpoints},
        "org_bytes_by_day": {
            str(d): {o: v["data_bytes"] for o, v in snapshots[d]["per_org"].items()}
            for d in checkpoints
        },
        "largest_node_bytes": largest,
        "bounded": all(s["nodes"] <= bound for s in snapshots.values()) and largest <= 4096,
        "checkpoints": {str(d): snapshots[d] for d in checkpoints},
    }


# -- main ------------------------------------------------------------------------------------


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def orders(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out or set(out) - {"same", "spread"}:
        raise argparse.ArgumentTypeError("a comma list of same, spread")
    return out


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's notes as they are written, and each option's default."""


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument(
        "--zookeeper",
        default=argparse.SUPPRESS,
        help="kazoo's hosts string (default: $GMD_TEST_ZOOKEEPER, else the tests' ensemble)",
    )
    parser.add_argument(
        "--parts", default="claims,latency,month", help="which parts to run (comma list)"
    )
    parser.add_argument(
        "--brokers", type=int, default=3, help="broker processes (claims and latency)"
    )
    parser.add_argument("--seed", type=int, default=1, help="of the probes' gaps and the month")
    claims = parser.add_argument_group("claims")
    claims.add_argument("--requests", type=int, default=10000, help="requests queued, then taken")
    claims.add_argument(
        "--order",
        type=orders,
        default="same,spread",
        help="same: every broker walks the queue in the same order (the choice rule's: they"
        " contend); spread: each from its own offset (they do not). A round each (comma list)",
    )
    claims.add_argument(
        "--publish-threads", type=int, default=8, help="threads publishing (on one client)"
    )
    latency = parser.add_argument_group("latency")
    latency.add_argument(
        "--probes", type=int, default=100, help="probes per queue size (and watch round trips)"
    )
    latency.add_argument(
        "--queued-behind",
        type=numbers,
        default="0,1000,10000",
        help="queue sizes the probes are timed at (comma list): requests no broker can take",
    )
    latency.add_argument(
        "--probe-budget-s",
        type=float,
        default=90.0,
        help="no new probe at a queue size after this long (a slow size gets fewer probes)",
    )
    latency.add_argument(
        "--probe-timeout-s", type=float, default=600.0, help="the longest a probe is waited for"
    )
    latency.add_argument(
        "--reads", type=int, default=3, help="times the queue is read alone per size (best kept)"
    )
    latency.add_argument("--broker-cores", type=float, default=8.0, help="each broker's capacity")
    latency.add_argument("--tick-s", type=float, default=0.5, help="the brokers' broker.tick_s")
    latency.add_argument(
        "--idle-window-s",
        type=float,
        default=5.0,
        help="after the probes: how long the idle brokers' CPU and requests are counted",
    )
    month = parser.add_argument_group("month")
    month.add_argument("--orgs", type=int, default=5, help="organisations")
    month.add_argument("--sites-per-org", type=int, default=3, help="sites (clouds) of each")
    month.add_argument("--days", type=int, default=30, help="simulated days")
    month.add_argument(
        "--requests-per-day", type=int, default=100, help="requests completed a simulated day"
    )
    month.add_argument(
        "--checkpoints",
        type=numbers,
        default="1,7,30",
        help="days the data is measured at (comma list; the last day always)",
    )
    month.add_argument("--month-threads", type=int, default=3, help="requests flowing at once")
    return parser


def main() -> None:
    args = arguments().parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"claims", "latency", "month"}
    if unknown:
        arguments().error(f"unknown parts: {', '.join(sorted(unknown))}")
    hosts = zookeeper_hosts(getattr(args, "zookeeper", None))
    started = time.perf_counter()
    figures: dict[str, Any] = {
        "benchmark": "broker",
        "zookeeper": hosts,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    base = f"/gmd-bench/{uuid.uuid4().hex}"
    zk = zk_client(hosts)
    try:
        zk.ensure_path(base)
        if "claims" in parts:
            figures["claims"] = claims_part(zk, hosts, base, args)
        if "latency" in parts:
            figures["latency"] = latency_part(zk, hosts, base, args)
        if "month" in parts:
            figures["month"] = month_part(zk, base, args)
    finally:
        say(f"removing {base}")
        remove_tree(zk, base)
        with contextlib.suppress(NoNodeError, NotEmptyError):
            zk.delete("/gmd-bench")  # when no other run's path is in it
        zk.stop()
        zk.close()
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    figures["runtime_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
