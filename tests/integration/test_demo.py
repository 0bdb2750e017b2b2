"""`make demo` in a shortened form: real gmd-daemon and gmd-agent processes replaying real
Bitbrains traces, then the operators' commands, checked against the traces themselves.

Two days of 14 VMs on two hosts: cmp-02 has 16 cores, cmp-01 a quarter of that, too few for
what its VMs' traces ask once initech's batch VMs run flat out (from the second day on). So
cmp-01 is saturated and contended at the end, cmp-02 is not (about half busy), and initech,
throttled, is capped on the one and not on the other."""

from __future__ import annotations

import bisect
import csv
import gzip
import itertools
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gmd.admin.cli import app
from gmd.admin.demo import PACKAGED_TRACES

TRACES = PACKAGED_TRACES  # what `gmd-admin demo` replays by default: N.csv.gz
BIN = Path(sys.executable).parent
DAYS = 2
INTERVAL_S = 900


def admin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gmd-admin"), "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def rows_of(path: Path) -> list[list[float]]:
    """A trace's rows, gunzipped and read with the standard library, not gmd's parser."""
    with gzip.open(path, "rt") as f:
        return [[float(x) for x in r] for r in list(csv.reader(f, delimiter=";"))[1:] if r]


def trace_core_seconds(path: Path, start: float, end: float) -> float:
    """CPU core-seconds a trace says its VM used in [start, end): each row's usage % of its
    cores holds until the next row. Read with the csv module, not gmd's parser."""
    rows = rows_of(path)
    total = 0.0
    for row, nxt in itertools.pairwise(rows):
        lo, hi = max(row[0], start), min(nxt[0], end)
        if hi > lo:
            total += row[4] / 100 * row[1] * (hi - lo)
    return total


def host_core_seconds(paths: list[Path], cores: float, start: float, end: float) -> float:
    """CPU core-seconds a host of ``cores`` gives the traced VMs in [start, end): at every
    instant what their rows ask together, but no more than its cores (∫ min(Σ rates, cores)).
    Each row's rate holds until the next row; read with the csv module, not gmd's parser."""
    steps = []
    edges = {start, end}
    for path in paths:
        rows = rows_of(path)
        times = [row[0] for row in rows]
        rates = [row[4] / 100 * row[1] for row in rows]
        steps.append((times, rates))
        edges.update(t for t in times if start < t < end)
    total = 0.0
    for a, b in itertools.pairwise(sorted(edges)):
        asked = 0.0
        for times, rates in steps:
            k = bisect.bisect_right(times, a) - 1
            if 0 <= k < len(times) - 1:  # the last row only ends the one before
                asked += rates[k]
        total += min(asked, cores) * (b - a)
    return total


def first_timestamp(path: Path) -> float:
    rows = rows_of(path)
    return rows[0][0] if rows else float("inf")


def test_the_demo_replays_accounts_and_reports_what_the_traces_say(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    run = subprocess.run(
        [
            str(BIN / "gmd-admin"),
            "demo",
            "--dir",
            str(root),
            "--days",
            str(DAYS),
            "--hosts",
            "2",
            "--vms",
            "1-4,41-46,54-57",
            "--cores",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # As after `make demo`: the virtualenv is not activated, gmd-admin is not on PATH.
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr + run.stdout[-3000:]
    out = run.stdout
    intervals = round(DAYS * 86400 / INTERVAL_S)
    assert "on 2 simulated hosts of 16 cores (cmp-01: 4, a small busy one)" in out
    assert f"accounting {intervals} intervals" in out
    for command in ("standings", "report --from", "explain ", "actions ", "enforce --plan"):
        typed = re.search(rf"^\$ (\S+) {re.escape(command)}", out, re.MULTILINE)
        assert typed is not None, command
        # Not on PATH: the command is shown by its path (relative to here when inside).
        assert os.path.samefile(typed[1], BIN / "gmd-admin"), typed[0]
    # The closing hints run as printed, in a shell without the virtualenv on its PATH.
    hints = out.split("Look further with:\n", 1)[1].splitlines()[:3]
    assert hints[0].strip().startswith("export GMD_CONFIG="), hints
    shell = subprocess.run(
        ["sh", "-c", f"{hints[0].strip()} && {hints[1].strip()}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # Where the demo ran, as an operator types them after `make demo`.
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    assert shell.returncode == 0, (hints, shell.stderr)
    assert "--group-by day\n" in out
    assert (root / "standings.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = root / "gmd.toml"

    # initech ends throttled: lower weights on both hosts, and no CPU cap on either: cmp-02 is
    # not contended, and cmp-01 is busy with initech's own VMs alone (the other customers'
    # use 1 % of it, below others_above's 5 %: a cap there would protect nobody).
    plans = json.loads(admin(config, "enforce", "--plan", "--format", "json").stdout)["plans"]
    initech = {p["host"]: p for p in plans if p["customer"] == "initech"}
    assert set(initech) == {"cmp-01", "cmp-02"}
    busy, idle = initech["cmp-01"], initech["cmp-02"]
    assert busy["level"] >= 2 and busy["cpu_weight"] == idle["cpu_weight"] < 100
    alone = "not applied: cpu 100 % ≥ 80 %, but the other customers used "
    assert busy["cpu_quota_cores"] is None and busy["caps"].startswith(alone)
    assert busy["caps"].endswith("< 5 %: nobody to protect")
    assert idle["cpu_quota_cores"] is None and idle["caps"].startswith("not applied: cpu ")
    assert f"  not capped on cmp-01 ({alone}" in out
    assert "; cmp-02 (not applied: cpu " in out
    summary = admin(config, "explain", "initech", "--summary").stdout.splitlines()
    assert len(summary) == 5 and summary[0].startswith("Customer initech is at throttle level")
    assert (
        "of its vCPUs not on cmp-01 (cpu 100 % ≥ 80 %, but the other customers used "
        in (summary[2])
    )

    # The customer explained is the one with the greatest balance.
    standings = json.loads(admin(config, "standings", "--format", "json").stdout)["customers"]
    assert {r["customer"] for r in standings} >= {"acme", "initech", "umbrella"}
    top = max(standings, key=lambda r: r["balance"])
    assert f" explain {top['customer']}\nCustomer {top['customer']} is " in out

    # Every host delivered every interval, and the ledger's CPU use per host is the traces':
    # what they asked, but never more than the host's cores at any instant (cmp-01 is short of
    # cores for much of the second day; cmp-02 during umbrella's burst of the first night).
    hosts = json.loads(
        admin(
            config, "report", "--from", "2000-01-01", "--group-by", "host", "--format", "json"
        ).stdout
    )["rows"]
    assert sorted(h["host"] for h in hosts) == ["cmp-01", "cmp-02"]
    for row in hosts:
        agent = tomllib.loads((root / f"agent-{row['host']}.toml").read_text())["agent"]
        assert agent["replay_dir"] == str(TRACES)  # the packaged traces, by default
        paths = [TRACES / f"{n}.csv.gz" for n in agent["replay_vms"]]
        start = min(first_timestamp(p) for p in paths)
        end = start + intervals * INTERVAL_S
        asked = sum(trace_core_seconds(p, start, end) for p in paths)
        given = host_core_seconds(paths, agent["replay_host_cores"], start, end)
        assert asked > 0
        assert row["cpu_core_s"] == pytest.approx(given, rel=1e-9), row["host"]
        if row["host"] == "cmp-01":
            assert given < 0.9 * asked
        assert row["late_samples"] == 0

    # The balances in the standings are the GM sums, decayed: the report's end balance agrees.
    by_customer = json.loads(
        admin(config, "report", "--from", "2000-01-01", "--format", "json").stdout
    )["rows"]
    for r in by_customer:
        shown = next(s for s in standings if s["customer"] == r["customer"])
        assert r["balance"] == pytest.approx(shown["balance"], abs=1e-12)

    # A what-if with no override over the demo's whole ledger reproduces it: every customer's
    # throttled hours, highest level and final balance as recorded, no level change moved.
    whatif = json.loads(admin(config, "whatif", "--from", "2000-01-01", "-f", "json").stdout)
    assert whatif["indicators"]["throttle_hours"] > 0
    for row in whatif["customers"]:
        assert row["throttle_hours"] == row["recorded_throttle_hours"], row
        assert row["max_level"] == row["recorded_max_level"], row
        assert row["balance"] == pytest.approx(row["recorded_balance"], abs=1e-9), row
        assert (row["added"], row["removed"], row["earlier"], row["later"]) == ("", "", "", "")


def test_the_demo_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(
        app, ["demo", "--dir", str(tmp_path), "--traces", str(TRACES)], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert "not empty and not a demo directory" in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_the_demo_says_where_the_traces_are_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["demo", "--dir", str(tmp_path / "d"), "--traces", str(tmp_path / "nowhere")]
    )
    assert result.exit_code == 1
    assert "no Bitbrains traces in" in result.stderr and "--traces" in result.stderr
    bad = CliRunner().invoke(
        app, ["demo", "--dir", str(tmp_path / "d"), "--traces", str(TRACES), "--vms", "1-x"]
    )
    assert bad.exit_code == 1 and "--vms '1-x'" in bad.stderr


def test_the_demo_refuses_more_days_than_its_traces_cover(tmp_path: Path) -> None:
    """The shipped traces hold three days (and an hour): a longer demo would stop short at
    their end, so it is refused before anything starts, saying what to give instead."""
    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path / "d"), "--days", "4"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"gmd-admin: error: demo: --days 4: the traces in {TRACES}" in result.stderr
    assert "cover 3.04 days: give --days 3.03 or fewer, or --traces DIR" in result.stderr
    assert not (tmp_path / "d").exists()


def test_a_bad_trace_stops_the_demo_naming_the_agent_file_and_line(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "1.csv.gz").write_bytes((TRACES / "1.csv.gz").read_bytes())
    lines = gzip.decompress((TRACES / "2.csv.gz").read_bytes()).decode().splitlines()
    fields = lines[4].split(";")
    fields[4] = "\tNaN%"
    lines[4] = ";".join(fields)
    (traces / "2.csv").write_text("\n".join(lines) + "\n")
    run = subprocess.run(
        [
            *(str(BIN / "gmd-admin"), "demo", "--dir", str(tmp_path / "demo")),
            *("--traces", str(traces), "--vms", "1-2", "--hosts", "2", "--days", "0.1"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1
    assert "gmd-agent for cmp-02 failed (exit 1)" in run.stderr
    assert "2.csv:5: CPU usage [%] is not a number: 'NaN%'" in run.stderr
    assert not list((tmp_path / "demo").glob("*.png"))
