"""Bad input to the single-pool GM and the baselines raises ValueError naming what is wrong."""

from __future__ import annotations

import math

import pytest

from gmd.fairness.baselines import price
from gmd.fairness.greediness import greediness
from gmd.fairness.ranking import ranks, spread

USE = [[3.0, 0.0], [0.0, 6.0], [3.0, 6.0]]
NAMES = {"consumers": ["c1", "c2", "c3"], "resources": ["cpu", "ram"]}


@pytest.mark.parametrize(
    ("use", "supply", "kwargs", "message"),
    [
        ([1.0, 2.0], [6, 12], {}, r"use must be a 2-D array, got shape \(2,\)"),
        ([[1.0, 2.0]], [6, 12, 1], {}, r"supply must have shape \(2,\)"),
        ([], [6, 12], {}, "use must be a 2-D array"),
        ([[1.0, -2.0]], [6, 12], {}, "use for consumer #0, resource #1 = -2.0 is negative"),
        ([[1.0, math.nan]], [6, 12], {}, "consumer #0, resource #1 = nan is not a finite"),
        ([[math.inf, 1.0]], [6, 12], {}, "use for consumer #0, resource #0 = inf"),
        (USE, [6, 0], {}, "supply for resource #1 = 0.0 is zero"),
        (USE, [6, -1], {}, "supply for resource #1 = -1.0 is negative"),
        (USE, [6, 12], {"gamma": -0.1}, r"gamma = -0.1 is outside \[0, 1\]"),
        (USE, [6, 12], {"gamma": math.nan}, "gamma = nan is outside"),
        (USE, [6, 12], {"gamma": "x"}, "gamma must be a number"),
        (USE, [6, 12], {"endowment": [[1, 1]]}, r"endowment must have shape \(3, 2\)"),
        (USE, [6, 12], {"weights": [0, 0]}, "weights are all zero"),
        (USE, [6, 12], {"weights": [1]}, r"weights must have shape \(2,\)"),
        ([["a", 1]], [6, 12], {}, "use must be numeric"),
    ],
)
def test_greediness_rejects(use, supply, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        greediness(use, supply, **kwargs)


def test_names_appear_in_messages() -> None:
    bad = [[3.0, 0.0], [0.0, -6.0], [3.0, 6.0]]
    with pytest.raises(ValueError, match=r"use for consumer 'c2', resource 'ram' = -6\.0"):
        greediness(bad, [6, 12], **NAMES)
    with pytest.raises(ValueError, match="endowment for consumer 'c3', resource 'cpu'"):
        greediness(USE, [6, 12], endowment=[[2, 4], [2, 4], [-2, 4]], **NAMES)
    with pytest.raises(ValueError, match="2 consumer names given for 3 consumers"):
        greediness(USE, [6, 12], consumers=["a", "b"])
    with pytest.raises(ValueError, match="supply for resource 'ram'"):
        price(USE, [6, 0], **NAMES)


def test_ranking_helpers_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="spread of no values"):
        spread([])
    with pytest.raises(ValueError, match="vector or a matrix"):
        ranks([[[1.0]]])
    assert ranks([0.5, 0.5 + 1e-15, 0.1]) == (1, 1, 3)
