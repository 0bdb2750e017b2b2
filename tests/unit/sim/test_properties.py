"""Every policy is greedy and FIFO per organization; the incremental utilities are exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmd.sim.coalitions import simulate_rand, simulate_ref
from gmd.sim.measures import fifo_violation, idle_while_waiting, utilities
from gmd.sim.policies import REGISTRY, parse_policy
from gmd.sim.scheduler import Schedule, simulate
from gmd.sim.utility import UTILITIES, UtilityBook
from gmd.sim.workload import Workload

instances = st.integers(1, 4).flatmap(
    lambda k: st.tuples(
        st.lists(st.integers(1, 3), min_size=k, max_size=k),
        st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9), st.integers(0, k - 1)),
                 min_size=1, max_size=40),
    )
)  # fmt: skip


def workload_of(data: tuple[list[int], list[tuple[int, int, int]]]) -> Workload:
    procs, jobs = data
    jobs = sorted(jobs, key=lambda j: j[0])
    return Workload(
        np.array([j[0] for j in jobs], dtype=np.int64),
        np.array([j[1] for j in jobs], dtype=np.int64),
        np.array([j[2] for j in jobs], dtype=np.int64),
        tuple(procs),
        horizon_s=30,
    )


def all_schedules(w: Workload) -> list[Schedule]:
    out = [simulate(w, factory(), seed=1) for factory in REGISTRY.values()]
    return [*out, simulate_ref(w).grand, simulate_rand(w, 3, seed=2).grand]


@settings(max_examples=40, deadline=None)
@given(instances)
def test_every_policy_is_greedy_fifo_and_complete(data) -> None:  # type: ignore[no-untyped-def]
    w = workload_of(data)
    for s in all_schedules(w):
        assert idle_while_waiting(s) is None, s.policy
        assert fifo_violation(s) is None, s.policy
        assert np.all(s.start >= w.release), s.policy
        # never more jobs running than processors: greedy must not overbook either
        ends = s.start + w.duration
        for t in np.unique(s.start):
            assert int(np.sum((s.start <= t) & (ends > t))) <= sum(w.processors), s.policy


def test_the_checkers_catch_violations() -> None:
    w = Workload(np.array([0, 0]), np.array([3, 3]), np.array([0, 0]), (2,), horizon_s=10)
    late = Schedule(w, "late", np.array([0, 3]), np.array([0, 0]))
    assert idle_while_waiting(late) == 0
    swapped = Schedule(w, "swapped", np.array([1, 0]), np.array([0, 0]))
    assert fifo_violation(swapped) == 1


@settings(max_examples=40, deadline=None)
@given(instances, st.sampled_from(UTILITIES), st.integers(0, 60))
def test_incremental_book_matches_direct_sum(data, kind: str, at: int) -> None:  # type: ignore[no-untyped-def]
    w = workload_of(data)
    s = simulate(w, parse_policy("FCFS").factory())  # type: ignore[misc]
    book = UtilityBook(w.n_orgs, kind)
    for j in np.argsort(s.start, kind="stable"):
        st_, e = int(s.start[j]), int(s.start[j] + w.duration[j])
        if st_ >= at:
            continue
        bonus = int(w.release[j]) if kind == "psi_prime" else 0
        book.start(int(w.org[j]), st_, bonus)
        if e <= at:
            book.finish(int(w.org[j]), st_, e, bonus)
    assert book.values(at) == utilities(s, at, kind).tolist()


def test_psi_of_one_job_by_hand() -> None:
    # a job run 2-5 released at 1: parts at 2, 3, 4; at T = 10 ψ = 8+7+6 = 21,
    # ψ′ = 21 + 3·1 = 24, ψ″ = 3; at T = 4 only parts 2, 3 are done: ψ = 2 + 1 = 3
    w = Workload(np.array([1]), np.array([3]), np.array([0]), (1,), horizon_s=10)
    s = Schedule(w, "x", np.array([2]), np.array([0]))
    assert utilities(s, 10, "psi").tolist() == [21.0]
    assert utilities(s, 10, "psi_prime").tolist() == [24.0]
    assert utilities(s, 10, "psi_double_prime").tolist() == [3.0]
    assert utilities(s, 4, "psi").tolist() == [3.0]


def test_policy_names() -> None:
    assert parse_policy("directcontr").name == "ORIG_DIRECT"
    assert parse_policy("Rand").samples == 15
    assert parse_policy("rand:75").name == "Rand:75"
    with pytest.raises(ValueError, match="'Lottery' is unknown"):
        parse_policy("Lottery")
