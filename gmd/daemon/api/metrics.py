"""The daemon's Prometheus metrics, in a registry of its own (one per app, so tests can run
several daemons in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DaemonMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batches = Counter(
            "gmd_ingest_batches", "Sample batches received, by outcome.", ["outcome"], registry=r
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
