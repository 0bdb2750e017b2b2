"""FALB's placement criteria: for a request and each candidate node, the node's utilisation as
if the request ran there, and how balanced the cluster would then be (Chen & Lai, "A
Fairness-aware Load Balancing Strategy in Multi-Tenant Clouds").

For candidate ``i`` the request's use is added to node ``i`` alone and every criterion is a
cost (smaller is better):

- **mean utilisation** ``MU_i`` (Eq. 5): the mean over resources of node ``i``'s use over its
  capacity;
- **utilisation gap** ``UG_i`` (Eq. 3): node ``i``'s largest resource utilisation less its
  smallest, the resource one will run out of while the other idles;
- **deviation** ``σ_i`` (Eq. 4): over resources, the largest standard deviation (population)
  of the nodes' utilisations of that resource — how unevenly the cluster is loaded.

:func:`falb_scores` ranks the candidates by TOPSIS (:mod:`gmd.fairness.topsis`) over the
criteria a strategy uses (Table 4): mean utilisation alone (YuniKorn's objective, and FA-YK's),
with the gap (FALB-2), with the deviation too (FALB-3). Kubernetes' balanced allocation, the
production baseline, scores a node ``1 − std`` of its own resource fractions after placement
(:func:`balanced_allocation`).

The paper's worked example (two nodes of 1 CPU/1 GB and 2 CPU/1 GB, a 0.5 CPU/0.2 GB request):
the gaps are 30 % and 5 % — the paper prints 10 % for the second, though its own formula,
``0.5/2 − 0.2/1``, gives 5 % — and placing the request on the first node leaves the nodes'
CPU utilisations 25 % apart in standard deviation and their memory 10 %: the paper's "25 and 10".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from gmd.fairness._validate import as_float_array, check_shape
from gmd.fairness.topsis import Topsis, topsis


class Criterion(enum.StrEnum):
    """One of FALB's criteria (all costs)."""

    mean_utilization = "mean_utilization"
    utilization_gap = "utilization_gap"
    deviation = "deviation"


class Strategy(enum.StrEnum):
    """Which criteria rank the nodes (the paper's Table 4, and Kubernetes' baseline)."""

    mean_utilization = "mean-utilization"
    """YuniKorn's objective (and FA-YK's, which adds RRDF's tenant order)"""
    falb2 = "falb-2"
    """mean utilisation and utilisation gap, by TOPSIS"""
    falb3 = "falb-3"
    """mean utilisation, utilisation gap and deviation, by TOPSIS"""
    balanced = "balanced"
    """Kubernetes' balanced allocation: 1 − std of a node's resource fractions"""

    @property
    def criteria(self) -> tuple[Criterion, ...]:
        """The criteria TOPSIS weighs for this strategy (none for ``balanced``)."""
        return _CRITERIA[self]


_CRITERIA = {
    Strategy.mean_utilization: (Criterion.mean_utilization,),
    Strategy.falb2: (Criterion.mean_utilization, Criterion.utilization_gap),
    Strategy.falb3: (Criterion.mean_utilization, Criterion.utilization_gap, Criterion.deviation),
    Strategy.balanced: (),
}


@dataclass(frozen=True)
class Criteria:
    """Each candidate node's criteria with the request placed on it."""

    utilization: np.ndarray
    """nodes × resources: candidate ``i``'s row with the request added"""
    mean_utilization: np.ndarray
    utilization_gap: np.ndarray
    deviation: np.ndarray

    def rows(self, index: object) -> Criteria:
        """The criteria of the nodes ``index`` picks (in its order): the candidates to rank,
        when the deviation was computed over a whole cluster that holds other nodes too."""
        i = np.asarray(index, dtype=np.intp)
        return Criteria(
            self.utilization[i],
            self.mean_utilization[i],
            self.utilization_gap[i],
            self.deviation[i],
        )

    def matrix(self, criteria: tuple[Criterion, ...]) -> np.ndarray:
        """nodes × len(criteria), in the order given."""
        return np.column_stack([getattr(self, c.value) for c in criteria])


def _checked(used: object, capacity: object, request: object) -> tuple[np.ndarray, ...]:
    u = as_float_array("used", used, 2)
    c = as_float_array("capacity", capacity, 2)
    r = as_float_array("request", request, 1)
    n, m = c.shape
    if n == 0 or m == 0:
        raise ValueError(f"capacity must have at least one node and resource, got {c.shape}")
    check_shape("used", u, (n, m), "one row per node, one column per resource")
    check_shape("request", r, (m,), "one amount per resource")
    for name, a in (("used", u), ("capacity", c), ("request", r)):
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError(f"{name} must be finite and ≥ 0")
    if np.any(c <= 0):
        node, resource = np.argwhere(c <= 0)[0]
        raise ValueError(f"capacity[{node}, {resource}] must be > 0")
    return u, c, r


def placement_criteria(used: object, capacity: object, request: object) -> Criteria:
    """FALB's criteria for placing ``request`` (per resource) on each node, whose ``used`` and
    ``capacity`` are nodes × resources in the same units. O(nodes × resources)."""
    u, c, r = _checked(used, capacity, request)
    n = c.shape[0]
    base = u / c
    placed = (u + r) / c
    mean = placed.mean(axis=1)
    gap = placed.max(axis=1) - placed.min(axis=1)
    # Each resource's std over nodes with candidate i's row replaced: from the sums, once.
    s1, s2 = base.sum(axis=0), (base * base).sum(axis=0)
    s1_i = s1 - base + placed
    s2_i = s2 - base * base + placed * placed
    var = np.maximum(s2_i / n - (s1_i / n) ** 2, 0.0)
    deviation = np.sqrt(var).max(axis=1)
    return Criteria(placed, mean, gap, deviation)


def balanced_allocation(used: object, capacity: object, request: object) -> np.ndarray:
    """Kubernetes' balanced allocation per node: ``1 − std`` of the node's resource fractions
    with the request placed on it (larger is better)."""
    u, c, r = _checked(used, capacity, request)
    return _balanced((u + r) / c)


def _balanced(placed: np.ndarray) -> np.ndarray:
    return 1.0 - placed.std(axis=1)


def falb_scores(
    used: object, capacity: object, request: object, strategy: Strategy
) -> tuple[np.ndarray, Topsis | None]:
    """Each node's score for ``request`` under ``strategy`` (larger is better: TOPSIS's
    closeness, or the balanced allocation), and the TOPSIS ranking behind it."""
    return scores(placement_criteria(used, capacity, request), strategy)


def scores(criteria: Criteria, strategy: Strategy) -> tuple[np.ndarray, Topsis | None]:
    """:func:`falb_scores` from criteria already computed (a simulator records them too)."""
    if strategy == Strategy.balanced:
        return _balanced(criteria.utilization), None
    ranked = topsis(criteria.matrix(strategy.criteria))
    return ranked.closeness, ranked


def fits(used: object, capacity: object, request: object) -> np.ndarray:
    """Which nodes have room for the request on every resource."""
    u, c, r = _checked(used, capacity, request)
    return np.all(u + r <= c * (1 + 1e-12), axis=1)


def rrdf_charge(request: object, run_time_s: float) -> float:
    """What scheduling one application adds to its tenant's RRDF (Eq. 1): the product of its
    requests and its execution time."""
    r = as_float_array("request", request, 1)
    if not np.all(np.isfinite(r)) or np.any(r < 0) or not run_time_s >= 0:
        raise ValueError("request and run_time_s must be finite and ≥ 0")
    return float(np.prod(r) * run_time_s)
