"""CloudShare's Scenario 3: local users' background load on their own organization's processors.

Local jobs run only on their organization's processors, ahead of the federation's, never
preempting a federation job; no policy and no measure sees them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from gmd.admin.cli import app
from gmd.sim.__main__ import main
from gmd.sim.coalitions import simulate_ref
from gmd.sim.command import SimulateOptions, run_simulate
from gmd.sim.experiment import ExperimentConfig, sample_workloads
from gmd.sim.policies import REGISTRY
from gmd.sim.scheduler import Schedule, simulate
from gmd.sim.swf import read_swf
from gmd.sim.workload import Background, Workload, build_workload, local_users
from tests.conftest import DATA

LPC = DATA / "pwa" / "LPC-EGEE-2004-1.2-cln.weeks-24-27.swf.gz"  # tests/data/pwa/README.md


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def fcfs(w: Workload) -> Schedule:
    return simulate(w, REGISTRY["FCFS"]())


def test_background_makes_a_job_wait_that_would_not_without_it() -> None:
    # Organization 0 has the only processor; its local job holds it over [0, 4).
    jobs = (ints(1), ints(3), ints(0))
    alone = Workload(*jobs, (1,), horizon_s=10)
    loaded = Workload(*jobs, (1,), horizon_s=10, background=Background(ints(0), ints(4), ints(0)))
    assert fcfs(alone).start.tolist() == [1]
    schedule = fcfs(loaded)
    assert schedule.start.tolist() == [4]
    assert schedule.background_start is not None and schedule.background_start.tolist() == [0]


def test_local_jobs_go_first_but_never_preempt() -> None:
    # One processor, owned by organization 0; organization 1 contributes none. The federation's
    # job A (released 0, 10 s) holds it when the local job arrives at 2: the local job waits for
    # A, then takes the processor at 10 before the federation's B (released 5), which waits for it.
    w = Workload(
        ints(0, 5), ints(10, 3), ints(1, 1), (1, 0), horizon_s=50,
        background=Background(ints(2), ints(6), ints(0)),
    )  # fmt: skip
    s = fcfs(w)
    assert s.background_start is not None
    assert s.start.tolist() == [0, 16] and s.background_start.tolist() == [10]


def test_a_local_job_runs_only_on_its_own_organizations_processors() -> None:
    # Organization 1's processor is free, but the local job is organization 0's: it waits.
    # (The federation's second job, at 8, keeps the replay going: it ends with the last start.)
    w = Workload(
        ints(0, 8), ints(5, 1), ints(0, 1), (1, 1), horizon_s=20,
        background=Background(ints(1), ints(2), ints(0)),
    )  # fmt: skip
    s = fcfs(w)
    assert s.background_start is not None
    assert s.owner.tolist() == [0, 1] and s.background_start.tolist() == [5]


instances = st.integers(1, 3).flatmap(
    lambda k: st.tuples(
        st.lists(st.integers(1, 2), min_size=k, max_size=k),
        st.lists(st.tuples(st.integers(0, 25), st.integers(1, 7), st.integers(0, k - 1)),
                 min_size=1, max_size=20),
        st.lists(st.tuples(st.integers(0, 25), st.integers(1, 9), st.integers(0, k - 1)),
                 max_size=10),
    )
)  # fmt: skip


Instance = tuple[list[int], list[tuple[int, int, int]], list[tuple[int, int, int]]]


def columns(jobs: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(release, duration, organization) arrays of jobs, in release order."""
    ordered = sorted(jobs)
    rel, dur, org = (np.array([j[c] for j in ordered], dtype=np.int64) for c in range(3))
    return rel, dur, org


def running(starts: np.ndarray, durations: np.ndarray, t: int) -> np.ndarray:
    return (starts >= 0) & (starts <= t) & (t < starts + durations)


@settings(max_examples=25, deadline=None)
@given(instances)
def test_every_organizations_processors_hold_at_most_their_number(data: Instance) -> None:
    procs, fed, local = data
    bg = Background(*columns(local))
    w = Workload(*columns(fed), tuple(procs), horizon_s=30, background=bg)
    for factory in REGISTRY.values():
        s = simulate(w, factory(), seed=4)
        assert s.background_start is not None
        assert np.all(s.start >= w.release)
        started = s.background_start >= 0
        assert np.all(s.background_start[started] >= bg.release[started])
        ends = [s.start, s.end, s.background_start, s.background_start + bg.duration]
        for t in np.unique(np.concatenate([w.release, bg.release, *ends])):  # occupancy changes
            fed_on = running(s.start, w.duration, t)
            bg_on = running(s.background_start, bg.duration, t)
            for o, p in enumerate(procs):
                used = int((fed_on & (s.owner == o)).sum() + (bg_on & (bg.org == o)).sum())
                assert used <= p, (factory().name, int(t), o)
                # local jobs are served first: none waits while its organization has a free one
                waits = (bg.org == o) & (bg.release <= t) & ((s.background_start > t) | ~started)
                before_end = t < s.start.max()
                assert not (waits.any() and used < p and before_end), (factory().name, int(t), o)


def test_coalitions_keep_their_members_background_only() -> None:
    w = Workload(
        ints(0, 0), ints(2, 2), ints(0, 1), (1, 1), horizon_s=10,
        background=Background(ints(0, 1), ints(3, 3), ints(1, 0)),
    )  # fmt: skip
    only_0 = w.restricted(0b01)
    assert only_0.background is not None and only_0.background.org.tolist() == [0]
    assert only_0.background.release.tolist() == [1]


def test_ref_refuses_background_load() -> None:
    local = Background(ints(0), ints(1), ints(0))
    w = Workload(ints(0), ints(1), ints(0), (1,), 5, background=local)
    with pytest.raises(ValueError, match="background"):
        simulate_ref(w)


def test_local_users_are_drawn_each_with_the_given_probability() -> None:
    users = range(20000)
    local = local_users(users, 0.3, seed=1)
    assert local <= set(users) and 0.28 < len(local) / len(users) < 0.32
    assert local == local_users(list(reversed(users)), 0.3, seed=1)  # whatever the order
    assert local != local_users(users, 0.3, seed=2)
    assert local_users(users, 0.0, seed=1) == set()
    with pytest.raises(ValueError, match="background"):
        local_users(users, 1.0, seed=1)


def test_local_jobs_leave_the_federation_and_are_not_cut() -> None:
    trace = read_swf(LPC)
    start = int(trace.submit_s[0])
    lo, hi = np.searchsorted(trace.submit_s, [start, start + 86400])
    users = np.unique(trace.user[lo:hi])
    mapping = {int(u): i % 2 for i, u in enumerate(users)}
    local = {int(users[0])}
    both = build_workload(trace, start, 86400, mapping, (10, 10), unit_s=3600, local=local)
    none = build_workload(trace, start, 86400, mapping, (10, 10), unit_s=3600)
    mine = trace.user[lo:hi] == users[0]
    assert both.background is not None
    assert both.background.n_jobs == int(trace.processors[lo:hi][mine].sum())
    assert sorted(both.background.duration.tolist()) == sorted(
        np.repeat(trace.run_s[lo:hi][mine], trace.processors[lo:hi][mine]).tolist()
    )
    assert set(both.background.org.tolist()) == {mapping[int(users[0])]}
    assert both.n_jobs < none.n_jobs and np.all(both.duration == 3600)


def test_scenario_3_on_the_lpc_egee_cut() -> None:
    """A small Scenario 3 run on the shipped LPC-EGEE weeks: the same windows as Scenario 1,
    fewer federation jobs, some local work in every sample, every pair of policies ordered."""
    policies = ("SIMPL_DIRECT", "FairShare", "RoundRobin")
    trace = read_swf(LPC)
    s1, s3 = (
        sample_workloads(
            ExperimentConfig(str(LPC), 86400, 3, 3, policies, seed=4, total_processors=30,
                             unit_s=3600, cloudshare=True, reference=False, background=share),
            trace,
        )
        for share in (0.0, 0.5)
    )  # fmt: skip
    for a, b in zip(s1, s3, strict=True):
        assert a.origin_s == b.origin_s and b.background is not None
        assert b.n_jobs < a.n_jobs
    text = run_simulate(
        SimulateOptions(LPC, 86400, 3, 3, policies, 4, workers=1, progress=False,
                        total_processors=30, unit_s=3600, cloudshare=True, reference=False,
                        background=0.5, bootstrap=300),
        "json",
    )  # fmt: skip
    doc = json.loads(text)
    shares = [sample["background_work"] for sample in doc["samples"]]
    assert all(0.0 <= x <= 1.0 for x in shares) and 0.0 < sum(shares) < len(shares)
    for sample in doc["samples"]:
        assert sum(sample["scores"].values()) <= len(policies) * (len(policies) - 1) / 2
    (table,) = doc["orderings"]
    contended = table["contended"]
    waited = [max(o["wait_s"] for o in s["outcomes"].values()) > 0 for s in doc["samples"]]
    overloaded = [s["overload_s"] > 0 for s in doc["samples"]]
    assert contended == sum(w and o for w, o in zip(waited, overloaded, strict=True))
    assert len(table["orderings"]) == (3 if contended >= 2 else 0)


def test_background_with_ref_is_one_line_error(capsys: pytest.CaptureFixture) -> None:
    code = main(["--trace", str(LPC), "--samples", "1", "--background", "0.5",
                 "--policy", "FairShare"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--no-ref" in err
    assert main(["--trace", str(LPC), "--background", "1.5", "--no-ref"]) == 2
    assert "[0, 1)" in capsys.readouterr().err


def test_pool_reads_runs_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = []
    for seed in (1, 2):
        text = run_simulate(
            SimulateOptions(LPC, 20000, 2, 3, ("ORIG_DIRECT", "RoundRobin"), seed, workers=1,
                            progress=False, total_processors=30),
            "json",
        )  # fmt: skip
        paths.append(tmp_path / f"run{seed}.json")
        paths[-1].write_text(text)
    args = ["--bootstrap", "200", "--format", "json"]
    pools = [arg for p in paths for arg in ("--pool", str(p))]
    assert main([*pools, *args]) == 0
    (table,) = json.loads(capsys.readouterr().out)["orderings"]
    assert table["measure"] == "Δψ/p" and table["samples"] == 4
    assert main(["--pool", str(paths[0])]) == 2  # no --bootstrap
    assert "--bootstrap" in capsys.readouterr().err


def test_gmd_admin_simulate_shows_the_orderings_and_refuses_background_with_ref() -> None:
    base = ["simulate", "--trace", str(LPC), "--window", "20000", "--samples", "3", "--orgs",
            "3", "--total-processors", "12", "--policy", "ORIG_DIRECT", "--policy", "RoundRobin",
            "--workers", "1"]  # fmt: skip
    shown = CliRunner().invoke(app, [*base, "--bootstrap", "200", "-f", "json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    (table,) = doc["orderings"]
    assert table["measure"] == "Δψ/p" and table["resamples"] == 200
    refused = CliRunner().invoke(app, [*base, "--background", "0.5"])
    assert refused.exit_code != 0 and "--no-ref" in refused.stderr
