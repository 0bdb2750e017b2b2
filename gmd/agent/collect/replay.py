"""The replay collector: recorded per-VM traces played back as if libvirt read them.

For what-if analysis and the demo, a host is simulated by replaying real VM traces in the
Bitbrains format (GWA-T-12, ``N.csv`` or ``N.csv.gz``: one row per VM every ~300 s). The
collector hands the agent the same raw cumulative counters libvirt would (CPU time, disk and
network bytes, resident memory), so everything after it — deltas and resets
(:mod:`gmd.agent.collect.counters`), intervals (:mod:`gmd.agent.collect.aggregate`), spool,
sender, the daemon's accounting — runs unchanged and is exercised by real workloads.

**Three clocks.** *Wall* time is what the machine says; *simulated* time is what the agent
stamps its readings with and what the daemon sees; *trace* time is the CSV's timestamps. A
:class:`ReplayClock` maps simulated onto trace time by a constant offset (one simulated second
is one trace second, so a VM's use per second is the trace's), and
:func:`gmd.agent.replay_run.replay_run` moves simulated time forward ``speed`` times faster than
wall time, or as fast as the agent can go. Simulated time starts at a past instant and never
passes the present: the daemon refuses intervals in the future but takes past ones, so a week of
trace is replayed as the week that just ended. The daemon's own accountant must not run
meanwhile — it closes every interval up to the *real* present, and the replayed batches would
all arrive late: run the daemon with ``--no-accounting`` and account afterwards, or, with every
host replayed in one process in lock step, account as simulated time passes (``account_due(…,
now_s=clock.now_s)`` from :func:`gmd.agent.replay_run.replay_run`'s ``on_tick``).

**What a row means** and how a trace is read and checked: :mod:`gmd.traces`. When a run ends
between two readings, the VM is reported once more with its final counters, so nothing it used
is lost (libvirt cannot do that for a VM that stops).

**A host gives no more than its cores.** The traced VMs ran on other machines; dealt onto a
simulated host with fewer cores, their traces can together ask for more CPU than it has, which
no real host gives (and the daemon refuses as implausible). Where they do, each VM gets the same
fraction of what its trace asks (:class:`OversubscribedCpu`), so the host is saturated, not
over-full. A host whose traces never ask more than its cores replays them exactly.

**Bad data stops the replay** with the file and line (:class:`gmd.traces.TraceError`).

**Resuming.** A replay is deterministic: the same traces on the same clock give the same
readings at the same simulated instants. Its plan (what it replays, and its clock) is kept
beside the spool (:func:`gmd.agent.replay_run.save_plan`), whose state holds the counters of the
last tick and its simulated time (``last_ok_s``). An agent killed mid-replay and started again
with the same replay takes the recorded clock (:func:`gmd.agent.replay_run.load_plan`) and ticks
on from that instant (:func:`gmd.agent.replay_run.replay_run` with ``resume``): the next reading
is measured from the saved counters, the intervals closed before are not made again, the open
ones go on, and the batches still spooled are sent under the keys they were made with. Those
keys are themselves deterministic (:func:`gmd.agent.replay_run.replay_key`: host, interval, the
replay, and the tick that closed it), so a batch made twice — a spool lost while its batches
were already delivered — is a duplicate the daemon acknowledges without counting. Another replay
on the same spool is refused.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gmd import GmdError
from gmd.agent.collect.base import (
    UNKNOWN_CUSTOMER,
    DomainFlavor,
    HostReading,
    HostResources,
    Ownership,
    VmReading,
)
from gmd.common.units import WEEK_S
from gmd.traces import Run, Trace, trace_name

log = logging.getLogger(__name__)

DEFAULT_HISTORY_S = WEEK_S
"""Without ``replay_start``, the replay covers the week before now (a Bitbrains trace's length)."""
UUID_NAMESPACE = uuidlib.UUID("6f1c2a47-2f0e-4c55-9a43-0b6a5d3e7a10")
"""Fixed, so a replayed VM keeps its UUID across runs and machines."""
DISK, NIC = "vda", "eth0"


class ReplayError(GmdError, RuntimeError):
    """A replay cannot run as asked; the message says why and where."""


# -- VMs and their owners ---------------------------------------------------------------------


def vm_uuid(host: str, path: Path) -> str:
    """A VM's UUID from its host and trace file (its directory's name and its trace name): the
    same VM replayed on the same host is the same VM in the ledger, run after run, and the same
    trace replayed on two hosts is two VMs. ``N.csv.gz`` is the VM of ``N.csv``."""
    path = Path(path)
    return str(uuidlib.uuid5(UUID_NAMESPACE, f"{host}/{path.parent.name}/{trace_name(path)}.csv"))


def deal_customers(
    names: Sequence[str],
    customers: Sequence[str] | Mapping[str, str] | None,
    default_customer: str | None = None,
) -> dict[str, str]:
    """Trace name → customer: looked up in a mapping, dealt round-robin in order from a list,
    or everything to ``default_customer`` (``"unknown"`` without one).

    A mapping must name every trace (:class:`ReplayError` otherwise): a VM silently given to
    a default customer would make that customer look greedy for someone else's use.
    """
    if customers is None or len(customers) == 0:
        return dict.fromkeys(names, default_customer or UNKNOWN_CUSTOMER)
    if isinstance(customers, Mapping):
        missing = [n for n in names if n not in customers]
        if missing:
            raise ReplayError(f"no customer for trace {missing[0]!r} in the mapping")
        return {n: customers[n] for n in names}
    return {n: customers[i % len(customers)] for i, n in enumerate(names)}


@dataclass(frozen=True)
class ReplayVm:
    trace: Trace
    uuid: str
    name: str
    customer: str


def replay_vms(
    traces: Sequence[Trace],
    host: str,
    customers: Sequence[str] | Mapping[str, str] | None = None,
    default_customer: str | None = None,
) -> list[ReplayVm]:
    """The VMs one simulated host replays, with stable UUIDs and their customers."""
    owners = deal_customers([t.name for t in traces], customers, default_customer)
    return [
        ReplayVm(t, vm_uuid(host, t.path), f"bitbrains-{t.name}", owners[t.name]) for t in traces
    ]


# -- time -------------------------------------------------------------------------------------


@dataclass
class ReplayClock:
    """Where simulated time stands, and how it maps onto trace time.

    ``trace_t = trace_start_s + (sim_t - start_s)``, and
    :func:`gmd.agent.replay_run.replay_run` advances simulated
    time by ``speed`` simulated seconds per wall second (``None``: as fast as the agent goes),
    so ``trace_t = trace_start_s + (wall - wall_start) × speed`` while it runs. Calling the
    clock gives the simulated now, so it can be handed to anything that takes a clock (an
    in-process daemon's, for one).
    """

    start_s: float
    end_s: float
    trace_start_s: float
    speed: float | None = None
    now_s: float = field(default=math.nan)
    resumed: bool = False
    """the clock is the one an earlier run of this replay recorded (see
    :func:`gmd.agent.replay_run.save_plan`)"""
    live: bool = False
    """simulated time is the wall clock's (:func:`plan_clock`): each tick waits for its instant,
    so a replay resumed after a stop catches up and then keeps to the present"""

    def __post_init__(self) -> None:
        if math.isnan(self.now_s):
            self.now_s = self.start_s

    def __call__(self) -> float:
        return self.now_s

    def to_trace(self, sim_s: float) -> float:
        return self.trace_start_s + (sim_s - self.start_s)

    def to_sim(self, trace_s: float) -> float:
        return self.start_s + (trace_s - self.trace_start_s)

    @property
    def fraction(self) -> float:
        """How much of the replay is done, 0–1 (for a progress bar)."""
        return min(max((self.now_s - self.start_s) / (self.end_s - self.start_s), 0.0), 1.0)


def plan_clock(
    traces: Iterable[Trace],
    *,
    start_s: float,
    interval_s: int,
    end_s: float | None = None,
    speed: float | None = None,
    offset_s: float = 0.0,
    now_s: float | None = None,
) -> ReplayClock:
    """The clock of a replay of ``traces`` from simulated ``start_s``.

    The start is aligned down to ``interval_s``; the earliest first row of the traces, plus
    ``offset_s``, falls on it. The end is the earliest of ``end_s``, the present (``now_s``,
    default the wall clock: the daemon refuses the future) and the end of the traces, aligned
    down to ``interval_s`` so that the last interval is closed whole. Several hosts replayed
    in step share one clock (and so one mapping).

    A replay at ``speed`` 1 from a start no later than the present to an end after it is
    *live*: its simulated time is the wall clock's (each tick waits for its instant), so its
    end may lie in the future (a soak's hosts replay known usage as it happens, against a
    daemon whose accountant runs).
    """
    traces = list(traces)
    firsts = [t.first_s for t in traces if t.first_s is not None]
    ends = [t.end_s for t in traces if t.end_s is not None]
    if not firsts:
        raise ReplayError("none of the traces has a row: nothing to replay")
    if speed is not None and not speed > 0:
        raise ReplayError(f"speed {speed!r}: give a number > 0, or None for as fast as possible")
    start = math.floor(start_s / interval_s) * interval_s
    now = time.time() if now_s is None else now_s
    live = speed == 1 and start <= now and end_s is not None and end_s > now
    clock = ReplayClock(start, start, min(firsts) + offset_s, speed, live=live)
    present = math.inf if live else now
    last = min(present, clock.to_sim(max(ends)), math.inf if end_s is None else end_s)
    clock.end_s = math.floor(last / interval_s) * interval_s
    if clock.end_s < start + interval_s:
        raise ReplayError(
            f"the replay from {start:.0f} would end at {clock.end_s:.0f} (the earliest of the"
            " requested end, the present and the traces' end): shorter than one interval"
        )
    return clock


# -- the host's CPUs --------------------------------------------------------------------------


def _cpu_rates(run: Run, starts: np.ndarray) -> np.ndarray:
    """The run's CPU rate (ns/s) on each segment beginning at ``starts`` (0 outside it)."""
    rates = np.array([r[0] for r in run.rates])
    k = np.clip(np.searchsorted(run.times, starts, side="right") - 1, 0, len(rates) - 1)
    active = (starts >= run.start_s) & (starts < run.end_s)
    return np.where(active, rates[k], 0.0)


class OversubscribedCpu:
    """The CPU counters of a host's VMs when their traces together ask more than its cores.

    On every stretch of trace time where the traced CPU rates add up to more than the host's
    cores, each VM gets the same fraction ``share`` of its rate: what the kernel's fair
    scheduler gives CPU-bound VMs whose runnable vCPU threads compete with equal weights (a
    VM asking for more cores has more threads). A VM's CPU counter is then its rate × the
    integral of ``share``, a function of trace time alone, precomputed on the breakpoints of
    every run: a resumed replay reads the same counters as an uninterrupted one, and they
    never go down. :meth:`of` gives None for a host that is never short of cores (its VMs'
    traces are replayed exactly).
    """

    def __init__(self, runs: Mapping[tuple[str, int], Run], times: np.ndarray, share: np.ndarray):
        self.times, self.share = times, share
        self.integral = np.concatenate([[0.0], np.add.accumulate(share * np.diff(times))])
        self._runs = dict(runs)
        self._before: dict[tuple[str, int], np.ndarray] = {}
        for key, run in self._runs.items():
            rates = np.array([r[0] for r in run.rates])
            given = np.diff(self._given(np.array([*run.times, run.end_s])))
            self._before[key] = np.concatenate([[0.0], np.add.accumulate(rates * given)])

    @classmethod
    def of(cls, runs: Mapping[tuple[str, int], Run], cores: float) -> OversubscribedCpu | None:
        """The host's CPU shares, or None when its VMs never ask more than ``cores``."""
        capacity = cores * 1e9
        if not runs or sum(max(r[0] for r in run.rates) for run in runs.values()) <= capacity:
            return None
        times = np.unique(np.concatenate([[*run.times, run.end_s] for run in runs.values()]))
        demand = np.zeros(len(times) - 1)
        for run in runs.values():
            demand += _cpu_rates(run, times[:-1])
        if not (demand > capacity).any():
            return None
        share = np.where(demand > capacity, capacity / np.maximum(demand, capacity), 1.0)
        return cls(runs, times, share)

    def _given(self, t: np.ndarray) -> np.ndarray:
        """∫ share from the first breakpoint to each of ``t`` (within the breakpoints)."""
        i = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, len(self.share) - 1)
        return self.integral[i] + self.share[i] * (t - self.times[i])

    def cpu_ns(self, key: tuple[str, int], t: float) -> int:
        """The CPU counter of run ``key`` (VM uuid, run id) at trace time ``t``."""
        run, before = self._runs[key], self._before[key]
        if t >= run.end_s:
            return round(before[-1])
        k = max(bisect.bisect_right(run.times, t) - 1, 0)
        given = self._given(np.array([max(t, run.times[k]), run.times[k]]))
        return round(before[k] + run.rates[k][0] * (given[0] - given[1]))

    def saturated_s(self) -> float:
        """How long, in trace time, the host was short of cores."""
        return float(np.diff(self.times)[self.share < 1].sum())


# -- the collector ----------------------------------------------------------------------------


class ReplayCollector:
    """A :class:`gmd.agent.collect.base.Collector` whose host runs recorded traces.

    Each reading is taken at the clock's simulated now and reads each VM's trace at the
    matching trace time. ``cores``/``memory_bytes`` are the host's capacity; by default the
    sum of the VMs' flavors (a host exactly big enough for what it runs).
    """

    def __init__(
        self,
        vms: Sequence[ReplayVm],
        clock: ReplayClock,
        *,
        cores: float | None = None,
        memory_bytes: float | None = None,
    ) -> None:
        self.vms, self.clock = list(vms), clock
        uuids = [vm.uuid for vm in self.vms]
        if len(set(uuids)) != len(uuids):
            raise ReplayError("a trace is replayed twice on one host")
        self._owners = {vm.uuid: self._ownership(vm) for vm in self.vms}
        cores = cores or sum(vm.trace.flavor.vcpus or 0.0 for vm in self.vms)
        memory_bytes = memory_bytes or sum(vm.trace.flavor.memory_bytes or 0.0 for vm in self.vms)
        if not (cores > 0 and memory_bytes > 0):
            raise ReplayError(
                "no replayed VM is provisioned with cores and memory: give the host's capacity"
                " (agent.replay_host_cores, agent.replay_host_memory_bytes)"
            )
        self._resources = HostResources(float(cores), float(memory_bytes))
        self._previous_trace_s: float | None = None
        self._final_cpu_ns: dict[tuple[str, int], int] = {}
        runs = {(vm.uuid, run.run_id): run for vm in self.vms for run in vm.trace.runs}
        self.cpu = OversubscribedCpu.of(runs, float(cores))
        if self.cpu is not None:
            log.info(
                "the replayed VMs ask more than the host's %g cores for %.1f h of trace: there"
                " each gets the same fraction of what its trace asks",
                cores,
                self.cpu.saturated_s() / 3600,
            )

    def _ownership(self, vm: ReplayVm) -> Ownership:
        runs = vm.trace.runs
        created = None
        if runs:
            created = max(math.floor(self.clock.to_sim(runs[0].start_s)), 0)
        given = vm.trace.flavor
        return Ownership(
            vm.customer, "replay", DomainFlavor(given.vcpus, given.memory_bytes), created
        )

    def resources(self) -> HostResources:
        return self._resources

    def resume_at(self, sim_s: float) -> None:
        """Continue from an earlier run's last reading at simulated ``sim_s``: a VM that
        stopped since is then reported once more with its final counters, as it would have
        been without the interruption."""
        self._previous_trace_s = self.clock.to_trace(sim_s)

    def collect(self) -> HostReading:
        now = self.clock.now_s
        t = self.clock.to_trace(now)
        previous, self._previous_trace_s = self._previous_trace_s, t
        vms = []
        for vm in self.vms:
            reading = self._read(vm, t, previous, now)
            if reading is not None:
                vms.append(reading)
        listed = frozenset(v.uuid for v in vms)
        return HostReading(now, True, tuple(vms), listed, host_cpu_s=self.host_cpu_s(t))

    def host_cpu_s(self, t: float) -> float:
        """The simulated host's busy CPU seconds at trace time ``t``: every run's CPU counter
        (its final one once it ended, 0 before it began) added up. The host runs nothing but
        its VMs, so its busy time is theirs, counters that stopped included, and it never
        goes down (a restarted VM's new run adds to it)."""
        total = 0
        for vm in self.vms:
            for run in vm.trace.runs:
                if t <= run.start_s:
                    continue
                key = (vm.uuid, run.run_id)
                if t >= run.end_s and key in self._final_cpu_ns:
                    total += self._final_cpu_ns[key]
                    continue
                ns = self.cpu.cpu_ns(key, t) if self.cpu is not None else run.counters_at(t)[0]
                if t >= run.end_s:
                    self._final_cpu_ns[key] = ns
                total += ns
        return total / 1e9

    def _read(self, vm: ReplayVm, t: float, previous: float | None, now: float) -> VmReading | None:
        """The VM at trace time ``t``: running, just stopped (its final counters, once), or
        not running (``None``)."""
        run = None
        if previous is not None:
            before = vm.trace.run_at(previous)
            if before is not None and before.end_s <= t:
                run = before  # it stopped since the last reading: report what it used
        if run is None:
            run = vm.trace.run_at(t)
        if run is None:
            return None
        cpu, rd, wr, rx, tx = run.counters_at(t)
        if self.cpu is not None:
            cpu = self.cpu.cpu_ns((vm.uuid, run.run_id), t)
        return VmReading(
            uuid=vm.uuid,
            run_id=run.run_id,
            taken_s=now,
            cpu_time_ns=cpu,
            memory_rss_bytes=run.rss_at(t),
            disks={DISK: (rd, wr)},
            nics={NIC: (rx, tx)},
            owner=self._owners[vm.uuid],
            name=vm.name,
        )

    def close(self) -> None:
        """Nothing to release: the traces are in memory."""
