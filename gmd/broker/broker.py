"""One cloud's broker: CloudShare's five events, handled one at a time on one thread.

- **local submit**: a request of this site runs here if it fits now, else it is published to
  the federation's queue;
- **federation submit**: a request appeared in the queue;
- **local resource ready**: capacity was freed here;
- **completion**: a request finished here; it is completed in the federation's state (counted
  once, into the organisations' summaries);
- **site lost**: a member left; its running foreign requests are requeued and its queued ones
  removed (:meth:`~gmd.broker.coordination.Federation.site_lost`).

After federation submit and resource ready, the broker takes work while its reservation (the
share of its federation capacity in use) is below ``threshold``: of the queued requests that fit
its free cores, the one of the organisation with the highest priority (contribution less
utility, from the summaries), and of that organisation's the longest waiting
(:func:`~gmd.broker.coordination.ordered`).

**The ledger.** With a :class:`~gmd.broker.history.History`, every decision is filed in this
cloud's ledger, a completion before ZooKeeper counts it; at the start and after every rejoin
the ledger and ZooKeeper's record of this site are reconciled; every ``standings_s`` the
federation's standings are copied there for gmd-admin and the read API.

**Connection states.** ZooKeeper's watches and kazoo's state changes only put events on the
queue (a listener must never block). While the session is SUSPENDED the broker starts nothing
(its claims may be expiring). After LOST kazoo opens a new session: the broker joins again and
reconciles: a request this site's state says it runs but the handler does not (the broker was
restarted) is requeued; one the handler runs whose running node is no longer this site's (it
was requeued as a lost site's while this broker was cut off) is stopped. After any step that
failed midway the broker settles the same way, once it is connected: a call whose answer never
came may have been made, and a claim so left would stand first for its request as long as the
session lives.
"""

from __future__ import annotations

import enum
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gmd.broker.coordination import (
    ROOT,
    Completion,
    Contended,
    Federation,
    FederationError,
    Request,
    ordered,
)
from gmd.broker.handlers import Finished, HandlerUnavailable, ResourceHandler
from gmd.broker.history import Entry, History, Reconciled
from gmd.fairness.federation import takes_work

LOG = logging.getLogger(__name__)
TAKE_EVERY_S = 5.0
"""How often the queue is looked at without an event or a change of free capacity (a missed
watch, a priority that changed)."""
UNREACHABLE: tuple[type[Exception], ...] = (KazooException, KazooTimeoutError)
"""ZooKeeper did not answer (a lost connection, a timeout, an expired session): what a broker
waits out rather than treats as a bug."""


class Event(enum.StrEnum):
    """CloudShare's five events, and the broker's own upkeep."""

    local_submit = "local-submit"
    federation_submit = "federation-submit"
    resource_ready = "resource-ready"
    completion = "completion"
    site_lost = "site-lost"
    rejoin = "rejoin"
    """the session was lost and a new one opened: join again and reconcile"""


class Choice(enum.StrEnum):
    """What the broker decided, as the decision log says it."""

    ran_locally = "ran-locally"
    published = "published"
    took = "took"
    completed = "completed"
    not_counted = "not-counted"
    """finished here, but no longer this site's to complete (requeued as a lost site's)"""
    requeued = "requeued"
    removed = "removed"
    stopped = "stopped"


@dataclass(frozen=True)
class Decision:
    """One line of the broker's decision log (what the simulator's run is compared with)."""

    choice: Choice
    request: str
    """the request's id"""
    org: str
    site: str
    """the site that published it"""
    at_s: float


@dataclass
class BrokerSettings:
    site: str
    org: str
    threshold: float = 1.0
    """take federation work while the reservation is below this share of capacity"""
    root: str = ROOT
    tick_s: float = 0.5
    """how often finished requests and missed events are looked for"""
    standings_s: float = 5.0
    """how often the federation's standings are read into the ledger (with a history)"""


@dataclass
class Broker:
    zk: KazooClient
    settings: BrokerSettings
    handler: ResourceHandler
    clock: Callable[[], float] = time.time
    decisions: list[Decision] = field(default_factory=list)
    _events: queue.Queue[tuple[Event, Any]] = field(default_factory=queue.Queue)
    _suspended: threading.Event = field(default_factory=threading.Event)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _members: set[str] = field(default_factory=set)
    _local: int = 0
    _uncompleted: list[Finished] = field(default_factory=list)
    """requests that finished here whose completion ZooKeeper has not taken yet"""
    _unpublished: list[Request] = field(default_factory=list)
    """local requests whose publish failed (ZooKeeper unreachable): published once it is back,
    unless ZooKeeper's marker says the publish was made (the answer was lost, not the
    request)"""
    _take_wanted: bool = True
    _free_seen: float = -1.0
    _take_due: float = 0.0
    _failed: list[str] = field(default_factory=list)
    """requests that failed here, to requeue (kept while ZooKeeper is unreachable)"""
    history: History | None = None
    """this cloud's ledger, where the decisions are filed (none: only :attr:`decisions`)"""
    _standings_due: float = 0.0
    _unsure: bool = False
    """a step failed midway: what it did in ZooKeeper is not known (see :meth:`_settle`)"""
    handed: Callable[[Request], None] | None = None
    """called with a local request once it is handed on: in ZooKeeper's queue (or its marker
    says it was put there), or running here; the inbox then lets its file go
    (:func:`gmd.broker.inbox.handed`). Called before the request's publish marker is deleted:
    a broker killed in between finds the marker when it starts and does not publish it again"""

    def __post_init__(self) -> None:
        s = self.settings
        self.federation = Federation(self.zk, s.site, s.org, root=s.root)

    # -- life ---------------------------------------------------------------------------------

    def start(self, held: Sequence[Request] = ()) -> None:
        """Join the federation, watch the queue and the members, and handle events. ``held``:
        local requests an earlier process of this site took and never handed on (it was killed
        while ZooKeeper could not be reached, say: :mod:`gmd.broker.inbox`). They are published
        first, never run here: one whose publish was made is refused by its marker, which is
        kept for it (an earlier process's other pending publishes went with it)."""
        self.federation.ensure()
        self._join()
        self.federation.forget_published(keep={r.id for r in held})
        self._unpublished.extend(held)
        self.zk.add_listener(self._on_state)
        self.zk.ChildrenWatch(self.federation.path("queue"), self._on_queue)
        self.zk.ChildrenWatch(self.federation.path("members"), self._on_members)
        # What this site runs (a broker restarted after a crash: work the site-lost rule has
        # requeued since, or work no longer running here) is reconciled as after a rejoin,
        # through the loop, which waits out a handler that cannot tell yet.
        self._events.put((Event.rejoin, None))
        self._thread = threading.Thread(
            target=self._loop, name=f"broker-{self.settings.site}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)

    def submit(self, request: Request) -> None:
        """A local submit (any thread)."""
        self._events.put((Event.local_submit, request))

    # -- kazoo's callbacks: never block, only queue -------------------------------------------

    def _on_state(self, state: str) -> None:
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._suspended.set()
        elif self._suspended.is_set():
            # connected again, in the same session or (after LOST) a new one: join (again) and
            # reconcile what this site runs with what ZooKeeper says it runs
            self._suspended.clear()
            self._events.put((Event.rejoin, None))

    def _on_queue(self, children: list[str]) -> bool:
        self._events.put((Event.federation_submit, len(children)))
        return not self._stopping.is_set()

    def _on_members(self, children: list[str]) -> bool:
        gone = self._members - set(children)
        self._members = set(children)
        for site in sorted(gone):
            if site != self.settings.site:
                self._events.put((Event.site_lost, site))
        return not self._stopping.is_set()

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                event, detail = self._events.get(timeout=self.settings.tick_s)
            except queue.Empty:
                event, detail = None, None
            try:
                if event is not None:
                    self._take_wanted = True
                    self._handle(event, detail)
                self._publish_again()
                self._collect()
                if self._unsure and not self._suspended.is_set():
                    self._settle()
                self._take()
                self._file()
            except UNREACHABLE as exc:  # the next tick tries again
                LOG.warning("%s: ZooKeeper unreachable (%s): waiting", self.settings.site, exc)
                self._again(event, detail)
            except HandlerUnavailable as exc:
                LOG.warning("%s: %s: waiting", self.settings.site, exc)
                self._again(event, detail)
            except Exception:  # a broker keeps going: the next tick tries again
                LOG.exception("%s: event %s failed", self.settings.site, event)
                self._again(event, detail)

    def _again(self, event: Event | None, detail: Any) -> None:
        """After a step failed: the broker settles once connected (what the step did is not
        known), and a rejoin or a lost site not handled is handled later (the others are
        redone by every tick anyway, or kept: unpublished requests, uncompleted work)."""
        self._unsure = True
        if event in (Event.rejoin, Event.site_lost) and not self._stopping.is_set():
            time.sleep(self.settings.tick_s)
            self._events.put((event, detail))

    def _handle(self, event: Event, detail: Any) -> None:
        if event == Event.local_submit:
            self._local_submit(detail)
        elif event == Event.site_lost:
            self._site_lost(detail)
        elif event == Event.rejoin:
            self._join()
            self._settle()
        # federation submit and resource ready: _take, after every event

    def _local_submit(self, request: Request) -> None:
        """The paper's event 1: "if there is enough capacity and no other tasks are waiting
        then the task is delegated to a free machine directly. Otherwise the broker publishes
        the task". Waiting: a local request not yet published, or a queued request that would
        fit here now (the free capacity is then the federation's to give by priority; this
        site may take its own request back). While ZooKeeper cannot say, nothing is known to
        wait: local work does not wait for ZooKeeper."""
        free = self.handler.free_cores()
        if request.cores <= free and not self._waiting(free):
            self._local += 1
            self.handler.start(f"local-{self._local}-{request.id}", request)
            self._hand_on(request)
            self._decide(Choice.ran_locally, request)
            return
        self._unpublished.append(request)
        self._publish_again()

    def _waiting(self, free: float) -> bool:
        if self._unpublished:
            return True
        if self._suspended.is_set():
            return False
        try:
            return any(q.request.cores <= free for q in self.federation.queued())
        except UNREACHABLE:
            return False

    def _publish_again(self) -> None:
        """Publish the local requests not yet published (in order), while connected."""
        while self._unpublished and not self._suspended.is_set():
            request = self._unpublished[0]
            try:
                # None: made already, its answer lost (the marker refused it again)
                self.federation.publish(request)
                self._hand_on(request)  # before the marker goes: see `handed`
                self.federation.published(request)
            except UNREACHABLE as exc:
                LOG.warning(
                    "%s: publishing %s: ZooKeeper unreachable (%s): later",
                    self.settings.site,
                    request.id,
                    exc,
                )
                return
            self._unpublished.pop(0)
            self._decide(Choice.published, request)

    def _hand_on(self, request: Request) -> None:
        if self.handed is not None:
            self.handed(request)

    def _take(self) -> None:
        """While the reservation is below the threshold, take the queued request of the
        highest priority organisation that fits."""
        if self._suspended.is_set():
            return
        free = self.handler.free_cores()
        now = time.monotonic()
        # Nothing to look at unless an event came, the free capacity changed, or a while
        # passed: a queue of thousands is not read every tick for nothing.
        if not self._take_wanted and free == self._free_seen and now < self._take_due:
            return
        self._take_wanted, self._free_seen = False, free
        self._take_due = now + TAKE_EVERY_S
        capacity = self.handler.capacity_cores()
        while not self._stopping.is_set():
            free = self.handler.free_cores()
            if not takes_work(capacity, free, self.settings.threshold):
                return
            fitting = [q for q in self.federation.queued() if q.request.cores <= free]
            if not fitting:
                return
            priorities = {o: s.priority for o, s in self.federation.summaries().items()}
            for candidate in ordered(fitting, priorities):
                claim = self.federation.claim(candidate.name)
                if claim is None:
                    continue
                running = self.federation.consume(claim, self.clock(), candidate.request)
                if running is None:
                    continue
                self.handler.start(candidate.name, running.request)
                self._decide(Choice.took, running.request, candidate.name)
                break
            else:
                return

    def _collect(self) -> None:
        """Completions: a finished federation request is completed in the shared state (kept
        and tried again while ZooKeeper is unreachable)."""
        for done in self.handler.finished():
            if done.name.startswith("local-"):
                continue  # a local request is this site's own business
            if done.completed:
                self._uncompleted.append(done)
            else:
                self._failed.append(done.name)
        self._requeue_failed()
        while self._uncompleted and not self._suspended.is_set():
            done = self._uncompleted[0]
            filed: list[Completion] = []
            try:
                completed = self.federation.complete(
                    done.name, done.ran_s, functools.partial(self._file_completion, filed=filed)
                )
            except IntegrityError:
                # The ledger holds this number counted already: ZooKeeper's count of this
                # site's completions went back (it lost writes it had acknowledged). Waiting
                # would not help: reconciling puts the lost completions back, and the next try
                # takes the number after the ledger's (History.reconcile).
                LOG.warning(
                    "%s: completing %s: the ledger holds its number counted already:"
                    " ZooKeeper's count is behind the ledger's: reconciling",
                    self.settings.site,
                    done.name,
                )
                self._unsure = True
                return
            except SQLAlchemyError as exc:  # the ledger first: the completion waits for it
                LOG.warning(
                    "%s: completing %s: the ledger: %s: later",
                    self.settings.site,
                    done.name,
                    type(exc).__name__,
                )
                return
            except Contended as exc:  # kept: the next tick tries again (its row refiled)
                LOG.warning("%s: %s", self.settings.site, exc)
                return
            except FederationError:
                LOG.exception("%s: completing %s", self.settings.site, done.name)
                completed = None
            self._uncompleted.pop(0)
            if completed is not None:
                self._decide(Choice.completed, completed.request, completed.name)
            else:
                self._decide_name(Choice.not_counted, done.name)
            if self.history is not None and filed:
                try:
                    self.history.settle(filed[-1].seq, completed is not None)
                except SQLAlchemyError as exc:
                    LOG.warning(
                        "%s: settling %s: the ledger: %s: settled from ZooKeeper's record later",
                        self.settings.site,
                        done.name,
                        type(exc).__name__,
                    )
                    self._unsure = True  # _settle reconciles the ledger at the next tick
            self._events.put((Event.resource_ready, done.name))

    def _requeue_failed(self) -> None:
        """A request that failed here (its server went to ERROR, its process exited non-zero)
        goes back to the queue for another site, if it is still this site's (kept and tried
        again while ZooKeeper is unreachable)."""
        while self._failed and not self._suspended.is_set():
            name = self._failed[0]
            found = self.federation.running_one(name)
            if found is not None and found[0].site == self.settings.site:
                running, stat = found
                if self.federation.requeue(name, running, stat, self.clock()):
                    self._decide(Choice.requeued, running.request, name)
            self._failed.pop(0)
            self._events.put((Event.resource_ready, name))

    def _file_completion(self, completion: Completion, filed: list[Completion]) -> None:
        if self.history is not None:
            self.history.begin(completion, self.clock())
            filed.append(completion)

    def _file(self) -> None:
        """The decisions into the ledger, and now and then the standings."""
        if self.history is None:
            return
        self.history.flush()
        now = time.monotonic()
        if now >= self._standings_due and not self._suspended.is_set():
            self._standings_due = now + self.settings.standings_s
            self.history.write_standings(self.federation.standings(), self.clock())

    def _reconcile_history(self) -> None:
        """Settle the ledger's unsettled completions from ZooKeeper's record of this site, and
        put back into ZooKeeper what it lost (:meth:`History.reconcile`)."""
        if self.history is None:
            return
        found = self.history.reconcile(
            self.federation.site_record(), self.federation.reseed, self.clock()
        )
        if found != Reconciled():
            LOG.info("%s: ledger and ZooKeeper reconciled: %s", self.settings.site, found)

    def _site_lost(self, site: str) -> None:
        requeued, removed = self.federation.site_lost(site, self.clock())
        for moved in requeued:
            self._decide(Choice.requeued, moved.request, moved.name)
        for moved in removed:
            self._decide(Choice.removed, moved.request, moved.name)

    # -- membership and reconciliation --------------------------------------------------------

    def _join(self) -> None:
        """Join, waiting out a member node a previous session of this site left (it goes when
        the ensemble expires that session)."""
        deadline = time.monotonic() + 120
        while True:
            try:
                self.federation.join(self.handler.free_cores())
                self._members = set(self.federation.members())
                return
            except FederationError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _settle(self) -> None:
        """Make ZooKeeper's state of this site and the ledger true again after a rejoin or a
        step that failed midway (a call whose answer never came may still have been made):
        settle the ledger's completions from the site's record (a completion made whose answer
        was lost is counted there), withdraw the claims this session left (a claim stands first
        for its request while the session lives, and would keep every broker from it), and
        reconcile what this site runs (a consume made whose answer was lost is a request
        ZooKeeper says runs here and nothing runs)."""
        self._reconcile_history()
        withdrawn = self.federation.withdraw_claims()
        if withdrawn:
            LOG.info("%s: withdrew %d claim(s) a lost answer left", self.settings.site, withdrawn)
        self._reconcile()
        self._unsure = False
        self._take_wanted = True

    def _reconcile(self) -> None:
        mine = {
            name: (running, stat)
            for name, (running, stat) in self.federation.running().items()
            if running.site == self.settings.site
        }
        runs = self.handler.running()
        # Finished here, not yet completed or requeued by this broker: neither to requeue nor
        # to stop (a completion whose answer was lost is one, its running node gone).
        here = runs | {done.name for done in self._uncompleted} | set(self._failed)
        for name, (running, stat) in mine.items():
            if name not in here and self.federation.requeue(name, running, stat, self.clock()):
                self._decide(Choice.requeued, running.request, name)
        for name in runs:
            if not name.startswith("local-") and name not in mine:
                self.handler.stop(name)
                self._decide_name(Choice.stopped, name)
        # Sites that left while this broker was cut off. The running work is read before the
        # members: a site joins before it runs anything, so a site that joined and took work
        # after the members were read would otherwise be taken for lost, its work requeued.
        running_sites = {running.site for running, _ in self.federation.running().values()}
        members = set(self.federation.members())
        for site in sorted(running_sites - members):
            self._site_lost(site)

    # -- the log ------------------------------------------------------------------------------

    def _decide(self, choice: Choice, request: Request, node: str | None = None) -> None:
        decision = Decision(choice, request.id, request.org, request.site, self.clock())
        self.decisions.append(decision)
        if self.history is not None and choice not in (Choice.completed, Choice.not_counted):
            self.history.record(
                Entry(
                    decision.at_s,
                    choice,
                    request.id,
                    request.org,
                    request.site,
                    node,
                    request.cores,
                )
            )
        LOG.info(
            "%s: %s %s (%s of %s)",
            self.settings.site,
            choice,
            request.id,
            request.org,
            request.site,
        )

    def _decide_name(self, choice: Choice, name: str, site: str = "") -> None:
        decision = Decision(choice, name, "", site or self.settings.site, self.clock())
        self.decisions.append(decision)
        if self.history is not None and choice != Choice.not_counted:
            self.history.record(Entry(decision.at_s, choice, name, "", decision.site, name))
        LOG.info("%s: %s %s", self.settings.site, choice, name)
