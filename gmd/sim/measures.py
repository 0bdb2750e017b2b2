"""What a schedule is judged by: utilities, unfairness against Ref, CloudShare's scores, waits.

All pure: schedules and numbers in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gmd.sim.scheduler import Schedule
from gmd.sim.shapley import shapley_float
from gmd.sim.utility import schedule_utility
from gmd.sim.workload import Workload


def utilities(schedule: Schedule, at: int | None = None, kind: str = "psi") -> np.ndarray:
    """Each organization's utility at ``at`` (default: the workload's horizon T)."""
    w = schedule.workload
    at = w.horizon_s if at is None else at
    return schedule_utility(w.release, schedule.start, w.duration, w.org, w.n_orgs, at, kind)


def unit_parts(schedule: Schedule, at: int | None = None) -> int:
    """How many unit parts of jobs completed by ``at``: the p of SPAA's Δψ/p."""
    return int(utilities(schedule, at, "psi_double_prime").sum())


def unfairness(psi: np.ndarray, psi_ref: np.ndarray, parts_ref: int) -> float:
    """SPAA's Δψ/p: Manhattan distance to Ref's utilities per unit part Ref completed.

    It reads as the average unjustified delay (or speed-up) of a unit part, in time units.
    """
    if parts_ref <= 0:
        return float("nan")
    return float(np.abs(np.asarray(psi) - np.asarray(psi_ref)).sum() / parts_ref)


def wait_per_org(schedule: Schedule) -> np.ndarray:
    """Total wait (start − release) of each organization's jobs; every job must have started."""
    w = schedule.workload
    if np.any(schedule.start < 0):
        j = int(np.argmax(schedule.start < 0))
        raise ValueError(f"{schedule.policy}: job {j} never started; wait time is undefined")
    return np.bincount(w.org, weights=schedule.start - w.release, minlength=w.n_orgs)


def utilization(schedule: Schedule, at: int | None = None) -> float:
    """Busy processor time over ``[0, at)`` divided by the processors' total time."""
    w = schedule.workload
    at = w.horizon_s if at is None else at
    ran = schedule.start >= 0
    s = np.minimum(schedule.start[ran], at)
    e = np.minimum(schedule.start[ran] + w.duration[ran], at)
    return float((e - s).sum() / (sum(w.processors) * at))


def coalition_wait_values(workload: Workload, starts: Mapping[int, np.ndarray]) -> np.ndarray:
    """CloudShare's characteristic function: total wait of each coalition's own schedule."""
    v = np.zeros(1 << workload.n_orgs)
    for c, start in starts.items():
        members = ((c >> workload.org) & 1).astype(bool)
        if np.any(start[members] < 0):
            raise ValueError(f"coalition {c:#b}: a job never started; run to completion")
        v[c] = float((start[members] - workload.release[members]).sum())
    return v


def cloudshare_unfairness(wait_grand: np.ndarray, coalition_waits: np.ndarray) -> float:
    """Distance (Manhattan) between the grand schedule's waits and their Shapley values."""
    phi = shapley_float(coalition_waits, wait_grand.shape[0])
    return float(np.abs(wait_grand - phi).sum())


def pairwise_scores(unfair: Mapping[str, float]) -> dict[str, int]:
    """CloudShare Table 1: a point each time a policy is strictly fairer than another one."""
    scores = {name: 0 for name in unfair}
    names = [n for n, u in unfair.items() if not np.isnan(u)]
    for a in names:
        for b in names:
            if a != b and unfair[a] < unfair[b]:
                scores[a] += 1
    return scores


def overload_s(workload: Workload) -> int:
    """Seconds during which the jobs, each started at its release, would need more processors
    than there are: how long a sample is overloaded (its background load included). A sample
    is *contended* (:func:`gmd.sim.command.is_contended`) when it is overloaded and some
    federation job did wait.

    Policy-free, and computed from the workload alone: until the first such moment every greedy
    schedule starts every job at its release, so policies can only differ after it. Without
    background load a sample with none is one where no job waits under any greedy policy, and
    every measure of fairness is the same for all of them. (With background load a local job may
    wait for its own organization's processors while others' are free, and delay the federation
    later, rarely; and an overload of local jobs alone makes no federation job wait.) It runs
    past the window's end when the window's last jobs do, as their waits do.
    """
    release, duration = [workload.release], [workload.duration]
    if workload.background is not None:
        release.append(workload.background.release)
        duration.append(workload.background.duration)
    start = np.concatenate(release)
    if start.size == 0:
        return 0
    times = np.concatenate([start, start + np.concatenate(duration)])
    deltas = np.concatenate([np.ones(start.size, np.int64), -np.ones(start.size, np.int64)])
    order = np.lexsort((deltas, times))  # at equal times, ends first: a freed processor is reused
    times, running = times[order], np.cumsum(deltas[order])
    over = running[:-1] > sum(workload.processors)
    return int((np.diff(times)[over]).sum())


def idle_while_waiting(schedule: Schedule) -> int | None:
    """The first time a processor idled while a released job waited, or None (greedy)."""
    w = schedule.workload
    start, end = schedule.start, schedule.end
    ran = start >= 0
    times = np.concatenate([w.release, start[ran], start[ran], end[ran]])
    d_wait = np.concatenate([np.ones(w.n_jobs), -np.ones(ran.sum()), np.zeros(2 * ran.sum())])
    d_run = np.concatenate([np.zeros(w.n_jobs), np.zeros(ran.sum()), np.ones(ran.sum())])
    d_run = np.concatenate([d_run, -np.ones(ran.sum())])
    order = np.argsort(times, kind="stable")
    times, d_wait, d_run = times[order], np.cumsum(d_wait[order]), np.cumsum(d_run[order])
    last = np.r_[times[1:] != times[:-1], True]  # state after every change at that time
    bad = last & (d_wait > 0) & (d_run < sum(w.processors))
    return int(times[bad][0]) if bad.any() else None


def fifo_violation(schedule: Schedule) -> int | None:
    """A job that started before an earlier-listed job of its organization, or None."""
    w = schedule.workload
    for o in range(w.n_orgs):
        idx = np.flatnonzero(w.org == o)
        s = schedule.start[idx].astype(np.float64)
        s[s < 0] = np.inf
        bad = np.flatnonzero(np.diff(s) < 0)
        if bad.size:
            return int(idx[bad[0] + 1])
    return None
