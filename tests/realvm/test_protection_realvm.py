"""Issue 43: gmd protects a moderate customer's work on a contended host, shown on real guests.

The direction, not a speed: in one run of bench/protection.py on the same guests, a moderate
project's jobs (work of a known size, timed by the guest itself) complete faster beside a greedy
project's spinning guests with gmd on than with gmd off, and gmd put back every setting it
changed (the bench's phases fail otherwise). How much faster is the bench's figure
(docs/benchmarks.md), not this test's: on a busy CI machine the ratios move, their order does
not. The same run is the bench's own test: it runs as `make bench` runs it, from its command
line, and prints its figures as JSON on its last line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.realvm

BENCH = Path(__file__).resolve().parents[2] / "bench" / "protection.py"
STRONG = ["--weight-factors", "0.1,0.1,0.1"]
"""The test's level table: the default's strongest weight from level 1 on. With the default's
x 0.5 at level 1 the bench measured the jobs at 1.6-1.9x against 2.3x with gmd off, too close to
tell apart on a busy machine, and which level a run reaches depends on the machine: CI once
compared level-1 jobs against gmd off and saw no difference (2.36x against 2.33x)."""
PHASES = ["baseline", "off", "on", "idle-off"]
RUN = [
    *("--phases", ",".join(PHASES), "--greedy-vms", "3", "--moderates", "1"),
    *("--baseline-s", "25", "--contended-s", "45", "--on-s", "30", "--idle-s", "10"),
    # gmd on waits for the state, not a time: five jobs started while the greedy project was held
    # (the first throttle came 14 s into the phase, a job beside the load takes ~4 s)
    *("--protected-jobs", "5", "--on-max-s", "400", *STRONG),
]


def test_moderate_jobs_run_faster_beside_a_greedy_project_with_gmd_on_than_off() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), *RUN],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stderr)  # one line a phase: its jobs, each project's cores, the greedy's levels
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "protection"
    assert list(figures["phases"]) == PHASES
    knobs = {k["knob"] for k in figures["host"]["capabilities"]["knobs"]}
    assert {"cpu_weight", "cpu_cap"} <= knobs
    assert figures["setup"]["enforcement"]["weight_factors"] == [0.1, 0.1, 0.1]
    assert figures["baseline_job_s"]["jobs"] > 0, "no job completed: see the guests' consoles"
    baseline, off, on = (figures["phases"][name] for name in PHASES[:3])
    assert baseline["ratio_median"] is not None
    assert figures["phases"]["idle-off"]["jobs"] == 0  # the moderates' guests were paused

    assert off["max_level"] == [0] and off["first_throttle_s"] == [None]  # gmd off: no change
    assert on["first_throttle_s"][0] is not None, f"gmd on never throttled the greedy: {on}"
    # The jobs that started while gmd held the greedy project throttled, against those beside
    # the same load with gmd off.
    assert on["protected_jobs"] > 0, f"no job completed while the greedy was throttled: {on}"
    assert on["protected_ratio_median"] < off["ratio_median"], (on, off)
    # the greedy project did take more than its share while gmd was off: a real contest
    shares = off["cpu_share_of_host"]
    assert shares["greedy"] > sum(c for p, c in shares.items() if p != "greedy"), shares
