"""The agent's Prometheus metrics: every series, its labels as enums, and a typed helper per
event, so that the loop says what happened (``metrics.read(reading)``) and this module alone
knows which series and label that is — as the daemon's :mod:`gmd.daemon.api.metrics` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import get_args

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from gmd.agent.collect.base import FailureKind, HostReading
from gmd.common.version import version
from gmd.wire import (
    PLAN_MODES,
    ApplyAction,
    HostCapabilities,
    Knob,
    KnobSupport,
    PlanMode,
    VmApplyResult,
)


class TickOutcome(StrEnum):
    """The ``outcome`` of ``gmd_agent_ticks_total``."""

    ok = "ok"
    host_unreadable = "host_unreadable"


class BatchFate(StrEnum):
    """The ``outcome`` of ``gmd_agent_batches_total``."""

    made = "made"
    accepted = "accepted"
    duplicate = "duplicate"
    rejected = "rejected"
    dropped = "dropped"


class FetchOutcome(StrEnum):
    """The ``outcome`` of ``gmd_agent_plan_fetches_total``."""

    ok = "ok"
    unavailable = "unavailable"


class ResultOutcome(StrEnum):
    """The ``outcome`` of ``gmd_agent_enforcement_results_total``."""

    ok = "ok"
    failed = "failed"


class ApplyFailure(StrEnum):
    """The ``reason`` of ``gmd_agent_plan_apply_failures_total``: why a plan was not applied
    through (the VMs' own failures are ``gmd_agent_enforcement_results_total``)."""

    backend_unavailable = "backend_unavailable"
    """the hypervisor could not be reached: the rest of the plan waits for the next fetch"""
    error = "error"
    """the applier failed (a bug; see the log): nothing of the plan was reported"""


def _registry() -> CollectorRegistry:
    """A registry of the agent's own, with the client library's process, platform and GC
    series and the build's version."""
    # No `_created` series beside counters and histograms: Prometheus does not use them.
    prometheus_client.disable_created_metrics()
    r = CollectorRegistry()
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    GCCollector(registry=r)
    Info("gmd_build", "The gmd version this agent runs.", registry=r).info({"version": version()})
    return r


class _Levels:
    """The levels the agent last saw, made gauges at each scrape: a custom collector of
    prometheus_client's, whose :meth:`collect` runs on the scraping thread and reads plain
    attributes that the agent's thread sets whole. What the loop says (a reading, the spool, a
    plan's mode, the host's knobs) is kept as it is, and each series, its labels and every label
    value (each at every scrape, so none reads "no data") are written once, here."""

    def __init__(self) -> None:
        self.last_tick_s = 0.0
        self.vms = 0
        self.disk_disagreeing = 0
        self.spool_batches = 0
        self.spool_bytes = 0
        self.throttled = 0
        self.mode: PlanMode | None = None
        """the mode of the latest plan applied (``None``: none yet)"""
        self.knobs: dict[Knob, KnobSupport] = dict.fromkeys(Knob, KnobSupport.unknown)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "gmd_agent_spool_batches", "Batches waiting in the spool.", self.spool_batches
        )
        yield GaugeMetricFamily(
            "gmd_agent_spool_bytes", "Bytes of the batches waiting in the spool.", self.spool_bytes
        )
        yield GaugeMetricFamily(
            "gmd_agent_vms_disk_counters_disagreeing",
            "VMs whose cgroup's disk bytes (the host devices' I/O) disagreed with their QEMU's"
            " block stats (what the guest asked) at the latest check: their disk use is QEMU's"
            " figure either way (kernel collector; 0 with the others).",
            self.disk_disagreeing,
        )
        yield GaugeMetricFamily(
            "gmd_agent_last_tick_seconds",
            "Unix time of the latest successful reading of the host.",
            self.last_tick_s,
        )
        mode = GaugeMetricFamily(
            "gmd_agent_enforcement_mode",
            "The mode of the latest plan this agent applied: 1 for it, 0 for the others (all 0"
            " before the first plan, and with agent.enforce_backend = none).",
            labels=["mode"],
        )
        for m in PLAN_MODES:
            mode.add_metric([m], 1.0 if m == self.mode else 0.0)
        yield mode
        yield GaugeMetricFamily(
            "gmd_agent_vms",
            "VMs running on this host at the latest tick that read it (those the agent measures:"
            " agent.domain_prefixes and agent.only_nova leave the others out).",
            self.vms,
        )
        yield GaugeMetricFamily(
            "gmd_agent_vms_throttled",
            "VMs gmd holds throttled now: those whose original settings it keeps to put back"
            " (0 with agent.enforce_backend = none).",
            self.throttled,
        )
        knobs = GaugeMetricFamily(
            "gmd_agent_knob_support",
            "Whether this host can set each knob (cpu_weight, cpu_cap, disk_weight, disk_limit,"
            " network_limit): 1 for its support (supported, unsupported or unknown), 0 for the"
            " others; unknown until the host is probed.",
            labels=["knob", "support"],
        )
        for knob, support in self.knobs.items():
            for s in KnobSupport:
                knobs.add_metric([knob, s], 1.0 if s == support else 0.0)
        yield knobs


class AgentMetrics:
    """The agent's Prometheus metrics, in a registry of its own (tests run several agents).

    Counters and histograms are made here; the levels (gauges) at each scrape, from what the
    agent last saw (:class:`_Levels`). Every label value is created at start (Kueue's habit),
    so that a rate or an alert on a series that has not happened yet reads 0, not "no data";
    the process, platform and GC series of the client library are in the same registry
    (``process_*``, ``python_*``)."""

    def __init__(self) -> None:
        self.registry = r = _registry()
        self._levels = _Levels()
        r.register(self._levels)
        self.samples = Counter(
            "gmd_agent_samples", "VM readings taken (one per running VM per tick).", registry=r
        )
        self.ticks = Counter(
            "gmd_agent_ticks",
            "Ticks, by outcome: ok, or host_unreadable (libvirt down).",
            ["outcome"],
            registry=r,
        )
        self.batches = Counter(
            "gmd_agent_batches",
            "Batches by fate: made, accepted, duplicate (acknowledged again), rejected (4xx,"
            " never acceptable), dropped (spool full).",
            ["outcome"],
            registry=r,
        )
        self.spooled = Counter(
            "gmd_agent_batches_spooled",
            "Batches the daemon could not take when they were first due (kept for replay).",
            registry=r,
        )
        self.libvirt_errors = Counter(
            "gmd_agent_libvirt_errors",
            "Read failures, by scope: host (libvirt unreachable, or its connection lost),"
            " domain (one VM's reading or description; a busy domain is not one) or"
            " block_stats (QEMU's block stats of the kernel-read VMs that need them).",
            ["scope"],
            registry=r,
        )
        self.busy_domains = Counter(
            "gmd_agent_busy_domains",
            "VM readings skipped because another libvirt job held the domain or it did not"
            " answer in time; read at a later tick, from its last counters.",
            registry=r,
        )
        self.kernel_fallbacks = Counter(
            "gmd_agent_kernel_fallbacks",
            "VM readings the kernel collector took through libvirt because a cgroup or sysfs"
            " file could not be read (one per VM per tick).",
            registry=r,
        )
        self.counter_resets = Counter(
            "gmd_agent_counter_resets",
            "VM counters that went down (process restarted): counted from zero, not negative.",
            registry=r,
        )
        self.tick_seconds = Histogram(
            "gmd_agent_tick_seconds",
            "Time to read the host and spool the results (without sending).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.plan_fetches = Counter(
            "gmd_agent_plan_fetches",
            "Throttling plan fetches, by outcome: ok, or unavailable (settings kept as they are).",
            ["outcome"],
            registry=r,
        )
        self.enforcement_results = Counter(
            "gmd_agent_enforcement_results",
            "VM changes reported to the daemon, by action (apply, restore, would_apply,"
            " would_restore) and outcome (ok, failed; a failure is reported once while it"
            " lasts).",
            ["action", "outcome"],
            registry=r,
        )
        self.apply_failures = Counter(
            "gmd_agent_plan_apply_failures",
            "Fetched plans not applied through, by reason: backend_unavailable (the hypervisor"
            " could not be reached; the rest waits for the next fetch) or error (the applier"
            " failed, see the log).",
            ["reason"],
            registry=r,
        )
        self._every_label_value()

    def _every_label_value(self) -> None:
        """Each labelled counter's every label value, at 0 (see the class docstring)."""
        for labelled, values in (
            (self.ticks, TickOutcome),
            (self.batches, BatchFate),
            (self.libvirt_errors, FailureKind),
            (self.plan_fetches, FetchOutcome),
            (self.apply_failures, ApplyFailure),
        ):
            for value in values:
                labelled.labels(value)
        for action in get_args(ApplyAction):
            for outcome in ResultOutcome:
                self.enforcement_results.labels(action, outcome)

    def applying(self, mode: PlanMode) -> None:
        """The mode of the plan being applied is now the current one."""
        self._levels.mode = mode

    def read(self, reading: HostReading) -> None:
        """One tick's reading of the host: its VMs, how it went, and what failed."""
        self.samples.inc(len(reading.vms))
        self.kernel_fallbacks.inc(len(reading.fallbacks))
        if reading.ok:
            self.ticks.labels(TickOutcome.ok).inc()
            self._levels.last_tick_s = reading.taken_s
            self._levels.vms = len(reading.listed)
            self._levels.disk_disagreeing = len(reading.disk_disagreements)
            for failure in reading.errors:
                self.libvirt_errors.labels(failure.kind).inc()
            self.busy_domains.inc(len(reading.busy))
        else:
            self.ticks.labels(TickOutcome.host_unreadable).inc()
            self.libvirt_errors.labels(FailureKind.host).inc()

    def spool(self, batches: int, size: int) -> None:
        """The spool holds ``batches`` waiting, of ``size`` bytes."""
        self._levels.spool_batches, self._levels.spool_bytes = batches, size

    def throttling(self, count: int) -> None:
        """``count`` VMs are held throttled now (the applier's remembered VMs)."""
        self._levels.throttled = count

    def capabilities(self, caps: HostCapabilities) -> None:
        """What probing the host found of each knob (one it did not report is unknown)."""
        self._levels.knobs = {knob: caps.support(knob).support for knob in Knob}

    def batches_went(self, fate: BatchFate, count: int) -> None:
        """``count`` batches met ``fate``."""
        self.batches.labels(fate).inc(count)

    def plan_fetched(self, outcome: FetchOutcome) -> None:
        self.plan_fetches.labels(outcome).inc()

    def apply_failed(self, reason: ApplyFailure) -> None:
        """A fetched plan was not applied through."""
        self.apply_failures.labels(reason).inc()

    def vm_changed(self, result: VmApplyResult) -> None:
        """One VM's change, reported to the daemon."""
        outcome = ResultOutcome.ok if result.ok else ResultOutcome.failed
        self.enforcement_results.labels(result.action, outcome).inc()
