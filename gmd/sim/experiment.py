"""Many samples of a trace through many policies, on every core: the papers' experiments.

A sample is a random window of the trace, its users dealt to organizations, its processors
split. Each sample runs Ref (the reference of Δψ/p) and every chosen policy, and, when asked,
CloudShare's scoring (every coalition under every policy, waits compared to their Shapley
values). Samples are independent, so they go to a process pool; each draws its randomness
from ``(seed, sample index)`` alone, so results do not depend on the number of workers.

With ``background`` > 0 (CloudShare's Scenario 3, :mod:`gmd.sim.workload`) each user of a
sample is local with that probability, drawn from a stream of its own, ``(seed, sample index,
1)``, so the windows and the organizations' users are those of the same run without background
load. Every sample also records how long it is contended
(:func:`~gmd.sim.measures.overload_s`), for :mod:`gmd.sim.bootstrap`'s orderings.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gmd.sim.coalitions import CoalitionRun, simulate_rand, simulate_ref
from gmd.sim.measures import (
    cloudshare_unfairness,
    coalition_wait_values,
    overload_s,
    pairwise_scores,
    unfairness,
    unit_parts,
    utilities,
    utilization,
    wait_per_org,
)
from gmd.sim.policies import PolicySpec, parse_policy
from gmd.sim.scheduler import Schedule, simulate
from gmd.sim.shapley import shapley_float
from gmd.sim.swf import SwfLog, peak_processors, read_swf
from gmd.sim.workload import (
    Deal,
    Workload,
    assign_users,
    build_workload,
    deal_jobs,
    local_users,
    processor_counts,
)

MAX_REF_ORGS = 12  # 2^12 coalitions: beyond this Ref, the reference of Δψ/p, is impractical


@dataclass(frozen=True)
class ExperimentConfig:
    trace: str
    window_s: int
    samples: int
    n_orgs: int
    policies: tuple[str, ...]
    seed: int = 0
    processors: str = "equal"
    total_processors: int | None = None  # default: the trace's MaxProcs (else its peak use)
    unit_s: int | None = None  # cut jobs into pieces of this length (CloudShare: 3600)
    cloudshare: bool = False  # also score by CloudShare's pairwise wait-time fairness
    org_of_user: dict[int, int] | None = None  # fixed assignment (else random per sample)
    reference: bool = True  # run Ref for Δψ/p (exponential in k; CloudShare scoring needs none)
    background: float = 0.0  # share of each organization's users that are local (Scenario 3)
    deal: Deal = Deal.users  # how the jobs of a sample without a fixed assignment are dealt


@dataclass(frozen=True)
class PolicyOutcome:
    utility: list[float]  # ψ per organization at T
    unfairness: float  # Δψ/p against Ref
    wait_s: float  # total wait of all jobs
    utilization: float
    cloudshare_unfairness: float  # NaN when not scored


@dataclass(frozen=True)
class SampleResult:
    index: int
    start_s: int
    n_jobs: int
    processors: tuple[int, ...]
    ref_parts: int
    shapley: list[float]  # Shapley values of ψ at T from Ref's coalition schedules
    outcomes: dict[str, PolicyOutcome]
    scores: dict[str, int] = field(default_factory=dict)
    overload_s: int = 0  # how long its jobs need more processors than there are (contention)
    background_work: float = 0.0  # local work's share of all work (Scenario 3), 0 without


@dataclass(frozen=True)
class ExperimentResult:
    config: ExperimentConfig
    samples: list[SampleResult]

    @property
    def policies(self) -> list[str]:
        return list(self.samples[0].outcomes) if self.samples else []

    def summary(self) -> list[dict[str, Any]]:
        """One row per policy: mean and standard deviation over samples, CloudShare points."""
        rows = []
        for name in self.policies:
            outs = [s.outcomes[name] for s in self.samples]
            row: dict[str, object] = {"policy": name, "samples": len(outs)}
            for key in ("unfairness", "wait_s", "utilization"):
                vals = np.array([getattr(o, key) for o in outs], dtype=np.float64)
                row[f"{key}_mean"] = _stat(np.nanmean, vals)
                row[f"{key}_std"] = _stat(np.nanstd, vals)
            if self.config.cloudshare:
                score = sum(s.scores.get(name, 0) for s in self.samples)
                opponents = max(len(self.policies) - 1, 1)
                row["score"] = score
                row["score_share"] = score / (opponents * len(self.samples))
            rows.append(row)
        return rows


def _stat(fn: Callable[[np.ndarray], float], vals: np.ndarray) -> float:
    if vals.size == 0 or np.all(np.isnan(vals)):
        return float("nan")
    return float(fn(vals))


def resolve_policies(names: Sequence[str]) -> list[PolicySpec]:
    specs = [parse_policy(n) for n in names]
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"policy {s.name} is listed twice")
        seen.add(s.name)
    return specs


def sample_workloads(config: ExperimentConfig, trace: SwfLog) -> list[Workload]:
    """The samples' workloads, each from its own ``(seed, index)`` random stream."""
    if config.n_orgs < 1:
        raise ValueError(f"organizations = {config.n_orgs}: need at least one")
    if config.samples < 1:
        raise ValueError(f"samples = {config.samples}: need at least one")
    total = config.total_processors or trace.max_procs or peak_processors(trace)
    procs = processor_counts(total, config.n_orgs, config.processors)
    first, last = int(trace.submit_s[0]), int(trace.submit_s[-1])
    if config.window_s > last - first + 1:
        raise ValueError(
            f"window = {config.window_s} s is longer than {config.trace} "
            f"({last - first + 1} s from the first to the last submission)"
        )
    out = []
    for i in range(config.samples):
        rng = np.random.default_rng([config.seed, i])
        for _ in range(1000):
            start = int(rng.integers(first, last - config.window_s + 2))
            lo, hi = np.searchsorted(trace.submit_s, [start, start + config.window_s])
            if hi > lo:
                break
        else:
            raise ValueError(f"{config.trace}: found no window of {config.window_s} s with jobs")
        mapping = config.org_of_user
        job_orgs = None
        if mapping is None:
            deal_seed = int(rng.integers(2**31))
            if config.deal == Deal.users:
                mapping = assign_users(trace.user[lo:hi], config.n_orgs, deal_seed)
            else:
                job_orgs = deal_jobs(trace.user[lo:hi], config.n_orgs, deal_seed, config.deal)
                mapping = {}
        local: set[int] = set()
        if config.background:
            # The sample's own users (a fixed assignment names the whole trace's).
            sample_users = np.unique(trace.user[lo:hi]).tolist()
            local = local_users(sample_users, config.background, [config.seed, i, 1])
        out.append(
            build_workload(
                trace,
                start,
                config.window_s,
                mapping,
                procs,
                unit_s=config.unit_s,
                label=f"sample {i}",
                local=local,
                job_orgs=job_orgs,
            )
        )
    return out


def run_sample(
    index: int,
    workload: Workload,
    policies: Sequence[str],
    seed: int,
    cloudshare: bool,
    reference: bool = True,
) -> SampleResult:
    """Everything measured on one sample (pure: no I/O, deterministic given its arguments)."""
    specs = resolve_policies(policies)
    k = workload.n_orgs
    reference = reference or any(s.name == "Ref" for s in specs)
    bg = workload.background
    if bg is not None and (reference or any(s.is_coalitional for s in specs)):
        raise ValueError(
            "background load: Ref and Rand do not model it; simulate without Ref (--no-ref) "
            "and leave out Ref and Rand"
        )
    if reference and k > MAX_REF_ORGS:
        raise ValueError(
            f"{k} organizations: Ref, the reference of Δψ/p, simulates 2^k coalitions; "
            f"use at most {MAX_REF_ORGS}"
        )
    T = workload.horizon_s
    ref: CoalitionRun | None = None
    psi_ref, parts, shapley = np.zeros(k), 0, [float("nan")] * k
    if reference:
        ref = simulate_ref(workload)
        psi_ref = utilities(ref.grand, T)
        parts = unit_parts(ref.grand, T)
        v = np.zeros(1 << k)
        for c, start in ref.starts.items():
            v[c] = float(utilities(Schedule(workload, "Ref", start, start), T).sum())
        shapley = shapley_float(v, k).tolist()

    outcomes: dict[str, PolicyOutcome] = {}
    for spec in specs:
        coalition_run: CoalitionRun | None = None
        if spec.name == "Ref" and ref is not None:
            coalition_run = ref
            schedule = ref.grand
        elif spec.is_coalitional:
            schedule = simulate_rand(workload, spec.samples, seed=seed).grand
        else:
            schedule = simulate(workload, spec.new_policy(), seed=seed)
        psi = utilities(schedule, T)
        cs = float("nan")
        if cloudshare and coalition_run is not None:
            cs = _cloudshare(workload, schedule, coalition_run.starts)
        elif cloudshare and not spec.is_coalitional:
            starts = {c: _coalition_starts(workload, c, spec, seed) for c in range(1, 1 << k)}
            cs = _cloudshare(workload, schedule, starts)
        outcomes[spec.name] = PolicyOutcome(
            utility=psi.tolist(),
            unfairness=unfairness(psi, psi_ref, parts) if reference else float("nan"),
            wait_s=float(wait_per_org(schedule).sum()),
            utilization=utilization(schedule, T),
            cloudshare_unfairness=cs,
        )
    scores = (
        pairwise_scores({n: o.cloudshare_unfairness for n, o in outcomes.items()})
        if cloudshare
        else {}
    )
    own_work = int(workload.duration.sum())
    local_work = 0 if bg is None else bg.work()
    return SampleResult(
        index, workload.origin_s, workload.n_jobs, workload.processors, parts, shapley,
        outcomes, scores, overload_s(workload),
        local_work / (own_work + local_work) if local_work else 0.0,
    )  # fmt: skip


def _coalition_starts(
    workload: Workload, coalition: int, spec: PolicySpec, seed: int
) -> np.ndarray:
    """Start times of coalition's own schedule, indexed like the whole workload's jobs."""
    sub = simulate(workload.restricted(coalition), spec.new_policy(), seed=seed)
    full = np.full(workload.n_jobs, -1, dtype=np.int64)
    full[((coalition >> workload.org) & 1).astype(bool)] = sub.start
    return full


def _cloudshare(workload: Workload, grand: Schedule, starts: dict[int, np.ndarray]) -> float:
    return cloudshare_unfairness(wait_per_org(grand), coalition_wait_values(workload, starts))


def _run_sample_args(args: tuple) -> SampleResult:
    return run_sample(*args)


def run_experiment(
    config: ExperimentConfig,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    trace: SwfLog | None = None,
) -> ExperimentResult:
    """Run every sample (in parallel when ``workers`` > 1; default: all cores)."""
    if not resolve_policies(config.policies):
        raise ValueError("no policy to simulate: name at least one")
    trace = trace or read_swf(config.trace)
    workloads = sample_workloads(config, trace)
    jobs = [
        (i, w, config.policies, config.seed + i, config.cloudshare, config.reference)
        for i, w in enumerate(workloads)
    ]
    workers = workers or os.cpu_count() or 1
    results: list[SampleResult] = []
    if workers == 1 or len(jobs) == 1:
        for done, job in enumerate(jobs, 1):
            results.append(_run_sample_args(job))
            if progress:
                progress(done, len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            chunk = max(1, math.ceil(len(jobs) / (workers * 4)))
            for done, res in enumerate(pool.map(_run_sample_args, jobs, chunksize=chunk), 1):
                results.append(res)
                if progress:
                    progress(done, len(jobs))
    return ExperimentResult(config, results)
