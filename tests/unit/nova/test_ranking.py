"""The weigher's arithmetic (gmd.nova.ranking) on hand-computed cases: the paper's worked
example, the deviation over the whole cluster, a capped project's expected CPU, hosts gmd has
not measured, and answers that are not what the route promises."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gmd.fairness.placement import Strategy
from gmd.nova.ranking import (
    MIB,
    UNRANKED,
    BadAnswer,
    Candidate,
    Project,
    Request,
    rank,
    read_cluster,
    read_project,
)

GIB = 1 << 30


def host(cores: float, memory: float, cpu: float, mem: float) -> dict[str, Any]:
    return {
        "capacity": {"cpu_cores": cores, "memory_bytes": memory},
        "utilization": {"cpu": cpu, "memory": mem},
    }


def answer(hosts: dict[str, Any], project: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"resources": ["cpu", "memory"], "intervals": [60], "hosts": hosts}
    if project is not None:
        doc["project"] = project
    return doc


def test_the_papers_worked_example_ranks_the_larger_node_best() -> None:
    """Two idle nodes of 1 CPU/1 GB and 2 CPU/1 GB, a 0.5 CPU/0.2 GB request: on the second
    every criterion is smaller (mean 0.225 < 0.35, gap 0.05 < 0.3, deviation 0.125 < 0.25),
    so TOPSIS puts it at the ideal (1) and the first at the anti-ideal (0)."""
    cluster = read_cluster(answer({"n1": host(1, GIB, 0, 0), "n2": host(2, GIB, 0, 0)}))
    ranked = rank(
        cluster,
        [Candidate("n1"), Candidate("n2")],
        Request(vcpus=0.5, memory_mb=0.2 * 1024),
        Project("p"),
        Strategy.falb3,
    )
    assert ranked.criteria is not None
    assert ranked.criteria.mean_utilization == pytest.approx([0.35, 0.225])
    assert ranked.criteria.utilization_gap == pytest.approx([0.3, 0.05])
    assert ranked.criteria.deviation == pytest.approx([0.25, 0.125])
    assert ranked.weights == pytest.approx([0.0, 1.0])
    assert ranked.measured == [True, True]


def test_the_deviation_is_over_the_whole_cluster_not_only_the_candidates() -> None:
    """C is no candidate (Nova filtered it out) but is part of the cluster: each candidate's
    deviation counts it."""
    cluster = read_cluster(
        answer({"a": host(1, GIB, 0.2, 0), "b": host(1, GIB, 0.6, 0), "c": host(1, GIB, 1.0, 0)})
    )
    ranked = rank(
        cluster, [Candidate("a"), Candidate("b")], Request(0.2, 0), Project("p"), Strategy.falb3
    )
    assert ranked.criteria is not None
    on_a, on_b = np.std([0.4, 0.6, 1.0]), np.std([0.2, 0.8, 1.0])
    assert ranked.criteria.deviation == pytest.approx([on_a, on_b])
    # a is better on every criterion: mean 0.2 < 0.4, gap 0.4 < 0.8, deviation
    assert ranked.weights == pytest.approx([1.0, 0.0])


def test_a_capped_projects_expected_cpu_is_its_cap_of_the_flavor() -> None:
    flavor = Request(vcpus=4, memory_mb=2048)
    assert flavor.expected(Project("p")).tolist() == [4.0, 2048 * MIB]
    capped = Project("p", level=2, cpu_cap_fraction=0.25)
    assert flavor.expected(capped).tolist() == [1.0, 2048 * MIB]
    doc = answer({}, {"id": "p", "level": 2, "cpu_cap_fraction": 0.25})
    assert read_project(doc, "p") == capped


def test_a_host_gmd_has_not_measured_is_ranked_from_novas_allocations() -> None:
    """A new empty compute host next to two busy measured ones: Nova's allocations say it is
    empty, and it ranks best; one matched by its node name is measured; one of no known size
    is not ranked."""
    cluster = read_cluster(
        answer({"busy-1": host(4, 8 * GIB, 0.9, 0.8), "node-2": host(4, 8 * GIB, 0.5, 0.5)})
    )
    candidates = [
        Candidate("busy-1"),
        Candidate("cmp-2", nodename="node-2"),
        Candidate("new", vcpus_total=4, vcpus_used=0, memory_mb_total=8192, memory_mb_free=8192),
        Candidate("ironic", vcpus_total=0, memory_mb_total=0),
    ]
    ranked = rank(cluster, candidates, Request(1, 1024), Project("p"))
    assert ranked.measured == [True, True, False, False]
    assert ranked.ranked == [0, 1, 2]
    assert ranked.weights[3] == UNRANKED
    assert ranked.weights[2] == max(ranked.weights) == 1.0
    assert ranked.weights[0] == 0.0
    assert ranked.criteria is not None
    # the new host's row: 1 of 4 cores, 1 of 8 GiB with the request placed
    assert ranked.criteria.utilization[2].tolist() == pytest.approx([0.25, 0.125])


def test_balanced_scores_one_minus_the_std_of_a_hosts_fractions() -> None:
    cluster = read_cluster(answer({"a": host(2, 4 * GIB, 0.5, 0.25), "b": host(2, 4 * GIB, 0, 0)}))
    ranked = rank(
        cluster, [Candidate("a"), Candidate("b")], Request(1, 1024), Project("p"), Strategy.balanced
    )
    # a: (0.5 + 0.5, 0.25 + 0.25) → std 0.25; b: (0.5, 0.25) → std 0.125
    assert ranked.weights == pytest.approx([0.75, 0.875])
    assert ranked.topsis is None


@pytest.mark.parametrize(
    "document",
    [None, [], "hosts", {"hosts": []}, {"hosts": {}, "intervals": "60"}, {"intervals": []}],
)
def test_an_answer_that_is_not_the_document_is_refused(document: object) -> None:
    with pytest.raises(BadAnswer):
        read_cluster(document)


def test_implausible_hosts_are_left_out_and_named() -> None:
    good = host(2, GIB, 0.5, 0.5)
    doc = answer(
        {
            "good": good,
            "nan": host(2, GIB, math.nan, 0.5),
            "negative": host(2, GIB, -0.1, 0.5),
            "no-cores": host(0, GIB, 0.1, 0.5),
            "boolean": host(True, GIB, 0.1, 0.5),
            "text": host("2", GIB, 0.1, 0.5),
            "infinite": host(math.inf, GIB, 0.1, 0.5),
            "list": [2, 1],
            "no-utilization": {"capacity": good["capacity"]},
        }
    )
    cluster = read_cluster(doc)
    assert list(cluster.index) == ["good"]
    assert set(cluster.ignored) == set(doc["hosts"]) - {"good"}
    assert cluster.used.tolist() == [[1.0, 0.5 * GIB]]


@pytest.mark.parametrize(
    "entry",
    [
        None,
        "p",
        {"id": "other", "level": 3, "cpu_cap_fraction": 0.5},
        {"id": "p", "level": -1, "cpu_cap_fraction": 2.0},
        {"id": "p", "level": True, "cpu_cap_fraction": 0},
        {"id": "p", "level": "3", "cpu_cap_fraction": "0.5"},
    ],
)
def test_an_odd_project_entry_is_level_0_uncapped(entry: object) -> None:
    assert read_project({"project": entry}, "p") == Project("p")


def test_a_host_with_absurd_figures_is_left_out_and_the_rest_are_weighed() -> None:
    """Finite figures no host has (a capacity of 1e300 cores, a utilisation of 1e200) would
    overflow FALB's arithmetic and make the whole request weigh neutrally: such a host is left
    out, from gmd's answer as from Nova's view, and the others are ranked as without it."""
    sane = {"n1": host(1, GIB, 0, 0), "n2": host(2, GIB, 0, 0)}
    absurd = {
        **sane,
        "huge": host(1e300, GIB, 0.5, 0.5),
        "busy": host(2, GIB, 1e200, 0.5),
        "vast": host(2, 1e300, 0.1, 0.5),
    }
    request, project = Request(vcpus=0.5, memory_mb=0.2 * 1024), Project("p")
    cluster = read_cluster(answer(absurd))
    assert set(cluster.ignored) == {"huge", "busy", "vast"}
    candidates = [
        Candidate("n1"),
        Candidate("n2"),
        Candidate("huge"),
        Candidate("new", vcpus_total=1e300, memory_mb_total=1e300, memory_mb_free=1e300),
    ]
    ranked = rank(cluster, candidates, request, project, Strategy.falb3)
    alone = rank(read_cluster(answer(sane)), candidates[:2], request, project, Strategy.falb3)
    assert alone.weights == pytest.approx([0.0, 1.0])
    assert ranked.weights[:2] == pytest.approx(alone.weights)
    assert ranked.weights[2:] == [UNRANKED, UNRANKED]
