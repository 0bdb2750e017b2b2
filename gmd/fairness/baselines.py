"""The bundle-value metrics the GM paper compares against (Poullie & Stiller, Sec. 3.2).

Each takes one pool's allocation (consumers × resources) and its supply and returns a value per
consumer; larger means "got more", i.e. greedier. They are what participants of the paper's
questionnaire used to rank consumers, and what reports show beside the GM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gmd.fairness._validate import Labels, as_float_array, check_amounts, check_shape


def _pool(
    use: object,
    supply: object,
    consumers: Sequence[str] | None,
    resources: Sequence[str] | None,
) -> tuple[np.ndarray, np.ndarray]:
    a = as_float_array("use", use, 2)
    n, m = a.shape
    if n == 0 or m == 0:
        raise ValueError(f"use must have at least one consumer and one resource, got {a.shape}")
    cols = Labels("resource", resources, m)
    r = as_float_array("supply", supply, 1)
    check_shape("supply", r, (m,), "one amount per resource, as use has columns")
    check_amounts("supply", r, None, cols, positive=True)
    check_amounts("use", a, Labels("consumer", consumers, n), cols)
    return a, r


def price(
    use: object,
    supply: object,
    p: float = 1.0,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """Price: a unit of ``r_i`` is worth ``p / r_i``; a bundle is worth the sum of its units."""
    a, r = _pool(use, supply, consumers, resources)
    return (a * (p / r)).sum(axis=1)


def price_scarcity(
    use: object,
    supply: object,
    p: float = 1.0,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """P×S: a unit of ``r_i`` is worth ``a(r_i) · p / r_i²``, ``a(r_i)`` the total allocated."""
    a, r = _pool(use, supply, consumers, resources)
    allocated = a.sum(axis=0)
    return (a * (allocated * p / r**2)).sum(axis=1)


def depleted(use: np.ndarray, supply: np.ndarray) -> np.ndarray:
    """Which resources are fully allocated (to 1e-12 relative, so that 0.1+0.2 counts)."""
    allocated = use.sum(axis=0)
    return allocated >= supply * (1.0 - 1e-12)


def price_cap_scarcity(
    use: object,
    supply: object,
    p: float = 1.0,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """P∩S: the Price metric counted only over depleted resources."""
    a, r = _pool(use, supply, consumers, resources)
    return (a * (p / r) * depleted(a, r)).sum(axis=1)


def dominant_share(
    use: object,
    supply: object,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """DRF's value of a bundle: its largest share of any resource (the L∞ norm)."""
    a, r = _pool(use, supply, consumers, resources)
    return (a / r).max(axis=1)


def drf_key(
    use: object,
    supply: object,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """Each bundle's shares sorted largest first: DRF compares these lexicographically.

    The paper breaks a tie of dominant shares by the second largest share (c₁ vs c₂ in S33);
    comparing the whole sorted row does that and every further tie the same way.
    """
    a, r = _pool(use, supply, consumers, resources)
    return -np.sort(-(a / r), axis=1)
