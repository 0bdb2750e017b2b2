"""What each host should do to its VMs now: the plan ``GET /v1/plan/{host}`` returns.

A VM is in its host's plan when it runs there now (:func:`running_vms`: it is in the host's
latest accounted interval of the last few) and its customer is above level 0; a VM not in the
plan is to be left (or put back) as it was. Weights are on the cgroup v2 / libvirt
``cpu_shares`` scale (100 = normal, 1–10000) and apply on every host; the hard caps of a
level (CPU in cores, from the VM's flavor vCPUs as last reported; disk bytes/s) apply only
where the host is contended for that resource (:func:`gmd.fairness.policy.host_contention`),
and the plan says why (:class:`~gmd.wire.HostCaps`).

Every query here is bounded by interval ids (an interval's id is its start): the last
``contention_intervals`` accounted intervals, found from the top of the intervals' primary
key, and the host's rows in that range through the ``(interval_id, host_id, …)`` indexes
and, on PostgreSQL, the daily partitions of that range only. Nothing reads a host's whole
history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Connection, Select, and_, false, func, select

from gmd.daemon.enforce.settings import EnforcementConfig
from gmd.daemon.ledger import capabilities
from gmd.fairness.policy import (
    CapDecision,
    CapResource,
    Contention,
    ContentionPolicy,
    DiskWeightFallback,
    capped_effect,
    cpu_cap_cores,
    for_customer,
    host_contention,
    unsupported,
    weight_as_disk_limit,
    weights_for,
)
from gmd.ledger_schema.kinds import BatchState, IntervalState
from gmd.ledger_schema.tables import (
    batches as _batches,
    customers as _customers,
    host_intervals as _host_intervals,
    hosts as _hosts,
    intervals as _intervals,
    levels as _levels,
    samples as _samples,
    vms as _vms,
)
from gmd.wire import (
    CPU_CAP_MAX_CORES,
    CPU_CAP_MIN_CORES,
    DISK_CAP_MAX_BYTES_PER_S,
    DISK_CAP_MIN_BYTES_PER_S,
    WEIGHT_DEFAULT,
    WEIGHT_MAX,
    WEIGHT_MIN,
    HostCapabilities,
    HostCaps,
    Knob,
    PlanMode,
    VmPlanItem,
    within,
)

# What a host's VMs used of each cap resource, and what it could give, per interval.
_USE = {
    CapResource.cpu: _samples.c.cpu_s,
    CapResource.disk: _samples.c.disk_read_bytes + _samples.c.disk_write_bytes,
}
_CAPACITY = {
    CapResource.cpu: _host_intervals.c.cpu_cores,
    CapResource.disk: _host_intervals.c.disk_bytes_per_s,
}


@dataclass(frozen=True)
class Window:
    """The intervals contention is measured over: the last accounted ones, newest last."""

    ids: tuple[int, ...]

    @property
    def first(self) -> int | None:
        return self.ids[0] if self.ids else None

    @property
    def last(self) -> int | None:
        return self.ids[-1] if self.ids else None


def recent_window(conn: Connection, intervals: int, upto_id: int | None = None) -> Window:
    """The last ``intervals`` accounted intervals (at or before ``upto_id``, if given)."""
    query = select(_intervals.c.id).where(_intervals.c.state == IntervalState.accounted)
    if upto_id is not None:
        query = query.where(_intervals.c.id <= upto_id)
    ids = conn.execute(query.order_by(_intervals.c.id.desc()).limit(intervals)).scalars()
    return Window(tuple(sorted(int(i) for i in ids)))


def running_vms(window: Window, host_id: int | None = None) -> Select[tuple[int, int]]:
    """The VMs running on each host (or on ``host_id``) as far as the ledger knows, a query
    of ``(vm_id, host_id)``: those of the host's latest interval in ``window`` (the intervals
    contention is measured over: the last ``contention_intervals`` accounted ones). A VM the
    host stopped reporting no longer runs there once that interval is accounted; a host
    silent for the whole window runs nothing gmd knows of.

    The one definition of "on the host now": plans list only these VMs, a host may report
    only on these (:mod:`gmd.daemon.enforce.audit`), and the standings count what is applied
    to these (:mod:`gmd.daemon.reports.enforced`). Bounded by the window's ids, as every
    query of the raw tables here."""
    hi = _host_intervals.c
    if window.first is None or window.last is None:
        return select(_samples.c.vm_id, _samples.c.host_id).where(false())
    latest = (
        select(hi.host_id, func.max(hi.interval_id).label("interval_id"))
        .where(hi.interval_id.between(window.first, window.last))
        .group_by(hi.host_id)
    )
    if host_id is not None:
        latest = latest.where(hi.host_id == host_id)
    last = latest.subquery()
    return (
        select(_samples.c.vm_id, _samples.c.host_id)
        .join(
            last,
            and_(
                _samples.c.interval_id == last.c.interval_id,
                _samples.c.host_id == last.c.host_id,
            ),
        )
        .where(_samples.c.interval_id.between(window.first, window.last))
        .distinct()
    )


def host_caps(
    conn: Connection, host_id: int | None, window: Window, policy: ContentionPolicy
) -> dict[CapResource, CapDecision]:
    """Whether caps apply on the host, per resource, from its use over ``window``: its VMs'
    use, and for CPU the host's own busy time where its agent reports it, whichever is more."""
    resources = list(CapResource)
    used = np.zeros((0, len(resources)))
    supply = np.zeros((0, len(resources)))
    if host_id is not None and window.ids:
        offered = _offered(conn, host_id, window)
        taken = {
            int(row[0]): row[1:]
            for row in conn.execute(
                select(_samples.c.interval_id, *(func.sum(_USE[r]) for r in resources))
                .where(
                    _samples.c.host_id == host_id,
                    _samples.c.interval_id.between(window.first, window.last),
                    _samples.c.interval_id.in_(window.ids),
                )
                .group_by(_samples.c.interval_id)
            )
        }
        none = (0.0,) * len(resources)
        supply = np.array([row[1:] for row in offered], dtype=np.float64)
        used = np.array([taken.get(int(row[0]), none) for row in offered], dtype=np.float64)
        busy = _host_busy_cpu_s(conn, host_id, window)
        if busy:
            # The host's own busy time holds its VMs' and everything else it ran: a host
            # saturated by other work is contended though its VMs idle (issue 27).
            k = resources.index(CapResource.cpu)
            host = np.array([busy.get(int(row[0]), 0.0) for row in offered], dtype=np.float64)
            used[:, k] = np.maximum(used[:, k], host)
    return host_contention(used, supply, policy)


def _offered(conn: Connection, host_id: int, window: Window) -> list[Any]:
    """Per interval of ``window`` the host reported in: (interval id, what it could give of
    each :class:`CapResource`: capacity × length), oldest first."""
    in_window = and_(
        _host_intervals.c.host_id == host_id,
        _host_intervals.c.interval_id.between(window.first, window.last),
        _host_intervals.c.interval_id.in_(window.ids),
    )
    return list(
        conn.execute(
            select(
                _host_intervals.c.interval_id,
                *(_CAPACITY[r] * _intervals.c.length_s for r in CapResource),
            )
            .join(_intervals, _intervals.c.id == _host_intervals.c.interval_id)
            .where(in_window)
            .order_by(_host_intervals.c.interval_id)
        ).all()
    )


def others_use(
    conn: Connection, host_id: int | None, window: Window
) -> dict[int, dict[CapResource, float]]:
    """Per customer with VMs on the host in ``window``: what everyone else used there of each
    cap resource — the other customers' VMs, and for CPU the host's own work beyond its VMs
    where its agent reports it (as :func:`host_caps` counts it) — as a fraction of what the
    host could give over the intervals it reported in. :func:`gmd.fairness.policy.for_customer`
    withholds the caps of a customer who contends a host alone."""
    if host_id is None or not window.ids:
        return {}
    offered = _offered(conn, host_id, window)
    supply = np.array([row[1:] for row in offered], dtype=np.float64).reshape(-1, len(CapResource))
    total_supply = supply.sum(axis=0)
    at = {int(row[0]): i for i, row in enumerate(offered)}
    rows = conn.execute(
        select(
            _samples.c.interval_id,
            _vms.c.customer_id,
            *(func.sum(_USE[r]) for r in CapResource),
        )
        .select_from(_samples.join(_vms, _vms.c.id == _samples.c.vm_id))
        .where(
            _samples.c.host_id == host_id,
            _samples.c.interval_id.between(window.first, window.last),
            _samples.c.interval_id.in_(sorted(at) or [-1]),
        )
        .group_by(_samples.c.interval_id, _vms.c.customer_id)
    ).all()
    own: dict[int, np.ndarray] = {}
    host = np.zeros_like(supply)
    for interval_id, customer_id, *used in rows:
        figures = np.array([float(v or 0.0) for v in used])
        own.setdefault(int(customer_id), np.zeros_like(supply))[at[int(interval_id)]] += figures
        host[at[int(interval_id)]] += figures
    cpu = list(CapResource).index(CapResource.cpu)
    busy = _host_busy_cpu_s(conn, host_id, window)
    for interval_id, i in at.items():
        host[i, cpu] = max(host[i, cpu], busy.get(interval_id, 0.0))
    out = {}
    for customer, theirs in own.items():
        others = (host - theirs).sum(axis=0)
        out[customer] = {
            r: float(others[k] / total_supply[k]) if total_supply[k] > 0 else 0.0
            for k, r in enumerate(CapResource)
        }
    return out


def _host_busy_cpu_s(conn: Connection, host_id: int, window: Window) -> dict[int, float]:
    """Interval id → the host's busy CPU seconds its batches reported (summed: an agent
    restarted mid-interval sends the rest in another batch), for the intervals of ``window``
    where it reported them. A quarantined or dropped batch counts as its samples do: not."""
    b = _batches.c
    rows = conn.execute(
        select(b.interval_id, func.sum(b.host_cpu_s))
        .where(
            b.host_id == host_id,
            b.interval_id.between(window.first, window.last),
            b.interval_id.in_(window.ids),
            b.host_cpu_s.is_not(None),
            b.state.in_([BatchState.accepted, BatchState.released]),
        )
        .group_by(b.interval_id)
    )
    return {int(i): float(v) for i, v in rows}


def wire_caps(
    caps: dict[CapResource, CapDecision], disk_weight: DiskWeight | None = None
) -> list[HostCaps]:
    """The decisions as the plan carries them (and, where the host has no disk weight, what
    stands in for it: :class:`DiskWeight`)."""
    out = [HostCaps.model_validate({**d.figures(), "why": d.words()}) for d in caps.values()]
    if disk_weight is not None:
        out.append(disk_weight.wire())
    return out


def host_knobs(
    caps: dict[CapResource, CapDecision], said: HostCapabilities | None
) -> dict[CapResource, CapDecision]:
    """The cap decisions on a host that said it cannot set a cap: withheld there, and why."""
    if said is None:
        return caps
    lacking = said.unsupported()
    out = dict(caps)
    for resource, knob in ((CapResource.cpu, Knob.cpu_cap), (CapResource.disk, Knob.disk_limit)):
        if knob in lacking:
            out[resource] = unsupported(caps[resource], lacking[knob])
    return out


@dataclass(frozen=True)
class DiskWeight:
    """A host without a disk weight (its agent said so), and what the plan does instead:
    ``limit`` — a bytes/s limit of the weight's share of the disk, where the disk is
    contended — or ``none``: disk throttling unavailable there."""

    why: str
    """the host's reason (no proportional scheduler on its disks…)"""
    fallback: DiskWeightFallback
    disk: CapDecision
    """the host's disk contention, which decides where a limit bites"""
    disk_bytes_per_s: float | None
    vms: int

    @property
    def limiting(self) -> bool:
        return self.fallback == DiskWeightFallback.limit and self.disk.applied

    def limit(self, weight_factor: float) -> float | None:
        """The limit standing in for ``weight_factor`` on this host (None: none)."""
        if not self.limiting or self.disk_bytes_per_s is None:
            return None
        return weight_as_disk_limit(weight_factor, self.disk_bytes_per_s, self.vms)

    def words(self) -> str:
        head = f"disk weight unsupported on this host ({self.why})"
        if self.fallback == DiskWeightFallback.none:
            return f"{head}: disk throttling unavailable here (disk_weight_fallback = none)"
        if not self.limiting:
            return f"{head}: a disk limit stands in where disk is contended; {self.disk.words()}"
        return f"{head}: held by a disk limit of the weight's share instead; {self.disk.words()}"

    def wire(self) -> HostCaps:
        return HostCaps(
            resource="disk_weight",
            applied=self.limiting,
            reason=Contention.unsupported.value,
            utilisation=self.disk.utilisation,
            threshold=self.disk.threshold,
            intervals=self.disk.intervals,
            window=self.disk.window,
            why=self.words(),
        )


@dataclass(frozen=True)
class Plan:
    """One host's plan: its throttled VMs, whether (and why) caps apply there, and what
    stands in for a disk weight the host lacks."""

    vms: list[VmPlanItem] = field(default_factory=list)
    caps: dict[CapResource, CapDecision] = field(default_factory=dict)
    disk_weight: DiskWeight | None = None
    customer_caps: dict[str, dict[CapResource, CapDecision]] = field(default_factory=dict)
    """per throttled customer of the host, the caps as they apply to it: the host's, but
    withheld where it contends the host alone (:func:`gmd.fairness.policy.for_customer`)"""

    def caps_of(self, customer: str) -> dict[CapResource, CapDecision]:
        return self.customer_caps.get(customer, self.caps)


def host_plan(conn: Connection, host: str, config: EnforcementConfig) -> Plan:
    """The throttled VMs running on ``host`` (:func:`running_vms`) and what to set on each
    (empty when "off")."""
    if config.mode == PlanMode.off:
        return Plan()
    host_id = conn.execute(select(_hosts.c.id).where(_hosts.c.name == host)).scalar()
    window = recent_window(conn, config.contention.intervals)
    word = capabilities.of_host(conn, host)
    said = word.capabilities if word is not None else None
    caps = host_knobs(host_caps(conn, host_id, window, config.contention), said)
    if host_id is None:
        return Plan([], caps)
    running = running_vms(window, host_id).subquery()
    disk_weight = _disk_weight(conn, host_id, window, config, caps, said, running)
    rows = conn.execute(
        select(_vms.c.id, _vms.c.uuid, _customers.c.name, _levels.c.level, _vms.c.customer_id)
        .join(_levels, _levels.c.customer_id == _vms.c.customer_id)
        .join(_customers, _customers.c.id == _vms.c.customer_id)
        .where(_vms.c.id.in_(select(running.c.vm_id)), _levels.c.level > 0)
        .order_by(_vms.c.uuid)
    ).all()
    vcpus = _flavor_vcpus(conn, host_id, window) if rows else {}
    others = others_use(conn, host_id, window) if rows else {}
    plans = []
    customer_caps: dict[str, dict[CapResource, CapDecision]] = {}
    for vm_id, uuid, customer, level, customer_id in rows:
        theirs = for_customer(caps, others.get(customer_id, {}), config.contention)
        customer_caps[customer] = theirs
        effect = capped_effect(config.policy.effect(level), theirs)
        weight = weights_for(effect.weight_factor, WEIGHT_DEFAULT, WEIGHT_MIN, WEIGHT_MAX)
        cpu_cap = cpu_cap_cores(effect.cpu_cap_fraction, vcpus.get(vm_id))
        disk_bytes = effect.disk_bytes_per_s
        io_weight = weight
        if disk_weight is not None:
            # a weight would do nothing here: none is asked, a limit may stand in for it
            io_weight = WEIGHT_DEFAULT
            stand_in = disk_weight.limit(effect.weight_factor)
            if stand_in is not None:
                disk_bytes = stand_in if disk_bytes is None else min(disk_bytes, stand_in)
        disk_cap = within(disk_bytes, DISK_CAP_MIN_BYTES_PER_S, DISK_CAP_MAX_BYTES_PER_S)
        plans.append(
            VmPlanItem(
                uuid=uuid,
                customer=customer,
                level=level,
                cpu_weight=weight,
                io_weight=io_weight,
                cpu_quota_cores=within(cpu_cap, CPU_CAP_MIN_CORES, CPU_CAP_MAX_CORES),
                disk_read_bytes_per_s=disk_cap,
                disk_write_bytes_per_s=disk_cap,
            )
        )
    return Plan(plans, caps, disk_weight, customer_caps)


def _disk_weight(
    conn: Connection,
    host_id: int,
    window: Window,
    config: EnforcementConfig,
    caps: dict[CapResource, CapDecision],
    said: HostCapabilities | None,
    running: Any,
) -> DiskWeight | None:
    """What stands in for the disk weight on a host that said it has none (None: it has one,
    or said nothing)."""
    if said is None or Knob.disk_weight not in said.unsupported():
        return None
    vms = conn.execute(select(func.count()).select_from(running)).scalar() or 0
    capacity = None
    if window.first is not None:
        capacity = conn.execute(
            select(_host_intervals.c.disk_bytes_per_s)
            .where(
                _host_intervals.c.host_id == host_id,
                _host_intervals.c.interval_id.between(window.first, window.last),
            )
            .order_by(_host_intervals.c.interval_id.desc())
            .limit(1)
        ).scalar()
    return DiskWeight(
        said.unsupported()[Knob.disk_weight],
        config.disk_weight_fallback,
        caps[CapResource.disk],
        None if capacity is None else float(capacity),
        int(vms),
    )


def _flavor_vcpus(conn: Connection, host_id: int, window: Window) -> dict[int, float | None]:
    """Each VM's vCPUs as its latest sample on the host in the window reported (a VM that
    reported nothing there is not running here: it gets no CPU cap)."""
    if window.first is None:
        return {}
    in_window = and_(
        _samples.c.host_id == host_id,
        _samples.c.interval_id.between(window.first, window.last),
    )
    # A VM is in a batch once, and batch ids grow: its latest batch holds its latest sample.
    latest = (
        select(_samples.c.vm_id, func.max(_samples.c.batch_id).label("batch_id"))
        .where(in_window)
        .group_by(_samples.c.vm_id)
        .subquery()
    )
    return {
        int(vm_id): vcpus
        for vm_id, vcpus in conn.execute(
            select(_samples.c.vm_id, _samples.c.flavor_vcpus)
            .join(
                latest,
                and_(latest.c.vm_id == _samples.c.vm_id, latest.c.batch_id == _samples.c.batch_id),
            )
            .where(in_window)
        )
    }
