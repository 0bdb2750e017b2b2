"""The GM against Poullie & Stiller (AIMS 2016): Table 6 to the digit, rankings of Tables 4-5,
and Q1. Inputs are typed here from the paper (Tables 2, 3, 5), independently of
gmd.fairness.scenarios, which is checked against them."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from gmd.fairness.greediness import greediness
from gmd.fairness.ranking import ranks, spread
from gmd.fairness.scenarios import SCENARIOS
from tests.support.paper_tables import Q1, Q1_SUPPLY, Q3, T5, T5_SUPPLY, q3, table6_formula

# Table 6's printed rows for γ = 1 and γ = 0.5 (0.0\bar{5} = 1/18, 0.02\bar{7} = 1/36).
TABLE6_PRINTED = {
    F(1): {
        "A12": [F(-1, 4), F(-1, 4), F(1, 2)],
        "A13": [F(0), F(0), F(0)],
        "S31": [F(0), F(2, 9), F(-2, 9)],
        "S32": [F(-1, 18), F(0), F(1, 18)],
    },
    F(1, 2): {
        "A12": [F(0), F(0), F(1, 2)],
        "A13": [F(1, 4), F(1, 4), F(0)],
        "S31": [F(0), F(2, 9), F(-1, 9)],
        "S32": [F(1, 36), F(0), F(1, 9)],
    },
}


def gm_of(column: str, gamma: float) -> np.ndarray:
    if column in Q1:
        return greediness(Q1[column], Q1_SUPPLY, gamma=gamma)
    use, supply = q3(column)
    return greediness(use, supply, gamma=gamma)


@pytest.mark.parametrize("gamma", [F(1), F(1, 2)])
@pytest.mark.parametrize("column", ["A12", "A13", "S31", "S32", "S33"])
def test_table6_printed_rows(column: str, gamma: F) -> None:
    expected = TABLE6_PRINTED[gamma]["S32" if column == "S33" else column]
    got = gm_of(column, float(gamma))
    np.testing.assert_allclose(got, [float(v) for v in expected], rtol=0, atol=1e-12)


@pytest.mark.parametrize("gamma", [F(0), F(1, 4), F(1, 3), F(3, 5), F(3, 4), F(1, 2), F(1)])
@pytest.mark.parametrize("column", ["A12", "A13", "S31", "S32", "S33"])
def test_table6_formula_row(column: str, gamma: F) -> None:
    expected = [float(v) for v in table6_formula(column, gamma)]
    np.testing.assert_allclose(gm_of(column, float(gamma)), expected, rtol=0, atol=1e-12)


def test_q1_a13_fairer_than_a12() -> None:
    """Q1: 68.5 % chose A13. With γ = 0.5 its greediness values are closer together."""
    a12 = spread(gm_of("A12", 0.5))
    a13 = spread(gm_of("A13", 0.5))
    assert a13 < a12
    assert (a12, a13) == pytest.approx((0.5, 0.25), abs=1e-12)


# Table 4: the most frequent rankings (ranks per consumer, 1 = greediest) are DRF's row.
MOST_FREQUENT = {"S31": (2, 1, 3), "S32": (2, 3, 1), "S33": (2, 3, 1)}


@pytest.mark.parametrize("gamma", [0.26, 0.3, 0.4, 0.5, 0.6, 0.66])
def test_gm_agrees_with_questionnaire_inside_quarter_two_thirds(gamma: float) -> None:
    """[24] shows γ ∈ ]1/4, 2/3[ complies with every questionnaire result."""
    for scenario, ranking in MOST_FREQUENT.items():
        assert ranks(gm_of(scenario, gamma)) == ranking, scenario
    assert spread(gm_of("A13", gamma)) < spread(gm_of("A12", gamma))


def test_gm_leaves_questionnaire_outside_the_interval() -> None:
    """The interval is tight: at γ ≤ 1/4 Q1 flips, at γ ≥ 2/3 S32/S33 flip."""
    assert spread(gm_of("A13", 0.2)) > spread(gm_of("A12", 0.2))
    assert ranks(gm_of("S32", 0.7)) != MOST_FREQUENT["S32"]
    assert ranks(gm_of("S32", 1.0)) == (3, 2, 1)  # the paper: "(3,2,1)" for γ = 1


def test_table5_gm_gives_the_inverse_of_drf() -> None:
    """Table 5: every metric but DRF ranks c3 greediest, c1 least; the GM agrees with them."""
    assert ranks(greediness(T5, T5_SUPPLY, gamma=0.5)) == (3, 2, 1)
    expected = [(8 - 19 * 0.5) / 30, (11 - 8 * 0.5) / 30, 8 / 30]
    np.testing.assert_allclose(greediness(T5, T5_SUPPLY, gamma=0.5), expected, atol=1e-12)


def test_builtin_scenarios_are_the_papers_tables() -> None:
    for name, use in Q1.items():
        s = SCENARIOS[name]
        assert [list(r) for r in s.use] == use and list(s.supply) == Q1_SUPPLY
    for name in Q3:
        use, supply = q3(name)
        s = SCENARIOS[name]
        assert [list(r) for r in s.use] == use and list(s.supply) == supply
    assert [list(r) for r in SCENARIOS["T5"].use] == T5
    assert list(SCENARIOS["T5"].supply) == T5_SUPPLY
