"""FALB's placement criteria and TOPSIS (gmd.fairness.placement, gmd.fairness.topsis): the
paper's worked example, hand-computed cases, and the vectorised deviation against a direct
computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gmd.fairness.placement import (
    Criterion,
    Strategy,
    balanced_allocation,
    falb_scores,
    fits,
    placement_criteria,
    rrdf_charge,
)
from gmd.fairness.topsis import topsis

# The paper's example: node 1 has 1 CPU and 1 GB, node 2 has 2 CPU and 1 GB, both idle; a request
# of 0.5 CPU and 0.2 GB.
IDLE = [[0.0, 0.0], [0.0, 0.0]]
NODES = [[1.0, 1.0], [2.0, 1.0]]
REQUEST = [0.5, 0.2]


def test_the_papers_worked_example() -> None:
    c = placement_criteria(IDLE, NODES, REQUEST)
    assert c.utilization.tolist() == [[0.5, 0.2], [0.25, 0.2]]
    # Eq. 3: the paper prints 30 % and 10 %; its formula (0.5/2 − 0.2/1) gives 5 % on node 2.
    assert c.utilization_gap == pytest.approx([0.30, 0.05])
    # Eq. 5: the mean of each node's utilisations with the request placed on it.
    assert c.mean_utilization == pytest.approx([0.35, 0.225])
    # Eq. 4: on node 1 the CPU utilisations are 0.5 and 0 (std 0.25) and the memory's 0.2 and 0
    # (std 0.1): the paper's "25 and 10"; the criterion is their largest. On node 2: 0.125, 0.1.
    assert c.deviation == pytest.approx([0.25, 0.125])
    # Node 2 is better on every criterion: the ideal itself (closeness 1), node 1 the anti-ideal.
    for strategy in (Strategy.mean_utilization, Strategy.falb2, Strategy.falb3):
        scores, ranked = falb_scores(IDLE, NODES, REQUEST, strategy)
        assert scores.tolist() == [0.0, 1.0]
        assert ranked is not None and ranked.best == 1
    # Kubernetes' balanced allocation: 1 − std(0.5, 0.2) = 0.85, 1 − std(0.25, 0.2) = 0.975.
    assert balanced_allocation(IDLE, NODES, REQUEST) == pytest.approx([0.85, 0.975])


def test_topsis_by_hand() -> None:
    """Columns [1, 2, 3] and [2, 1, 3] both have norm √14; with equal weights every weighted
    value is k·a, a = 1/(2√14): rows (a, 2a), (2a, a), (3a, 3a). The ideal is (a, a), the
    anti-ideal (3a, 3a): row 1 is a from the ideal and √5·a from the anti-ideal."""
    ranked = topsis([[1, 2], [2, 1], [3, 3]])
    a = 1 / (2 * math.sqrt(14))
    assert ranked.weighted == pytest.approx(np.array([[a, 2 * a], [2 * a, a], [3 * a, 3 * a]]))
    assert ranked.d_best == pytest.approx([a, a, math.sqrt(8) * a])
    assert ranked.d_worst == pytest.approx([math.sqrt(5) * a, math.sqrt(5) * a, 0.0])
    close = math.sqrt(5) / (1 + math.sqrt(5))
    assert ranked.closeness == pytest.approx([close, close, 0.0])
    assert ranked.best == 0  # the first of equals
    # the same matrix as benefits: row 3 is now the ideal
    assert topsis([[1, 2], [2, 1], [3, 3]], benefit=[True, True]).best == 2


def test_topsis_weights_decide_a_trade_off() -> None:
    """Row 0 is better on criterion 0, row 1 on criterion 1: the heavier criterion wins."""
    matrix = [[1.0, 4.0], [4.0, 1.0]]
    assert topsis(matrix, [3, 1]).best == 0
    assert topsis(matrix, [1, 3]).best == 1
    assert topsis(matrix, [1, 1]).closeness == pytest.approx([0.5, 0.5])


def test_nothing_separates_equal_alternatives() -> None:
    ranked = topsis([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0]])
    assert ranked.closeness.tolist() == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    ("matrix", "weights", "message"),
    [
        ([[1.0, math.nan]], None, r"matrix\[0, 1\] = nan"),
        ([[1.0, 2.0]], [1.0], "one weight per criterion"),
        ([[1.0, 2.0]], [0.0, 0.0], "not all 0"),
        ([[1.0, 2.0]], [-1.0, 2.0], "≥ 0"),
        (np.zeros((0, 2)), None, "at least one alternative"),
    ],
)
def test_topsis_refuses_what_it_cannot_rank(matrix: object, weights: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        topsis(matrix, weights)


def test_the_deviation_equals_a_direct_computation() -> None:
    """Each candidate's deviation, computed from the sums once, equals placing the request on
    that node and taking numpy's std of every resource over the nodes."""
    rng = np.random.default_rng(7)
    capacity = rng.uniform(4, 64, size=(9, 3))
    used = capacity * rng.uniform(0, 0.9, size=(9, 3))
    request = np.array([2.0, 3.5, 0.5])
    c = placement_criteria(used, capacity, request)
    for i in range(9):
        placed = used.copy()
        placed[i] += request
        util = placed / capacity
        assert c.deviation[i] == pytest.approx(util.std(axis=0).max())
        assert c.utilization_gap[i] == pytest.approx(util[i].max() - util[i].min())
        assert c.mean_utilization[i] == pytest.approx(util[i].mean())
    assert c.matrix(Strategy.falb3.criteria).shape == (9, 3)
    assert Strategy.falb2.criteria == (Criterion.mean_utilization, Criterion.utilization_gap)


def test_the_gap_steers_falb_2_where_mean_utilisation_alone_does_not() -> None:
    """Node 0 is CPU-heavy, node 1 memory-heavy, equally used on average. A CPU-heavy request
    fits both with the same mean utilisation; only the gap tells that node 1 balances it."""
    capacity = [[10.0, 10.0], [10.0, 10.0]]
    used = [[6.0, 2.0], [2.0, 6.0]]
    request = [2.0, 0.0]
    c = placement_criteria(used, capacity, request)
    assert c.mean_utilization.tolist() == [0.5, 0.5]
    assert c.utilization_gap == pytest.approx([0.6, 0.2])
    assert falb_scores(used, capacity, request, Strategy.mean_utilization)[0].tolist() == [
        0.5,
        0.5,
    ]
    scores, _ = falb_scores(used, capacity, request, Strategy.falb2)
    assert scores[1] > scores[0]


def test_what_fits_and_what_is_refused() -> None:
    assert fits([[0.5, 0.9], [0.0, 0.0]], NODES, REQUEST).tolist() == [False, True]
    with pytest.raises(ValueError, match=r"capacity\[0, 1\] must be > 0"):
        placement_criteria(IDLE, [[1.0, 0.0], [1.0, 1.0]], REQUEST)
    with pytest.raises(ValueError, match="one amount per resource"):
        placement_criteria(IDLE, NODES, [1.0])


def test_rrdf_charges_the_product_of_the_requests() -> None:
    """Eq. 1's example: three applications of 1 CPU (1000 millicores) and 1 KB (1000 bytes)
    make a tenant's RRDF 3·10⁶ (their execution time left at 1)."""
    assert 3 * rrdf_charge([1000, 1000], 1.0) == 3e6
    assert rrdf_charge([2, 8], 50.0) == 800.0  # Table 3's user1: 2 CPU, 8 GB, 50 s


def test_rows_picks_the_candidates_criteria_out_of_the_clusters() -> None:
    """The deviation is the whole cluster's; the candidates' rows keep it as computed there."""
    whole = placement_criteria([[0.2], [0.6], [1.0]], [[1.0], [1.0], [1.0]], [0.2])
    picked = whole.rows([1, 0])
    assert picked.deviation.tolist() == [whole.deviation[1], whole.deviation[0]]
    assert picked.utilization.tolist() == [[0.8], [0.4]]
    assert picked.mean_utilization.tolist() == pytest.approx([0.8, 0.4])
