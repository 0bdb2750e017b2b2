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
    # One bincount per column (a cloud has a handful of resources), not one over a flattened
    # (group, column) index: building that index cost as much as the sums (1M VM rows × 4
    # columns into 50k groups: 33 ms against 18 ms). Each group's sum is taken in the same
    # row order either way, so the results are the same to the bit.
    out = np.empty((size, values.shape[1]))
    for j in range(values.shape[1]):
        out[:, j] = np.bincount(index, weights=values[:, j], minlength=size)[:size]
    return out


def segment_count(index: np.ndarray, size: int) -> np.ndarray:
    """How many rows fall into each of ``size`` groups."""
    return np.bincount(index, minlength=size)[:size]
