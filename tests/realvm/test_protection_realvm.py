"""Issue 43: gmd protects a moderate customer's work on a contended host, shown on real guests.

The direction, not a speed: in one run on the same guests, a moderate project's jobs (work of a
known size, timed by the guest itself) complete faster beside a greedy project's spinning
guests with gmd on than with gmd off, and gmd put back every setting it changed. How much
faster is bench/protection.py's figure (docs/benchmarks.md), not this test's: on a busy CI
machine the ratios move, their order does not.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

pytestmark = pytest.mark.realvm

STRONG = {"weight_factors": [0.1, 0.1, 0.1]}
"""The test's level table: the default's strongest weight from level 1 on. With the default's
x 0.5 at level 1 the bench measured the jobs at 1.6-1.9x against 2.3x with gmd off, too close to
tell apart on a busy machine, and which level a run reaches depends on the machine: CI once
compared level-1 jobs against gmd off and saw no difference (2.36x against 2.33x)."""


def test_moderate_jobs_run_faster_beside_a_greedy_project_with_gmd_on_than_off(
    tmp_path: Path,
) -> None:
    from gmd.wire import PlanMode
    from tests.support.protection import Console, Phase, booted, run_phase
    from tests.support.realvm import RealVMError

    try:
        with booted(tmp_path, greedy_vms=3, moderates=1) as host:
            console = Console(host.moderate)
            baseline = run_phase(tmp_path, host, Phase("baseline", 25, greedy=False), console)
            gmd_off = Phase("off", 60, greedy=True, mode=PlanMode.off)
            off = run_phase(tmp_path, host, gmd_off, console)
            gmd_on = Phase("on", 100, greedy=True, protected_jobs=5, max_seconds=400)
            on = run_phase(tmp_path, host, gmd_on, console, overrides=STRONG)
    except RealVMError as e:
        pytest.fail(f"real VMs: {e}", pytrace=False)

    assert baseline.jobs and off.jobs, "no job completed: see the guests' consoles"
    base = statistics.median(j.seconds for j in baseline.jobs)
    assert off.max_level == 0 and off.first_throttle_s is None  # gmd off changes nothing
    assert on.first_throttle_s is not None, f"gmd on never throttled the greedy: {on.levels}"
    # The jobs that started while gmd held the greedy project throttled, against those beside
    # the same load with gmd off.
    protected = on.ratios(base, at_level=1)
    unprotected = off.ratios(base)
    print(
        f"baseline job {base:.2f} s; off: {sorted(round(x, 2) for x in unprotected)}; "
        f"on, throttled from {on.first_throttle_s:.0f} s: {sorted(round(x, 2) for x in protected)}"
    )
    assert protected, f"no job completed while the greedy was throttled ({on.levels})"
    assert statistics.median(protected) < statistics.median(unprotected)
    # the greedy project did take more than its share while gmd was off: a real contest
    assert off.cores["greedy"] > sum(c for p, c in off.cores.items() if p != "greedy")


def test_the_protection_bench_runs_its_phases_and_prints_json_last() -> None:
    """bench/protection.py end to end on short phases (its figures are not asserted: the test
    above holds the direction): every phase named is in the JSON line, with its jobs counted."""
    import json
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench" / "protection.py"
    short = ["--greedy-vms", "2", "--moderates", "1", "--baseline-s", "15", "--contended-s", "15"]
    out = subprocess.run(
        [sys.executable, str(bench), "--phases", "baseline,off,on,idle-on", *short, "--on-s", "25"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "protection"
    assert list(figures["phases"]) == ["baseline", "off", "on", "idle-on"]
    assert figures["baseline_job_s"]["jobs"] > 0
    assert figures["phases"]["baseline"]["ratio_median"] is not None
    assert figures["phases"]["idle-on"]["jobs"] == 0  # the moderates' guests were paused
    assert figures["phases"]["off"]["max_level"] == [0]
    knobs = {k["knob"] for k in figures["host"]["capabilities"]["knobs"]}
    assert {"cpu_weight", "cpu_cap"} <= knobs
