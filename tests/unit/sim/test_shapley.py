"""Shapley values: the published examples exactly, and the axioms on random games."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmd.sim.shapley import (
    SubsetTables,
    coalitions_by_size,
    masks_from_lex,
    shapley_exact,
    shapley_float,
)


def test_lex_order_is_by_size_then_members() -> None:
    # {1},{2},{3},{1,2},{1,3},{2,3},{1,2,3} as bit masks
    assert coalitions_by_size(3) == [0b001, 0b010, 0b100, 0b011, 0b101, 0b110, 0b111]


def test_published_examples_exactly(test_vectors: dict) -> None:
    examples = test_vectors["shapley"]
    assert len(examples) == 6
    for ex in examples:
        n = ex["n"]
        v = masks_from_lex([Fraction(str(x)) for x in ex["v_lex"]], n)
        expected = [Fraction(str(x)) for x in ex["expected"]]
        assert shapley_exact(v, n) == expected, ex["id"]
        approx = shapley_float(np.array([float(x) for x in v]), n)
        assert np.allclose(approx, [float(x) for x in expected], rtol=0, atol=1e-12), ex["id"]


def test_wrong_game_size_is_named() -> None:
    with pytest.raises(ValueError, match="needs 7 values"):
        masks_from_lex([1, 2, 3], 3)


games = st.integers(1, 5).flatmap(
    lambda n: st.tuples(
        st.just(n), st.lists(st.integers(-50, 50), min_size=(1 << n) - 1, max_size=(1 << n) - 1)
    )
)


@settings(max_examples=60, deadline=None)
@given(games)
def test_axioms_and_fast_tables_agree(game: tuple[int, list[int]]) -> None:
    n, rest = game
    v = [0, *rest]
    phi = shapley_exact(v, n)
    assert sum(phi) == v[-1]  # efficiency
    fast = SubsetTables((1 << n) - 1, n).values(np.array(v, dtype=np.float64))
    assert np.allclose(fast, [float(x) for x in phi], atol=1e-9)
    # dummy: a player adding nothing to any coalition gets nothing
    dummy = [v[m & ~1] for m in range(1 << n)]
    assert shapley_exact(dummy, n)[0] == 0
