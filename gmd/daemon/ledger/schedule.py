"""The accountant inside the daemon: an APScheduler job that runs :func:`account_due`.

The first run waits one grace period after start, so that agents which spooled while the
daemon was down can replay before the intervals they missed are closed. Runs never overlap;
a run that fails is logged (a database outage once as it begins and once as it ends, not
at every run: :class:`Outage`), counted and retried at the next tick (the interval it was on stays
closed and unaccounted: nothing is half written). While ``hold`` gives a reason (the ledger's
writes fail, :mod:`.write_health`), no interval is closed: those already closed are still
accounted, and the outage's wait for the batches that agents spool meanwhile. The accountant's
own database failures are failed writes too, and while writes fail a run that succeeded
probes whether the ledger writes again before it says so. A daemon that was stopped (SIGSTOP, a
frozen VM) or starved of CPU took no batch meanwhile either: when the scheduler's runs come
later than they can (:meth:`Accountant.scheduled`), closing waits one grace period, as at the
daemon's start, so that the agents' batches of those seconds arrive first. Stopping asks a
run in progress to end after the interval it is on, so that a daemon told to stop
mid-catch-up does so within about one interval's accounting, not after the whole catch-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gmd.daemon.config import AccountingConfig
from gmd.daemon.ledger.accounting import AccountingStuck, AfterInterval, RunReport, account_due
from gmd.daemon.ledger.write_health import WriteHealth, first_line, probe_write

log = logging.getLogger(__name__)


def database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the ledger database's (an outage, a refusal), not gmd's: SQLAlchemy's
    errors, and a driver's own where a connection was taken outside SQLAlchemy."""
    if isinstance(exc, SQLAlchemyError):
        return True
    module = type(exc).__module__.split(".")[0]
    return module in ("psycopg", "sqlite3")


class Outage:
    """One log line when a recurring job starts failing on the ledger database, and one when
    it works again: a database down for an hour is two lines, not a traceback every run
    (issue 44). Errors of any other kind are gmd's and logged in full each time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.since: float | None = None

    def failed(self, exc: BaseException, retry_s: float) -> bool:
        """Log ``exc`` if it starts an outage; True when it is the database's (said once)."""
        if not database_error(exc):
            return False
        if self.since is None:
            self.since = time.monotonic()
            log.error(
                "%s: the ledger database fails (%s: %s); retrying every %g s, quietly until it"
                " answers",
                self.name,
                type(exc).__name__,
                first_line(exc),
                retry_s,
            )
        return True

    def ok(self) -> None:
        if self.since is not None:
            log.info(
                "%s: the ledger database answers again, after %.0f s",
                self.name,
                time.monotonic() - self.since,
            )
            self.since = None


class Accountant:
    def __init__(
        self,
        engine: Engine,
        config: AccountingConfig,
        every_s: float,
        on_run: Callable[[RunReport], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        after: AfterInterval | None = None,
        hold: Callable[[float], str | None] | None = None,
        unverified_wait_s: float | None = None,
        writes: WriteHealth | None = None,
    ) -> None:
        self.engine, self.config, self.every_s = engine, config, every_s
        self.unverified_wait_s = unverified_wait_s
        """``[placement] wait_s`` when Placement verifies batches (see ``account_next``)"""
        self._waiting: int | None = None
        self.on_run, self.on_error, self.after = on_run, on_error, after
        self.hold = hold
        self.writes = writes
        """where the accountant's own failed and recovered writes are told (it holds, through
        ``hold``, a daemon that received no batch in an outage)"""
        self._held: str | None = None
        self._last_end: float | None = None
        """monotonic time the latest scheduled run ended"""
        self._resumed_until: float = 0.0
        """closing waits until then (wall time): the daemon was stopped or starved"""
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._stopping = threading.Event()
        self._outage = Outage("accountant")

    def scheduled(self, at_s: float | None = None, now_s: float | None = None) -> RunReport | None:
        """One run as the scheduler makes it (``at_s``: monotonic now; ``now_s``: wall now).
        A run that comes long after the previous one ended (more than ``every_s`` and
        ``max(2, every_s)`` of slack) means the process did not run meanwhile: closing then
        waits one grace period."""
        at = time.monotonic() if at_s is None else at_s
        now = time.time() if now_s is None else now_s
        if self._last_end is not None and at - self._last_end > self.every_s + max(
            2.0, self.every_s
        ):
            self._resumed_until = now + self.config.grace_s
            log.warning(
                "accountant: the daemon did not run for %.0f s (stopped, or starved of CPU);"
                " closing no interval until %s, so that the agents' batches of that time"
                " arrive first",
                at - self._last_end,
                datetime.fromtimestamp(self._resumed_until, UTC).strftime("%H:%M:%S"),
            )
        try:
            return self.run_once(now)
        finally:
            self._last_end = time.monotonic() if at_s is None else at_s

    def run_once(self, now_s: float | None = None) -> RunReport | None:
        now = time.time() if now_s is None else now_s
        held = None if self.hold is None else self.hold(now)
        if held is None and now < self._resumed_until:
            held = "the daemon did not run for a while; the agents' batches of that time first"
        if held != self._held:
            if held is not None:
                log.warning("accountant: closing no interval: %s", held)
            else:
                log.info("accountant: closing intervals again")
            self._held = held
        try:
            report = account_due(
                self.engine,
                self.config,
                now,
                after=self.after,
                should_stop=self._stopping.is_set,
                close=held is None,
                unverified_wait_s=self.unverified_wait_s,
            )
        except AccountingStuck as exc:
            log.critical("accounting is stuck, nothing after this interval is accounted: %s", exc)
            if self.on_error is not None:
                self.on_error(exc)
            return None
        except Exception as exc:
            if not self._outage.failed(exc, self.every_s):
                log.exception("accounting failed; retrying at the next run")
            elif self.writes is not None:
                self.writes.failed(now, exc)
            if self.on_error is not None:
                self.on_error(exc)
            return None
        self._outage.ok()
        if self.writes is not None and self.writes.failing() is not None:
            # This run may have written nothing (closing held): does the ledger write again?
            try:
                probe_write(self.engine)
            except SQLAlchemyError as exc:
                self.writes.failed(now, exc)
            else:
                self.writes.succeeded(now)
        waiting = report.waiting
        if waiting is not None and waiting.start_s != self._waiting:
            log.warning(
                "accountant: interval %s waits for %d batch(es) Placement has not verified"
                " (Placement could not be reached); at most until %s",
                datetime.fromtimestamp(waiting.start_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                waiting.batches,
                datetime.fromtimestamp(waiting.until_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        self._waiting = None if waiting is None else waiting.start_s
        if self.on_run is not None:
            self.on_run(report)
        return report

    def start(self, delay_s: float | None = None) -> None:
        delay = self.config.grace_s if delay_s is None else delay_s
        first = datetime.now(UTC) + timedelta(seconds=delay)
        self._scheduler.add_job(
            self.scheduled,
            "interval",
            seconds=self.every_s,
            next_run_time=first,
            max_instances=1,
            coalesce=True,
            id="account",
        )
        self._scheduler.start()
        log.info(
            "accountant: first run at %s, then every %g s",
            first.strftime("%H:%M:%S"),
            self.every_s,
        )

    def every(
        self, seconds: float, job: Callable[[], object], name: str, *, at_start: bool = False
    ) -> None:
        """Run ``job`` every ``seconds`` beside the accountant (never two at once), and once at
        start when ``at_start``; a failure is logged and the job runs again at its next time."""

        outage = Outage(name)

        def guarded() -> None:
            try:
                job()
            except Exception as exc:
                if not outage.failed(exc, seconds):
                    log.exception("%s failed; it runs again in %g s", name, seconds)
            else:
                outage.ok()

        first = {"next_run_time": datetime.now(UTC)} if at_start else {}
        self._scheduler.add_job(
            guarded, "interval", seconds=seconds, max_instances=1, coalesce=True, id=name, **first
        )

    def stop(self) -> None:
        self._stopping.set()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
