"""The daemon's Prometheus metrics, in a registry of its own (one per app, so tests can run
several daemons in one process).

Label values are bounded: a refusal's ``reason`` is a :class:`Rejection`, a host is one the
ledger knows (only a stored batch names it), a level one of the policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import get_args

import prometheus_client
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)

from gmd.common.version import version
from gmd.daemon.placement.view import Disagreement
from gmd.wire import PLAN_MODES, ApplyAction, Knob, KnobOutcome


class Rejection(StrEnum):
    """Why a batch was refused: the ``reason`` of ``gmd_ingest_rejected_batches_total``."""

    content_type = "content_type"
    """not sent as application/json (415)"""
    malformed_json = "malformed_json"
    """not JSON, or NaN/Infinity in it (400)"""
    invalid_fields = "invalid_fields"
    """JSON, but not a batch: unknown, missing or mistyped fields, a VM twice (422)"""
    too_large = "too_large"
    """over daemon.max_body_bytes or daemon.max_batch_vms (413)"""
    unauthorized = "unauthorized"
    """no token, or one no host has (401)"""
    wrong_host = "wrong_host"
    """another host's token (403)"""
    interval_mismatch = "interval_mismatch"
    """an interval of another length, or misaligned: the agent's interval_s is not ours (422)"""
    future = "future"
    """an interval (425: the agent keeps the batch and sends it again) or a VM (422) from the
    future beyond daemon.clock_skew_s: a host's clock"""
    too_old = "too_old"
    """an interval that ended more than daemon.max_late_s ago (422)"""
    implausible = "implausible"
    """use, capacity or flavor no host could have (422)"""
    key_reused = "key_reused"
    """a stored batch's key with other content (409)"""
    capacity_conflict = "capacity_conflict"
    """the host's capacity for the interval differs from its first batch's (409)"""
    before_origin = "before_origin"
    """an interval before the ledger's first, once accounting has begun (422)"""
    over_limit = "over_limit"
    """past a host's bound of [daemon.limits]: batches per interval (422), new customers or
    VMs per interval (429, or 422 for one batch beyond it)"""
    placement = "placement"
    """Placement disagrees with the batch (409): gmd_placement_refused_batches_total says how"""


class QuotaChange(StrEnum):
    """What a quota write did: the ``action`` of ``gmd_enforcement_quota_writes_total``."""

    lowered = "lower"
    restored = "restore"


HOST_ACTIONS = tuple(sorted({a.removeprefix("would_") for a in get_args(ApplyAction)}))
"""What a host does to a VM, dry-run or not: the ``action`` of host failures."""


class DaemonMetrics:
    def __init__(self) -> None:
        # prometheus_client adds a `_created` series beside every counter and histogram by
        # default; Prometheus does not use them, and they double what every scrape carries.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        # The process's CPU, memory, open files and start time, Python's version and its
        # garbage collector, as every Prometheus client exports them: the collectors of the
        # default registry, registered in this one too (they read /proc and gc when scraped).
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        Info("gmd_build", "The gmd version this daemon runs.", registry=r).info(
            {"version": version()}
        )
        self._ingest(r)
        self._accounting(r)
        self._enforcement(r)
        self._ledger(r)
        self._placement(r)
        self.read_busy = Counter(
            "gmd_read_busy_requests",
            "Read requests (reports, plots, what-ifs, pages) answered 503 because"
            " [read_api] concurrent were being served and they waited [read_api] queue_s.",
            registry=r,
        )

    def _ingest(self, r: CollectorRegistry) -> None:
        """Batches and samples received, refused and stored, per host and reason."""
        self.batches = Counter(
            "gmd_ingest_batches",
            "Sample batches received, by outcome: accepted, duplicate (a retry, acknowledged"
            " again) or rejected (gmd_ingest_rejected_batches_total says why).",
            ["outcome"],
            registry=r,
        )
        self.rejected = Counter(
            "gmd_ingest_rejected_batches",
            "Sample batches refused, by reason (see the daemon's log for which and why).",
            ["reason"],
            registry=r,
        )
        for reason in Rejection:
            self.rejected.labels(reason.value)
        self.last_batch = Gauge(
            "gmd_ingest_last_batch_seconds",
            "When (Unix time) the daemon last stored a batch from each host: from the ledger"
            " at start, then from every batch this daemon stores.",
            ["host"],
            registry=r,
        )
        self.samples = Counter(
            "gmd_ingest_samples",
            "VM samples stored, by whether they arrived before their interval closed.",
            ["timing"],
            registry=r,
        )
        self.ingest_seconds = Histogram(
            "gmd_ingest_batch_seconds",
            "Time to validate and store one batch.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )

    def _accounting(self, r: CollectorRegistry) -> None:
        """Intervals accounted, how long each took, what failed or was set aside."""
        self.intervals = Counter(
            "gmd_accounting_intervals", "Intervals accounted by this daemon.", registry=r
        )
        self.accounting_seconds = Histogram(
            "gmd_accounting_interval_seconds",
            "Time to account one interval (read, compute, write).",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.accounting_errors = Counter(
            "gmd_accounting_errors", "Accountant runs that failed (see the log).", registry=r
        )
        self.quarantined = Counter(
            "gmd_accounting_quarantined_batches",
            "Batches accounting could not account and set aside (gmd-admin batches"
            " --quarantined lists them).",
            registry=r,
        )
        self.last_accounted = Gauge(
            "gmd_accounting_last_interval_start_seconds",
            "Start (Unix time) of the latest interval this daemon accounted.",
            registry=r,
        )

    def _enforcement(self, r: CollectorRegistry) -> None:
        """Throttle levels, the enforcement mode, quota writes and what hosts reported."""
        self.levels = Gauge(
            "gmd_enforcement_customers",
            "Customers at each throttle level above 0, as the latest decision left them"
            " (exported by a daemon that accounts; dry-run levels included).",
            ["level"],
            registry=r,
        )
        self._levels_shown: set[int] = set()
        self.mode = Gauge(
            "gmd_enforcement_mode",
            "The configured enforcement.mode: 1 for the current one, 0 for the others.",
            ["mode"],
            registry=r,
        )
        for mode in PLAN_MODES:
            self.mode.labels(mode).set(0)
        self.quota_writes = Counter(
            "gmd_enforcement_quota_writes",
            "OpenStack compute quotas written: lowered for a customer's level, or restored.",
            ["action"],
            registry=r,
        )
        for change in QuotaChange:
            self.quota_writes.labels(change.value)
        self.quota_failures = Counter(
            "gmd_enforcement_quota_write_failures",
            "Quota writes that failed (the enforcement log and the daemon's log say why).",
            registry=r,
        )
        self.host_failures = Counter(
            "gmd_enforcement_host_failures",
            "VMs whose throttle settings a host reported it could not apply or restore.",
            ["action"],
            registry=r,
        )
        for action in HOST_ACTIONS:
            self.host_failures.labels(action)
        self.host_knobs = Counter(
            "gmd_enforcement_host_knobs",
            "Knobs of VMs hosts reported on, by what became of them: applied, restored,"
            " unsupported (the host cannot set it: gmd-admin hosts says why) or failed.",
            ["knob", "outcome"],
            registry=r,
        )
        for knob in Knob:
            for outcome in KnobOutcome:
                self.host_knobs.labels(knob.value, outcome.value)

    def _ledger(self, r: CollectorRegistry) -> None:
        """Ledger writes that failed, and whether they are failing now."""
        self.ledger_write_failures = Counter(
            "gmd_ledger_write_failures",
            "Requests whose ledger write failed with a database error (answered 503).",
            registry=r,
        )
        self.ledger_failing = Gauge(
            "gmd_ledger_write_failing",
            "1 while the ledger's latest write failed (no interval is closed meanwhile), else 0.",
            registry=r,
        )

    def _placement(self, r: CollectorRegistry) -> None:
        """What Placement refused, set aside or vouched for, and the requests to it."""
        self.placement_refused = Counter(
            "gmd_placement_refused_batches",
            "Batches refused at ingest because Placement contradicts the host's own claims"
            " (no provider of its name, a capacity past its inventory), by which.",
            ["reason"],
            registry=r,
        )
        self.placement_quarantined = Counter(
            "gmd_placement_quarantined_batches",
            "Batches accepted while Placement could not be reached, then quarantined when it"
            " answered and disagreed, by what it disagreed with.",
            ["reason"],
            registry=r,
        )
        self.placement_set_aside = Counter(
            "gmd_placement_set_aside_samples",
            "VMs' samples set aside at ingest (stored quarantined, the rest of their batch"
            " stored) because Placement contradicts them, by what it contradicts.",
            ["reason"],
            registry=r,
        )
        for disagreement in Disagreement:
            self.placement_refused.labels(disagreement.value)
            self.placement_quarantined.labels(disagreement.value)
            self.placement_set_aside.labels(disagreement.value)
        self.placement_unverified = Counter(
            "gmd_placement_unverified_batches",
            "Batches accepted unverified because Placement could not be reached (verified"
            " later by the daemon's job).",
            registry=r,
        )
        self.placement_verified_late = Counter(
            "gmd_placement_late_verified_batches",
            "Batches accepted unverified that Placement vouched for once it answered.",
            registry=r,
        )
        self.placement_waiting = Gauge(
            "gmd_placement_waiting_batches",
            "Batches stored unverified that Placement has yet to vouch for.",
            registry=r,
        )
        self.placement_requests = Counter(
            "gmd_placement_requests",
            "HTTP requests this daemon made to Placement.",
            registry=r,
        )

    def report_mode(self, mode: str) -> None:
        for each in PLAN_MODES:
            self.mode.labels(each).set(1 if each == mode else 0)

    def watch_writes(self, failing: Callable[[], object]) -> None:
        """``gmd_ledger_write_failing`` reads ``failing()`` (truthy: writes fail) at scrape."""
        self.ledger_failing.set_function(lambda: 1.0 if failing() else 0.0)

    def report_host_failure(self, action: str) -> None:
        """A host could not ``action`` (``apply``, ``restore``, or their ``would_`` forms) a
        VM's settings."""
        self.host_failures.labels(action.removeprefix("would_")).inc()

    def report_knob(self, knob: str, outcome: str) -> None:
        """A host reported ``outcome`` for ``knob`` of one VM."""
        self.host_knobs.labels(knob, outcome).inc()

    def report_rejected(self, reason: Rejection) -> None:
        self.batches.labels("rejected").inc()
        self.rejected.labels(reason.value).inc()

    def report_seen(self, last_seen_s: Mapping[str, float]) -> None:
        """Hosts' latest batches (Unix time), from the ledger or a batch just stored."""
        for host, at_s in last_seen_s.items():
            self.last_batch.labels(host).set(at_s)

    def report_levels(self, counts: Mapping[int, int], highest: int) -> None:
        """Customers per level (absent: none), every level 1..``highest`` exported, 0 or not,
        and any level above it a customer still holds (the policy lost levels since)."""
        shown = {*range(1, highest + 1), *counts, *self._levels_shown}
        for level in sorted(shown):
            self.levels.labels(str(level)).set(counts.get(level, 0))
        self._levels_shown = shown
