"""bench/agent.py still runs and ends with its JSON line (figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import needs

BENCH = Path(__file__).resolve().parents[2] / "bench" / "agent.py"


def test_agent_bench_prints_json_last() -> None:
    needs.extra("libvirt")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--domains", "1,5", "--ticks", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert [s["domains"] for s in figures["sizes"]] == [1, 5]
    five = figures["sizes"][1]
    # Per-domain polling: list + (XML, info, memoryStats, one disk, one interface) per domain.
    assert five["per_domain_libvirt_calls"] == 1 + 5 * 5
    # gmd on the test driver: bulk call + (info, one disk, one interface) per domain; the XML
    # is cached and memoryStats is not asked again once it proved empty.
    assert five["gmd_libvirt_calls_test_driver"] == 1 + 5 * 3
