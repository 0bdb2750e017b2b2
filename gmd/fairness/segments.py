"""Segment reductions: sums of rows grouped by an index, without a Python loop over groups.

Accounting a cloud interval reduces 10^5 VM rows onto 10^3-10^4 hosts or customers; one
``np.bincount`` over a flattened (group, column) index does that for every column at once.
"""

from __future__ import annotations

import numpy as np


def segment_sum(values: np.ndarray, index: np.ndarray, size: int) -> np.ndarray:
    """Sum rows of ``values`` into ``size`` groups: ``out[g] = Σ_{k: index[k]=g} values[k]``.

    ``values`` is (n,) or (n, m); ``index`` is (n,) of ints in [0, size).
    """
    if values.ndim == 1:
        return np.bincount(index, weights=values, minlength=size)[:size]
    _n, m = values.shape
    flat = (index[:, None] * m + np.arange(m)).ravel()
    return np.bincount(flat, weights=values.ravel(), minlength=size * m)[: size * m].reshape(
        size, m
    )


def segment_count(index: np.ndarray, size: int) -> np.ndarray:
    """How many rows fall into each of ``size`` groups."""
    return np.bincount(index, minlength=size)[:size]
