"""Samples per second through the HTTP API into SQLite and PostgreSQL (batches of 500 VMs).

    python bench/ingest.py --database postgresql --batches 400 --clients 4

Starts a real ``gmd-daemon`` process (uvicorn, token auth, accountant off so that only ingest
is measured) on a fresh ledger, warms it with one round in which every VM is seen first, then
posts ``--batches`` prepared batches from ``--clients`` concurrent HTTP clients and times them
until the last is acknowledged. Each host posts one batch per interval, as agents do. Without
``--url``, PostgreSQL is the test cluster that ``tests/postgres.sh`` starts. Prints a JSON line
last.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psycopg
import sqlalchemy as sa
from ledger_accounting import drop_database, postgres_url

INTERVAL_S = 60
CAPACITY = {
    "cpu_cores": 64,
    "memory_bytes": 512e9,
    "disk_bytes_per_s": 1e9,
    "network_bytes_per_s": 1.25e9,
}
# Per usage field (cpu_s, memory_byte_s, disk read/write, network rx/tx), what the host offers
# per second.
HOST_PER_S = np.array([64, 512e9, 1e9, 1e9, 1.25e9, 1.25e9])


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
            "flavor": {"vcpus": 2, "memory_bytes": 8e9},
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


SAMPLE_COLUMNS = (
    "interval_id, vm_id, host_id, customer_id, batch_id, cpu_s, memory_byte_s, disk_read_bytes,"
    " disk_write_bytes, network_rx_bytes, network_tx_bytes, flavor_vcpus, flavor_memory_bytes,"
    " flavor_disk_bytes_per_s, flavor_network_bytes_per_s, late"
)


def copy_ceiling(url: str, where: str) -> tuple[int, float]:
    """The sample rows ``where`` selects, and the seconds one binary COPY of them (and its
    commit) takes into the same table: what the database takes with no per-batch work."""
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        payload = bytearray()
        with conn.cursor().copy(
            f"COPY (SELECT {SAMPLE_COLUMNS} FROM samples WHERE {where}) TO STDOUT (FORMAT BINARY)"
        ) as copy:
            for chunk in copy:
                payload += chunk
        rows = conn.execute(f"SELECT count(*) FROM samples WHERE {where}").fetchone()
        conn.commit()
        started = time.perf_counter()
        with conn.cursor().copy(
            f"COPY samples ({SAMPLE_COLUMNS}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.write(payload)
        conn.commit()
        return (int(rows[0]) if rows else 0), time.perf_counter() - started


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
    for k, port in enumerate(ports):
        config = workdir / f"{database}-{k}.toml"
        config.write_text(
            f'[database]\nurl = "{url}"\n[accounting]\ninterval_s = {INTERVAL_S}\n'
            f'[daemon]\nbind = "127.0.0.1"\nport = {port}\naccounting = false\n'
            + "".join(f'[hosts.{h}]\ntoken_sha256 = "{t}"\n' for h, t in hosts.items())
        )
        configs.append(config)
    rounds = 1 + -(-args.batches // args.hosts)
    first_s = (int(time.time()) // INTERVAL_S - rounds - 2) * INTERVAL_S
    prepared = bodies(args.hosts, rounds, args.vms, args.customers, first_s)
    warm, timed = prepared[: args.hosts], prepared[args.hosts : args.hosts + args.batches]
    log = (workdir / f"{database}-{daemons}.log").open("wb")
    processes = [
        subprocess.Popen(
            [str(Path(sys.executable).with_name("gmd-daemon")), "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for config in configs
    ]
    try:
        for port in ports:
            for _ in range(300):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
        local = threading.local()
        next_client = iter(range(1 << 30))

        def post(item: tuple[str, bytes]) -> None:
            # http.client, not httpx: the load generator shares the machine with the daemon and
            # PostgreSQL, and takes a third of httpx's CPU per request.
            token, body = item
            conn = getattr(local, "conn", None)
            if conn is None:
                port = ports[next(next_client) % daemons]
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
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

        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(post, warm))
            t0 = time.perf_counter()
            list(pool.map(post, timed))
            elapsed = time.perf_counter() - t0
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one()
        engine.dispose()
        expected = (len(warm) + len(timed)) * args.vms
        if stored != expected:
            raise RuntimeError(f"{stored} samples stored, {expected} posted")
    except Exception:
        log.flush()
        print((workdir / f"{database}-{daemons}.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        for daemon in processes:
            daemon.send_signal(signal.SIGTERM)
        for daemon in processes:
            daemon.wait(30)
        log.close()
    samples = len(timed) * args.vms
    print(
        f"{database}, {daemons} daemon(s): {samples} samples in {elapsed:.2f} s"
        f" = {samples / elapsed:,.0f}/s"
    )
    figures: dict[str, object] = {
        "samples": samples,
        "seconds": round(elapsed, 3),
        "samples_per_s": round(samples / elapsed),
        "batches_per_s": round(len(timed) / elapsed, 1),
    }
    if database == "postgresql":
        # The same rows again, by one binary COPY: the ceiling the HTTP path is measured against.
        rows, copy_s = copy_ceiling(url, f"interval_id >= {first_s + INTERVAL_S}")
        figures["copy_samples_per_s"] = round(rows / copy_s)
        figures["of_copy"] = round(samples / elapsed / (rows / copy_s), 3)
        print(f"{database}: raw binary COPY of {rows} rows: {rows / copy_s:,.0f}/s")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--url", help="PostgreSQL server URL (a database is created on it)")
    parser.add_argument("--batches", type=int, default=400, help="timed batches")
    parser.add_argument("--vms", type=int, default=500, help="VMs per batch")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--customers", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
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
    with tempfile.TemporaryDirectory() as tmp:
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
