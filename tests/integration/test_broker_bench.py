"""bench/broker.py still runs on the shared ZooKeeper ensemble and ends with its JSON line
(figures are not asserted; the exactly-once checks are)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "broker.py"

pytest_plugins = ("tests.support.zookeeper_fixtures",)


def test_broker_bench_claims_probes_and_measures_a_month(zookeeper_hosts: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--zookeeper",
            zookeeper_hosts,
            "--requests",
            "50",
            "--order",
            "same",
            "--probes",
            "3",
            "--queued-behind",
            "0,20",
            "--probe-budget-s",
            "10",
            "--idle-window-s",
            "0.2",
            "--reads",
            "1",
            "--days",
            "2",
            "--requests-per-day",
            "10",
            "--checkpoints",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "broker"

    claims = figures["claims"]
    assert (claims["requests"], claims["brokers"], claims["workers"]) == (50, 3, "processes")
    same = claims["orders"]["same"]
    assert claims["exactly_once"] and same["exactly_once"]
    assert (same["consumed"], same["running_nodes"], same["duplicates"]) == (50, 50, 0)
    assert same["queue_left"] == 0
    assert sum(b["consumed"] for b in same["per_broker"].values()) == 50
    assert same["claims_per_s"] > 0 and same["zookeeper_requests_per_request"] >= 1
    assert claims["ceiling_tx_per_s"] > 0 and claims["ceiling_tx_failed"] == 0

    latency = figures["latency"]
    assert latency["watch_round_trip_ms"]["p50"] > 0
    assert [s["queued_behind"] for s in latency["sizes"]] == [0, 20]
    for size in latency["sizes"]:
        assert size["probes"] == 3 and size["each_probe_started_once"]
        assert size["latency_ms"]["p50"] <= size["latency_ms"]["max"]
        assert size["queued_read_s"] > 0 and size["queued_read_pipelined_s"] > 0

    month = figures["month"]
    assert month["requests_completed"] == 20 and month["summaries_match_completions"]
    assert set(month["nodes_by_day"]) == {"1", "2"}
    assert month["bounded"]
    assert figures["runtime_s"] > 0
