"""When a sample is contended: a federation job waited, and the jobs, each started at release,
need more than the processors.

Without background load the two are the same, and then of every greedy policy: an uncontended
sample is one where every policy makes the same schedule and every measure ties.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmd.sim.command import ordering_tables
from gmd.sim.measures import overload_s
from gmd.sim.policies import REGISTRY
from gmd.sim.scheduler import simulate
from gmd.sim.workload import Workload


def jobs(procs: tuple[int, ...], *spec: tuple[int, int, int]) -> Workload:
    """(release, duration, organization) per job."""
    rel, dur, org = (np.array(col, dtype=np.int64) for col in zip(*spec, strict=True))
    return Workload(rel, dur, org, procs, horizon_s=100)


def test_overlap_within_the_processors_is_not_contended() -> None:
    w = jobs((1, 1), (0, 10, 0), (2, 10, 1), (10, 5, 0))  # the third starts as the first ends
    assert overload_s(w) == 0
    for factory in REGISTRY.values():
        assert np.array_equal(simulate(w, factory()).start, w.release)


def test_three_jobs_on_two_processors_are_contended_while_they_overlap() -> None:
    w = jobs((1, 1), (0, 5, 0), (2, 10, 1), (3, 4, 0))  # all three run in [3, 5)
    assert overload_s(w) == 2
    schedule = simulate(w, REGISTRY["FCFS"]())
    assert np.any(schedule.start > w.release)  # somebody waited


instances = st.integers(1, 3).flatmap(
    lambda k: st.tuples(
        st.lists(st.integers(1, 3), min_size=k, max_size=k),
        st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8), st.integers(0, k - 1)),
                 min_size=1, max_size=25),
    )
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(instances)
def test_uncontended_exactly_when_no_greedy_policy_makes_anyone_wait(
    data: tuple[list[int], list[tuple[int, int, int]]],
) -> None:
    procs, spec = data
    w = jobs(tuple(procs), *sorted(spec))
    for factory in REGISTRY.values():
        waited = bool(np.any(simulate(w, factory(), seed=3).start > w.release))
        assert waited == (overload_s(w) > 0), factory().name


def document(overloads: list[int], values: list[list[float]]) -> dict:
    """A run's JSON as ordering_tables reads it: Δψ/p per policy, samples of 1000 s."""
    # a job waits exactly when the jobs need more than the processors (no background load)
    samples = [
        {
            "overload_s": o,
            "outcomes": {n: {"unfairness": v, "wait_s": o} for n, v in (("P", p), ("Q", q))},
        }
        for o, (p, q) in zip(overloads, values, strict=True)
    ]
    return {
        "config": {"window_s": 1000, "reference": True, "cloudshare": False},
        "samples": samples,
    }


def test_only_contended_samples_are_resampled() -> None:
    # Quiet samples tie at 0; the contended ones all favour Q. The threshold is a share of the
    # window: 0 counts any overload, 0.1 only samples overloaded for more than 100 s.
    doc = document([0, 0, 50, 500, 900], [[0, 0], [0, 0], [3, 1], [4, 1], [5, 2]])
    (any_overload,) = ordering_tables([doc], 200, 0.0, seed=1)
    assert any_overload.document["contended"] == 3 and any_overload.document["samples"] == 5
    (row,) = any_overload.rows
    assert (row["fairer"], row["other"], row["resolved"]) == ("Q", "P", True)
    assert row["advantage"] == pytest.approx((2 + 3 + 3) / 3)
    (longer,) = ordering_tables([doc], 200, 0.1, seed=1)
    assert longer.document["contended"] == 2
    assert longer.rows[0]["advantage"] == pytest.approx(3.0)


def test_an_overload_of_local_jobs_alone_is_not_contention() -> None:
    # Background load: the second sample's local jobs overloaded the processors, but no federation
    # job waited, so the policies' schedules are the same there; it is left out.
    doc = document([100, 100, 100], [[3, 1], [0, 0], [4, 1]])
    for o in doc["samples"][1]["outcomes"].values():
        o["wait_s"] = 0
    (table,) = ordering_tables([doc], 200, 0.0, seed=1)
    assert table.document["contended"] == 2
    assert table.rows[0]["advantage"] == pytest.approx(2.5)


def test_fewer_than_two_contended_samples_resolve_nothing() -> None:
    (table,) = ordering_tables([document([0, 7, 0], [[0, 0], [1, 2], [0, 0]])], 200, 0.0, 1)
    assert table.rows == [] and "nothing to resolve" in table.caption


def test_pooled_runs_count_every_run() -> None:
    a = document([10, 10, 10], [[1, 2], [1, 3], [2, 2]])
    b = document([0, 10], [[0, 0], [5, 6]])
    (table,) = ordering_tables([a, b], 200, 0.0, seed=1)
    assert (table.document["contended"], table.document["samples"]) == (4, 5)
    assert "pooled over 2 runs" in table.caption
