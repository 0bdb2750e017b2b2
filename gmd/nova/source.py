"""gmd's answer for the weigher: fetched at most once per request, kept for a short while,
never waited on longer than a hard timeout.

A scheduler must not stall on gmd. Each fetch runs on a worker thread and the request waits
for it at most ``timeout_s`` in all (connect, TLS, a slow answer, a large body: one bound,
which a socket timeout is not); past it the request is weighed neutrally and the fetch goes on,
so that its answer, when it comes, serves the next requests. One fetch at a time: requests
that find one under way wait for that one, and a gmd that stopped answering is asked again
only after ``retry_s`` (each request in between is neutral at once, not after a timeout).

The hosts' utilisation changes only when gmd accounts an interval, so it is kept for
``cache_s``; a project's level changes as rarely and is kept as long, per project (at most
``max_projects`` of them). A fetch of the hosts names the requesting project too; a project
not yet known while the hosts are fresh is asked for alone (``hosts=false``: no host read).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from gmd.nova.ranking import BadAnswer, Cluster, Project, read_cluster, read_project

LOG = logging.getLogger(__name__)

Fetch = Callable[[str, bool], object]
"""Fetches gmd's answer for a request of the project named, with the hosts or (False) the
project alone: the JSON document, or raises."""
ASKING_AT_MOST = 16
"""Projects whose level is being fetched in the background at once, at most."""


@dataclass
class Counters:
    """What the weigher did, since it started (logged, and read by tests and the benchmark)."""

    fetches: int = 0
    failures: int = 0
    """fetches that raised or gave no usable document"""
    timeouts: int = 0
    """requests that waited ``timeout_s`` for a fetch and were weighed neutrally"""
    neutral: int = 0
    """requests weighed neutrally, for any reason"""
    ranked: int = 0
    """requests ranked from gmd's answer"""


@dataclass(frozen=True)
class RequestView:
    """What one request is weighed by."""

    cluster: Cluster
    project: Project


@dataclass
class _State:
    cluster: Cluster | None = None
    cluster_at: float = -1e18
    projects: dict[str, tuple[Project, float]] = field(default_factory=dict)
    failed_at: float = -1e18
    pending: Future[RequestView | None] | None = None
    asking: set[str] = field(default_factory=set)
    """projects whose level alone is being fetched"""


class Source:
    """gmd's answers, cached, behind a hard timeout; :meth:`view` is None when the request
    must be weighed neutrally (and says why in the log)."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        timeout_s: float = 1.0,
        cache_s: float = 30.0,
        retry_s: float = 10.0,
        max_projects: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.timeout_s, self.cache_s, self.retry_s = timeout_s, cache_s, retry_s
        self.max_projects = max_projects
        self._clock = clock
        self._lock = threading.Lock()
        self._state = _State()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gmd-weigher-fetch")
        self.counters = Counters()

    def _cluster(self, now: float) -> Cluster | None:
        s = self._state
        return s.cluster if s.cluster is not None and now - s.cluster_at <= self.cache_s else None

    def _project(self, project_id: str, now: float) -> tuple[Project, bool]:
        """The project as last known (level 0 and no cap if never), and whether that is
        fresh."""
        known = self._state.projects.get(project_id)
        if known is None:
            return Project(project_id), False
        return known[0], now - known[1] <= self.cache_s

    def _start(self, project_id: str, now: float) -> Future[RequestView | None] | None:
        """The fetch under way, or one started now (none while gmd is in its retry pause)."""
        s = self._state
        if s.pending is None and now - s.failed_at >= self.retry_s:
            s.pending = self._pool.submit(self._refresh, project_id)
        return s.pending

    def _ask(self, project_id: str, now: float) -> None:
        """Fetch ``project_id``'s level alone in the background (the hosts are fresh)."""
        s = self._state
        if (
            project_id not in s.asking
            and len(s.asking) < ASKING_AT_MOST
            and now - s.failed_at >= self.retry_s
        ):
            s.asking.add(project_id)
            self._pool.submit(self._refresh_project, project_id)

    def view(self, project_id: str) -> RequestView | None:
        """The cluster and the project for one request, or None: weigh it neutrally.

        With the hosts fresh, a project not known (or known too long ago) is fetched in the
        background and this request is weighed with what is known of it (never seen: level
        0, no cap, i.e. its whole flavor): its level refines only its expected CPU use, and is
        not worth a wait."""
        now = self._clock()
        with self._lock:
            cluster = self._cluster(now)
            if cluster is not None:
                project, fresh = self._project(project_id, now)
                if not fresh:
                    self._ask(project_id, now)
                return RequestView(cluster, project)
            pending = self._start(project_id, now)
            if pending is None:
                LOG.debug("gmd failed lately: weighing neutrally until it is asked again")
                return None
        try:
            # The answer waited for serves this request however old the cache rule would call
            # it (cache_time 0: every request fetches); another project's answer serves
            # with the hosts it brought and what is known of this project.
            fetched = pending.result(timeout=self.timeout_s)
        except FutureTimeout:
            self.counters.timeouts += 1
            LOG.warning(
                "gmd did not answer within %.2f s: weighing neutrally (its answer, when it"
                " comes, serves the next requests)",
                self.timeout_s,
            )
            return None
        if fetched is None or fetched.project.id == project_id:
            return fetched
        with self._lock:
            return RequestView(fetched.cluster, self._project(project_id, self._clock())[0])

    def _refresh(self, project_id: str) -> RequestView | None:
        """One fetch, on the worker thread: its answer replaces the cached one (None: it
        failed)."""
        try:
            self.counters.fetches += 1
            document = self._fetch(project_id, True)
            cluster = read_cluster(document)
            project = read_project(document, project_id)
        except Exception as exc:  # gmd or the network, whatever failed: fail open
            self.counters.failures += 1
            reason = str(exc) if isinstance(exc, BadAnswer) else f"{type(exc).__name__}: {exc}"
            LOG.warning("gmd's host utilisation could not be read: %s", reason[:500])
            with self._lock:
                self._state.failed_at = self._clock()
                self._state.pending = None
            return None
        now = self._clock()
        if cluster.ignored:
            LOG.warning(
                "gmd's answer has %d host(s) with implausible figures, left out: %s",
                len(cluster.ignored),
                ", ".join(cluster.ignored[:10]),
            )
        with self._lock:
            s = self._state
            s.cluster, s.cluster_at, s.pending = cluster, now, None
            self._remember(project, now)
        return RequestView(cluster, project)

    def _refresh_project(self, project_id: str) -> None:
        """One project's level, on the worker thread (the route without its hosts)."""
        try:
            self.counters.fetches += 1
            project = read_project(self._fetch(project_id, False), project_id)
        except Exception as exc:  # as for the hosts: fail open, ask again after retry_s
            self.counters.failures += 1
            LOG.warning("gmd's level of project %s could not be read: %s", project_id, exc)
            with self._lock:
                self._state.failed_at = self._clock()
                self._state.asking.discard(project_id)
            return
        with self._lock:
            self._remember(project, self._clock())
            self._state.asking.discard(project_id)

    def _remember(self, project: Project, now: float) -> None:
        s = self._state
        if len(s.projects) >= self.max_projects:
            # the newest half stays (a scheduler serving very many projects refetches the
            # others' levels in the background)
            newest = sorted(s.projects.items(), key=lambda kv: kv[1][1], reverse=True)
            s.projects = dict(newest[: self.max_projects // 2])
        s.projects[project.id] = (project, now)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
