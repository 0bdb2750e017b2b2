"""The Greediness Metric of one pool (one host): Eq. 1-2 of Poullie & Stiller (AIMS 2016).

``fairness-model.md`` Sec. 2 generalizes the paper's equal share ``r_i/n`` to any endowment
``e_ij`` and caps the credit factor at 1 (``κ_i = min(1, α_i/β_i)``), which changes nothing
when endowments are equal and sum to the supply. The paper's normalization ``n/(m·r_i)`` is
written ``1/(m·s_i)`` with ``s_i`` one customer's share, so that the same core serves the
single-pool calculator and the cloud-wide batched form in :mod:`gmd.fairness.cloud`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gmd.fairness._validate import (
    Labels,
    as_float_array,
    check_amounts,
    check_gamma,
    check_shape,
    resource_weights,
)
from gmd.fairness.segments import segment_sum


@dataclass(frozen=True)
class Offsets:
    """Per-consumer offsets ``o_ij`` and the per-pool sums that produced them.

    ``over`` (α), ``ceded`` (β) and ``credit`` (κ) are (pools × m): kept so that an operator
    can be shown why a ceded unit was credited only partly.
    """

    offsets: np.ndarray
    over: np.ndarray
    ceded: np.ndarray
    credit: np.ndarray


def pool_offsets(
    use: np.ndarray, endowment: np.ndarray, pool_of: np.ndarray, n_pools: int, gamma: float
) -> Offsets:
    """Eq. 2 for many pools at once; inputs are assumed valid (callers check them).

    One resource at a time, into column-major arrays: resources do not mix in Eq. 2, and on a
    10^6-VM cloud a column (8 MB) stays in cache through the passes Eq. 2 makes over it, where
    the whole matrix (32 MB for 4 resources) would come from memory on each. Every value is
    the one the whole-matrix formulas give, to the bit; ``offsets`` is column-major.
    """
    n, m = use.shape
    offsets = np.empty((n, m), order="F")
    over = np.empty((n_pools, m))
    ceded = np.empty((n_pools, m))
    credit = np.empty((n_pools, m))
    part = np.empty(n)
    for i in range(m):
        diff = np.subtract(use[:, i], endowment[:, i], out=offsets[:, i])
        over[:, i] = segment_sum(np.maximum(diff, 0.0, out=part), pool_of, n_pools)
        ceded[:, i] = segment_sum(
            np.maximum(np.negative(diff, out=part), 0.0, out=part), pool_of, n_pools
        )
        given = ceded[:, i] > 0.0
        safe = np.where(given, ceded[:, i], 1.0)
        credit[:, i] = np.where(given, np.minimum(1.0, over[:, i] / safe), 0.0)
        # o = diff where diff >= 0, else γ·κ·diff. As 0 <= γ·κ <= 1 that is max(diff, γ·κ·diff),
        # to the bit (rounding keeps the order; a zero keeps its sign): one ufunc, several times
        # faster than selecting by the signs, whose pattern defeats branch prediction.
        credited = (gamma * credit[:, i]).take(pool_of)
        np.maximum(diff, np.multiply(credited, diff, out=credited), out=diff)
    return Offsets(offsets=offsets, over=over, ceded=ceded, credit=credit)


def normalized_terms(offsets: np.ndarray, share: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each resource's summand of Eq. 1: ``w_i · o_ij / (m · s_i)``."""
    m = offsets.shape[1]
    return offsets * (weights / (m * share))


def resource_sum(terms: np.ndarray) -> np.ndarray:
    """Eq. 1's sum over resources of each consumer's terms, to the bit as numpy sums C rows.

    numpy adds a short row (fewer than 8 values) left to right from 0: adding the columns one
    at a time does the same, fast on the column-major terms :func:`pool_offsets` leads to
    (a C-ordered ``sum(axis=1)`` of 10^6 × 4 costs ten times more). Longer rows numpy sums
    pairwise, so those are summed as C rows.
    """
    n, m = terms.shape
    if m >= 8:
        return np.ascontiguousarray(terms).sum(axis=1)
    total = np.zeros(n)
    for i in range(m):
        total += terms[:, i]
    return total


@dataclass(frozen=True)
class PoolGreediness:
    """Everything Eq. 1-2 computed for one pool, for display and explanation.

    ``terms[j, i]`` is resource i's share of consumer j's greediness; rows sum to
    ``greediness``. ``offsets`` are in the resources' own units, as in the paper.
    """

    greediness: np.ndarray
    offsets: np.ndarray
    terms: np.ndarray
    endowment: np.ndarray
    over: np.ndarray
    ceded: np.ndarray
    credit: np.ndarray


def greediness_detail(
    use: object,
    supply: object,
    gamma: float = 0.5,
    endowment: object | None = None,
    weights: object | None = None,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> PoolGreediness:
    """Greediness of n consumers sharing one pool of m resources, with the intermediate values.

    ``use`` is (n × m), ``supply`` has length m, ``endowment`` is (n × m) or None for the
    equal share ``supply / n``. ``consumers``/``resources`` name rows and columns in errors.
    """
    a = as_float_array("use", use, 2)
    n, m = a.shape
    if n == 0 or m == 0:
        raise ValueError(f"use must have at least one consumer and one resource, got {a.shape}")
    rows = Labels("consumer", consumers, n)
    cols = Labels("resource", resources, m)
    r = as_float_array("supply", supply, 1)
    check_shape("supply", r, (m,), "one amount per resource, as use has columns")
    check_amounts("supply", r, None, cols, positive=True)
    check_amounts("use", a, rows, cols)
    g = check_gamma(gamma)
    w = resource_weights(weights, m, cols)
    if endowment is None:
        e = np.broadcast_to(r / n, (n, m))
    else:
        e = as_float_array("endowment", endowment, 2)
        check_shape("endowment", e, (n, m), "consumers × resources, as use")
        check_amounts("endowment", e, rows, cols)

    pool = np.zeros(n, dtype=np.intp)
    off = pool_offsets(a, e, pool, 1, g)
    terms = normalized_terms(off.offsets, r / n, w)
    return PoolGreediness(
        greediness=resource_sum(terms),
        offsets=off.offsets,
        terms=terms,
        endowment=np.array(e),
        over=off.over[0],
        ceded=off.ceded[0],
        credit=off.credit[0],
    )


def greediness(
    use: object,
    supply: object,
    gamma: float = 0.5,
    endowment: object | None = None,
    weights: object | None = None,
    *,
    consumers: Sequence[str] | None = None,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """The n greediness values of Eq. 1-2 for consumers sharing one pool (one host).

    >>> greediness([[3, 0], [0, 6], [3, 6]], [6, 12], gamma=0.5).round(12).tolist()
    [0.0, 0.0, 0.5]
    """
    return greediness_detail(
        use, supply, gamma, endowment, weights, consumers=consumers, resources=resources
    ).greediness
