"""Ref: utilities divide the grand coalition's value; they equal Shapley values when they can."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from gmd.sim.coalitions import simulate_rand, simulate_ref
from gmd.sim.measures import unfairness, unit_parts, utilities
from gmd.sim.scheduler import Schedule
from gmd.sim.shapley import shapley_float
from gmd.sim.workload import Workload


def coalition_values(run, at: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    w = run.workload
    v = np.zeros(1 << w.n_orgs)
    for c, start in run.starts.items():
        v[c] = utilities(Schedule(w, "x", start, start), at).sum()
    return v


def test_symmetric_organizations_get_exactly_their_shapley_value() -> None:
    # A and B: one processor and two unit jobs at 0 each. Alone: ψ(10) = 10 + 9 = 19 each;
    # together the same, so by symmetry each Shapley value is 19, and Ref reaches it.
    w = Workload(np.zeros(4, dtype=np.int64), np.ones(4, dtype=np.int64), np.array([0, 1, 0, 1]),
                 (1, 1), horizon_s=10)  # fmt: skip
    run = simulate_ref(w)
    psi = utilities(run.grand)
    assert psi.tolist() == [19.0, 19.0]
    assert shapley_float(coalition_values(run, 10), 2).tolist() == [19.0, 19.0]


def test_hand_computed_instance() -> None:
    # A: 1 processor, one unit job at 0. B: 1 processor, three unit jobs at 0. T = 4.
    # v(A) = 4; v(B) = 4 + 3 + 2 = 9; v(AB) = 4 + 4 + 3 + 3 = 14 (two jobs at 0, two at 1).
    # φ_A = (4 + 14 − 9)/2 = 4.5, φ_B = (9 + 14 − 4)/2 = 9.5. A's one job can give 4 (at 0)
    # or 3 (at 1): Ref must start it at 0, the utilities (4, 10) closest to (4.5, 9.5).
    w = Workload(np.zeros(4, dtype=np.int64), np.ones(4, dtype=np.int64), np.array([0, 1, 1, 1]),
                 (1, 1), horizon_s=4)  # fmt: skip
    run = simulate_ref(w)
    v = coalition_values(run, 4)
    assert v[0b01] == 4 and v[0b10] == 9 and v[0b11] == 14
    assert shapley_float(v, 2).tolist() == [4.5, 9.5]
    assert utilities(run.grand).tolist() == [4.0, 10.0]
    assert run.grand.start.tolist() == [0, 0, 1, 1]


small = st.integers(2, 4).flatmap(
    lambda k: st.tuples(
        st.lists(st.integers(0, 3), min_size=k, max_size=k),
        st.lists(st.tuples(st.integers(0, 12), st.integers(1, 5), st.integers(0, k - 1)),
                 min_size=1, max_size=25),
    )
)  # fmt: skip


def workload_of(data: tuple[list[int], list[tuple[int, int, int]]], unit: bool = False) -> Workload:
    procs, jobs = data
    procs = [max(p, 1) for p in procs]
    jobs = sorted(jobs, key=lambda j: j[0])
    rel = np.array([j[0] for j in jobs], dtype=np.int64)
    dur = np.ones(len(jobs), dtype=np.int64) if unit else np.array([j[1] for j in jobs])
    return Workload(rel, dur, np.array([j[2] for j in jobs]), tuple(procs), horizon_s=15)


@settings(max_examples=40, deadline=None)
@given(small)
def test_ref_utilities_sum_to_the_grand_coalitions_value(data) -> None:  # type: ignore[no-untyped-def]
    w = workload_of(data)
    run = simulate_ref(w)
    grand = (1 << w.n_orgs) - 1
    for at in (w.horizon_s, 7, 30):
        v = coalition_values(run, at)
        assert utilities(run.grand, at).sum() == v[grand]
        assert abs(shapley_float(v, w.n_orgs).sum() - v[grand]) < 1e-6


def test_rand_converges_to_ref_on_unit_jobs() -> None:
    # Unit jobs: every greedy schedule gives a coalition the same value (SPAA Prop. 5.4), so
    # Rand's FCFS subcoalitions are exact and only its sampling error remains.
    rng = np.random.default_rng(7)
    few, many = [], []
    for _ in range(6):
        k = 3
        rel = np.sort(rng.integers(0, 30, 60))
        w = Workload(rel, np.ones(60, dtype=np.int64), rng.integers(0, k, 60), (1, 1, 1), 40)
        ref = simulate_ref(w).grand
        psi_ref, parts = utilities(ref), unit_parts(ref)
        for n, out in ((1, few), (400, many)):
            dist = [unfairness(utilities(simulate_rand(w, n, seed=s).grand), psi_ref, parts)
                    for s in range(3)]  # fmt: skip
            out.append(np.mean(dist))
    assert np.mean(many) < 0.5 * np.mean(few)
    assert np.mean(many) < 0.05
