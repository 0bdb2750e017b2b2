"""``run_simulate`` and ``python -m gmd.sim`` end to end on a small cut of LPC-EGEE."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gmd.sim.__main__ import main
from gmd.sim.command import SimulateOptions, run_simulate
from tests.conftest import DATA

LPC = DATA / "pwa" / "LPC-EGEE-2004-1.2-cln.weeks-24-27.swf.gz"  # tests/data/pwa/README.md


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with gzip.open(LPC, "rt") as src:
        head = [next(src) for _ in range(3000)]
    path = tmp_path_factory.mktemp("swf") / "lpc-head.swf"
    path.write_text("".join(head))
    return path


def test_json_has_every_policy_and_sample(small_trace: Path) -> None:
    text = run_simulate(SimulateOptions(
        small_trace, 20000, 2, 3, ["Ref", "DirectContr", "FairShare", "Rand:4"], seed=5,
        workers=1, progress=False, total_processors=12, cloudshare=True,
    ), "json")  # fmt: skip
    doc = json.loads(text)
    assert [r["policy"] for r in doc["policies"]] == ["Ref", "ORIG_DIRECT", "FairShare", "Rand:4"]
    assert len(doc["samples"]) == 2
    ref = doc["policies"][0]
    assert ref["unfairness_mean"] == 0.0  # Ref against itself
    # Rand is not scored by CloudShare's method (its subcoalitions are not its own schedules)
    assert doc["samples"][0]["outcomes"]["Rand:4"]["cloudshare_unfairness"] is None
    for s in doc["samples"]:
        assert sum(s["scores"].values()) <= 3 * 2  # at most one point per ordered pair


def test_same_seed_same_result_whatever_the_workers(small_trace: Path) -> None:
    args = (small_trace, 20000, 2, 3, ["ORIG_DIRECT", "RoundRobin"], 9, "equal")
    assert run_simulate(SimulateOptions(*args, workers=1, progress=False), "csv") == run_simulate(
        SimulateOptions(*args, workers=2, progress=False), "csv"
    )


def test_table_and_module_entry_point(small_trace: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["--trace", str(small_trace), "--window", "20000", "--samples", "1",
                 "--orgs", "2", "--policy", "SIMPL_DIRECT", "--total-processors", "4",
                 "--workers", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "SIMPL_DIRECT" in out and "Δψ/p" in out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fmt": "xml"}, "--format 'xml'"),
        ({"processors": "pareto"}, "--processors 'pareto'"),
        ({"policies": ["Lottery"]}, "policy 'Lottery' is unknown"),
        ({"samples": 0}, "--samples 0"),
        ({"window_s": 10**9}, "longer than"),
    ],
)
def test_bad_input_is_named(small_trace: Path, kwargs: dict, message: str) -> None:
    args = {"trace": small_trace, "window_s": 20000, "samples": 1, "organizations": 2,
            "policies": ["FairShare"], "workers": 1, "progress": False} | kwargs  # fmt: skip
    fmt = args.pop("fmt", "table")
    with pytest.raises(ValueError, match=message):
        run_simulate(SimulateOptions(**args), fmt)


def test_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--trace", str(tmp_path / "none.swf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_without_reference_there_is_no_unfairness(small_trace: Path) -> None:
    text = run_simulate(SimulateOptions(
        small_trace, 20000, 1, 2, ["FairShare"], workers=1, progress=False,
        total_processors=4, reference=False,
    ), "json")  # fmt: skip
    assert json.loads(text)["policies"][0]["unfairness_mean"] is None


def test_gmd_admin_simulate(small_trace: Path) -> None:
    """The admin CLI's wiring: options reach the simulator, bad input exits 2 with its reason."""
    admin = Path(sys.executable).with_name("gmd-admin")
    common = ["simulate", "--trace", str(small_trace), "--window", "20000", "--samples", "1",
              "--orgs", "2", "--total-processors", "4", "--workers", "1"]  # fmt: skip
    args = [*common, "--policy", "FairShare", "--policy", "RoundRobin", "--no-ref"]
    out = subprocess.run(
        [str(admin), *args, "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [r["policy"] for r in doc["policies"]] == ["FairShare", "RoundRobin"]
    assert doc["config"]["total_processors"] == 4 and doc["config"]["reference"] is False
    bad = subprocess.run(
        [str(admin), *common, "--policy", "Lottery"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "policy 'Lottery' is unknown" in bad.stderr


def test_gmd_admin_simulate_placement() -> None:
    """FALB's experiment through the admin CLI: every strategy, the figures falb_experiment
    gives for the same seeds, and a bad scenario refused in one line with exit 2."""
    from gmd.sim.placement import (
        FALB_POLICIES,
        Arrival,
        FalbInputs,
        FalbScenario,
        Tie,
        falb_experiment,
    )

    admin = Path(sys.executable).with_name("gmd-admin")
    args = ["simulate-placement", "--scenario", "stream", "--seeds", "2", "--jitter", "0.05",
            "--arrival", "sequential", "--tie", "random"]  # fmt: skip
    out = subprocess.run(
        [str(admin), *args, "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["config"] == {"scenario": "stream", "seeds": 2, "jitter": 0.05,
                             "arrival": "sequential", "gap_s": 1.0, "tie": "random"}  # fmt: skip
    assert [r["policy"] for r in doc["policies"]] == [p.name for p in FALB_POLICIES]
    inputs = FalbInputs(FalbScenario.stream, 0.05, Arrival.sequential, 1.0, Tie.random)
    expected = falb_experiment(inputs, seeds=2)
    assert [r["makespan_s"] for r in doc["policies"]] == [e.makespan_s.mean for e in expected]
    assert [r["rrdf_spread_ci95"] for r in doc["policies"]] == [
        e.rrdf_spread.half_width for e in expected
    ]
    bad = subprocess.run(
        [str(admin), "simulate-placement", "--scenario", "burst"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "burst" in bad.stderr and "Traceback" not in bad.stderr
