"""Samples per second through the HTTP API into SQLite and PostgreSQL (batches of 500 VMs).

    python bench/ingest.py --database postgresql --batches 800 --rounds 3 --clients 4

Starts a real ``gmd-daemon`` process (uvicorn, token auth, accountant off so that only ingest
is measured) on a fresh ledger, warms it with one round in which every VM is seen first, then
posts ``--rounds`` rounds of ``--batches`` prepared batches from ``--clients`` concurrent HTTP
clients and times each until its last batch is acknowledged. Each host posts one batch per
interval, as agents do. On PostgreSQL every round is followed by one binary COPY of the rows it
stored, into the same table: the ceiling, measured beside each round rather than once. The
figures are the rounds' medians, with the daemon's and the server's CPU per batch. Without
``--url``, PostgreSQL is the test cluster that ``tests/scripts/postgres.sh`` starts. Prints a JSON
line last.

``--verify``: the daemon checks every batch against Placement (``[placement] verify = "on"``),
the real one of ``tests/scripts/openstack.sh``, seeded first with the bench's hosts (a provider
each, 64 VCPU) and every VM allocated on its host, owned by its customer, as Nova would have them
(about 40 ms a VM: that Placement writes to SQLite one at a time, so keep ``--hosts`` small,
e.g. ``--hosts 8 --batches 200``). Its snapshots are read in the warm-up round and stay fresh
through the timed ones: what is measured is a batch's check, not Placement's reads.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import sqlalchemy as sa
from ledger_accounting import drop_database, postgres_url
from procstat import cpu_s

from gmd.daemon.ledger.sample_store import BATCH_COLUMNS

INTERVAL_S = 60
CAPACITY = {
    "cpu_cores": 64,
    "memory_bytes": 512e9,
    "disk_bytes_per_s": 1e9,
    "network_bytes_per_s": 1.25e9,
}
VM_VCPUS, VM_RAM_MB = 2, 512
"""Every VM's flavor, as its batch gives it and as Placement allocates it (a host of the
largest bench holds 500 of them within its 64 × 16 VCPU and 500,000 MB)."""

# Per usage field (cpu_s, memory_byte_s, disk read/write, network rx/tx), what the host offers
# per second.
HOST_PER_S = np.array([64, 512e9, 1e9, 1e9, 1.25e9, 1.25e9])


def seed_placement(hosts: int, vms: int, customers: int, prefix: str) -> Any:
    """The bench's hosts and VMs in the test cloud's Placement, as Nova would have them: a
    provider per host (named ``prefix-cmp-N``), each VM allocated on its host and owned by
    its customer. Returns what removes them (``close``)."""
    from placement import seeded, use_test_cloud

    from tests.support.placement_support import PlacementWriteError

    use_test_cloud()
    written = seeded()
    try:
        for h in range(hosts):
            provider = written.host(f"{prefix}-cmp-{h}", 64, 500_000, ratio=16.0)
            for vm in host_vms(h, customers, np.zeros((vms, 6))):
                written.server(provider, str(vm["customer"]), str(vm["uuid"]), VM_RAM_MB, VM_VCPUS)
    except BaseException as exc:
        written.close()
        if isinstance(exc, PlacementWriteError):
            raise SystemExit(str(exc)) from None
        raise
    return written


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_vms(host: int, customers: int, use: np.ndarray) -> list[dict[str, object]]:
    """Host ``host``'s VMs with ``use`` (VMs × the six usage amounts): the same UUIDs and
    owners every interval, so that a warm-up makes them known."""
    vms = len(use)
    return [
        {
            "uuid": f"00000000-0000-4000-8000-{host:06d}{j:06d}",
            "customer": f"proj-{(host * vms + j) % customers}",
            "cpu_s": u[0],
            "memory_byte_s": u[1],
            "disk_read_bytes": u[2],
            "disk_write_bytes": u[3],
            "network_rx_bytes": u[4],
            "network_tx_bytes": u[5],
            "flavor": {"vcpus": VM_VCPUS, "memory_bytes": float(VM_RAM_MB * 2**20)},
        }
        for j, u in enumerate(use.tolist())
    ]


def bodies(
    n_hosts: int, rounds: int, vms: int, customers: int, first_s: int
) -> list[tuple[str, bytes]]:
    """``rounds`` intervals of one batch per host, as JSON bytes (made before timing)."""
    rng = np.random.default_rng(3)
    out = []
    for r in range(rounds):
        start = first_s + r * INTERVAL_S
        for h in range(n_hosts):
            # The host's VMs together at about 80 % of each resource it has (the daemon
            # refuses more than the host can give).
            use = rng.uniform(0, 1, (vms, 6)) * (1.6 * INTERVAL_S / vms) * HOST_PER_S
            batch = {
                "key": f"cmp-{h}:{start}",
                "host": f"cmp-{h}",
                "interval_start_s": start,
                "interval_s": INTERVAL_S,
                "capacity": CAPACITY,
                "vms": host_vms(h, customers, use),
            }
            out.append((f"token-{h}", json.dumps(batch).encode()))
    return out


STORED_COLUMNS = ", ".join(BATCH_COLUMNS)
"""``sample_batches``' columns: a batch's samples as PostgreSQL stores them."""
COPY_BATCH_OFFSET = 10**15


def processes_cpu_s(processes: list[subprocess.Popen[bytes]]) -> float:
    return sum(cpu_s(p.pid) for p in processes)


def server_cpu_s() -> dict[int, float]:
    """CPU seconds so far of every PostgreSQL process on this machine (its backends, WAL
    writer and checkpointer), by process: what the server spends, to set beside the
    daemon's."""
    spent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    spent[int(entry.name)] = cpu_s(int(entry.name))
            except OSError:
                continue
    return spent


def server_cpu_since(before: dict[int, float]) -> float:
    """CPU seconds PostgreSQL's processes spent since ``before``: by process, so that a
    backend that exited meanwhile (the COPY's) takes nothing off the sum."""
    return sum(s - before.get(pid, 0.0) for pid, s in server_cpu_s().items())


def copy_ceiling(url: str, where: str) -> tuple[int, float]:
    """The samples of the stored batches ``where`` selects, and the seconds one binary COPY of
    those rows (and its commit) takes into the same table: what the database takes with no
    per-batch work. The copies get batch ids far above any real one, and are deleted after."""
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    shifted = ", ".join(
        f"{c} + {COPY_BATCH_OFFSET}" if c == "batch_id" else c for c in BATCH_COLUMNS
    )
    with psycopg.connect(dsn) as conn:
        payload = bytearray()
        with conn.cursor().copy(
            f"COPY (SELECT {shifted} FROM sample_batches WHERE {where}) TO STDOUT (FORMAT BINARY)"
        ) as copy:
            for chunk in copy:
                payload += chunk
        rows = conn.execute(
            f"SELECT coalesce(sum(cardinality(vm_id)), 0) FROM sample_batches WHERE {where}"
        ).fetchone()
        conn.commit()
        started = time.perf_counter()
        with conn.cursor().copy(
            f"COPY sample_batches ({STORED_COLUMNS}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.write(payload)
        conn.commit()
        elapsed = time.perf_counter() - started
        conn.execute(f"DELETE FROM sample_batches WHERE batch_id >= {COPY_BATCH_OFFSET}")
        conn.commit()
        return (int(rows[0]) if rows else 0), elapsed


def run(
    database: str, url: str, args: argparse.Namespace, workdir: Path, daemons: int = 1
) -> dict[str, object]:
    """Ingest through ``daemons`` gmd-daemon processes on one ledger (the clients spread over
    them as agents behind a load balancer would): one daemon is one Python process, whose
    global interpreter lock bounds it to about one core."""
    ports = [free_port() for _ in range(daemons)]
    hosts = {
        f"cmp-{h}": hashlib.sha256(f"token-{h}".encode()).hexdigest() for h in range(args.hosts)
    }
    configs = []
    verify = ""
    if args.verify:
        from placement import LEGACY

        verify = (
            f'[placement]\nverify = "on"\ncloud = "{LEGACY}"\nrefresh_s = 86400\n'
            "[placement.providers]\n" + "".join(f'"{h}" = "{args.providers}-{h}"\n' for h in hosts)
        )
    for k, port in enumerate(ports):
        config = workdir / f"{database}-{k}.toml"
        config.write_text(
            f'[database]\nurl = "{url}"\n[accounting]\ninterval_s = {INTERVAL_S}\n'
            f'[daemon]\nbind = "127.0.0.1"\nport = {port}\naccounting = false\n'
            f"ingest_threads = {args.ingest_threads}\n"
            + verify
            + "".join(f'[hosts.{h}]\ntoken_sha256 = "{t}"\n' for h, t in hosts.items())
        )
        configs.append(config)
    timed_batches = args.batches * args.rounds
    intervals = 1 + -(-timed_batches // args.hosts)
    first_s = (int(time.time()) // INTERVAL_S - intervals - 2) * INTERVAL_S
    prepared = bodies(args.hosts, intervals, args.vms, args.customers, first_s)
    warm = prepared[: args.hosts]
    timed = prepared[args.hosts : args.hosts + timed_batches]
    log = (workdir / f"{database}-{daemons}.log").open("wb")
    processes = [
        subprocess.Popen(
            [str(Path(sys.executable).with_name("gmd-daemon")), "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for config in configs
    ]
    engine = sa.create_engine(url)
    rounds: list[dict[str, float]] = []
    try:
        for port in ports:
            for _ in range(300):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
        local = threading.local()
        connections: list[http.client.HTTPConnection] = []
        next_client = iter(range(1 << 30))

        def post(item: tuple[str, bytes]) -> None:
            # http.client, not httpx: the load generator shares the machine with the daemon and
            # PostgreSQL, and takes a third of httpx's CPU per request.
            token, body = item
            conn = getattr(local, "conn", None)
            if conn is None:
                port = ports[next(next_client) % daemons]
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                connections.append(conn)
            conn.request(
                "POST",
                "/v1/samples",
                body,
                {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            )
            response = conn.getresponse()
            text = response.read()
            if response.status != 200 or json.loads(text)["status"] != "accepted":
                raise RuntimeError(f"{response.status}: {text[:300]!r}")

        copied = 0
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(post, warm))
            # The warm-up's slowest batches (with --verify, each host's first sight of
            # Placement) may have outlived the others' keep-alive: open again.
            for conn in connections:
                conn.close()
            for r in range(args.rounds):
                chunk = timed[r * args.batches : (r + 1) * args.batches]
                daemon_cpu, server_cpu = processes_cpu_s(processes), server_cpu_s()
                t0 = time.perf_counter()
                list(pool.map(post, chunk))
                elapsed = time.perf_counter() - t0
                figures = {
                    "samples_per_s": len(chunk) * args.vms / elapsed,
                    "daemon_cpu_ms_per_batch": (processes_cpu_s(processes) - daemon_cpu)
                    / len(chunk)
                    * 1e3,
                }
                if database == "postgresql":
                    figures["postgres_cpu_ms_per_batch"] = (
                        server_cpu_since(server_cpu) / len(chunk) * 1e3
                    )
                    # The same rows again, by one binary COPY: the ceiling the HTTP path is
                    # measured against, right after it, so that both see the same machine.
                    rows, copy_s = copy_ceiling(url, batches_of(engine, chunk))
                    # Idle through the COPY, the connections may have outlived the daemon's
                    # keep-alive: each opens again at its next request.
                    for conn in connections:
                        conn.close()
                    copied += rows
                    figures["copy_samples_per_s"] = rows / copy_s
                    figures["of_copy"] = figures["samples_per_s"] / figures["copy_samples_per_s"]
                rounds.append(figures)
                print(
                    f"{database}, {daemons} daemon(s), round {r + 1}: "
                    + ", ".join(f"{k} {v:,.3g}" for k, v in figures.items())
                )
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one()
        expected = (len(warm) + len(timed)) * args.vms + copied
        if stored != expected:
            raise RuntimeError(f"{stored} samples stored, {expected} posted or copied")
    except Exception:
        log.flush()
        print((workdir / f"{database}-{daemons}.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        engine.dispose()
        for daemon in processes:
            daemon.send_signal(signal.SIGTERM)
        for daemon in processes:
            daemon.wait(30)
        log.close()
    # The median round of each figure: a round that the machine's neighbours slowed (this is a
    # shared virtual machine) moves no figure.
    summary: dict[str, object] = {
        key: round(statistics.median(r[key] for r in rounds), 3 if key == "of_copy" else 2)
        for key in rounds[0]
    }
    summary["samples"] = len(timed) * args.vms
    summary["rounds"] = [{k: round(v, 3) for k, v in r.items()} for r in rounds]
    return summary


def batches_of(engine: sa.Engine, posted: list[tuple[str, bytes]]) -> str:
    """A condition on ``samples`` that selects the rows of the ``posted`` batches (their ids
    are consecutive: a round is posted whole before the next)."""
    keys = [json.loads(body)["key"] for _, body in posted]
    with engine.connect() as conn:
        low, high = conn.execute(
            sa.text("SELECT min(id), max(id) FROM batches WHERE key = ANY(:keys)"), {"keys": keys}
        ).one()
    return f"batch_id BETWEEN {low} AND {high}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--batches", type=int, default=800, help="timed batches per round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timed rounds, each followed by a COPY of its rows; figures are the medians",
    )
    parser.add_argument("--vms", type=int, default=500, help="VMs per batch")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--customers", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    parser.add_argument(
        "--ingest-threads", type=int, default=2, help="the daemon's daemon.ingest_threads"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="the daemon verifies batches against the test cloud's Placement, seeded first",
    )
    parser.add_argument(
        "--daemons",
        type=int,
        default=1,
        help="also ingest into PostgreSQL through this many daemons at once (1: only one)",
    )
    args = parser.parse_args()

    figures: dict[str, object] = {
        "benchmark": "ingest",
        "vms_per_batch": args.vms,
        "clients": args.clients,
        "target_samples_per_s_postgresql": 20000,
        "cpus": os.cpu_count(),
    }
    seeded = None
    if args.verify:
        args.providers = f"bench-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        seeded = seed_placement(args.hosts, args.vms, args.customers, args.providers)
        figures["placement_seed_s"] = round(time.perf_counter() - started, 1)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as cleanup:
        if seeded is not None:
            cleanup.callback(seeded.close)
        workdir = Path(tmp)
        if args.database in ("sqlite", "both"):
            figures["sqlite"] = run("sqlite", f"sqlite:///{workdir / 'ledger.db'}", args, workdir)
        if args.database in ("postgresql", "both"):
            url, admin, name = postgres_url(args.url)
            try:
                figures["postgresql"] = run("postgresql", url, args, workdir)
            finally:
                drop_database(admin, name)
            if args.daemons > 1:
                url, admin, name = postgres_url(args.url)
                try:
                    figures[f"postgresql_{args.daemons}_daemons"] = run(
                        "postgresql", url, args, workdir, args.daemons
                    )
                finally:
                    drop_database(admin, name)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
