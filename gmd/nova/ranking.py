"""FALB's ranking of Nova's candidate hosts for one request, from gmd's measured utilisation:
the weigher's arithmetic, kept free of Nova so that it is tested and benchmarked without it.

gmd's answer (``GET /v1/hosts/utilization``) is read once per fetch into a :class:`Cluster`
(every host gmd measured: its capacity and utilisation of CPU and memory); each request then
costs one vectorised pass over the cluster (:func:`rank`). The answer is another service's:
anything in it that is not a finite, non-negative figure (a capacity of 0 included) leaves
that host out as unknown, and a document that is not one at all raises :class:`BadAnswer`,
which the weigher treats as gmd being down.

**Two resources, CPU and memory**, as FALB's: a flavor states what a server may use of both,
and nothing of disk or network rates, so those would only weigh in what other servers did.

**The request's expected use is its flavor**: its vCPUs (times the CPU cap gmd puts on the
project's VMs at its level, when caps are applied: a capped VM cannot use more) and its
memory. Not what the project's VMs of that flavor used lately: a new server's use is unknown
until it runs, a project's past idling says nothing of its next workload (a batch project
boots idle and then spins), and ranking a project by its own past use would reward a project
for keeping its servers idle until they are placed. The flavor is what the project may use,
and the cap what gmd will let it.

**Candidates gmd has not measured** (a new compute host, one whose agent is down) are ranked
from Nova's own view of them, their allocations over their capacity: a new, empty host looks
empty, as it is. One with no capacity at all is not ranked (:data:`UNRANKED`).

**The deviation (Eq. 4) is over the whole cluster**, every host gmd measured and every
candidate, as the paper's is over all nodes; TOPSIS then ranks the candidates alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gmd import GmdError
from gmd.fairness.placement import Criteria, Criterion, Strategy, placement_criteria, scores
from gmd.fairness.topsis import Topsis

MIB = 1 << 20
RESOURCES = ("cpu", "memory")
"""What the ranking weighs, in the order of every per-resource column here."""
CAPACITY = ("cpu_cores", "memory_bytes")
"""The capacity gmd's answer gives for each of :data:`RESOURCES`."""
UNRANKED = 0.0
"""The weight of a candidate that cannot be ranked (neither gmd nor Nova knows its size)."""


class BadAnswer(GmdError, ValueError):
    """gmd's answer is not the document the route promises."""


@dataclass(frozen=True)
class Cluster:
    """Every host gmd measured: ``used`` and ``capacity`` are hosts × :data:`RESOURCES`, in
    cores and bytes."""

    index: Mapping[str, int]
    used: np.ndarray
    capacity: np.ndarray
    intervals: tuple[int, ...]
    ignored: tuple[str, ...] = ()
    """hosts whose figures were not finite non-negative numbers (left out)"""

    @property
    def size(self) -> int:
        return len(self.index)


@dataclass(frozen=True)
class Project:
    """The requesting project as gmd sees it."""

    id: str
    level: int = 0
    cpu_cap_fraction: float | None = None


MAX_FIGURE = {"cpu_cores": 1e7, "memory_bytes": 2.0**70, "share": 100.0}
"""The largest figure any host has (the daemon's own bounds: ``daemon.max_host_cores`` at
most 1e7, memory at most 2^70 bytes; a utilisation share past 100× its capacity is no
measurement): beyond, FALB's squares and sums overflow, and the host is left out."""


def _figure(value: object, most: float = math.inf) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) and 0 <= f <= most else None


def read_cluster(document: object) -> Cluster:
    """The cluster in gmd's answer; :class:`BadAnswer` when it is not that document."""
    if not isinstance(document, Mapping):
        raise BadAnswer(f"the answer is a {type(document).__name__}, not a JSON object")
    hosts = document.get("hosts")
    intervals = document.get("intervals", [])
    if not isinstance(hosts, Mapping) or not isinstance(intervals, list):
        raise BadAnswer("the answer has no 'hosts' object or no 'intervals' list")
    names: list[str] = []
    ignored: list[str] = []
    rows: list[tuple[float, float, float, float]] = []
    for name, entry in hosts.items():
        row = _host_row(entry)
        if row is None:
            ignored.append(str(name)[:255])
            continue
        names.append(str(name))
        rows.append(row)
    figures = np.array(rows, dtype=float).reshape(len(rows), 4)
    capacity = figures[:, 2:]
    used = figures[:, :2] * capacity
    starts = tuple(int(s) for s in intervals if isinstance(s, int) and not isinstance(s, bool))
    return Cluster(
        {n: i for i, n in enumerate(names)}, used, capacity, starts, tuple(sorted(ignored))
    )


def _host_row(entry: object) -> tuple[float, float, float, float] | None:
    """(cpu share, memory share, cores, bytes), or None when any is missing or implausible."""
    if not isinstance(entry, Mapping):
        return None
    capacity, utilization = entry.get("capacity"), entry.get("utilization")
    if not isinstance(capacity, Mapping) or not isinstance(utilization, Mapping):
        return None
    shares = [_figure(utilization.get(r), MAX_FIGURE["share"]) for r in RESOURCES]
    sizes = [_figure(capacity.get(c), MAX_FIGURE[c]) for c in CAPACITY]
    if any(v is None for v in shares) or any(not v for v in sizes):
        return None
    cpu, memory = shares
    cores, size = sizes
    assert cpu is not None and memory is not None and cores and size
    return cpu, memory, cores, size


def read_project(document: object, project_id: str) -> Project:
    """The project's level and CPU cap in gmd's answer (level 0, no cap, when absent or odd:
    a placement must not fail on a project gmd has not seen)."""
    entry = document.get("project") if isinstance(document, Mapping) else None
    if not isinstance(entry, Mapping) or entry.get("id") != project_id:
        return Project(project_id)
    level = entry.get("level")
    cap = _figure(entry.get("cpu_cap_fraction"))
    return Project(
        project_id,
        level if isinstance(level, int) and not isinstance(level, bool) and level >= 0 else 0,
        cap if cap is not None and 0 < cap <= 1 else None,
    )


@dataclass(frozen=True)
class Candidate:
    """A host Nova offers, with Nova's own view of it (for a host gmd has not measured)."""

    host: str
    nodename: str | None = None
    vcpus_total: float = 0.0
    vcpus_used: float = 0.0
    memory_mb_total: float = 0.0
    memory_mb_free: float = 0.0


@dataclass(frozen=True)
class Request:
    """What the request's flavor asks for."""

    vcpus: float
    memory_mb: float

    def expected(self, project: Project) -> np.ndarray:
        """Its expected use, per resource in cores and bytes (see the module's docstring)."""
        cap = 1.0 if project.cpu_cap_fraction is None else project.cpu_cap_fraction
        return np.array([self.vcpus * cap, self.memory_mb * MIB])


@dataclass(frozen=True)
class Ranked:
    """The weights of one request's candidates, and what they were computed from."""

    weights: list[float]
    """per candidate, in Nova's order: the closeness (or balanced score), in [0, 1]"""
    measured: list[bool]
    """per candidate: ranked from gmd's measurement (else from Nova's allocations)"""
    ranked: list[int]
    """the positions of the candidates that were ranked (the others weigh :data:`UNRANKED`)"""
    criteria: Criteria | None
    """the ranked candidates' criteria, in the order of ``ranked``"""
    topsis: Topsis | None
    expected: np.ndarray


def _match(cluster: Cluster, candidate: Candidate) -> int | None:
    at = cluster.index.get(candidate.host)
    if at is None and candidate.nodename:
        at = cluster.index.get(candidate.nodename)
    return at


def rank(
    cluster: Cluster,
    candidates: Sequence[Candidate],
    request: Request,
    project: Project,
    strategy: Strategy = Strategy.falb3,
) -> Ranked:
    """Weigh ``candidates`` for ``request`` of ``project``: FALB's criteria over the cluster
    with the request placed on each candidate in turn, then TOPSIS (or the balanced score)
    over the candidates."""
    expected = request.expected(project)
    rows: list[int] = []  # per ranked candidate, its row in the extended cluster
    ranked: list[int] = []
    measured: list[bool] = []
    extra_used: list[tuple[float, float]] = []
    extra_capacity: list[tuple[float, float]] = []
    taken: set[int] = set()
    for position, candidate in enumerate(candidates):
        at = _match(cluster, candidate)
        if at is not None and at not in taken:
            taken.add(at)
            rows.append(at)
            ranked.append(position)
            measured.append(True)
            continue
        measured.append(False)
        cores, memory = candidate.vcpus_total, candidate.memory_mb_total * MIB
        if not (0 < cores <= MAX_FIGURE["cpu_cores"] and 0 < memory <= MAX_FIGURE["memory_bytes"]):
            continue  # NaN included: no capacity Nova could mean
        used_memory = min(max(memory - candidate.memory_mb_free * MIB, 0.0), memory)
        extra_used.append((min(max(candidate.vcpus_used, 0.0), cores), used_memory))
        extra_capacity.append((cores, memory))
        rows.append(cluster.size + len(extra_used) - 1)
        ranked.append(position)
    weights = [UNRANKED] * len(candidates)
    if not ranked:
        return Ranked(weights, measured, ranked, None, None, expected)
    used = np.vstack([cluster.used, np.array(extra_used).reshape(-1, 2)])
    capacity = np.vstack([cluster.capacity, np.array(extra_capacity).reshape(-1, 2)])
    with np.errstate(over="ignore", invalid="ignore"):
        criteria = placement_criteria(used, capacity, expected).rows(rows)
    finite = np.isfinite(criteria.matrix(tuple(Criterion))).all(axis=1)
    if not finite.all():
        # Within the bounds this does not happen; if it ever does, the candidates it
        # concerns are left out, and the others still weighed.
        keep = np.flatnonzero(finite)
        criteria = criteria.rows(keep)
        ranked = [ranked[i] for i in keep.tolist()]
        if not ranked:
            return Ranked(weights, measured, ranked, None, None, expected)
    score, ranking = scores(criteria, strategy)
    for position, value in zip(ranked, score.tolist(), strict=True):
        weights[position] = min(max(float(value), 0.0), 1.0) if math.isfinite(value) else UNRANKED
    return Ranked(weights, measured, ranked, criteria, ranking, expected)
