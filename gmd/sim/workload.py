"""From a trace to what the scheduler replays: organizations, their processors, their jobs.

The papers' preprocessing lives here: a time window cut from the log, users mapped onto
organizations, processors split between organizations, a q-processor job replaced by q
sequential copies (the model has sequential jobs only) and, optionally, every job cut into
unit-length pieces (CloudShare cuts hour-long pieces so that every greedy schedule has the same
total wait time and only its distribution between organizations differs).

Background load (CloudShare's Scenario 3: "users local to each CSP generating background load";
"the amount of contributed resources changes dynamically") is the jobs of *local* users: each
runs only on its own organization's processors, is not the federation's (no policy sees it, no
measure counts it) and takes those processors first, so what an organization contributes is
what its local users leave. The paper says no more; the choices left open are ours:

- which users are local: each user of a sample, with a fixed probability (:func:`local_users`);
  their jobs, as the trace has them, are the background of the organization they are dealt to;
- the local scheduler is FIFO and comes first: at every event, an organization's free
  processors go to its waiting local jobs before the federation's policy names anyone;
- no preemption: a federation job already running on a processor keeps it, so a local job may
  wait for its own processors (a non-preemptive cluster that lends out its idle nodes);
- local jobs keep their real length (split per processor, never cut into ``unit_s`` pieces):
  the cut only serves to make the federation's total wait schedule-independent, and cutting the
  background would make it wider and shorter than the trace's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from gmd.sim.swf import SwfLog

PROCESSOR_MODES: tuple[str, ...] = ("equal", "zipf")


@dataclass(frozen=True)
class Background:
    """Local jobs: they run only on their organization's processors, before the federation's.

    Sequential, in release order, times in the window's seconds, like :class:`Workload`'s jobs.
    """

    release: np.ndarray  # int64, non-decreasing
    duration: np.ndarray  # int64, >= 1
    org: np.ndarray  # int64: whose processors, and only theirs

    def __post_init__(self) -> None:
        n = self.release.shape[0]
        if self.duration.shape != (n,) or self.org.shape != (n,):
            raise ValueError("background: release, duration and org need one entry per job")
        if n and (np.any(np.diff(self.release) < 0) or self.duration.min() < 1):
            raise ValueError("background jobs must be in order of release and last >= 1 s")

    @property
    def n_jobs(self) -> int:
        return int(self.release.shape[0])

    def work(self) -> int:
        """Processor-seconds of local work."""
        return int(self.duration.sum())

    def restricted(self, members: int) -> Background:
        keep = ((members >> self.org) & 1).astype(bool)
        return Background(self.release[keep], self.duration[keep], self.org[keep])


@dataclass(frozen=True)
class Workload:
    """Sequential jobs in release order; times are seconds since the window's start.

    ``horizon_s`` is the papers' T, the moment at which utilities are compared (the end of the
    window). Jobs of one organization start in the order they appear here (FIFO).
    """

    release: np.ndarray  # int64, non-decreasing
    duration: np.ndarray  # int64, >= 1
    org: np.ndarray  # int64 in [0, n_orgs)
    processors: tuple[int, ...]  # per organization
    horizon_s: int
    origin_s: int = 0  # the window's start in the trace's own clock
    label: str = ""
    background: Background | None = None  # local jobs (Scenario 3); None: the federation's only

    def __post_init__(self) -> None:
        n = self.release.shape[0]
        if self.duration.shape != (n,) or self.org.shape != (n,):
            raise ValueError("release, duration and org must have one entry per job")
        if not self.processors or min(self.processors) < 0 or sum(self.processors) < 1:
            raise ValueError(f"processors = {self.processors}: need at least one in total")
        if n:
            if np.any(np.diff(self.release) < 0):
                raise ValueError("jobs must be given in order of release")
            if self.duration.min() < 1:
                bad = int(np.argmin(self.duration))
                raise ValueError(f"job {bad} has duration {int(self.duration[bad])} < 1")
            if self.org.min() < 0 or self.org.max() >= self.n_orgs:
                bad = int(np.argmax((self.org < 0) | (self.org >= self.n_orgs)))
                raise ValueError(f"job {bad} belongs to organization {int(self.org[bad])}")
        bg = self.background
        if bg is not None and bg.n_jobs and (bg.org.min() < 0 or bg.org.max() >= self.n_orgs):
            raise ValueError(f"a background job belongs to no organization of {self.processors}")

    @property
    def n_orgs(self) -> int:
        return len(self.processors)

    @property
    def n_jobs(self) -> int:
        return int(self.release.shape[0])

    def restricted(self, members: int) -> Workload:
        """The sub-workload of a coalition (a bit mask of organizations): its jobs, its machines.

        Organizations keep their indices so that per-organization results line up.
        """
        keep = ((members >> self.org) & 1).astype(bool)
        procs = tuple(p if members >> o & 1 else 0 for o, p in enumerate(self.processors))
        return Workload(
            self.release[keep],
            self.duration[keep],
            self.org[keep],
            procs,
            self.horizon_s,
            self.origin_s,
            self.label,
            None if self.background is None else self.background.restricted(members),
        )


def processor_counts(total: int, n_orgs: int, mode: str = "equal") -> tuple[int, ...]:
    """Split ``total`` processors: equally, or by Zipf's law (∝ 1/rank), each getting at least one.

    At least one each: an organization without a machine could never run its jobs alone, and
    its coalition values (hence Shapley values and waits) would be undefined.
    """
    if n_orgs < 1:
        raise ValueError(f"organizations = {n_orgs}: need at least one")
    if total < n_orgs:
        raise ValueError(f"{total} processors cannot give each of {n_orgs} organizations one")
    if mode == "equal":
        weights = np.ones(n_orgs)
    elif mode == "zipf":
        weights = 1.0 / np.arange(1, n_orgs + 1)
    else:
        raise ValueError(f"processors = {mode!r}; choose one of {', '.join(PROCESSOR_MODES)}")
    spare = total - n_orgs
    exact = weights / weights.sum() * spare
    counts = np.floor(exact).astype(int)
    # Largest remainder, earlier organizations first on ties, so the split is deterministic.
    for i in np.argsort(-(exact - counts), kind="stable")[: spare - int(counts.sum())]:
        counts[i] += 1
    return tuple(int(c) + 1 for c in counts)


def assign_users(users: np.ndarray, n_orgs: int, seed: int) -> dict[int, int]:
    """A uniformly random balanced assignment of the given users to organizations.

    Balanced (shuffled, then dealt round-robin) rather than independent draws, so that no
    organization of a small sample ends up without users by chance.
    """
    distinct = np.unique(users)
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(distinct)
    return {int(u): i % n_orgs for i, u in enumerate(shuffled)}


class Deal(StrEnum):
    """How a sample's jobs are dealt to organizations (SPAA: "we uniformly distributed the user
    identifiers between the organizations"; it also tried jobs dealt uniformly)."""

    users = "users"
    """each user to an organization, shuffled then dealt round-robin (balanced)"""
    independent_users = "independent-users"
    """each user to an organization drawn uniformly and independently"""
    jobs = "jobs"
    """each job to an organization, shuffled then dealt round-robin, whoever submitted it"""


def deal_jobs(users: np.ndarray, n_orgs: int, seed: int, deal: Deal) -> np.ndarray:
    """One organization per job of ``users`` (the window's jobs' users), as ``deal`` says."""
    rng = np.random.default_rng(seed)
    if deal == Deal.jobs:
        return rng.permutation(len(users)) % n_orgs
    distinct = np.unique(users)
    if deal == Deal.independent_users:
        org_of = dict(
            zip(distinct.tolist(), rng.integers(0, n_orgs, distinct.size).tolist(), strict=True)
        )
    else:
        org_of = assign_users(users, n_orgs, seed)
    return np.array([org_of[int(u)] for u in users.tolist()], dtype=np.int64)


def local_users(users: Collection[int], fraction: float, seed: int | Sequence[int]) -> set[int]:
    """Scenario 3's local users: each of ``users`` independently with probability ``fraction``.

    Independent draws rather than a fixed count per organization: a sample's organizations
    often have one or two users, and any rounding of "half of one user" would make all of them
    local (or none); a draw per user keeps the expected share ``fraction`` everywhere.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"background = {fraction}: the share of local users must be in [0, 1)")
    ordered = sorted(int(u) for u in users)
    draws = np.random.default_rng(seed).random(len(ordered))
    return {u for u, x in zip(ordered, draws.tolist(), strict=True) if x < fraction}


def read_assignment(path: str | Path) -> tuple[dict[int, int], list[str]]:
    """A user → organization file: one ``USER ORGANIZATION`` pair per line, ``#`` comments.

    Organizations are numbered in the order they first appear; their names are returned too.
    """
    path = Path(path)
    mapping: dict[int, int] = {}
    names: list[str] = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the user assignment {path}: {exc}") from exc
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{lineno}: expected 'USER ORGANIZATION', found {raw!r}")
        try:
            user = int(parts[0])
        except ValueError:
            raise ValueError(f"{path}:{lineno}: user {parts[0]!r} is not an integer id") from None
        if user in mapping:
            raise ValueError(f"{path}:{lineno}: user {user} is assigned twice")
        if parts[1] not in names:
            names.append(parts[1])
        mapping[user] = names.index(parts[1])
    if not mapping:
        raise ValueError(f"{path}: no user assignments")
    return mapping, names


def build_workload(
    trace: SwfLog,
    start_s: int,
    window_s: int,
    org_of_user: Mapping[int, int],
    processors: tuple[int, ...],
    *,
    unit_s: int | None = None,
    label: str = "",
    local: Collection[int] = (),
    job_orgs: np.ndarray | None = None,
) -> Workload:
    """The jobs submitted in ``[start_s, start_s + window_s)``, split into sequential pieces.

    Jobs of the users in ``local`` become the background load (never cut into pieces).
    ``job_orgs`` (one organization per job of the window) deals jobs rather than users.
    """
    if window_s < 1:
        raise ValueError(f"window = {window_s} s: must be at least 1 s")
    if unit_s is not None and unit_s < 1:
        raise ValueError(f"unit = {unit_s} s: must be at least 1 s")
    lo, hi = np.searchsorted(trace.submit_s, [start_s, start_s + window_s], side="left")
    users = trace.user[lo:hi]
    orgs = np.empty(hi - lo, dtype=np.int64)
    if job_orgs is not None:
        if len(job_orgs) != hi - lo:
            raise ValueError(f"{len(job_orgs)} organizations for the window's {hi - lo} jobs")
        orgs[:] = job_orgs
    for i, u in enumerate(users.tolist() if job_orgs is None else ()):
        o = org_of_user.get(u)
        if o is None:
            raise ValueError(
                f"{trace.path}: user {u} (job {int(trace.job_id[lo + i])}) has no organization"
            )
        orgs[i] = o
    if orgs.size and orgs.max() >= len(processors):
        raise ValueError(
            f"the user assignment names {int(orgs.max()) + 1} organizations, "
            f"but processors are given for {len(processors)}"
        )
    copies = trace.processors[lo:hi]
    is_local = np.isin(users, np.fromiter(local, dtype=np.int64, count=len(local)))
    background = None
    if local:
        lc = np.where(is_local, copies, 0)
        background = Background(
            np.repeat(trace.submit_s[lo:hi] - start_s, lc).astype(np.int64),
            np.repeat(trace.run_s[lo:hi], lc).astype(np.int64),
            np.repeat(orgs, lc).astype(np.int64),
        )
        copies = np.where(is_local, 0, copies)
    release = np.repeat(trace.submit_s[lo:hi] - start_s, copies)
    duration = np.repeat(trace.run_s[lo:hi], copies)
    org = np.repeat(orgs, copies)
    if unit_s is not None:
        pieces = -(-duration // unit_s)
        release = np.repeat(release, pieces)
        org = np.repeat(org, pieces)
        duration = np.full(release.shape, unit_s, dtype=np.int64)
    return Workload(
        release.astype(np.int64),
        duration.astype(np.int64),
        org.astype(np.int64),
        tuple(int(p) for p in processors),
        int(window_s),
        int(start_s),
        label,
        background,
    )
