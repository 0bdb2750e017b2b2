"""The FALB placement simulator (gmd.sim.placement) on instances small enough to check by hand,
and FALB's experiment on the paper's nodes and tenants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gmd.fairness.placement import Strategy
from gmd.sim.placement import (
    FALB_APPS_PER_TENANT,
    FALB_POLICIES,
    FALB_TENANTS,
    App,
    Arrival,
    FalbInputs,
    FalbPolicy,
    FalbScenario,
    Order,
    Tie,
    falb_apps,
    falb_experiment,
    simulate_placement,
)

FIFO_MEAN = FalbPolicy("mean", Order.fifo, Strategy.mean_utilization)
RRDF_FALB3 = FalbPolicy("falb3", Order.rrdf, Strategy.falb3)


def test_two_nodes_by_hand() -> None:
    """Node 0: 4 cores, 4 GB; node 1: 2 cores, 8 GB. App 0 (2 cores, 1 GB) leaves node 0 at
    mean utilisation (0.5 + 0.25)/2 = 0.375 and node 1 at (1 + 0.125)/2 = 0.5625: node 0.
    App 1 (1 core, 4 GB) then leaves node 0 at (0.75 + 1.25)/2 — it does not fit (5 GB > 4) —
    so node 1. App 2 (4 cores) fits only an empty node 0: it waits for app 0 (10 s)."""
    capacity = [[4.0, 4.0], [2.0, 8.0]]
    apps = [
        App(0, (2.0, 1.0), 10.0, 0.0),
        App(1, (1.0, 4.0), 30.0, 0.0),
        App(0, (4.0, 1.0), 5.0, 0.0),
    ]
    run = simulate_placement(capacity, apps, 2, FIFO_MEAN)
    assert run.nodes == [0, 1, 0]
    assert run.starts == [0.0, 0.0, 10.0]
    assert run.makespan_s == 30.0  # app 1 ends last; app 2 ends at 15
    # the gap of each placement on its node: |2/4 − 1/4|, |1/2 − 4/8|, |4/4 − 1/4|
    assert run.gaps == pytest.approx([0.25, 0.0, 0.75])


def test_a_blocked_head_holds_the_queue_behind_it() -> None:
    """FIFO: app 1 needs the whole node, app 2 would fit beside app 0 but waits its turn."""
    capacity = [[4.0, 4.0]]
    apps = [
        App(0, (2.0, 2.0), 10.0, 0.0),
        App(0, (4.0, 4.0), 10.0, 1.0),
        App(1, (1.0, 1.0), 10.0, 2.0),
    ]
    run = simulate_placement(capacity, apps, 2, FIFO_MEAN)
    assert run.starts == [0.0, 10.0, 20.0]
    assert run.makespan_s == 30.0


def test_rrdf_order_serves_the_tenant_that_has_had_least() -> None:
    """Tenant 0 submitted first and twice; with RRDF order, once its first application runs
    (RRDF 2·2·10 = 40), tenant 1's (RRDF 0) goes before tenant 0's second."""
    capacity = [[2.0, 2.0]]
    apps = [
        App(0, (2.0, 2.0), 10.0, 0.0),
        App(0, (2.0, 2.0), 10.0, 0.0),
        App(1, (2.0, 2.0), 10.0, 0.0),
    ]
    fifo = simulate_placement(capacity, apps, 2, FIFO_MEAN)
    fair = simulate_placement(capacity, apps, 2, RRDF_FALB3)
    assert fifo.starts == [0.0, 10.0, 20.0]
    assert fair.starts == [0.0, 20.0, 10.0]
    # after the second placement both tenants have 40: spread 0
    assert fair.rrdf_spread[1:] == [0.0, 1.0]


def test_an_application_no_node_can_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="application 0 fits no node"):
        simulate_placement([[2.0, 2.0]], [App(0, (3.0, 1.0), 1.0, 0.0)], 1, FIFO_MEAN)


def test_the_papers_workload() -> None:
    rng = np.random.default_rng(0)
    batch = falb_apps(FalbScenario.batch, rng)
    assert len(batch) == len(FALB_TENANTS) * FALB_APPS_PER_TENANT == 200
    assert {a.submit_s for a in batch} == {0.0}
    assert {(a.demand, a.run_s) for a in batch if a.tenant == 0} == {((2, 8), 50)}
    stream = falb_apps(FalbScenario.stream, np.random.default_rng(0), gap_s=2.0)
    assert [a.submit_s for a in stream] == [2.0 * i for i in range(200)]
    assert sorted(a.tenant for a in stream) == sorted(a.tenant for a in batch)
    # every tenant's applications charge the same RRDF: 2·8·50 = 1·4·200 = 8·2·50 = 4·1·200
    assert {math.prod(a.demand) * a.run_s for a in batch} == {800.0}


def test_falb_experiment_reports_each_policy_with_an_interval() -> None:
    results = falb_experiment(FalbInputs(FalbScenario.batch), seeds=4)
    by = {r.policy: r for r in results}
    assert set(by) == {"YuniKorn", "FA-YK", "FALB-2", "FALB-3", "k8s-balanced"}
    for r in results:
        assert r.makespan_s.mean > 0 and r.makespan_s.half_width >= 0
        # no schedule can beat the work over the cluster's cores: 200 apps' core-seconds / 136
        work = FALB_APPS_PER_TENANT * sum(c * t for _n, c, _m, t in FALB_TENANTS)
        assert r.makespan_s.mean >= work / 136
    # Fig. 2's claim is judged by the protocol (docs/reproduction.md), over its 40 seeds and
    # the paper's own inputs, not here on four seeds.


def test_the_stream_arrives_interleaved_or_tenant_after_tenant() -> None:
    def tenants(arrival: Arrival) -> list[int]:
        apps = falb_apps(FalbScenario.stream, np.random.default_rng(0), arrival=arrival)
        return [a.tenant for a in sorted(apps, key=lambda a: a.submit_s)]

    assert tenants(Arrival.sequential) == sorted(tenants(Arrival.sequential))
    assert tenants(Arrival.interleaved) != sorted(tenants(Arrival.interleaved))
    assert sorted(tenants(Arrival.interleaved)) == tenants(Arrival.sequential)


def test_a_random_tie_break_picks_among_equal_nodes_only() -> None:
    """Two empty identical nodes and a third too small: a random tie goes to either of the
    two, never the third; ``lowest`` always to the first."""
    capacity = [(4, 4), (4, 4), (1, 1)]
    apps = [App(0, (2, 2), 10.0, 0.0)]
    policy = FALB_POLICIES[0]
    chosen = {
        simulate_placement(
            capacity, apps, 1, policy, tie=Tie.random, rng=np.random.default_rng(s)
        ).nodes[0]
        for s in range(40)
    }
    assert chosen == {0, 1}
    assert simulate_placement(capacity, apps, 1, policy).nodes[0] == 0
    with pytest.raises(ValueError, match="random generator"):
        simulate_placement(capacity, apps, 1, policy, tie=Tie.random)
