"""A multi-resource placement simulator for FALB's experiment (Chen & Lai, "A Fairness-aware
Load Balancing Strategy in Multi-Tenant Clouds", Tables 1, 3 and 4, Fig. 2).

Nodes offer CPU and memory (GB, as the paper's tables give it); applications ask for both, for
a run time, and arrive at once (``batch``) or one after another (``stream``). At each arrival
and completion the scheduler places what it can, in an order and onto nodes its
:class:`~gmd.fairness.placement.Strategy` and ordering decide:

- **order**: ``fifo`` takes applications by submission time (YuniKorn's FIFO); ``rrdf``
  (FALB's Algorithm 1) takes the earliest unscheduled application of the tenant whose RRDF
  (:func:`gmd.fairness.placement.rrdf_charge`, summed over its scheduled applications) is the
  least;
- **node**: the fitting node with the best score under the strategy (TOPSIS's closeness over
  the strategy's criteria, or Kubernetes' balanced allocation; ties to the lowest node).

An application that fits no node now waits and blocks the ones behind it in the order
(YuniKorn's and Kubernetes' queues are head-of-line per queue; FALB's Algorithm 1 returns one
application, the next to place). What the run records: the total execution time (the last
completion), each placement's utilisation gap and the cluster's deviation after it, and the
tenants' RRDF over time.

Everything here is deterministic given its inputs. The paper leaves some inputs open, and each
is a choice of :class:`FalbInputs`: whether run times vary (±``jitter``), in what order the
stream arrives (:class:`Arrival`) and how fast, how ties between nodes break (:class:`Tie`).
:func:`falb_runs` runs every policy on one seed's applications, :func:`falb_experiment` many
seeds with means and 95 % confidence intervals; docs/reproduction.md shows which of these
choices decide whether FALB beats YuniKorn.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gmd.fairness.placement import (
    Strategy,
    fits,
    placement_criteria,
    rrdf_charge,
    scores,
)
from gmd.sim.placement_kinds import Arrival, FalbScenario, Tie

FALB_NODES: tuple[tuple[str, float, float], ...] = (
    ("node1", 16, 36),
    ("node2", 16, 42),
    ("node3", 16, 32),
    ("node4", 8, 32),
    ("node5", 8, 32),
    ("node6", 16, 36),
    ("node7", 16, 30),
    ("node8", 16, 36),
    ("node9", 24, 32),
)
"""Table 1's workers (node10, YuniKorn's master, runs no application): name, cores, GB."""

FALB_TENANTS: tuple[tuple[str, float, float, float], ...] = (
    ("user1", 2, 8, 50),
    ("user2", 1, 4, 200),
    ("user3", 8, 2, 50),
    ("user4", 4, 1, 200),
)
"""Table 3: each tenant's application, CPU, memory (GB) and execution time (s); 50 each."""
FALB_APPS_PER_TENANT = 50


class Order(enum.StrEnum):
    """Which waiting application is placed next."""

    fifo = "fifo"
    rrdf = "rrdf"


@dataclass(frozen=True)
class FalbPolicy:
    """One row of Table 4 (and the baseline): an order and a node strategy."""

    name: str
    order: Order
    strategy: Strategy


FALB_POLICIES: tuple[FalbPolicy, ...] = (
    FalbPolicy("YuniKorn", Order.fifo, Strategy.mean_utilization),
    FalbPolicy("FA-YK", Order.rrdf, Strategy.mean_utilization),
    FalbPolicy("FALB-2", Order.rrdf, Strategy.falb2),
    FalbPolicy("FALB-3", Order.rrdf, Strategy.falb3),
    FalbPolicy("k8s-balanced", Order.fifo, Strategy.balanced),
)


@dataclass(frozen=True)
class App:
    """One application: its tenant (index), demand per resource, run time, submission time."""

    tenant: int
    demand: tuple[float, ...]
    run_s: float
    submit_s: float


@dataclass
class FalbRun:
    """What one simulation recorded."""

    makespan_s: float
    """when the last application finished (the total execution time)"""
    starts: list[float]
    """per application (in the input's order), when it started"""
    nodes: list[int]
    """per application, where it ran"""
    gaps: list[float] = field(default_factory=list)
    """at each placement, the chosen node's utilisation gap after it"""
    deviations: list[float] = field(default_factory=list)
    """at each placement, the cluster's largest per-resource deviation after it"""
    rrdf_spread: list[float] = field(default_factory=list)
    """at each placement, the tenants' largest RRDF over their smallest, less 1 (0: equal)"""
    run_s: list[float] = field(default_factory=list)
    """per application (in the input's order), its run time"""

    @property
    def mean_gap(self) -> float:
        return float(np.mean(self.gaps)) if self.gaps else 0.0

    @property
    def max_deviation(self) -> float:
        return float(np.max(self.deviations)) if self.deviations else 0.0

    @property
    def last_start_s(self) -> float:
        """When the application that finished last started: the makespan is it plus its run."""
        ends = [(s + run, s) for s, run in zip(self.starts, self.run_s, strict=True)]
        return max(ends)[1] if ends else 0.0

    @property
    def mean_rrdf_spread(self) -> float:
        """The RRDF spread averaged over the placements made once every tenant had one."""
        finite = [x for x in self.rrdf_spread if math.isfinite(x)]
        return float(np.mean(finite)) if finite else math.inf


def simulate_placement(
    capacity: Sequence[Sequence[float]],
    apps: Sequence[App],
    n_tenants: int,
    policy: FalbPolicy,
    *,
    tie: Tie = Tie.lowest,
    rng: np.random.Generator | None = None,
) -> FalbRun:
    """Run ``apps`` on nodes of ``capacity`` (nodes × resources) under ``policy``. Raises
    ValueError for an application no node could ever hold (it would wait for ever).

    ``tie = random`` needs ``rng``: equally scored nodes (within 1e-12) are drawn from it."""
    if tie == Tie.random and rng is None:
        raise ValueError("tie = random needs a random generator")
    cap = np.asarray(capacity, dtype=np.float64)
    m = cap.shape[1]
    for k, app in enumerate(apps):
        if len(app.demand) != m:
            raise ValueError(f"application {k} asks for {len(app.demand)} resources, not {m}")
        if not np.any(np.all(np.asarray(app.demand) <= cap, axis=1)):
            raise ValueError(f"application {k} fits no node even when the cluster is empty")
    used = np.zeros_like(cap)
    rrdf = [0.0] * n_tenants
    starts = [math.nan] * len(apps)
    nodes = [-1] * len(apps)
    run = FalbRun(0.0, starts, nodes, run_s=[a.run_s for a in apps])
    # events: (time, kind, app); kind 0 = completion before 1 = arrival at the same instant
    events: list[tuple[float, int, int]] = [(a.submit_s, 1, k) for k, a in enumerate(apps)]
    heapq.heapify(events)
    waiting: list[int] = []
    while events:
        now = events[0][0]
        while events and events[0][0] == now:  # everything at this instant, then place
            _, kind, k = heapq.heappop(events)
            if kind == 0:
                used[nodes[k]] -= apps[k].demand
            else:
                waiting.append(k)
        np.maximum(used, 0.0, out=used)  # no -1e-16 left by float sums
        while waiting:
            k = _next(waiting, apps, rrdf, policy.order)
            request = np.asarray(apps[k].demand, dtype=np.float64)
            room = fits(used, cap, request)
            if not room.any():
                break  # head-of-line: it waits for a completion
            criteria = placement_criteria(used, cap, request)
            score, _ = scores(criteria, policy.strategy)
            node = _chosen(np.where(room, score, -np.inf), tie, rng)
            used[node] += request
            waiting.remove(k)
            starts[k], nodes[k] = now, node
            rrdf[apps[k].tenant] += rrdf_charge(request, apps[k].run_s)
            run.gaps.append(float(criteria.utilization_gap[node]))
            run.deviations.append(float(criteria.deviation[node]))
            low = min(rrdf)
            run.rrdf_spread.append(max(rrdf) / low - 1.0 if low > 0 else math.inf)
            heapq.heappush(events, (now + apps[k].run_s, 0, k))
            run.makespan_s = max(run.makespan_s, now + apps[k].run_s)
    return run


def _chosen(score: np.ndarray, tie: Tie, rng: np.random.Generator | None) -> int:
    best = int(np.argmax(score))
    if tie == Tie.lowest or rng is None:
        return best
    tied = np.flatnonzero(score >= score[best] - 1e-12)
    return int(tied[rng.integers(tied.size)]) if tied.size > 1 else best


def _next(waiting: list[int], apps: Sequence[App], rrdf: list[float], order: Order) -> int:
    """The waiting application to place next (see the module docstring)."""
    if order == Order.fifo:
        return min(waiting, key=lambda k: (apps[k].submit_s, k))
    tenants = {apps[k].tenant for k in waiting}
    tenant = min(tenants, key=lambda t: (rrdf[t], t))
    return min(
        (k for k in waiting if apps[k].tenant == tenant), key=lambda k: (apps[k].submit_s, k)
    )


def falb_apps(
    scenario: FalbScenario,
    rng: np.random.Generator,
    *,
    jitter: float = 0.0,
    gap_s: float = 1.0,
    arrival: Arrival = Arrival.interleaved,
) -> list[App]:
    """Table 3's 4 × 50 applications, run times varied by ±``jitter`` (a fraction)."""
    apps = []
    for t, (_name, cpu, mem, run_s) in enumerate(FALB_TENANTS):
        for _ in range(FALB_APPS_PER_TENANT):
            scale = 1.0 + (rng.uniform(-jitter, jitter) if jitter else 0.0)
            apps.append(App(t, (cpu, mem), run_s * scale, 0.0))
    if scenario == FalbScenario.stream:
        interleaved = arrival == Arrival.interleaved
        order = rng.permutation(len(apps)) if interleaved else np.arange(len(apps))
        apps = [
            App(apps[k].tenant, apps[k].demand, apps[k].run_s, i * gap_s)
            for i, k in enumerate(order)
        ]
    return apps


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its 95 % confidence interval (normal approximation)."""

    mean: float
    half_width: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Estimate:
        a = np.asarray(values, dtype=np.float64)
        if a.size < 2:
            return cls(float(a.mean()) if a.size else math.nan, math.nan)
        return cls(float(a.mean()), float(1.96 * a.std(ddof=1) / math.sqrt(a.size)))


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    makespan_s: Estimate
    mean_gap: Estimate
    max_deviation: Estimate
    rrdf_spread: Estimate
    """the tenants' RRDF spread, averaged over the placements made once each had one"""


@dataclass(frozen=True)
class FalbInputs:
    """The choices the paper leaves open, one value each (:func:`falb_runs`)."""

    scenario: FalbScenario
    jitter: float = 0.1
    """run times varied by ±this fraction (0: Table 3's exact times)"""
    arrival: Arrival = Arrival.interleaved
    gap_s: float = 1.0
    """between two arrivals of the stream"""
    tie: Tie = Tie.lowest


def falb_runs(
    inputs: FalbInputs, seed: int, policies: Sequence[FalbPolicy] = FALB_POLICIES
) -> dict[str, FalbRun]:
    """Every policy on the same applications, drawn from ``seed``."""
    capacity = [(cpu, mem) for _n, cpu, mem in FALB_NODES]
    rng = np.random.default_rng(seed)
    apps = falb_apps(
        inputs.scenario, rng, jitter=inputs.jitter, gap_s=inputs.gap_s, arrival=inputs.arrival
    )
    return {
        p.name: simulate_placement(
            capacity, apps, len(FALB_TENANTS), p, tie=inputs.tie,
            rng=np.random.default_rng([seed, 1]),
        )
        for p in policies
    }  # fmt: skip


def falb_experiment(
    inputs: FalbInputs, *, seeds: int = 10, policies: Sequence[FalbPolicy] = FALB_POLICIES
) -> list[PolicyResult]:
    """FALB's experiment on Table 1's nodes and Table 3's tenants, every policy on the same
    applications for each seed (0 … seeds − 1)."""
    per: dict[str, list[FalbRun]] = {p.name: [] for p in policies}
    for seed in range(seeds):
        for name, run in falb_runs(inputs, seed, policies).items():
            per[name].append(run)
    return [
        PolicyResult(
            name,
            Estimate.of([r.makespan_s for r in runs]),
            Estimate.of([r.mean_gap for r in runs]),
            Estimate.of([r.max_deviation for r in runs]),
            Estimate.of([r.mean_rrdf_spread for r in runs]),
        )
        for name, runs in per.items()
    ]
