"""DRF progressive filling and Asset Fairness against the NSDI 2011 example in
tests/data/test_vectors.json (values recomputed there with exact fractions)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from gmd.fairness.drf import equalizing_tasks, progressive_filling


def frac(text: str) -> float:
    return float(Fraction(text))


@pytest.fixture()
def drf_case(test_vectors: dict) -> dict:
    return next(c for c in test_vectors["drf"] if c["id"] == "drf_nsdi11_sec4")


def _inputs(case: dict, order: list[str]) -> tuple[list[float], dict[str, list[float]]]:
    resources = list(case["capacity"])
    capacity = [case["capacity"][r] for r in resources]
    demands = {u: [case["task_demand"][u][r] for r in resources] for u in order}
    return capacity, demands


def test_progressive_filling_final_allocation(drf_case: dict) -> None:
    capacity, demands = _inputs(drf_case, ["B", "A"])
    result = progressive_filling(capacity, demands)
    assert result.tasks == {u: float(n) for u, n in drf_case["expected_tasks"].items()}
    for user, alloc in drf_case["expected_alloc"].items():
        np.testing.assert_allclose(result.allocation[user], list(alloc.values()), atol=1e-12)
    for user, share in drf_case["expected_dominant_share"].items():
        assert result.dominant[user] == pytest.approx(frac(share), abs=1e-12)


def test_progressive_filling_steps(drf_case: dict) -> None:
    """Every step of the NSDI table, B listed first so that the opening tie goes to B."""
    capacity, demands = _inputs(drf_case, ["B", "A"])
    steps = progressive_filling(capacity, demands).steps
    expected = drf_case["expected_steps_B_first"]
    assert [s.pick for s in steps] == [e["pick"] for e in expected]
    for got, want in zip(steps, expected, strict=True):
        for user in ("A", "B"):
            np.testing.assert_allclose(
                got.shares[user], [frac(x) for x in want[f"share_{user}"]], atol=1e-12
            )
            assert got.dominant[user] == pytest.approx(frac(want["dom"][user]), abs=1e-12)
        np.testing.assert_allclose(got.total, [frac(x) for x in want["total"]], atol=1e-12)


def test_tie_order_changes_only_the_first_picks(drf_case: dict) -> None:
    capacity, demands = _inputs(drf_case, ["A", "B"])
    result = progressive_filling(capacity, demands)
    assert result.steps[0].pick == "A"
    assert result.tasks == {"A": 3.0, "B": 2.0}


def test_fractional_drf_equalizes_dominant_shares(drf_case: dict) -> None:
    capacity, demands = _inputs(drf_case, ["A", "B"])
    tasks = equalizing_tasks(capacity, demands, "dominant")
    assert tasks == pytest.approx({"A": 3.0, "B": 2.0}, abs=1e-12)


def test_asset_fairness(test_vectors: dict, drf_case: dict) -> None:
    case = next(c for c in test_vectors["drf"] if c["id"] == "asset_fairness_nsdi11_sec5_1")
    capacity, demands = _inputs(drf_case, ["A", "B"])
    tasks = equalizing_tasks(capacity, demands, "asset")
    assert tasks == pytest.approx(case["expected_tasks_fractional"], abs=1e-12)


def test_bad_demands_are_named() -> None:
    with pytest.raises(ValueError, match="user 'B'"):
        progressive_filling([9, 18], {"A": [1, 4], "B": [3, -1]}, resources=["cpu", "mem"])
    with pytest.raises(ValueError, match="zero for every resource"):
        progressive_filling([9, 18], {"A": [0, 0]})
    with pytest.raises(ValueError, match="'asset'"):
        equalizing_tasks([9, 18], {"A": [1, 4]}, "leontief")
