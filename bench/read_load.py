"""Members' plots against the agents: what 60 concurrent ``plot.svg`` requests do to an agent's
plan fetch and to ``/healthz``.

    python bench/read_load.py --plots 60 --seconds 20

Builds a SQLite ledger of one day of 300 s intervals (``--customers`` customers with two VMs
each, on one host), accounted, then starts a real ``gmd-daemon`` process on it (read API
``auth = "local"``, accountant off) twice: with the default admission of reads
(``[read_api] concurrent``) and with ``concurrent = 64``, no bound in effect (as before the
admission). In each, one thread plays an agent: ``GET /v1/plan/cmp-1`` then ``GET /healthz``
back to back for ``--seconds``, alone first (the floor, measured in the same run), then while
``--plots`` threads each ask for a customer's plot (the member's default range) again and
again. Reports per run the agent's and the probe's latency (median, p99, max) alone and under
load, and the plots answered 200 and 503.

Prints a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from ingest import free_port

from gmd.daemon.config import ReadApiConfig, parse
from gmd.daemon.ingest.parse import parse_record
from gmd.daemon.ingest.store import LedgerStore
from gmd.daemon.ledger.accounting import account_due
from gmd.ledger_schema import migrate

INTERVAL_S = 300
HOST = "cmp-1"
DAEMON = Path(sys.executable).with_name("gmd-daemon")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plots", type=int, default=60, help="concurrent plot requests")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--customers", type=int, default=30)
    parser.add_argument("--hours", type=int, default=24, help="the ledger's length")
    return parser.parse_args()


def customer(i: int) -> str:
    return f"{i:032x}"


def build(path: Path, customers: int, hours: int) -> tuple[str, int]:
    """The ledger: ``hours`` of accounted intervals ending an interval ago; its URL and the
    start of its first interval."""
    url = f"sqlite:///{path}"
    config = parse(
        {"database": {"url": url}, "accounting": {"interval_s": INTERVAL_S}}, "bench/read_load"
    )
    engine = migrate.engine_for(url)
    migrate.upgrade(engine)
    store = LedgerStore(engine, config.owner_of, config.organization_customers)
    now = int(time.time())
    last = now - now % INTERVAL_S - INTERVAL_S
    first = last - hours * 3600
    for start in range(first, last, INTERVAL_S):
        vms = [
            {
                "uuid": f"00000000-0000-4000-8000-{i:06d}{j:06d}",
                "customer": customer(i),
                "cpu_s": float(INTERVAL_S * (0.1 + (i % 7) * 0.2) * (1 + (start // 3600) % 3)),
                "memory_byte_s": 1e9 * INTERVAL_S,
                "disk_read_bytes": 1e6,
                "disk_write_bytes": 1e6,
                "network_rx_bytes": 1e6,
                "network_tx_bytes": 1e6,
                "flavor": {"vcpus": 2, "memory_bytes": 4.0 * 2**30},
            }
            for i in range(customers)
            for j in range(2)
        ]
        body = {
            "key": f"{HOST}:{start}",
            "host": HOST,
            "interval_start_s": start,
            "interval_s": INTERVAL_S,
            "capacity": {
                "cpu_cores": 4.0 * customers,
                "memory_bytes": 16e9 * customers,
                "disk_bytes_per_s": 1e9,
                "network_bytes_per_s": 1.25e9,
            },
            "vms": vms,
        }
        store.ingest(parse_record(json.dumps(body).encode()), now_s=start + INTERVAL_S)
    account_due(engine, config.accounting, now_s=now, budget_s=3600)
    engine.dispose()
    return url, first


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values) * 1e3, 2),
        "p99_ms": round(percentile(values, 0.99) * 1e3, 2),
        "max_ms": round(max(values) * 1e3, 2),
        "n": len(values),
    }


def agent(base: str, seconds: float) -> tuple[list[float], list[float]]:
    """An agent's plan fetch and a probe, back to back, for ``seconds``."""
    plans, probes = [], []
    with httpx.Client(base_url=base, timeout=120) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            answer = client.get(f"/v1/plan/{HOST}")
            plans.append(time.perf_counter() - t)
            assert answer.status_code == 200, answer.text
            t = time.perf_counter()
            answer = client.get("/healthz")
            probes.append(time.perf_counter() - t)
            assert answer.status_code == 200, answer.text
            time.sleep(0.05)
    return plans, probes


def run(url: str, customers: int, concurrent: int, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gmd.toml"
        config.write_text(
            f'[database]\nurl = "{url}"\n[accounting]\ninterval_s = {INTERVAL_S}\n'
            f'[daemon]\nauth = "none"\nbind = "127.0.0.1"\nport = {port}\naccounting = false\n'
            f'[read_api]\nauth = "local"\nconcurrent = {concurrent}\n'
            f'[hosts.{HOST}]\nowner = "operator"\n'
        )
        log = open(Path(tmp) / "daemon.log", "wb")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(
            [str(DAEMON), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"gmd-daemon did not start: {proc.returncode}")
                time.sleep(0.1)
            alone = agent(base, args.seconds / 2)
            stop = threading.Event()
            answers: dict[int, int] = {}
            lock = threading.Lock()

            def member(k: int) -> None:
                with httpx.Client(base_url=base, timeout=300) as client:
                    while not stop.is_set():
                        answer = client.get(f"/v1/customers/{customer(k % customers)}/plot.svg")
                        with lock:
                            answers[answer.status_code] = answers.get(answer.status_code, 0) + 1

            members = [
                threading.Thread(target=member, args=(k,), daemon=True) for k in range(args.plots)
            ]
            for m in members:
                m.start()
            time.sleep(1.0)  # every member has asked
            loaded = agent(base, args.seconds)
            stop.set()
            for m in members:
                m.join(300)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
    return {
        "concurrent": concurrent,
        "plan_alone": figures(alone[0]),
        "healthz_alone": figures(alone[1]),
        "plan_under_plots": figures(loaded[0]),
        "healthz_under_plots": figures(loaded[1]),
        "plots_answered": {str(k): v for k, v in sorted(answers.items())},
    }


def main() -> None:
    args = arguments()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        url, _ = build(Path(tmp) / "ledger.db", args.customers, args.hours)
        built_s = time.perf_counter() - t
        bounded = run(url, args.customers, ReadApiConfig().concurrent, args)
        unbounded = run(url, args.customers, 64, args)
    for name, r in (("bounded", bounded), ("unbounded", unbounded)):
        print(
            f"{name} (concurrent = {r['concurrent']}): plan p99 {r['plan_alone']['p99_ms']} ms"
            f" alone, {r['plan_under_plots']['p99_ms']} ms under {args.plots} plots;"
            f" /healthz p99 {r['healthz_alone']['p99_ms']} → {r['healthz_under_plots']['p99_ms']}"
            f" ms; plots {r['plots_answered']}"
        )
    print(
        json.dumps(
            {
                "plots": args.plots,
                "customers": args.customers,
                "intervals": args.hours * 3600 // INTERVAL_S,
                "ledger_built_s": round(built_s, 1),
                "cpus": os.cpu_count(),
                "bounded": bounded,
                "unbounded": unbounded,
            }
        )
    )


if __name__ == "__main__":
    main()
