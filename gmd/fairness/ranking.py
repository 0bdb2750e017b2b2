"""Ranks and spreads: how the questionnaire and the paper compare consumers and allocations.

The paper writes a ranking as a triplet of ranks by consumer, 1 = greediest: (2,1,3) says c₁
is moderate, c₂ greediest, c₃ least greedy. An allocation is fair when its consumers'
greediness values are aligned, so the spread (max − min) orders allocations: with it, the GM
prefers A13 to A12 exactly for γ > 1/4, the lower end of the paper's interval ]1/4, 2/3[.
"""

from __future__ import annotations

import numpy as np


def ranks(values: object, tolerance: float = 1e-12) -> tuple[int, ...]:
    """Rank per consumer, 1 = largest value; values within ``tolerance`` share a rank.

    ``values`` is a vector, or a matrix whose rows are compared lexicographically (DRF keys).
    Ties get the same (smallest) rank, as in "1, 1, 3".
    """
    keys = np.asarray(values, dtype=np.float64)
    if keys.ndim == 1:
        keys = keys[:, None]
    if keys.ndim != 2:
        raise ValueError(f"values must be a vector or a matrix, got shape {keys.shape}")
    n = keys.shape[0]
    result = []
    for j in range(n):
        above = 0
        for k in range(n):
            if k != j and _greater(keys[k], keys[j], tolerance):
                above += 1
        result.append(above + 1)
    return tuple(result)


def _greater(x: np.ndarray, y: np.ndarray, tolerance: float) -> bool:
    for a, b in zip(x, y, strict=True):
        if abs(a - b) > tolerance:
            return bool(a > b)
    return False


def spread(values: object) -> float:
    """Max − min of the consumers' greediness: 0 when perfectly aligned."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("spread of no values")
    return float(v.max() - v.min())
