"""Shapley values of coalition games, exactly (SPAA Eq. 1) or from sampled orderings (Eq. 2).

Coalitions are bit masks over organizations: bit o set ⇔ organization o is a member, so a
game on n players is a sequence of 2^n values indexed by mask, ``v[0] = 0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from itertools import combinations
from math import factorial

import numpy as np


def coalitions_by_size(n: int) -> list[int]:
    """Non-empty coalitions by size, then lexicographically by members (the test vectors' order)."""
    return [
        sum(1 << i for i in members)
        for size in range(1, n + 1)
        for members in combinations(range(n), size)
    ]


def masks_from_lex(v_lex: Sequence[object], n: int) -> list[object]:
    """A game given in ``coalitions_by_size`` order, re-indexed by mask (``v[0] = 0``)."""
    order = coalitions_by_size(n)
    if len(v_lex) != len(order):
        raise ValueError(f"a game on {n} players needs {len(order)} values, got {len(v_lex)}")
    v: list[object] = [0] * (1 << n)
    for mask, value in zip(order, v_lex, strict=True):
        v[mask] = value
    return v


def shapley_weights(n: int) -> list[Fraction]:
    """``|S|!(n−|S|−1)!/n!`` by |S|: the chance that exactly S precedes a player."""
    return [Fraction(factorial(s) * factorial(n - s - 1), factorial(n)) for s in range(n)]


def shapley_exact(v: Sequence[int | float | Fraction], n: int) -> list[Fraction]:
    """Exact Shapley values in fractions (``v`` indexed by mask, ints or Fractions)."""
    if len(v) != 1 << n:
        raise ValueError(f"a game on {n} players needs 2^{n} = {1 << n} values, got {len(v)}")
    w = shapley_weights(n)
    values = [Fraction(x) for x in v]
    phi = [Fraction(0)] * n
    for mask in range(1 << n):
        size = mask.bit_count()
        for o in range(n):
            if not mask >> o & 1:
                phi[o] += w[size] * (values[mask | 1 << o] - values[mask])
    return phi


def shapley_float(v: np.ndarray, n: int) -> np.ndarray:
    """Shapley values in floating point, vectorized (``v`` indexed by mask)."""
    v = np.asarray(v, dtype=np.float64)
    if v.shape != (1 << n,):
        raise ValueError(f"a game on {n} players needs 2^{n} = {1 << n} values, got {v.shape}")
    masks = np.arange(1 << n)
    sizes = np.array([int(m).bit_count() for m in masks])
    w = np.array([float(x) for x in shapley_weights(n)] + [0.0])
    phi = np.empty(n)
    for o in range(n):
        without = masks[(masks >> o) & 1 == 0]
        phi[o] = np.sum(w[sizes[without]] * (v[without | 1 << o] - v[without]))
    return phi


class SubsetTables:
    """Index tables to compute every member's Shapley value inside one coalition fast.

    For coalition C with members o_1..o_m: ``with_[i]`` and ``without[i]`` list (as masks)
    every S ⊆ C∖{o_i} and S ∪ {o_i}; ``weight[i]`` the matching Shapley weights within C.
    """

    __slots__ = ("members", "weight", "with_", "without")

    def __init__(self, coalition: int, n: int) -> None:
        self.members = [o for o in range(n) if coalition >> o & 1]
        m = len(self.members)
        w = [float(x) for x in shapley_weights(m)]
        subsets = [s for s in range(1 << n) if s & ~coalition == 0]
        rows_with, rows_without, rows_w = [], [], []
        for o in self.members:
            bit = 1 << o
            without = [s for s in subsets if not s & bit]
            rows_without.append(without)
            rows_with.append([s | bit for s in without])
            rows_w.append([w[s.bit_count()] for s in without])
        self.with_ = np.array(rows_with, dtype=np.int64)
        self.without = np.array(rows_without, dtype=np.int64)
        self.weight = np.array(rows_w, dtype=np.float64)

    def values(self, v: np.ndarray) -> np.ndarray:
        """Shapley value of each member (in ``members`` order) in the game ``v`` restricted to C."""
        return np.sum(self.weight * (v[self.with_] - v[self.without]), axis=1)


def sampled_predecessors(n: int, samples: int, rng: np.random.Generator) -> list[list[int]]:
    """For each player, ``samples`` coalitions of its predecessors in uniformly random orders.

    The mean marginal contribution to these coalitions is an unbiased Shapley estimate (Eq. 2),
    which is how Rand (SPAA Fig. 6) samples its subcoalitions.
    """
    out: list[list[int]] = [[] for _ in range(n)]
    for o in range(n):
        for _ in range(samples):
            order = rng.permutation(n)
            pos = int(np.flatnonzero(order == o)[0])
            out[o].append(sum(1 << int(p) for p in order[:pos]))
    return out
