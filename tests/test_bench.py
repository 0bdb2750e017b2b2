"""The benchmark scripts still run and end with their JSON line (figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_accounting_bench_prints_json_last() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "accounting.py"),
            "--vms",
            "500",
            "--hosts",
            "20",
            "--customers",
            "30",
            "--runs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["vms"] == 500 and figures["runs"] == 2
    assert figures["seconds_min"] <= figures["seconds_median"] <= figures["seconds_max"]
