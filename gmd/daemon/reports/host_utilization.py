"""Each host's measured utilisation per resource over the latest accounted intervals, and one
project's throttle level: what a fairness-aware placement (the Nova weigher of issue 31, FALB's
criteria in :mod:`gmd.fairness.placement`) places a new server by.

Measured, not allocated: a host's utilisation of a resource is what its VMs' on-time samples
used in those intervals over what the host offered then (its capacity, as its batches gave it,
times the intervals' length) — CPU core-seconds over cores × seconds, memory byte-seconds over
bytes × seconds, disk bytes read and written and network bytes in and out over the configured
bandwidth × seconds. Nova's own weighers see allocations: a host full of idle flavors looks
full to them and empty here.

Only accounted intervals count (their samples are all in): the latest ``intervals`` of those
some host reported in. A host that sent nothing in them is not listed (the weigher treats it
as unknown). The answer
changes only when an interval is accounted, so a caller may cache it for that long.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from gmd.daemon.ledger.lookup import UnknownCustomer, customer_id
from gmd.fairness.policy import ThrottlePolicy
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.tables import (
    host_intervals as _host_intervals,
    hosts as _hosts,
    intervals as _intervals,
    levels as _levels,
    samples as _samples,
)
from gmd.wire import visible_name

RESOURCES = ("cpu", "memory", "disk", "network")
"""The resources measured, in the order of every per-resource tuple here."""
CAPACITY = ("cpu_cores", "memory_bytes", "disk_bytes_per_s", "network_bytes_per_s")
"""What a host offers of each resource, as its batches say it."""
MAX_INTERVALS = 60
"""The most intervals one answer sums (an hour of minutes): enough to smooth a burst."""


@dataclass(frozen=True)
class HostUse:
    """One host's capacity and measured utilisation, per resource of :data:`RESOURCES`."""

    host: str
    capacity: tuple[float, float, float, float]
    """cores, memory bytes, disk bytes/s, network bytes/s (the latest interval's)"""
    utilization: tuple[float, float, float, float]
    """used over offered, each in [0, 1] unless a host's VMs used more than it claimed"""


@dataclass(frozen=True)
class HostUtilization:
    """The hosts' utilisation over the intervals summed, and the project's level."""

    intervals: tuple[int, ...]
    """the start of each interval summed, newest first (empty: nothing accounted yet)"""
    hosts: tuple[HostUse, ...]
    project: str | None = None
    level: int | None = None
    """the project's throttle level now (0 for a project the ledger has not seen)"""
    cpu_cap_fraction: float | None = None
    """the share of its vCPUs each of the project's VMs may use at that level, when caps are
    applied (enforcement mode ``on``); None: not capped. A placement expects a new VM of the
    project to use at most this share of its flavor's vCPUs."""

    def document(self) -> dict[str, object]:
        """The read API's answer (``GET /v1/hosts/utilization``)."""
        out: dict[str, object] = {
            "resources": list(RESOURCES),
            "intervals": list(self.intervals),
            "hosts": {
                h.host: {
                    "capacity": dict(
                        zip(
                            (
                                "cpu_cores",
                                "memory_bytes",
                                "disk_bytes_per_s",
                                "network_bytes_per_s",
                            ),
                            h.capacity,
                            strict=True,
                        )
                    ),
                    "utilization": dict(zip(RESOURCES, h.utilization, strict=True)),
                }
                for h in self.hosts
            },
        }
        if self.project is not None:
            out["project"] = {
                "id": self.project,
                "level": self.level,
                "cpu_cap_fraction": self.cpu_cap_fraction,
            }
        return out


def _ratio(used: float | None, offered: float) -> float:
    return float(used or 0.0) / offered if offered > 0 else 0.0


def host_utilization(
    conn: Connection,
    *,
    intervals: int = 3,
    project: str | None = None,
    policy: ThrottlePolicy | None = None,
    with_hosts: bool = True,
) -> HostUtilization:
    """Every host's utilisation over the latest ``intervals`` accounted intervals (1 to
    :data:`MAX_INTERVALS`), and ``project``'s level when one is named, with the CPU cap
    ``policy`` puts on it at that level (no ``policy``: caps are not applied). Without
    ``with_hosts``, the project alone: what a scheduler that holds the hosts asks for a
    project it has not seen."""
    if not 1 <= intervals <= MAX_INTERVALS:
        raise ValueError(f"intervals must be 1 to {MAX_INTERVALS}, not {intervals}")
    i_ = _intervals.c
    reported = select(_host_intervals.c.interval_id).where(_host_intervals.c.interval_id == i_.id)
    latest = conn.execute(
        select(i_.id, i_.start_s, i_.length_s)
        .where(i_.state == IntervalState.accounted, reported.exists())
        .order_by(i_.start_s.desc())
        .limit(intervals)
    ).all()
    ids = [int(r.id) for r in latest]
    hosts: tuple[HostUse, ...] = ()
    if ids and with_hosts:
        hosts = _hosts_use(conn, ids)
    level = cap = None
    if project is not None:
        level = _level(conn, project)
        if policy is not None:
            # A level above the policy's (it was shortened since) holds its highest level's cap.
            cap = policy.effect(min(level, policy.levels)).cpu_cap_fraction
    return HostUtilization(tuple(int(r.start_s) for r in latest), hosts, project, level, cap)


def _hosts_use(conn: Connection, ids: list[int]) -> tuple[HostUse, ...]:
    h_, i_ = _host_intervals.c, _intervals.c
    # One read of the hosts' rows in interval order: their offer summed (capacity × length),
    # their newest capacity (the last row of each) and their names.
    offered: dict[int, list[float]] = {}
    newest: dict[int, tuple[float, float, float, float]] = {}
    names: dict[int, str] = {}
    for r in conn.execute(
        select(
            h_.host_id,
            _hosts.c.name,
            i_.length_s,
            h_.cpu_cores,
            h_.memory_bytes,
            h_.disk_bytes_per_s,
            h_.network_bytes_per_s,
        )
        .join(_intervals, i_.id == h_.interval_id)
        .join(_hosts, _hosts.c.id == h_.host_id)
        .where(h_.interval_id.in_(ids))
        .order_by(h_.interval_id)
    ):
        host_id = int(r.host_id)
        capacity = (
            float(r.cpu_cores),
            float(r.memory_bytes),
            float(r.disk_bytes_per_s),
            float(r.network_bytes_per_s),
        )
        sums = offered.setdefault(host_id, [0.0] * len(RESOURCES))
        for k, amount in enumerate(capacity):
            sums[k] += amount * r.length_s
        newest[host_id], names[host_id] = capacity, str(r.name)
    if not offered:
        return ()
    s_ = _samples.c
    used = {
        int(r.host_id): r
        for r in conn.execute(
            select(
                s_.host_id,
                func.sum(s_.cpu_s).label("cpu"),
                func.sum(s_.memory_byte_s).label("memory"),
                func.sum(s_.disk_read_bytes + s_.disk_write_bytes).label("disk"),
                func.sum(s_.network_rx_bytes + s_.network_tx_bytes).label("network"),
            )
            .where(s_.interval_id.in_(ids), s_.late.is_(False))
            .group_by(s_.host_id)
        )
    }
    out = []
    for host_id, o in offered.items():
        u = used.get(host_id)
        shares = tuple(
            _ratio(None if u is None else getattr(u, r), o[k]) for k, r in enumerate(RESOURCES)
        )
        out.append(
            HostUse(names[host_id], newest[host_id], (shares[0], shares[1], shares[2], shares[3]))
        )
    return tuple(sorted(out, key=lambda h: h.host))


def _level(conn: Connection, project: str) -> int:
    try:
        visible_name(project)
    except ValueError:
        return 0  # a name no batch could have given (and PostgreSQL refuses a NUL)
    try:
        cid = customer_id(conn, project)
    except UnknownCustomer:
        return 0
    level = conn.execute(
        select(_levels.c.level).where(_levels.c.customer_id == cid)
    ).scalar_one_or_none()
    return int(level or 0)
