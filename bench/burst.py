"""The interval-end burst: every host posts its batch for the interval that just ended, at once.

    python bench/burst.py --hosts 5000 --vms 20

Starts a real ``gmd-daemon`` process (token auth, accountant on, the default ``grace_s``) on a
fresh PostgreSQL database, warms it with one interval in which every host and VM is seen
first (the steady state: a daemon has seen its hosts before), waits until the accountant has
accounted that interval, restarts the daemons (which recall the hosts from the ledger as they
start: processes that have each seen every host, as long-running ones sharing a port have)
and waits until the next interval boundary has passed, then has every host post
the interval that just ended, over real HTTP, at most ``--concurrency`` at a time (each post
on a connection of its own, as an agent's once-a-minute post is). ``--spread S`` posts each
host at a random moment in [0, S) after the end instead, as agents with ``post_jitter_s = S``
do. ``--daemons N`` starts N processes sharing the port (``daemon.share_port``) and the
database, all with the accountant on, as a region that ingests on several cores runs them.

Reports the drain time (first post to last acknowledgement), batches/s, per-batch latency,
what was accepted and whether every sample arrived on time, the CPU seconds of the daemon
and of its PostgreSQL server processes during the burst (those alive at its end: a pool
connection closed meanwhile takes its CPU time along; ``postgres_connections_opened`` says how
many came and went), and beside them the physical ceiling: a binary ``COPY`` of the same
sample rows into the same table on one connection. The client is
plain asyncio on sockets (HTTP/1.1 written by hand) so that it takes as little as possible of
the CPU the daemon and the database share with it. Without ``--url``, PostgreSQL is
``$GMD_TEST_POSTGRES_URL`` or the test cluster that ``tests/scripts/postgres.sh`` starts. Prints a
JSON line last.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import orjson
import sqlalchemy as sa
from ingest import CAPACITY, HOST_PER_S, copy_ceiling, free_port, host_vms
from ledger_accounting import drop_database, postgres_url
from procstat import cpu_s

from gmd.daemon.config import AccountingConfig

T = TypeVar("T")


@dataclass(frozen=True)
class Posted:
    """One batch's post: when it left, when its answer came, and what the daemon said."""

    sent_s: float
    answered_s: float
    status: int
    receipt: dict[str, Any]


def token_sha256(host: int) -> str:
    return hashlib.sha256(f"token-{host}".encode()).hexdigest()


def host_batches(
    hosts: int, vms: int, customers: int, start_s: int, interval_s: int, seed: int
) -> list[tuple[str, bytes]]:
    """One batch per host for the interval at ``start_s``, as (token, JSON body).

    The same VMs (UUIDs) and owners every interval, so that a warm-up interval makes them
    known. Each host's VMs together use at most 80 % of each resource the host offers, so the
    daemon's plausibility check never refuses one, whatever the number of VMs.
    """
    rng = np.random.default_rng(seed)
    use = rng.uniform(0.05, 1.0, (hosts, vms, len(HOST_PER_S)))
    offered = HOST_PER_S * interval_s
    use *= 0.8 * offered / use.sum(axis=1, keepdims=True).clip(min=1.0)
    out = []
    for h in range(hosts):
        body = {
            "key": f"cmp-{h}/{start_s}/{rng.integers(2**63):016x}",
            "host": f"cmp-{h}",
            "interval_start_s": start_s,
            "interval_s": interval_s,
            "capacity": CAPACITY,
            "vms": host_vms(h, customers, use[h]),
        }
        out.append((f"token-{h}", orjson.dumps(body)))
    return out


async def post(port: int, token: str, body: bytes) -> Posted:
    """``POST /v1/samples`` on a new connection, as an agent does once an interval."""
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            (
                f"POST /v1/samples HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        answer = await reader.readexactly(length)
    finally:
        writer.close()
    return Posted(sent, time.perf_counter(), status, orjson.loads(answer) if answer else {})


async def bounded(
    jobs: list[Callable[[], Awaitable[T]]], concurrency: int, delays: list[float] | None = None
) -> list[T]:
    """Run ``jobs``, at most ``concurrency`` at a time; job i no earlier than ``delays[i]``
    seconds after the first started."""
    gate = asyncio.Semaphore(concurrency)
    start = time.perf_counter()

    async def one(i: int) -> T:
        if delays is not None:
            await asyncio.sleep(max(0.0, start + delays[i] - time.perf_counter()))
        async with gate:
            return await jobs[i]()

    return list(await asyncio.gather(*(one(i) for i in range(len(jobs)))))


def post_all(
    port: int, items: list[tuple[str, bytes]], concurrency: int, spread_s: float = 0.0
) -> list[Posted]:
    rng = random.Random(7)
    delays = [spread_s * rng.random() for _ in items] if spread_s else None
    jobs = [lambda t=t, b=b: post(port, t, b) for t, b in items]
    return asyncio.run(bounded(jobs, concurrency, delays))


def backend_pids(engine: sa.Engine) -> list[int]:
    """The server processes of this database's other connections (the daemon's pool)."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid()"
                )
            ).scalars()
        )


def sessions(engine: sa.Engine) -> int:
    """Connections ever opened to this database (PostgreSQL 14+); the pool's churn is the
    difference."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def wait_until(
    what: str, check: Callable[[], bool], daemons: list[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + 180
    while not check():
        ended = [d.poll() for d in daemons if d.poll() is not None]
        if ended or time.monotonic() > deadline:
            raise RuntimeError(f"no {what} (daemon exit status {ended or 'none: timed out'})")
        time.sleep(0.2)


def wal_bytes(engine: sa.Engine) -> int:
    """Where PostgreSQL's write-ahead log is, in bytes: what a burst wrote, as a difference."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
            ).scalar_one()
        )


def interval_state(engine: sa.Engine, start_s: int) -> str | None:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT state FROM intervals WHERE start_s = :s"), {"s": start_s}
        ).scalar_one_or_none()


def recalled(log_path: Path) -> list[str]:
    """What each restarted daemon said it recalled from the ledger as it started."""
    return [
        line.split(": ", 1)[-1].strip()
        for line in log_path.read_text().splitlines()
        if "recalled" in line and "from the ledger" in line
    ]


def refused(posted: list[Posted]) -> list[str]:
    return [f"HTTP {p.status}: {p.receipt}" for p in posted if p.status != 200]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(url: str, args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    port = free_port()
    interval = args.interval_s
    config = workdir / "gmd.toml"
    grace_s = AccountingConfig().grace_s if args.grace_s is None else args.grace_s
    config.write_text(
        f'[database]\nurl = "{url}"\n[accounting]\ninterval_s = {interval}\ngrace_s = {grace_s}\n'
        f'[daemon]\nbind = "127.0.0.1"\nport = {port}\naccount_every_s = {min(10, interval / 4)}\n'
        f"share_port = {'true' if args.daemons > 1 else 'false'}\n"
        f"ingest_threads = {args.ingest_threads}\n"
        + "".join(
            f'[hosts.cmp-{h}]\ntoken_sha256 = "{token_sha256(h)}"\n' for h in range(args.hosts)
        )
    )
    engine = sa.create_engine(url)
    log_path = workdir / "daemon.log"
    log = log_path.open("wb")
    # All of them may account: the advisory lock lets one at a time (as in production).
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def start() -> list[subprocess.Popen[bytes]]:
        started = [
            subprocess.Popen(
                [str(Path(sys.executable).with_name("gmd-daemon")), "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for _ in range(args.daemons)
        ]
        # Each process answers /healthz once it listens; with a shared port a probe reaches
        # any of them, so wait for the database to show every one's connection pool too.
        wait_until("healthy daemon", healthy, started)
        wait_until(
            f"{args.daemons} daemons connected",
            lambda: len(backend_pids(engine)) >= args.daemons,
            started,
        )
        return started

    def stop(running: list[subprocess.Popen[bytes]]) -> None:
        for d in running:
            d.send_signal(signal.SIGTERM)
        for d in running:
            d.wait(60)
        if any(d.returncode != 0 for d in running):
            raise RuntimeError(
                f"gmd-daemon exited {[d.returncode for d in running]}:\n"
                f"{log_path.read_text()[-3000:]}"
            )

    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons = start()
        warm_start = (int(time.time()) // interval - 1) * interval
        warm = host_batches(args.hosts, args.vms, args.customers, warm_start, interval, seed=1)
        t = time.perf_counter()
        problems = refused(post_all(port, warm, args.concurrency))
        warm_s = time.perf_counter() - t
        if problems:
            raise RuntimeError(f"warm-up: {len(problems)} refused, first: {problems[0]}")
        print(f"warm-up: {len(warm)} batches in {warm_s:.1f} s", file=sys.stderr)
        wait_until(
            "accounting of the warm-up interval",
            lambda: interval_state(engine, warm_start) == "accounted",
            daemons,
        )
        # Long-running processes have each seen every host (a host's connections reach any
        # of them); restarted ones recall the hosts from the ledger as they start, as a
        # daemon restarted in a running cloud does.
        stop(daemons)
        daemons = []
        t = time.perf_counter()
        daemons = start()
        restart_s = time.perf_counter() - t
        end_s = (int(time.time()) // interval + 1) * interval
        burst = host_batches(args.hosts, args.vms, args.customers, end_s - interval, interval, 2)
        time.sleep(max(0.0, end_s - time.time()))
        before = {pid: cpu_s(pid) for pid in backend_pids(engine)}
        sessions_before = sessions(engine)
        wal_before = wal_bytes(engine)
        daemon_before = sum(cpu_s(d.pid) for d in daemons)
        client_before = time.process_time()
        posted = post_all(port, burst, args.concurrency, args.spread_s)
        last_ack_after_end_s = time.time() - end_s
        daemon_cpu = sum(cpu_s(d.pid) for d in daemons) - daemon_before
        wal_written = wal_bytes(engine) - wal_before
        client_cpu = time.process_time() - client_before
        after = backend_pids(engine)
        postgres_cpu = sum(cpu_s(pid) - before.get(pid, 0.0) for pid in after)
        opened = sessions(engine) - sessions_before
        state = interval_state(engine, end_s - interval)
    except Exception:
        log.flush()
        print(f"gmd-daemon's log ends:\n{log_path.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        try:
            stop(daemons)
        finally:
            log.close()
    problems = refused(posted)
    first_sent = min(p.sent_s for p in posted)
    last_answer = max(p.answered_s for p in posted)
    drain = last_answer - first_sent
    latency_ms = [(p.answered_s - p.sent_s) * 1e3 for p in posted]
    ok = [p.receipt for p in posted if p.status == 200]
    late = sum(int(r.get("late", 0)) for r in ok)
    rows, copy_s = copy_ceiling(url, f"interval_id = {int(end_s - interval)}")
    engine.dispose()
    samples = args.hosts * args.vms
    print(
        f"burst: {len(posted)} batches ({samples} samples) drained in {drain:.2f} s"
        f" = {len(posted) / drain:,.0f} batches/s; latency p50 {percentile(latency_ms, 50):.0f}"
        f" ms, p99 {percentile(latency_ms, 99):.0f} ms; {late} samples late; the same rows by"
        f" binary COPY: {copy_s:.2f} s",
        file=sys.stderr,
    )
    return {
        "drain_s": round(drain, 3),
        "last_ack_after_interval_end_s": round(last_ack_after_end_s, 3),
        "grace_s": grace_s,
        "batches": len(posted),
        "batches_per_s": round(len(posted) / drain, 1),
        "samples_per_s": round(samples / drain),
        "latency_ms_p50": round(percentile(latency_ms, 50), 1),
        "latency_ms_p99": round(percentile(latency_ms, 99), 1),
        "latency_ms_max": round(max(latency_ms), 1),
        "accepted": sum(1 for r in ok if r.get("status") == "accepted"),
        "refused": len(problems),
        "first_refusal": problems[0] if problems else None,
        "late_samples": late,
        "all_on_time": late == 0 and not problems,
        "interval_state_after": state,
        "daemon_cpu_s": round(daemon_cpu, 2),
        "postgres_backends_cpu_s": round(postgres_cpu, 2),
        # What docs/operations.md sizes a region from: the CPU one batch of --vms VMs costs
        # the daemons and PostgreSQL, and the write-ahead log it makes PostgreSQL write.
        "daemon_cpu_ms_per_batch": round(daemon_cpu / len(posted) * 1e3, 3),
        "postgres_cpu_ms_per_batch": round(postgres_cpu / len(posted) * 1e3, 3),
        "wal_bytes": wal_written,
        "wal_bytes_per_sample": round(wal_written / samples, 1),
        "postgres_connections_opened": opened,
        "client_cpu_s": round(client_cpu, 2),
        "warmup_s": round(warm_s, 2),
        "restart_s": round(restart_s, 2),
        "recalled": recalled(log_path),
        "copy_rows": rows,
        "copy_s": round(copy_s, 3),
        "copy_rows_per_s": round(rows / copy_s) if copy_s else None,
        "drain_over_copy": round(drain / copy_s, 1) if copy_s else None,
        "median_batch_bytes": statistics.median(len(b) for _t, b in burst),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--vms", type=int, default=20, help="VMs per host")
    parser.add_argument("--customers", type=int, default=2000)
    parser.add_argument(
        "--concurrency", type=int, default=256, help="posts in flight at once (connections)"
    )
    parser.add_argument(
        "--spread-s",
        type=float,
        default=0.0,
        help="post each host at a random moment this long after the interval's end (0: at once)",
    )
    parser.add_argument(
        "--daemons",
        type=int,
        default=1,
        help="gmd-daemon processes sharing the port (daemon.share_port) and the database",
    )
    parser.add_argument(
        "--ingest-threads", type=int, default=2, help="each daemon's daemon.ingest_threads"
    )
    parser.add_argument("--interval-s", type=int, default=60)
    parser.add_argument("--grace-s", type=int, help="accounting.grace_s (default: the daemon's)")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    args = parser.parse_args()
    figures: dict[str, object] = {
        "benchmark": "burst",
        "hosts": args.hosts,
        "vms_per_host": args.vms,
        "concurrency": args.concurrency,
        "daemons": args.daemons,
        "ingest_threads": args.ingest_threads,
        "spread_s": args.spread_s,
        "cpus": os.cpu_count(),
    }
    url, admin, name = postgres_url(args.url or os.environ.get("GMD_TEST_POSTGRES_URL"))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures.update(run(url, args, Path(tmp)))
    finally:
        drop_database(admin, name)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
