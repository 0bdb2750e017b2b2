"""The event loop: one coalition of organizations, one policy, jobs replayed in time.

Greedy and FIFO by construction: at every event time, completions free processors, releases
fill queues, then while a processor is free and a job waits the policy names an organization
and that organization's oldest waiting job starts. Ties between organizations go to the one
whose head job was released first, then to the lower index, so a run is reproducible.

Placement is the CloudShare broker's: a job runs on its own organization's free processor when
there is one, otherwise on a free processor drawn at random (seeded). Only DirectContr looks at
placement (it credits the processor's owner); every other measure is placement-free.

Background load (``Workload.background``, CloudShare's Scenario 3) is local jobs that run only
on their organization's processors: at every event time, after completions and releases, each
organization's free processors first go to its waiting local jobs (FIFO), and only then does the
policy hand out what is left. Local jobs are invisible to the policy (it is told of federation
jobs only) and never preempt a federation job already running. The loop ends when every
federation job has started; local jobs still waiting then matter to nobody.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

import numpy as np

from gmd.sim.policies import Policy
from gmd.sim.workload import Workload

_NEVER = 1 << 62
"""A time after every release and end: the loop's "nothing left to happen"."""


@dataclass(frozen=True)
class Schedule:
    """When (``start``, -1 if never) and on whose processor (``owner``) every job ran."""

    workload: Workload
    policy: str
    start: np.ndarray
    owner: np.ndarray
    background_start: np.ndarray | None = None
    """when each local job started (on its organization's processor), -1 if not before every
    federation job had; None without background load"""

    @property
    def end(self) -> np.ndarray:
        return np.where(self.start >= 0, self.start + self.workload.duration, -1)


def simulate(
    workload: Workload,
    policy: Policy,
    *,
    seed: int = 0,
    horizon: int | None = None,
) -> Schedule:
    """Replay ``workload`` under ``policy`` until every job started (or until ``horizon``).

    Longer than the rule on purpose: one loop over the events with all its state in local
    variables, because it runs for every event of every replay (a reproduction replays
    millions), and a helper per step would pay a call and attribute look-ups per event.
    """
    n = workload.n_jobs
    bg = workload.background
    nb = 0 if bg is None else bg.n_jobs
    # Local jobs are numbered n, n + 1, … in the completion heap; a sentinel release ends them.
    bg_release = [_NEVER] if bg is None else [*bg.release.tolist(), _NEVER]
    bg_duration = [] if bg is None else bg.duration.tolist()
    bg_org = [] if bg is None else bg.org.tolist()
    bg_queues: list[deque[int]] = [deque() for _ in range(workload.n_orgs)]
    bg_waiting: set[int] = set()
    bg_start = [-1] * nb
    b = 0
    k = workload.n_orgs
    procs = workload.processors
    total = sum(procs)
    policy.reset(k, [p / total for p in procs])
    rng = random.Random(seed)

    release = workload.release.tolist()
    duration = workload.duration.tolist()
    org_of = workload.org.tolist()
    start = [-1] * n
    owner = [-1] * n
    free = list(procs)
    n_free = total
    queues: list[deque[int]] = [deque() for _ in range(k)]
    waiting: set[int] = set()
    n_waiting = 0
    heap: list[tuple[int, int]] = []  # (end, job)
    keys_of = policy.keys
    started, finished = policy.started, policy.finished
    owners = range(k)
    i = 0
    while i < n or n_waiting:
        t: int = release[i] if i < n else _NEVER
        if bg_release[b] < t:
            t = bg_release[b]
        if heap and heap[0][0] < t:
            t = heap[0][0]
        if t == _NEVER or (horizon is not None and t >= horizon):
            break
        while heap and heap[0][0] == t:
            _, j = heapq.heappop(heap)
            if j >= n:  # a local job: its processor goes back to its organization
                free[bg_org[j - n]] += 1
                n_free += 1
                continue
            free[owner[j]] += 1
            n_free += 1
            finished(t, org_of[j], owner[j], start[j], release[j])
        while i < n and release[i] == t:
            o = org_of[i]
            queues[o].append(i)
            waiting.add(o)
            n_waiting += 1
            i += 1
        if nb:
            while bg_release[b] == t:
                bg_queues[bg_org[b]].append(b)
                bg_waiting.add(bg_org[b])
                b += 1
            for o in list(bg_waiting):
                q = bg_queues[o]
                while q and free[o]:
                    lj = q.popleft()
                    bg_start[lj] = t
                    free[o] -= 1
                    n_free -= 1
                    heapq.heappush(heap, (t + bg_duration[lj], n + lj))
                if not q:
                    bg_waiting.discard(o)
        while n_free and n_waiting:
            if len(waiting) == 1:
                o = next(iter(waiting))
            else:
                keys = keys_of(t)
                o = min(waiting, key=lambda x: (keys[x], release[queues[x][0]], x))
            q = queues[o]
            j = q.popleft()
            if not q:
                waiting.discard(o)
            n_waiting -= 1
            if free[o]:
                w = o
            else:
                pick = rng.randrange(n_free)
                for w in owners:
                    if pick < free[w]:
                        break
                    pick -= free[w]
            free[w] -= 1
            n_free -= 1
            start[j] = t
            owner[j] = w
            heapq.heappush(heap, (t + duration[j], j))
            started(t, o, w, duration[j], release[j])
    return Schedule(
        workload,
        policy.name,
        np.array(start, dtype=np.int64),
        np.array(owner, dtype=np.int64),
        None if bg is None else np.array(bg_start, dtype=np.int64),
    )
