"""TOPSIS: ranking alternatives by their closeness to the ideal one over several criteria, the
multi-criteria method FALB places workloads by (Chen & Lai's FALB, Eq. 9 and Algorithm 2).

One implementation, for the Nova weigher and the simulator alike. Each criterion's column is
vector-normalised (divided by its Euclidean norm, so criteria of different units compare) and
weighted; the ideal alternative takes each criterion's best value (the smallest for a cost, the
largest for a benefit), the anti-ideal the worst; an alternative's closeness is
``D⁻ / (D⁺ + D⁻)``, its distance to the anti-ideal over the sum of both distances: 1 at the
ideal, 0 at the anti-ideal. The best alternative has the largest closeness (Eq. 9's arg max;
Algorithm 2's last line says "minimal", which would choose the worst: a slip).

A criterion on which every alternative is equal separates none of them: its column is all
zeros after normalisation (a zero norm is kept at zero). When nothing separates any alternative
both distances are 0 and every closeness is 0.5, so that a caller ranking by closeness keeps
them all level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gmd.fairness._validate import as_float_array, check_shape


@dataclass(frozen=True)
class Topsis:
    """The ranking of one set of alternatives (rows) over criteria (columns)."""

    weighted: np.ndarray
    """alternatives × criteria: normalised and weighted"""
    ideal: np.ndarray
    """per criterion, the best weighted value (A⁺)"""
    anti_ideal: np.ndarray
    """per criterion, the worst weighted value (A⁻)"""
    d_best: np.ndarray
    """D⁺: each alternative's Euclidean distance to the ideal"""
    d_worst: np.ndarray
    """D⁻: each alternative's Euclidean distance to the anti-ideal"""
    closeness: np.ndarray
    """D⁻ / (D⁺ + D⁻), in [0, 1]: larger is better"""

    @property
    def best(self) -> int:
        """The index of the best alternative (the first of equals)."""
        return int(np.argmax(self.closeness))


def topsis(
    matrix: object, weights: object | None = None, *, benefit: Sequence[bool] | None = None
) -> Topsis:
    """Rank the rows of ``matrix`` (alternatives × criteria). ``weights`` (one per criterion,
    ≥ 0, not all 0; default equal) are scaled to sum to 1, as FALB's "divide them by 3".
    ``benefit[c]`` says criterion ``c`` is better larger; by default every criterion is a cost
    (FALB's three are)."""
    x = as_float_array("matrix", matrix, 2)
    n, k = x.shape
    if n == 0 or k == 0:
        raise ValueError(f"matrix must have at least one alternative and criterion, got {x.shape}")
    if not np.all(np.isfinite(x)):
        row, col = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(f"matrix[{row}, {col}] = {x[row, col]} is not a finite number")
    if weights is None:
        w = np.full(k, 1.0 / k)
    else:
        w = as_float_array("weights", weights, 1)
        check_shape("weights", w, (k,), "one weight per criterion")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
            raise ValueError(f"weights must be finite, ≥ 0 and not all 0, got {w.tolist()}")
        w = w / w.sum()
    better_larger = np.zeros(k, dtype=bool) if benefit is None else np.asarray(benefit, bool)
    if better_larger.shape != (k,):
        raise ValueError(
            f"benefit must say, for each of the {k} criteria, whether larger is better"
        )
    norm = np.sqrt((x * x).sum(axis=0))
    scaled = np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)
    v = scaled * w
    top, bottom = v.max(axis=0), v.min(axis=0)
    ideal = np.where(better_larger, top, bottom)
    anti = np.where(better_larger, bottom, top)
    d_best = np.sqrt(((v - ideal) ** 2).sum(axis=1))
    d_worst = np.sqrt(((v - anti) ** 2).sum(axis=1))
    total = d_best + d_worst
    closeness = np.divide(d_worst, total, out=np.full(n, 0.5), where=total > 0)
    return Topsis(v, ideal, anti, d_best, d_worst, closeness)
