"""The agent's Prometheus metrics: every series, its labels as enums, and a typed helper per
event, so that the loop says what happened (``metrics.read(reading)``) and this module alone
knows which series and label that is — as the daemon's :mod:`gmd.daemon.api.metrics` does.
"""

from __future__ import annotations

from enum import StrEnum
from typing import get_args

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

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


class AgentMetrics:
    """The agent's Prometheus metrics, in a registry of its own (tests run several agents).

    Every label value is created at start (Kueue's habit), so that a rate or an alert on a
    series that has not happened yet reads 0, not "no data"; the process, platform and GC
    series of the client library are in the same registry (``process_*``, ``python_*``)."""

    def __init__(self) -> None:
        # No `_created` series beside counters and histograms: Prometheus does not use them.
        prometheus_client.disable_created_metrics()
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        Info("gmd_build", "The gmd version this agent runs.", registry=r).info(
            {"version": version()}
        )
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
        self.spool_batches = Gauge(
            "gmd_agent_spool_batches", "Batches waiting in the spool.", registry=r
        )
        self.spool_bytes = Gauge(
            "gmd_agent_spool_bytes", "Bytes of the batches waiting in the spool.", registry=r
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
        self.disk_disagreeing = Gauge(
            "gmd_agent_vms_disk_counters_disagreeing",
            "VMs whose cgroup's disk bytes (the host devices' I/O) disagreed with their QEMU's"
            " block stats (what the guest asked) at the latest check: their disk use is QEMU's"
            " figure either way (kernel collector; 0 with the others).",
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
        self.last_tick = Gauge(
            "gmd_agent_last_tick_seconds",
            "Unix time of the latest successful reading of the host.",
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
        self.mode = Gauge(
            "gmd_agent_enforcement_mode",
            "The mode of the latest plan this agent applied: 1 for it, 0 for the others (all 0"
            " before the first plan, and with agent.enforce_backend = none).",
            ["mode"],
            registry=r,
        )
        self.vms = Gauge(
            "gmd_agent_vms",
            "VMs running on this host at the latest tick that read it (those the agent measures:"
            " agent.domain_prefixes and agent.only_nova leave the others out).",
            registry=r,
        )
        self.vms_throttled = Gauge(
            "gmd_agent_vms_throttled",
            "VMs gmd holds throttled now: those whose original settings it keeps to put back"
            " (0 with agent.enforce_backend = none).",
            registry=r,
        )
        self.knob_support = Gauge(
            "gmd_agent_knob_support",
            "Whether this host can set each knob (cpu_weight, cpu_cap, disk_weight, disk_limit,"
            " network_limit): 1 for its support (supported, unsupported or unknown), 0 for the"
            " others; unknown until the host is probed.",
            ["knob", "support"],
            registry=r,
        )
        for knob in Knob:
            self._knob(knob, KnobSupport.unknown)
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
        for mode in PLAN_MODES:
            self.mode.labels(mode).set(0)

    def applying(self, mode: PlanMode) -> None:
        """The mode of the plan being applied is now the current one."""
        for m in PLAN_MODES:
            self.mode.labels(m).set(1 if m == mode else 0)

    def read(self, reading: HostReading) -> None:
        """One tick's reading of the host: its VMs, how it went, and what failed."""
        self.samples.inc(len(reading.vms))
        self.kernel_fallbacks.inc(len(reading.fallbacks))
        if reading.ok:
            self.ticks.labels(TickOutcome.ok).inc()
            self.last_tick.set(reading.taken_s)
            self.vms.set(len(reading.listed))
            self.disk_disagreeing.set(len(reading.disk_disagreements))
            for failure in reading.errors:
                self.libvirt_errors.labels(failure.kind).inc()
            self.busy_domains.inc(len(reading.busy))
        else:
            self.ticks.labels(TickOutcome.host_unreadable).inc()
            self.libvirt_errors.labels(FailureKind.host).inc()

    def throttling(self, count: int) -> None:
        """``count`` VMs are held throttled now (the applier's remembered VMs)."""
        self.vms_throttled.set(count)

    def capabilities(self, caps: HostCapabilities) -> None:
        """What probing the host found of each knob (one it did not report is unknown)."""
        for knob in Knob:
            self._knob(knob, caps.support(knob).support)

    def _knob(self, knob: Knob, support: KnobSupport) -> None:
        for s in KnobSupport:
            self.knob_support.labels(knob, s).set(1 if s == support else 0)

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
