"""The agent's loop: collector → state → spool → sender, one tick at a time.

Each tick reads the host (:mod:`gmd.agent.collect.libvirt`), folds the reading into the agent state
(:func:`gmd.agent.collect.aggregate.advance`), stores closed intervals as batches together with the
new state in the spool in one transaction (:mod:`gmd.agent.spool`), and only then replays
the spool to the daemon (:mod:`gmd.agent.sender`): a crash anywhere loses nothing, and a
batch keeps its key until the daemon has acknowledged it, so nothing counts twice.

A new batch is first posted a random time in [0, ``post_jitter_s``) after its interval's end,
not at the tick that made it: every host closes the interval at the same moment, and a daemon
that takes them all at once may need longer than the grace period. Between ticks the loop
sleeps until the next tick or the next batch due, whichever comes first, so sending never
delays a reading by more than one post.

After sending, at most once per ``plan_every_s``, the agent fetches the host's throttling plan
and hands it to its applier (:mod:`gmd.agent.apply.base`), then reports what changed or failed
(``POST /v1/plan/{host}/report``). A plan that cannot be fetched changes nothing: the VMs keep
their current settings until the daemon says otherwise. Reports that cannot be posted are kept
(in memory, bounded) and posted with the next round's.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gmd.agent.capabilities import describe
from gmd.agent.client import DaemonClient, Delivery, PlanUnavailable, PostOutcome
from gmd.agent.collect.aggregate import (
    AgentState,
    ClosedInterval,
    VmTotals,
    advance,
    batch_document,
    dump_state,
    load_state,
)
from gmd.agent.collect.base import Collector, HostReading
from gmd.agent.collect.capacity import SYS_CLASS_NET, Bandwidth, HostCapacity
from gmd.agent.config import AgentConfig
from gmd.agent.metrics import AgentMetrics, ApplyFailure, BatchFate, FetchOutcome
from gmd.agent.sender import Sender
from gmd.agent.spool import Spool, Spooled, SpoolError
from gmd.common.timespec import iso
from gmd.wire import HostCapabilities, HostPlan, PlanReport, VmApplyResult

if TYPE_CHECKING:
    from gmd.agent.apply.base import PlanApplier
    from gmd.agent.capabilities import HostProbe

log = logging.getLogger("gmd.agent")

PROBE_EVERY_S = 600.0
"""How often the host's knobs are probed again though its VMs stayed the same (a scheduler
switched, a hierarchy remounted)."""

MAX_PENDING_RESULTS = 10_000
"""Unposted enforcement results kept for the next round; older ones are dropped (logged)."""


class PlanClient(Protocol):
    """Where plans come from and reports go (:class:`gmd.agent.client.DaemonClient`)."""

    def get_plan(self, host: str) -> HostPlan: ...

    def put_capabilities(self, host: str, caps: HostCapabilities) -> PostOutcome: ...

    def post_report(self, host: str, report: PlanReport) -> PostOutcome: ...


@dataclass(frozen=True, slots=True)
class TickReport:
    reading: HostReading
    batches: int
    dropped: int
    waiting: int
    enforcement: tuple[VmApplyResult, ...] = ()
    """what the plan fetched in this tick changed or failed to change (empty: no fetch)"""


def new_key(host: str, interval_start_s: int) -> str:
    """A fresh idempotency key: readable, ≤ 128 printable characters, never reused."""
    name = "".join(c if "!" <= c <= "~" else "_" for c in host)[:80]
    return f"{name}/{interval_start_s}/{secrets.token_hex(8)}"


class AgentLoop:
    """One host's agent: collector → state → spool → sender. ``tick()`` is one round."""

    def __init__(
        self,
        config: AgentConfig,
        collector: Collector,
        spool: Spool,
        sender: Sender | None,
        metrics: AgentMetrics | None = None,
        *,
        sys_class_net: Path | None = None,
        key: Callable[[str, int], str] = new_key,
        applier: PlanApplier | None = None,
        plans: PlanClient | None = None,
        rng: random.Random | None = None,
        probe: HostProbe | None = None,
    ) -> None:
        self.config, self.collector, self.spool, self.sender = config, collector, spool, sender
        self.applier, self.plans = applier, plans
        self.probe = probe
        self.capabilities: HostCapabilities | None = None
        """what the latest probe of the host found (None: not probed)"""
        self._probed_for: frozenset[str] | None = None
        self._probe_due_s = 0.0
        self._capabilities_unsaid = False
        self._clock_behind = False
        """the last reading came before the one before it (the clock was stepped back)"""
        self._rng = rng or random.Random()
        self._plan_due_s: float | None = None
        self._unreported: list[tuple[int, VmApplyResult]] = []
        self.metrics = metrics or AgentMetrics()
        self._key = key
        self.state = AgentState()
        blob = spool.state()
        if blob is not None:
            try:
                self.state = load_state(blob)
            except (ValueError, KeyError, TypeError) as exc:
                log.error(
                    "spool %s: cannot use the saved agent state (%s): starting afresh, the"
                    " use since the last saved tick is not counted",
                    spool.path,
                    exc,
                )
            else:
                log.info(
                    "resuming from spool %s: %d VMs' counters, %d open intervals",
                    spool.path,
                    len(self.state.baselines),
                    len(self.state.open),
                )
        self._sys_class_net = sys_class_net or SYS_CLASS_NET
        self._bandwidth = Bandwidth.of(
            config.disk_bytes_per_s, config.network_bytes_per_s, self._sys_class_net
        )
        self.capacity: HostCapacity | None = None
        self.finished: tuple[float, TickReport] | None = None
        """when the latest tick ended (``time.monotonic()``) and its report"""
        self._capacity_interval: int | None = None

    def _refresh_capacity(self, now_s: float) -> HostCapacity | None:
        """Cores and RAM from libvirt once per interval (a host can gain memory), the rest
        from the configuration."""
        interval = int(now_s // self.config.interval_s)
        if self.capacity is not None and interval == self._capacity_interval:
            return self.capacity
        resources = self.collector.resources()
        if resources is None:
            return self.capacity
        capacity = self._bandwidth.capacity(resources)
        if capacity != self.capacity:
            log.info(
                "host %s capacity: %g cores, %.1f GiB RAM (%s), disk %.0f MB/s"
                " (agent.disk_bytes_per_s), network %.0f MB/s (%s)",
                self.config.host,
                capacity.cpu_cores,
                capacity.memory_bytes / 2**30,
                self.config.collector,
                capacity.disk_bytes_per_s / 1e6,
                capacity.network_bytes_per_s / 1e6,
                self._bandwidth.network_source,
            )
        self.capacity, self._capacity_interval = capacity, interval
        return capacity

    def tick(self, now_s: float | None = None) -> TickReport:
        """Read, fold, spool, send. A host that cannot be read leaves the state untouched:
        the next reading measures from the last good one."""
        started = time.perf_counter()
        m = self.metrics
        now_s = time.time() if now_s is None else now_s
        capacity = self._refresh_capacity(now_s)
        if capacity is None:
            reading = HostReading(now_s, False)
            m.read(reading)
            return self._finished(TickReport(reading, 0, 0, self._send(now_s)))
        reading = self.collector.collect()
        last = self.state.last_ok_s
        if last is not None and reading.taken_s < last and not self._clock_behind:
            log.warning(
                "the clock went back %.1f s: readings are timed at the last one's (%s) until it"
                " is past it again, so that no second is counted twice",
                last - reading.taken_s,
                iso(last),
            )
        self._clock_behind = last is not None and reading.taken_s < last
        result = advance(self.state, reading, self.config.interval_s)
        m.read(reading)
        for span in result.spans:
            if span.resets:
                m.counter_resets.inc(len(span.resets))
                log.info(
                    "VM %s: counters reset (%s): counted from zero",
                    span.uuid,
                    ", ".join(span.resets),
                )
        wire_capacity = capacity.as_wire()
        batches = []
        for closed in result.closed:
            key = self._key(self.config.host, closed.start_s)
            doc = batch_document(closed, key=key, host=self.config.host, capacity=wire_capacity)
            batches.append((key, closed.start_s, orjson.dumps(doc)))
        dropped = self.spool.commit(dump_state(result.state), batches)
        self.state = result.state
        self._schedule(result.closed, [key for key, _start, _body in batches], dropped)
        m.batches_went(BatchFate.made, len(batches))
        m.batches_went(BatchFate.dropped, len(dropped))
        m.tick_seconds.observe(time.perf_counter() - started)
        waiting = self._send(now_s)
        if self.sender is None:
            m.spooled.inc(min(len(batches), waiting))
        if reading.ok:
            self._probe(now_s, reading)
        enforced = self._enforce(now_s) if reading.ok else ()
        m.throttling(len(self.applier.remembered) if self.applier is not None else 0)
        return self._finished(TickReport(reading, len(batches), len(dropped), waiting, enforced))

    def _finished(self, report: TickReport) -> TickReport:
        """Keep the tick's report with when it ended (``time.monotonic()``): /healthz's."""
        self.finished = (time.monotonic(), report)
        return report

    def _probe(self, now_s: float, reading: HostReading) -> None:
        """Probe the host's knobs (:mod:`gmd.agent.capabilities`) at the first reading, when
        the set of VMs changed (a VM's group is where its files are looked at) and every
        :data:`PROBE_EVERY_S`; hand what changed to the applier, the metrics and the log, and
        tell the daemon until it has heard it."""
        if self.probe is None:
            return
        running = frozenset(vm.uuid for vm in reading.vms)
        if running != self._probed_for or now_s >= self._probe_due_s:
            self._probed_for, self._probe_due_s = running, now_s + PROBE_EVERY_S
            names = sorted(vm.name for vm in reading.vms if vm.name)
            caps = self.probe.through(self.applier, names, sorted(running))
            before = self.capabilities
            if before is None or _knobs(before) != _knobs(caps):
                log.info("host %s: %s", self.config.host, describe(caps))
                self._capabilities_unsaid = True
            self.capabilities = caps
            if self.applier is not None:
                self.applier.capabilities = caps
            self.metrics.capabilities(caps)
        if self._capabilities_unsaid and self.plans is not None and self.capabilities:
            outcome = self.plans.put_capabilities(self.config.host, self.capabilities)
            if outcome.kind == Delivery.unavailable:
                log.warning(
                    "cannot tell the daemon this host's knobs (%s): tried again next tick",
                    outcome.detail,
                )
                return
            if outcome.kind == Delivery.rejected:
                log.error(
                    "the daemon refused this host's knobs (HTTP %s: %s); its plans are made as"
                    " if every knob worked here",
                    outcome.status,
                    outcome.detail,
                )
            self._capabilities_unsaid = False

    def _enforce(self, now_s: float) -> tuple[VmApplyResult, ...]:
        """Fetch the plan if it is due, apply it, report; what was reported (or is kept)."""
        if self.applier is None or self.plans is None:
            return ()
        if self._plan_due_s is not None and now_s < self._plan_due_s:
            return ()
        self._plan_due_s = now_s + self.config.plan_every_s
        host = self.config.host
        try:
            plan = self.plans.get_plan(host)
        except PlanUnavailable as exc:
            self.metrics.plan_fetched(FetchOutcome.unavailable)
            log.warning(
                "cannot fetch the throttling plan for %s (%s): the VMs keep their current settings",
                host,
                exc,
            )
            return ()
        self.metrics.plan_fetched(FetchOutcome.ok)
        if plan.host != host:
            log.error("the daemon sent the plan of %r when asked for %r: ignored", plan.host, host)
            return ()
        self.metrics.applying(plan.mode)
        try:
            results = self.applier.sync(plan)
        except Exception:
            self.metrics.apply_failed(ApplyFailure.error)
            log.exception(
                "applying the plan of %d failed; retried at the next fetch", plan.generated_s
            )
            return ()
        if self.applier.interrupted is not None:
            self.metrics.apply_failed(ApplyFailure.backend_unavailable)
        for r in results:
            self.metrics.vm_changed(r)
        self._unreported.extend((plan.generated_s, r) for r in results)
        if len(self._unreported) > MAX_PENDING_RESULTS:
            lost = len(self._unreported) - MAX_PENDING_RESULTS
            del self._unreported[:lost]
            log.warning("%d enforcement results could not be reported and were dropped", lost)
        self._report()
        return tuple(results)

    def _report(self) -> None:
        """Post the unreported results, one report per plan they came from, oldest first."""
        if self.plans is None:
            return
        while self._unreported:
            generated = self._unreported[0][0]
            chunk = [r for g, r in self._unreported if g == generated][:MAX_PENDING_RESULTS]
            report = PlanReport(generated_s=generated, results=chunk)
            outcome = self.plans.post_report(self.config.host, report)
            if outcome.kind == Delivery.unavailable:
                log.warning(
                    "cannot report %d enforcement result(s) to the daemon (%s): kept for the"
                    " next round",
                    len(chunk),
                    outcome.detail,
                )
                return
            if outcome.kind == Delivery.rejected:
                log.error(
                    "the daemon refused the enforcement report of plan %d (HTTP %s: %s): dropped",
                    generated,
                    outcome.status,
                    outcome.detail,
                )
            sent = {id(r) for r in chunk}
            self._unreported = [(g, r) for g, r in self._unreported if id(r) not in sent]

    def _schedule(
        self, closed: list[ClosedInterval], keys: list[str], dropped: list[Spooled]
    ) -> None:
        """Tell the sender when each new batch may first be posted.

        A fresh random delay per batch rather than one fixed offset per host: a host with a
        fixed offset near the end of the window would always be the one closest to the
        daemon's grace period, the first to be late whenever the daemon is slow; drawn anew,
        that risk is shared by all hosts, and the spread over hosts stays as even. The delay
        counts from the interval's end, not from the tick, so a tick that ran late does not
        push the post later still.

        A replay posts at once: its configuration's ``post_jitter_s`` is 0
        (:func:`gmd.agent.config.parse_agent`).
        """
        if self.sender is None:
            return
        jitter_s = self.config.post_jitter_s
        for interval, key in zip(closed, keys, strict=True):
            delay_s = jitter_s * self._rng.random() if jitter_s else 0.0
            self.sender.schedule(key, interval.start_s + interval.interval_s + delay_s)
        for gone in dropped:
            self.sender.forget(gone.key)

    def _send(self, now_s: float, budget_s: float | None = None) -> int:
        """Replay the spool, the batches due by ``now_s``; the number of batches still
        waiting."""
        m = self.metrics
        if self.sender is not None:
            report = self.sender.drain(
                budget_s=self.config.tick_s / 2 if budget_s is None else budget_s, now_s=now_s
            )
            m.batches_went(BatchFate.accepted, report.accepted)
            m.batches_went(BatchFate.duplicate, report.duplicates)
            m.batches_went(BatchFate.rejected, report.rejected)
            m.spooled.inc(report.missed)
        waiting, size = self.spool.size()
        m.spool(waiting, size)
        return waiting

    def reconfigure(self, config: AgentConfig, client: DaemonClient | None = None) -> None:
        """Put a reloaded ``config`` in force (:mod:`gmd.agent.reload` kept the running value
        of what takes a restart): the bandwidths from the next tick on, a new ``client`` (a
        daemon, token or timeout changed) for the next post and plan."""
        self._bandwidth = Bandwidth.of(
            config.disk_bytes_per_s, config.network_bytes_per_s, self._sys_class_net
        )
        self._capacity_interval = None  # the capacity is worked out again, and said
        if client is not None:
            if self.sender is not None:
                self.sender.client = client
            if self.plans is not None:
                self.plans = client
        self.config = config

    def run(self, stop: threading.Event, clock: Callable[[], float] = time.time) -> None:
        """Tick at whole multiples of ``tick_s`` until ``stop`` is set, posting scheduled
        batches in between when they are due. A tick that overruns skips the ticks it
        overlapped: the next reading covers the time, nothing is lost."""
        tick_s = self.config.tick_s
        while not stop.is_set():
            try:
                self.tick(clock())
            except SpoolError:
                raise  # the state cannot be saved: ticking on would measure nothing
            except Exception:
                log.exception("tick failed; the next tick measures from the last saved state")
            next_tick_s = (math.floor(clock() / tick_s) + 1) * tick_s
            self._post_until(next_tick_s, stop, clock)
            stop.wait(next_tick_s - clock())

    def _post_until(
        self, next_tick_s: float, stop: threading.Event, clock: Callable[[], float]
    ) -> None:
        """Post each scheduled batch when it is due, until the next tick is. Every drain stops
        posting at the next tick, so a reading is late by one post's time at most."""
        while self.sender is not None and not stop.is_set():
            due_s = self.sender.next_post_s()
            if due_s is None or due_s >= next_tick_s:
                return
            if stop.wait(max(0.0, due_s - clock())):
                return
            now_s = clock()
            try:
                self._send(now_s, budget_s=max(0.0, next_tick_s - now_s))
            except SpoolError:
                raise
            except Exception:
                log.exception("posting the batches due failed; the next tick tries again")
                return


def dry_run_batch(config: AgentConfig, collector: Collector) -> tuple[dict[str, Any], float]:
    """Two readings ``tick_s`` apart, and the batch that span's use would go out as.

    Nothing is written or sent. The amounts are one tick's use (not a whole interval's), under
    the interval the second reading falls in.
    """
    resources = collector.resources()
    if resources is None:
        # Why, in the connection's words (with what this user needs, where it lacks rights).
        why = "; ".join(map(str, collector.collect().errors))
        raise RuntimeError(why or f"cannot read the host through libvirt at {config.libvirt_uri}")
    capacity = Bandwidth.of(config.disk_bytes_per_s, config.network_bytes_per_s).capacity(resources)
    reading = collector.collect()
    if not reading.ok:
        raise RuntimeError("; ".join(map(str, reading.errors)) or "the host could not be read")
    first = advance(AgentState(), reading, config.interval_s)
    log.info(
        "dry run: reading %d VMs again in %g s (agent.tick_s)", len(reading.vms), config.tick_s
    )
    time.sleep(config.tick_s)
    reading = collector.collect()
    if not reading.ok:
        raise RuntimeError("; ".join(map(str, reading.errors)) or "the host could not be read")
    second = advance(first.state, reading, config.interval_s)
    totals: dict[str, VmTotals] = {}
    for vms in [*(c.vms for c in second.closed), *second.state.open.values()]:
        for uuid, t in vms.items():
            before = totals.get(uuid)
            totals[uuid] = t if before is None else VmTotals(before.usage.plus(t.usage), t.owner)
    start = int(reading.taken_s // config.interval_s) * config.interval_s
    host_cpu = [c.host_cpu_s for c in second.closed if c.host_cpu_s is not None]
    host_cpu += second.state.open_host_cpu.values()
    closed = ClosedInterval(start, config.interval_s, totals, sum(host_cpu) if host_cpu else None)
    doc = batch_document(
        closed, key=f"dry-run/{start}", host=config.host, capacity=capacity.as_wire()
    )
    span = second.spans[0].end_s - second.spans[0].start_s if second.spans else config.tick_s
    return doc, span


def _knobs(caps: HostCapabilities) -> object:
    """What of a probe is worth saying again: all but when it was made."""
    return caps.model_dump(exclude={"probed_s"})
