"""From a trace to what the scheduler replays: organizations, their processors, their jobs.

The papers' preprocessing lives here: a time window cut from the log, users mapped onto
organizations, processors split between organizations, a q-processor job replaced by q
sequential copies (the model has sequential jobs only) and, optionally, every job cut into
unit-length pieces (CloudShare cuts hour-long pieces so that every greedy schedule has the same
total wait time and only its distribution between organizations differs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gmd.sim.swf import Trace

PROCESSOR_MODES: tuple[str, ...] = ("equal", "zipf")


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
    trace: Trace,
    start_s: int,
    window_s: int,
    org_of_user: Mapping[int, int],
    processors: tuple[int, ...],
    *,
    unit_s: int | None = None,
    label: str = "",
) -> Workload:
    """The jobs submitted in ``[start_s, start_s + window_s)``, split into sequential pieces."""
    if window_s < 1:
        raise ValueError(f"window = {window_s} s: must be at least 1 s")
    if unit_s is not None and unit_s < 1:
        raise ValueError(f"unit = {unit_s} s: must be at least 1 s")
    lo, hi = np.searchsorted(trace.submit_s, [start_s, start_s + window_s], side="left")
    users = trace.user[lo:hi]
    orgs = np.empty(hi - lo, dtype=np.int64)
    for i, u in enumerate(users.tolist()):
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
    )
