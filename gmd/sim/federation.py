"""CloudShare's brokers as a pure, deterministic discrete-event model: the live brokers
(:mod:`gmd.broker`) without ZooKeeper, threads or processes, so that a sequence of events gives
one decision log that a replay through live brokers can be compared with.

What it models is what :class:`gmd.broker.broker.Broker` does, which follows the paper (its
words are quoted where a rule is made):

- **sites**: a name, an organisation, the cores it offers and its ``threshold``; a site's free
  cores are its cores less those of everything running there (its local runs and the
  federation requests it took);
- **the global queue**: entries named ``req-<10 digits>``, numbered in the order they are
  made (a publish, or a requeue: a new entry), as ZooKeeper numbers a parent's sequential
  children (it counts creations, not deletions), so that the choice rule's last tie-break (the
  older entry) is the live one; any site takes from it, its own published requests too, as the
  broker does;
- **the summaries**: per organisation, the core-seconds its sites lent to other
  organisations' requests and its requests used of other organisations' sites, counted at
  completion exactly as :meth:`gmd.broker.coordination.Federation.complete` does: only when
  the runner's organisation differs from the request's, ``cores × run time``;
- **the events**:

  - a local submit (event 1): "if there is enough capacity and no other tasks are waiting
    then the task is delegated to a free machine directly. Otherwise the broker publishes the
    task", as ``Broker._local_submit`` reads it: run here if the request fits the free cores
    now and no queued request (of any site, this one's too) fits them; else publish (the
    broker's other waiting tasks, its local requests not yet published, are none here: a
    publish never fails);
  - a federation submit and a resource ready (events 2 and 3): every site offered the queue;
  - a completion (event 4): a local run ends silently, as the broker's ``local-`` runs do; a
    federation request completes and is counted; or, if its process failed (``fails``), its
    runner requeues it "as if just submitted", as ``Broker._requeue_failed`` does;
  - a site lost (event 5): "jobs that were computed by the disconnected organization are
    treated as if they were just submitted": its running foreign requests requeued, each a new
    entry submitted at the loss (``Federation.site_lost(site, now_s)``); "jobs submitted by the
    lost site are removed, apart from those which are already being executed": its queued
    requests, and the records of its own requests it ran itself (they went with it).

A site offered the queue takes exactly as ``Broker._take`` does: while
:func:`~gmd.fairness.federation.takes_work`, the first of the queued requests that fit its free
cores in :func:`~gmd.fairness.federation.choice_order`.

**The log** names a decision's request by its id, organisation and publishing site, as the
broker's does (requeued and removed ones too), and says at which site it was made.

**Order at one instant** (the live system's is a race; a comparison with it must avoid ties):
completions that fall at the same instant come first, in the order their runs started; then
the input events at that instant, in the order given. After every event the sites are offered
the queue in the order they were given, each taking all it takes before the next is offered
(only a publish or a requeue can let two sites want the same entry: a completion frees only
its own site; live, the site that published or requeued is likely first, being first told).
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gmd.fairness.federation import Summary, choice_order, takes_work


class Choice(enum.StrEnum):
    """What a site decided: the values of :class:`gmd.broker.broker.Choice` (gmd.sim cannot
    import gmd.broker, which needs kazoo), those the model can decide."""

    ran_locally = "ran-locally"
    published = "published"
    took = "took"
    completed = "completed"
    requeued = "requeued"
    removed = "removed"


@dataclass(frozen=True)
class Site:
    name: str
    org: str
    cores: float
    threshold: float = 1.0
    """take federation work while the reservation is below this share of ``cores``"""


@dataclass(frozen=True)
class Request:
    """A request submitted at ``site`` (the fields of :class:`gmd.broker.coordination.Request`)."""

    id: str
    org: str
    site: str
    cores: float
    run_s: float
    submitted_s: float

    @property
    def key(self) -> tuple[str, str]:
        """(site, id): an id is unique only at its site."""
        return (self.site, self.id)


@dataclass(frozen=True)
class Submit:
    """A local submit of ``request`` at its site (``request.site``) at ``at_s``; when it runs,
    it finishes ``request.run_s`` later."""

    at_s: float
    request: Request

    @property
    def site(self) -> str:
        return self.request.site


@dataclass(frozen=True)
class SiteLost:
    """``site`` leaves the federation at ``at_s`` (its broker's member node went)."""

    at_s: float
    site: str


Event = Submit | SiteLost


@dataclass(frozen=True)
class Decision:
    """One line of the decision log: the request it is about (``request``, ``org``,
    ``origin``: what the broker's :class:`gmd.broker.broker.Decision` says as its ``request``,
    ``org`` and ``site``, for every choice) and where it was made.

    ``site`` is where it happened: the site that ran it locally, published, took or completed
    it, for requeued the site that ran it (lost, or where it failed), for removed the lost
    site. (The broker's own log is one per broker, so it names the site that decided only by
    whose log a line is in, and a lost site's requests are moved by whichever other broker
    comes first.) ``entry`` is the queue entry the decision is about ("" for a local run; for
    requeued and removed the entry it ran or waited as, which the broker's ledger keeps as
    ``node``)."""

    at_s: float
    choice: Choice
    request: str
    """the request's id"""
    org: str
    """its organisation"""
    origin: str
    """the site that submitted (published) it"""
    site: str
    entry: str = ""


@dataclass(frozen=True)
class Outcome:
    decisions: tuple[Decision, ...]
    summaries: dict[str, Summary]
    """the organisations seeded or counted, as ``summaries/<org>`` would hold them"""

    def at(self, site: str, choices: Iterable[Choice] = tuple(Choice)) -> list[tuple[str, str]]:
        """The decisions at ``site`` of the kinds ``choices``, in order: (choice, request id)."""
        kinds = set(choices)
        return [
            (str(d.choice), d.request)
            for d in self.decisions
            if d.site == site and d.choice in kinds
        ]


@dataclass
class _Run:
    name: str
    request: Request
    started_s: float
    foreign: bool
    """a federation request taken from the queue (completed and counted), not a local run"""


def entry_name(number: int) -> str:
    """A queue entry's name, as ZooKeeper names the ``number``-th sequential child."""
    return f"req-{number:010d}"


@dataclass
class FederationModel:
    """The federation's state and its sites' moves; :func:`replay` drives it."""

    sites: Sequence[Site]
    summaries: dict[str, Summary] = field(default_factory=dict)
    used_s: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """what a completion counts per request key, when not its ``run_s`` (a live run's measured
    time): only counting reads it, never the timing"""
    fails: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """per request key, how many of its runs taken from the queue fail (their process exits
    non-zero): each is requeued by its runner when it ends, instead of completed"""
    queue: dict[str, Request] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    _by_name: dict[str, Site] = field(default_factory=dict)
    _alive: set[str] = field(default_factory=set)
    _runs: dict[str, dict[int, _Run]] = field(default_factory=dict)
    _finishes: list[tuple[float, int]] = field(default_factory=list)
    """(at, run): the heap of the runs' ends; at one instant, the run started first ends first"""
    _where: dict[int, str] = field(default_factory=dict)
    """run → the site it runs at; a run no longer here (its site lost) never ends"""
    _order: int = 0
    _entries: int = 0
    _locals: dict[str, int] = field(default_factory=dict)
    _failed: dict[tuple[str, str], int] = field(default_factory=dict)
    """per request key, how many of its runs have failed so far"""

    def __post_init__(self) -> None:
        for site in self.sites:
            if site.name in self._by_name:
                raise ValueError(f"site {site.name!r} given twice")
            self._by_name[site.name] = site
            self._alive.add(site.name)
            self._runs[site.name] = {}
            self._locals[site.name] = 0

    # -- what the sites see -------------------------------------------------------------------

    def free_cores(self, site: str) -> float:
        return self._by_name[site].cores - sum(r.request.cores for r in self._runs[site].values())

    def running(self, site: str) -> list[tuple[str, Request]]:
        """(name, request) of what ``site`` runs, in the order started."""
        return [(r.name, r.request) for r in self._runs[site].values()]

    def next_finish_s(self) -> float | None:
        while self._finishes and self._finishes[0][1] not in self._where:
            heapq.heappop(self._finishes)
        return self._finishes[0][0] if self._finishes else None

    # -- the events ---------------------------------------------------------------------------

    def waiting(self, site: str) -> bool:
        """Whether a task waits, for a local submit at ``site``: a queued request (any site's)
        fits its free cores now, so that the free capacity is the federation's to give by
        priority (``Broker._waiting``)."""
        free = self.free_cores(site)
        return any(r.cores <= free for r in self.queue.values())

    def submit(self, at_s: float, request: Request) -> None:
        """Event 1, a local submit: "if there is enough capacity and no other tasks are waiting
        then the task is delegated to a free machine directly. Otherwise the broker publishes
        the task" (event 2 follows; the site may take it back by priority)."""
        site = self._site_alive(request.site)
        if request.cores <= self.free_cores(site.name) and not self.waiting(site.name):
            self._locals[site.name] += 1
            name = f"local-{self._locals[site.name]}-{request.id}"
            self._start(at_s, site.name, name, request, foreign=False)
            self._decide(at_s, Choice.ran_locally, request, site.name)
        else:
            entry = self._enqueue(request)
            self._decide(at_s, Choice.published, request, site.name, entry)
        self.offer(at_s)

    def finish_next(self) -> float:
        """Event 4 for the next run to end (a completion if it was a federation request; its
        requeue if it failed), then event 3 (the queue offered); the time it ended."""
        if self.next_finish_s() is None:
            raise ValueError("nothing is running")
        at_s, number = heapq.heappop(self._finishes)
        site = self._where.pop(number)
        run = self._runs[site].pop(number)
        if run.foreign:
            key = run.request.key
            if self._failed.get(key, 0) < self.fails.get(key, 0):
                self._failed[key] = self._failed.get(key, 0) + 1
                self._requeue(at_s, site, run)
            else:
                self._complete(at_s, site, run)
        self.offer(at_s)
        return at_s

    def site_lost(self, at_s: float, site: str) -> None:
        """Event 5, as ``Federation.site_lost``: first what it ran, in entry-name order ("jobs
        that were computed by the disconnected organization are treated as if they were just
        submitted": other sites' requests requeued, each a new entry submitted at ``at_s``;
        its own dropped: their records went with it), then its queued requests removed, in
        entry-name order ("jobs submitted by the lost site are removed")."""
        self._site_alive(site)
        self._alive.discard(site)
        runs, self._runs[site] = self._runs[site], {}
        for number in runs:
            del self._where[number]  # their ends never come
        for run in sorted(runs.values(), key=lambda r: r.name):
            if not run.foreign:
                continue  # a local run: the site's own business, gone with it
            if run.request.site != site:
                self._requeue(at_s, site, run)
            else:
                self._decide(at_s, Choice.removed, run.request, site, run.name)
        for entry, request in sorted(self.queue.items()):
            if request.site == site:
                del self.queue[entry]
                self._decide(at_s, Choice.removed, request, site, entry)
        self.offer(at_s)

    def offer(self, at_s: float) -> None:
        """Events 2 and 3: every site that is up, in the order given, takes what it takes."""
        for site in self.sites:
            if site.name in self._alive:
                self._take(at_s, site)

    # -- the moves ----------------------------------------------------------------------------

    def _take(self, at_s: float, site: Site) -> None:
        """``Broker._take``: while the reservation is below the threshold, the first request
        that fits in the choice order."""
        while True:
            free = self.free_cores(site.name)
            if not takes_work(site.cores, free, site.threshold):
                return
            fitting = [(e, r) for e, r in self.queue.items() if r.cores <= free]
            if not fitting:
                return
            priorities = {o: s.priority for o, s in self.summaries.items()}
            entry, request = choice_order(fitting, priorities, lambda q: q[1], lambda q: q[0])[0]
            del self.queue[entry]
            self._start(at_s, site.name, entry, request, foreign=True)
            self._decide(at_s, Choice.took, request, site.name, entry)

    def _complete(self, at_s: float, site: str, run: _Run) -> None:
        """``Federation.complete``: counted only across organisations."""
        request = run.request
        org = self._by_name[site].org
        amount = request.cores * max(self.used_s.get(request.key, request.run_s), 0.0)
        if request.org != org and amount > 0:
            self._add(org, contributed=amount)
            self._add(request.org, used=amount)
        self._decide(at_s, Choice.completed, request, site, run.name)

    def _requeue(self, at_s: float, site: str, run: _Run) -> None:
        """``Federation.requeue``: back in the queue "as if just submitted", a new entry
        submitted at ``at_s``; the log names the entry it ran as."""
        self._enqueue(dataclasses.replace(run.request, submitted_s=at_s))
        self._decide(at_s, Choice.requeued, run.request, site, run.name)

    def _add(self, org: str, contributed: float = 0.0, used: float = 0.0) -> None:
        self.summaries[org] = self.summaries.get(org, Summary(org)).plus(contributed, used)

    def _start(self, at_s: float, site: str, name: str, request: Request, foreign: bool) -> None:
        self._order += 1
        self._runs[site][self._order] = _Run(name, request, at_s, foreign)
        self._where[self._order] = site
        heapq.heappush(self._finishes, (at_s + request.run_s, self._order))

    def _enqueue(self, request: Request) -> str:
        entry = entry_name(self._entries)
        self._entries += 1
        self.queue[entry] = request
        return entry

    def _site_alive(self, name: str) -> Site:
        if name not in self._by_name:
            raise ValueError(f"no site {name!r}")
        if name not in self._alive:
            raise ValueError(f"site {name!r} has left the federation")
        return self._by_name[name]

    def _decide(
        self, at_s: float, choice: Choice, request: Request, site: str, entry: str = ""
    ) -> None:
        self.decisions.append(
            Decision(at_s, choice, request.id, request.org, request.site, site, entry)
        )


def replay(
    sites: Sequence[Site],
    events: Iterable[Event],
    summaries: Mapping[str, Summary] | None = None,
    used_s: Mapping[tuple[str, str], float] | None = None,
    fails: Mapping[tuple[str, str], int] | None = None,
) -> Outcome:
    """Run ``events`` (sorted by time, stably) and every run they start to its end: the
    decision log and the summaries. ``summaries`` seeds the organisations' history;
    ``used_s`` replaces a request's ``run_s`` in what its completion counts; ``fails`` says,
    per request key, how many of its runs taken from the queue fail (each requeued)."""
    pending = sorted(events, key=lambda e: e.at_s)
    for e in pending:
        if not math.isfinite(e.at_s):
            raise ValueError(f"event {e!r}: not at a finite time")
    model = FederationModel(
        sites,
        summaries={o: Summary(o, s.contributed, s.used) for o, s in (summaries or {}).items()},
        used_s=dict(used_s or {}),
        fails=dict(fails or {}),
    )
    for event in pending:
        while (t := model.next_finish_s()) is not None and t <= event.at_s:
            model.finish_next()
        if isinstance(event, Submit):
            model.submit(event.at_s, event.request)
        else:
            model.site_lost(event.at_s, event.site)
    while model.next_finish_s() is not None:
        model.finish_next()
    return Outcome(tuple(model.decisions), dict(model.summaries))
