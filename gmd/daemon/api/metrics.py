"""The daemon's Prometheus metrics, in a registry of its own (one per app, so tests can run
several daemons in one process).

Label values are bounded: a refusal's ``reason`` is a :class:`Rejection`, a host is one the
ledger knows (only a stored batch names it), a level one of the policy's.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from gmd.common.version import version


class Rejection(StrEnum):
    """Why a batch was refused: the ``reason`` of ``gmd_ingest_rejected_batches``."""

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
    """an interval or VM from the future beyond daemon.clock_skew_s: a host's clock (422)"""
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


class DaemonMetrics:
    def __init__(self) -> None:
        # prometheus_client adds a `_created` series beside every counter and histogram by
        # default; Prometheus does not use them, and they double what every scrape carries.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        Info("gmd_build", "The gmd version this daemon runs.", registry=r).info(
            {"version": version()}
        )
        self.batches = Counter(
            "gmd_ingest_batches",
            "Sample batches received, by outcome: accepted, duplicate (a retry, acknowledged"
            " again) or rejected (gmd_ingest_rejected_batches says why).",
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
        self.levels = Gauge(
            "gmd_enforcement_customers",
            "Customers at each throttle level above 0, as the latest decision left them"
            " (exported by a daemon that accounts; dry-run levels included).",
            ["level"],
            registry=r,
        )
        self._levels_shown: set[int] = set()

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
