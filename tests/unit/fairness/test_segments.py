"""Segment sums (gmd.fairness.segments) against the plain definition, to the bit: each group's
rows are added in row order, as ``np.add.at`` adds them."""

from __future__ import annotations

import numpy as np
import pytest

from gmd.fairness.segments import segment_count, segment_sum


@pytest.mark.parametrize(("n", "m", "size"), [(1, 1, 1), (1000, 3, 17), (20000, 5, 999)])
def test_segment_sum_is_the_row_order_sum_of_each_group(n: int, m: int, size: int) -> None:
    rng = np.random.default_rng(n + m)
    values = rng.random((n, m)) * 1e6 - 3e5
    index = rng.integers(0, size, n)
    expected = np.zeros((size, m))
    np.add.at(expected, index, values)
    assert np.array_equal(segment_sum(values, index, size), expected)
    flat = np.zeros(size)
    np.add.at(flat, index, values[:, 0])
    assert np.array_equal(segment_sum(values[:, 0], index, size), flat)


def test_groups_no_row_falls_into_are_zero() -> None:
    values = np.array([[1.0, 2.0], [3.0, 4.0]])
    out = segment_sum(values, np.array([2, 2]), 4)
    assert out.tolist() == [[0.0, 0.0], [0.0, 0.0], [4.0, 6.0], [0.0, 0.0]]
    assert segment_count(np.array([2, 2]), 4).tolist() == [0, 0, 2, 0]
    assert segment_sum(np.empty((0, 3)), np.empty(0, dtype=np.int64), 2).shape == (2, 3)
