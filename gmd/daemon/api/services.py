"""The daemon's long-lived parts, built once per app and shared by every route.

Routes take them from ``request.app.state.services`` (see :mod:`.deps`) rather than from a
closure, so each route can live in its own module and a test can build the parts without a
server. The accountant and the quota reconciler run between the app's startup and shutdown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine

from gmd.daemon.api.access import read_access
from gmd.daemon.api.auth import TokenAuth
from gmd.daemon.api.metrics import DaemonMetrics, QuotaChange
from gmd.daemon.config import Config
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.enforce.quota_job import QuotaReconciler, QuotaRun
from gmd.daemon.ingest.checks import Plausible
from gmd.daemon.ingest.limits import HostLimits
from gmd.daemon.ingest.said_once import SaidOnce
from gmd.daemon.ingest.store import LedgerStore
from gmd.daemon.ledger import partitions, rollups
from gmd.daemon.ledger.accounting import RunReport
from gmd.daemon.ledger.retention import purge
from gmd.daemon.ledger.schedule import Accountant
from gmd.daemon.ledger.status import hosts_last_seen, level_counts
from gmd.daemon.ledger.write_health import WriteHealth
from gmd.daemon.placement.recheck import Rechecker, RecheckReport
from gmd.daemon.placement.view import PlacementView
from gmd.daemon.project_names import NameRefresher, ProjectNames
from gmd.openstack.placement import PlacementReader
from gmd.wire import PlanMode

log = logging.getLogger(__name__)


class Services:
    """Configuration, database, clock, metrics, ledger store, token check and accountant.

    ``run_accountant`` None follows ``daemon.accounting`` in the configuration.
    """

    def __init__(
        self,
        config: Config,
        engine: Engine,
        *,
        clock: Callable[[], float] = time.time,
        run_accountant: bool | None = None,
    ) -> None:
        self.config, self.engine, self.clock = config, engine, clock
        self.metrics = DaemonMetrics()
        self.read_access = read_access(config.read_api)
        d = config.daemon
        self.plausible = Plausible(d.plausibility_margin, d.max_capacity())
        self.limits = HostLimits(d.limits, config.accounting.interval_s)
        """what each host may claim of the ledger (``[daemon.limits]``)"""
        self.store = LedgerStore(engine, config.owner_of, config.organization_customers)
        self.auth = TokenAuth(
            {h.name: h.token_sha256 for h in config.hosts.values() if h.token_sha256},
            required=config.daemon.auth == "token",
        )
        self.run_accountant = config.daemon.accounting if run_accountant is None else run_accountant
        self.write_health = WriteHealth(config.accounting.grace_s)
        """whether the ledger's writes succeed: holds the accountant, answers ``/healthz``"""
        self.metrics.watch_writes(self.write_health.failing)
        self.metrics.report_mode(config.enforcement.mode)
        self.accountant = Accountant(
            engine,
            config.accounting,
            config.daemon.account_every_s,
            on_run=self._count_run,
            on_error=self._count_error,
            after=after_interval(config.enforcement, on_levels=self._count_levels),
            hold=self.write_health.hold_closing,
            unverified_wait_s=config.placement.wait_s if config.placement.on else None,
            writes=self.write_health,
        )
        self.placement: PlacementView | None = None
        """Placement's view, when it vouches for batches (``[placement] verify``: on, or auto with
        a cloud)"""
        if config.placement.on:
            p = config.placement
            client = PlacementReader(
                p.cloud,
                timeout_s=p.timeout_s,
                on_call=self.metrics.placement_requests.inc,
                pause_s=p.miss_s,
                pause_named="[placement] miss_s",
            )
            # A deleted server's last seconds come in a batch up to max_late_s after its
            # interval: that long, its host may still name it.
            self.placement = PlacementView(
                p,
                client,
                d.plausibility_margin,
                remember_s=config.daemon.max_late_s + config.accounting.interval_s,
            )
        self.rechecker = None if self.placement is None else Rechecker(engine, self.placement)
        self.set_aside_said = SaidOnce()
        """the VMs set aside whose log line was written today, per host"""
        self.quotas: QuotaReconciler | None = None
        self.names: NameRefresher | None = None
        self._ingest_pool: ThreadPoolExecutor | None = None

    @property
    def ingest_pool(self) -> ThreadPoolExecutor:
        """The threads that parse and store batches (``daemon.ingest_threads``), apart from
        the thread pool of the other routes: batches are CPU work under Python's global
        interpreter lock, and the forty threads of the shared pool spent a third of the
        daemon's time handing it to each other (``bench/ingest.py``)."""
        if self._ingest_pool is None:
            self._ingest_pool = ThreadPoolExecutor(
                self.config.daemon.ingest_threads, thread_name_prefix="ingest"
            )
        return self._ingest_pool

    def start(self) -> None:
        """Record the configured organizations, make the raw tables' partitions of the coming
        days, recall the hosts that post (:meth:`~gmd.daemon.ingest.store.LedgerStore.recall`)
        and set the gauges from the ledger, then start the accountant (unless disabled)
        with its jobs: partitions ahead, retention, the quota reconciler when cloud quotas are
        enforced, names."""
        config = self.config
        self.store.sync_organizations(
            {config.default_owner} | {h.owner for h in config.hosts.values()}
        )
        partitions.make_ahead(self.engine)
        recalled = self.store.recall()
        if recalled.hosts:
            log.info(
                "recalled %d hosts and their %d VMs from the ledger in %.1f s",
                recalled.hosts,
                recalled.vms,
                recalled.seconds,
            )
        enforcing = self.run_accountant and config.enforcement.mode != PlanMode.off
        with self.engine.connect() as conn:
            self.metrics.report_seen(hosts_last_seen(conn))
            if enforcing:
                self._count_levels(level_counts(conn))
        if not self.run_accountant:
            return
        retention = config.retention
        self.accountant.every(
            min(retention.every_s, 3600.0), lambda: partitions.make_ahead(self.engine), "partitions"
        )
        self.accountant.every(
            retention.every_s,
            lambda: purge(self.engine, retention, forget=self.store.forget),
            "retention",
            at_start=True,
        )
        self.accountant.every(
            3600.0, lambda: rollups.backfill(self.engine), "rollups", at_start=True
        )
        if self.rechecker is not None:
            # Every miss_s (at least every 5 s, at most every refresh_s): snapshots older than
            # refresh_s are read again, and unverified batches wait about that long at most
            # once Placement answers.
            every = min(max(config.placement.miss_s, 5.0), config.placement.refresh_s)
            self.accountant.every(every, self.run_placement, "placement", at_start=True)
        if config.enforcement.quota.cloud and config.enforcement.mode != PlanMode.off:
            self.quotas = QuotaReconciler(self.engine, config.enforcement)
            self.accountant.every(config.enforcement.quota.every_s, self.run_quotas, "quotas")
        q = config.enforcement.quota
        if q.cloud and q.names_every_s > 0:
            client = ProjectNames(q.cloud, timeout_s=q.timeout_s, retries=q.retries)
            self.names = NameRefresher(self.engine, client)
            self.accountant.every(q.names_every_s, self.names.run, "project names", at_start=True)
        self.accountant.start()

    def stop(self) -> None:
        self.accountant.stop()
        if self._ingest_pool is not None:
            self._ingest_pool.shutdown()
            self._ingest_pool = None
        if self.quotas is not None:
            self.quotas.close()
            self.quotas = None
        if self.names is not None:
            self.names.close()
            self.names = None
        if self.placement is not None:
            self.placement.close()

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        self.start()
        try:
            yield
        finally:
            self.stop()

    def reload(self, config: Config) -> None:
        """Put ``config``'s live settings in force (:mod:`gmd.daemon.reload` decides which;
        it has kept the running value of every other): the hosts, tokens and owners, the
        organizations, the enforcement policy, the plausibility and hosts' bounds, the
        accounting settings of the next intervals. Each part is replaced whole: a request
        sees the old or the new, never a mix within one part."""
        d = config.daemon
        self.plausible = Plausible(d.plausibility_margin, d.max_capacity())
        self.limits.config = d.limits
        self.auth = TokenAuth(
            {h.name: h.token_sha256 for h in config.hosts.values() if h.token_sha256},
            required=config.daemon.auth == "token",
        )
        self.store.ids.owner_of = config.owner_of
        self.store.ids.organization_customers = dict(config.organization_customers)
        self.store.sync_organizations(
            {config.default_owner} | {h.owner for h in config.hosts.values()}
        )
        self.accountant.config = config.accounting
        self.accountant.after = after_interval(config.enforcement, on_levels=self._count_levels)
        if self.quotas is not None:
            # Its cloud and timing are not live (the reload kept them); its policy and mode are.
            self.quotas.config = config.enforcement
        self.metrics.report_mode(config.enforcement.mode)
        self.config = config

    def ledger_write_failed(self, error: Exception) -> bool:
        """A write to the ledger failed with a database error (the request answers 503);
        whether it begins an outage."""
        self.metrics.ledger_write_failures.inc()
        return self.write_health.failed(self.clock(), error)

    def run_quotas(self) -> QuotaRun:
        """One pass of the quota reconciler, counted in the metrics."""
        assert self.quotas is not None
        run = self.quotas.run()
        self.metrics.quota_writes.labels(QuotaChange.lowered.value).inc(run.lowered)
        self.metrics.quota_writes.labels(QuotaChange.restored.value).inc(run.restored)
        self.metrics.quota_failures.inc(run.failed)
        return run

    def run_placement(self) -> RecheckReport:
        """One run of the Placement job, counted in the metrics."""
        assert self.rechecker is not None
        report = self.rechecker.run()
        self.metrics.placement_verified_late.inc(len(report.verified))
        for _key, reason, _message in report.quarantined:
            self.metrics.placement_quarantined.labels(reason.value).inc()
        self.metrics.quarantined.inc(len(report.quarantined))
        self.metrics.placement_waiting.set(report.waiting)
        return report

    def _count_run(self, report: RunReport) -> None:
        for seconds in report.seconds:
            self.metrics.intervals.inc()
            self.metrics.accounting_seconds.observe(seconds)
        if report.accounted:
            self.metrics.last_accounted.set(report.accounted[-1])
        if report.quarantined:
            self.metrics.quarantined.inc(len(report.quarantined))

    def _count_levels(self, counts: dict[int, int]) -> None:
        self.metrics.report_levels(counts, self.config.enforcement.policy.levels)

    def _count_error(self, _exc: Exception) -> None:
        self.metrics.accounting_errors.inc()
