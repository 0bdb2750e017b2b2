"""Ref and Rand: schedules that need the schedules of other coalitions, simulated in lockstep.

Ref (SPAA Fig. 1 and 3) keeps a schedule for every one of the 2^k coalitions. At each event
time coalitions decide in order of size, so that when coalition C decides, every proper subset
has already decided and its value at t + 1 is known; C then gives each free processor to the
member with the largest Shapley contribution − utility. Starting a job adds Δ = 1 (its first
unit part, valued at t + 1) to v(C) and to the member's utility, and — since only v(C) moved —
Δ/|C| to every member's contribution (the update of SPAA's procedure Distance).

All coalitions share one release stream and one completion heap, and each coalition's value is
kept as polynomial sums in T (``utility.py``) stored in arrays indexed by coalition mask, so
a decision costs one vectorized pass over C's 2^|C| subsets.

Rand (SPAA Fig. 6) keeps, for each organization o, N coalitions S of o's predecessors in random
orders and S ∪ {o}, schedules them with a plain greedy (FCFS), and lets the grand coalition use
the mean marginal contribution as o's contribution. Its guarantee holds for unit jobs only;
with real job sizes it is the paper's heuristic.

Neither models background load (Scenario 3's local jobs): they would need every coalition's
placement per organization, which Ref's books do without. A workload with background is refused.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from gmd.sim.scheduler import Schedule
from gmd.sim.shapley import SubsetTables, sampled_predecessors
from gmd.sim.workload import Workload

_TIE = 1e-9


@dataclass(frozen=True)
class CoalitionRun:
    """The grand coalition's schedule and the start times of every simulated coalition."""

    workload: Workload
    grand: Schedule
    starts: dict[int, np.ndarray]  # coalition mask -> start per job (-1: not a member / never)


class _LocalTables:
    """Shapley tables of one coalition with subsets numbered locally (0..2^|C|−1)."""

    __slots__ = ("members", "rows", "tables")

    def __init__(self, coalition: int, n: int) -> None:
        self.rows = np.array([s for s in range(1 << n) if s & ~coalition == 0], dtype=np.int64)
        local = {int(s): i for i, s in enumerate(self.rows)}
        self.tables = SubsetTables(coalition, n)
        self.members = self.tables.members
        remap = np.vectorize(local.__getitem__, otypes=[np.int64])
        self.tables.with_ = remap(self.tables.with_)
        self.tables.without = remap(self.tables.without)


def simulate_ref(workload: Workload, *, horizon: int | None = None) -> CoalitionRun:
    """Algorithm Ref on every coalition (exact Shapley-fair for the utility ψ)."""
    k = workload.n_orgs
    coalitions = list(range(1, 1 << k))
    return _Engine(workload, coalitions, {c: "ref" for c in coalitions}, horizon=horizon).run()


def simulate_rand(
    workload: Workload, samples: int, *, seed: int = 0, horizon: int | None = None
) -> CoalitionRun:
    """Algorithm Rand with ``samples`` sampled predecessor coalitions per organization."""
    k = workload.n_orgs
    grand = (1 << k) - 1
    preds = sampled_predecessors(k, samples, np.random.default_rng(seed))
    needed = {s for row in preds for s in row} | {
        s | 1 << o for o, row in enumerate(preds) for s in row
    }
    rules = {c: "fcfs" for c in needed if c}
    rules[grand] = "rand"
    return _Engine(workload, sorted(rules), rules, horizon=horizon, rand_preds=preds).run()


class _Engine:
    def __init__(
        self,
        workload: Workload,
        coalitions: list[int],
        rules: dict[int, str],
        *,
        horizon: int | None,
        rand_preds: list[list[int]] | None = None,
    ) -> None:
        if workload.background is not None and workload.background.n_jobs:
            raise ValueError(
                "Ref and Rand do not model background load: simulate it with other policies "
                "and without Ref (--no-ref)"
            )
        self.w = workload
        self.k = workload.n_orgs
        self.coalitions = sorted(coalitions, key=lambda c: (c.bit_count(), c))
        self.rules = rules
        self.horizon = horizon
        self.preds = rand_preds

    def run(self) -> CoalitionRun:
        """Replay the workload once for every coalition at the same time.

        Longer than the rule on purpose: one loop over the events with all its state in local
        variables and arrays, because it runs for every event of every coalition's replay, and
        a helper per step would pay a call and attribute look-ups per event.
        """
        w, k = self.w, self.k
        n = w.n_jobs
        size = 1 << k
        release = w.release.tolist()
        duration = w.duration.tolist()
        org_of = w.org.tolist()
        org_jobs: list[list[int]] = [[] for _ in range(k)]
        for j, o in enumerate(org_of):
            org_jobs[o].append(j)
        released = [0] * k

        # Doubled ψ books per (coalition, org): value2(T) = A2·T + B + R·T² + (R−2·S1)·T + S2 − S1
        a2 = np.zeros((size, k))
        b = np.zeros((size, k))
        r = np.zeros((size, k))
        s1 = np.zeros((size, k))
        s2 = np.zeros((size, k))

        procs = w.processors
        free = [0] * size
        for c in self.coalitions:
            free[c] = sum(p for o, p in enumerate(procs) if c >> o & 1)
        ptr = [[0] * k for _ in range(size)]
        waiting = [0] * size
        total_waiting = 0
        starts = {c: np.full(n, -1, dtype=np.int64) for c in self.coalitions}
        rank = {c: i for i, c in enumerate(self.coalitions)}
        containing = [[c for c in self.coalitions if c >> o & 1] for o in range(k)]
        tables: dict[int, _LocalTables] = {}
        rand = self._rand_tables()

        heap: list[tuple[int, int, int]] = []
        inf = float("inf")
        i = 0
        while i < n or total_waiting:
            t = release[i] if i < n else inf
            if heap and heap[0][0] < t:
                t = heap[0][0]
            if t == inf or (self.horizon is not None and t >= self.horizon):
                break
            active: set[int] = set()
            while heap and heap[0][0] == t:
                _, c, j = heapq.heappop(heap)
                o, s = org_of[j], t - duration[j]
                p = duration[j]
                free[c] += 1
                r[c, o] -= 1
                s1[c, o] -= s
                s2[c, o] -= s * s
                a2[c, o] += 2 * p
                b[c, o] -= p * (s + t - 1)
                if waiting[c]:
                    active.add(c)
            while i < n and release[i] == t:
                o = org_of[i]
                released[o] += 1
                for c in containing[o]:
                    waiting[c] += 1
                    if free[c]:
                        active.add(c)
                total_waiting += len(containing[o])
                i += 1
            at = t + 1
            for c in sorted(active, key=rank.__getitem__):
                rule = self.rules[c]
                members = [o for o in range(k) if c >> o & 1]
                cptr = ptr[c]
                if rule == "fcfs":
                    d = None
                else:
                    tab = None
                    if rule == "ref":
                        tab = tables.get(c)
                        if tab is None:
                            tab = tables[c] = _LocalTables(c, k)
                        rows = tab.rows
                    else:
                        assert rand is not None  # made above for every "rand" coalition
                        rows = rand[0]
                    v2 = (
                        a2[rows] * at
                        + b[rows]
                        + r[rows] * (at * at + at)
                        - s1[rows] * (2 * at + 1)
                        + s2[rows]
                    )
                    own = v2[-1] if rule == "ref" else v2[rows == c][0]
                    if tab is not None:
                        phi = tab.tables.values(v2.sum(axis=1))
                        d = dict(zip(members, (phi - own[members]).tolist(), strict=True))
                        bump = {o: 2.0 / len(members) for o in members}
                    else:
                        assert rand is not None
                        vs = v2.sum(axis=1)
                        phi = (vs[rand[1]] - vs[rand[2]]).mean(axis=1)
                        d = dict(zip(members, (phi - own[members]).tolist(), strict=True))
                        bump = dict(zip(members, rand[3], strict=False))
                while free[c] and waiting[c]:
                    cands = [o for o in members if cptr[o] < released[o]]
                    if d is None:
                        o = min(cands, key=lambda x: (release[org_jobs[x][cptr[x]]], x))
                    else:
                        best = max(d[x] for x in cands)
                        eps = _TIE * (1.0 + abs(best))
                        o = min(
                            (x for x in cands if d[x] >= best - eps),
                            key=lambda x: (release[org_jobs[x][cptr[x]]], x),
                        )
                        d[o] -= 2.0
                        for x in members:
                            d[x] += bump[x]
                    j = org_jobs[o][cptr[o]]
                    cptr[o] += 1
                    waiting[c] -= 1
                    total_waiting -= 1
                    free[c] -= 1
                    starts[c][j] = t
                    r[c, o] += 1
                    s1[c, o] += t
                    s2[c, o] += t * t
                    heapq.heappush(heap, (t + duration[j], c, j))
        grand = (1 << k) - 1
        name = "Ref" if self.preds is None else f"Rand:{len(self.preds[0])}"
        schedule = Schedule(w, name, starts[grand], np.full(n, -1, dtype=np.int64))
        return CoalitionRun(w, schedule, starts)

    def _rand_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]] | None:
        """Rows read by Rand's grand coalition and, per org, local indices of S ∪ {o} and S."""
        if self.preds is None:
            return None
        k = self.k
        grand = (1 << k) - 1
        masks = sorted(
            {s for row in self.preds for s in row}
            | {grand}
            | {s | 1 << o for o, row in enumerate(self.preds) for s in row}
        )
        local = {m: i for i, m in enumerate(masks)}
        with_ = np.array([[local[s | 1 << o] for s in row] for o, row in enumerate(self.preds)])
        without = np.array([[local[s] for s in row] for row in self.preds])
        # Only v(grand) moves when the grand coalition starts a job: o's estimate moves by the
        # share of its samples whose S ∪ {o} is the grand coalition (o sampled last).
        full = [
            2.0 * sum(s | 1 << o == grand for s in row) / len(row)
            for o, row in enumerate(self.preds)
        ]
        return np.array(masks, dtype=np.int64), with_, without, full
