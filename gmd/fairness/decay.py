"""Exponential forgetting of balances, as Slurm's PriorityDecayHalfLife.

A customer greedy last month should not be throttled today for it; a half-life H (default 7
days) halves the weight of past intervals every H seconds: ``B(t) = B(t−Δt)·2^(−Δt/H) + G(t)``.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0


def decay_factor(elapsed_s: float, half_life_s: float | None) -> float:
    """``2^(−elapsed/H)``; 1 when ``half_life_s`` is None or infinite (no forgetting)."""
    if not math.isfinite(elapsed_s) or elapsed_s < 0:
        raise ValueError(f"elapsed_s = {elapsed_s!r} must be finite and >= 0")
    if half_life_s is None or half_life_s == math.inf:
        return 1.0
    if not (half_life_s > 0):
        raise ValueError(f"half_life_s = {half_life_s!r} must be > 0 (or None for no decay)")
    return 2.0 ** (-elapsed_s / half_life_s)


def decayed_balance(
    balance: object, increment: object, elapsed_s: float, half_life_s: float | None
) -> np.ndarray:
    """The balance after one more interval: the old one decayed by ``elapsed_s``, plus the new."""
    b = np.asarray(balance, dtype=np.float64)
    inc = np.asarray(increment, dtype=np.float64)
    if b.shape != inc.shape:
        raise ValueError(f"balance {b.shape} and increment {inc.shape} differ in shape")
    if not np.all(np.isfinite(inc)):
        raise ValueError(
            f"increment holds a non-finite value at {np.argwhere(~np.isfinite(inc))[0]}"
        )
    return b * decay_factor(elapsed_s, half_life_s) + inc
