"""The GM paper's tables (Poullie & Stiller, AIMS 2016), typed in from the paper for tests.

Kept apart from gmd.fairness.scenarios on purpose: a test compares the two."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np

# Table 2 (Q1): six units of r1, twelve of r2.
Q1_SUPPLY = [6, 12]
Q1 = {
    "A11": [[2, 0], [0, 4], [4, 8]],
    "A12": [[3, 0], [0, 6], [3, 6]],
    "A13": [[4, 0], [0, 8], [2, 4]],
    "A14": [[5, 0], [0, 10], [1, 2]],
}
# Table 3 (Q3): bundles and the remainder; supply = column sums + remainder.
Q3 = {
    "S31": ([[4, 3, 3], [2, 1, 5], [4, 2, 1]], [2, 3, 0]),
    "S32": ([[4, 2, 4], [1, 4, 3], [1, 6, 2]], [6, 0, 0]),
    "S33": ([[4, 1, 4], [1, 4, 3], [1, 6, 2]], [6, 1, 0]),
}
# Table 5: 30 units of each resource.
T5_SUPPLY = [30, 30, 30]
T5 = [[18, 0, 0], [0, 14, 17], [10, 16, 12]]


def q3(name: str) -> tuple[list[list[int]], list[int]]:
    use, remainder = Q3[name]
    totals = np.sum(use, axis=0)
    return use, [int(t) + rest for t, rest in zip(totals, remainder, strict=True)]


def table6_formula(column: str, x: F) -> list[F]:
    """Table 6's first block: the GM as a function of γ = x."""
    if column == "A12":
        return [F(1, 4) - x / 2, F(1, 4) - x / 2, F(1, 2)]
    if column == "A13":
        return [F(1, 2) - x / 2, F(1, 2) - x / 2, F(0)]
    if column == "S31":
        return [F(0), F(2, 9), -F(2, 9) * x]
    return [F(1, 9) - F(1, 6) * x, F(0), F(1, 6) - F(1, 9) * x]  # S32 and S33
