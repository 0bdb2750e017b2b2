"""The simulator and the live brokers agree (issue 32): one event sequence replayed through
gmd.sim's model of CloudShare (:mod:`gmd.sim.federation`) and through three live brokers on the
real ZooKeeper ensemble, each with its own session and local processes, gives the same choices
and the same summaries.

**The sequence** (model seconds; every request one core). Sites ``a`` (org-a, 1 core), ``b``
(org-b, 1 core) and ``c`` (org-c, 2 cores, threshold 0.5: it takes only while idle). The
summaries are seeded so that the organisations' priorities differ: org-c +5, org-a +2,
org-b −13. At 0 every site runs a local blocker (``LA`` 10 s, ``LB`` 4 s, ``LC`` 14 s; c also
``LC2`` 4 s in its second core, whose end lets c take nothing: its threshold): they fit and
nothing waits yet. Then the others are published (their sites are full) while no site may
take: a1 (submitted at 1), c1 (3), c2 (6), b1 (2), b2 (5).

- 4: b frees and takes **c1**: org-c's priority wins over the older a1, b1 and b2, and of
  org-c's the older. 8: b completes c1 (org-c falls to 1, below org-a) and, on that
  completion, takes **a1**, org-a's.
- 10: a takes **c2** (org-c still above org-b). 14: c takes **b1** (the older of org-b's).
- Then (the second step) a3 (a, submitted at 13) and b3 (b) are published (their sites are
  full), and so is c3 (submitted at 12), though it fits c's free core: b2 and a3 wait and
  would fit it (the paper's event 1: "if there is enough capacity and no other tasks are
  waiting"). Then **b is lost** while it runs a1: a1 is requeued "as if just submitted"
  (submitted at the loss, after 14), b2 and b3 are removed.
- 20: c completes b1 (org-c rises to 7) and takes **c3**, its own request back (org-c's
  priority), and only it (the threshold). 21: c completes c3 (counted nowhere) and takes
  **a3**: a1 was submitted first, but requeued it counts as submitted at the loss, after a3.
  23: c completes a3 and takes **a1**. 32: a completes c2; 34: c completes a1.

**Why each choice is determined despite real timing.** A site's completion and the take that
follows it are one broker thread's, in that order; takes at different sites are at least 3 s
apart (but b's at 8 and a's at 10, which choose the same whichever comes first; c's from 20
on are its alone: b is gone and a busy until 32), and no request is ever published or
requeued while two sites could take it. A local submit's fate is no race either: the blockers
go first, into an empty queue; the later ones at 0 do not fit; c3 fits, but b2 waits until the
loss, which comes after it. The second step is made when c's log shows it took b1, not at a
time, and the loss right after it. The requests' ``submitted_s`` are given live as seconds
after the first submit, so that a requeue's (the requeuing broker's clock at the loss) is
later than a3's there as in the model.
:func:`test_the_sequence_leaves_no_choice_to_timing` checks on the model that runs lasting up
to :data:`SLACK_S` longer than their ``run_s`` (each its own amount), the second step coming
up to as late, and the loss up to :data:`LOSS_SLACK_S` after it, change no choice. Live runs
overshoot by the child's start and the broker's reaping: 0.04–0.4 s in runs under a load of 4
to 11 on two cores, 2.3 s once under 13 (a failure prints each run's overshoot).

**What is compared**, per site: the requests it took, in order; its local submits' fates
(ran-locally or published), in order; its completions, in order. Not one interleaved log: the
order of a site's own submit and an unrelated completion there is timing, not a choice. And
the lost site's requests requeued or removed, each by exactly one of the others (whichever
came first), each named as the broker's log names every request: id, organisation and
publishing site.

**Summaries.** A live completion counts the *measured* run time (from the process's start to
its reaping: more than ``run_s``). The model is made to count those same measured times (its
``used_s``, which counting reads, never the timing), so that the summaries agree to 1e-6
relative and the comparison says something: a tolerance instead would have to be as wide as
the measurement's slack times the completions counted, wide enough to hide a run counted
twice or not at all.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from kazoo.client import KazooClient

from gmd.broker import broker as live
from gmd.broker.broker import Broker, BrokerSettings
from gmd.broker.coordination import Request as LiveRequest
from gmd.broker.handlers import Finished, LocalProcesses
from gmd.sim.federation import (
    Choice,
    Decision,
    Event,
    FederationModel,
    Request,
    Site,
    SiteLost,
    Submit,
    Summary,
    replay,
)
from tests.support.polling import wait_until
from tests.support.zookeeper_fixtures import client

pytest_plugins = ("tests.support.zookeeper_fixtures",)

SITES = (Site("a", "org-a", 1), Site("b", "org-b", 1), Site("c", "org-c", 2, threshold=0.5))
SEEDS = {
    "org-a": Summary("org-a", contributed=2.0),
    "org-b": Summary("org-b", used=13.0),
    "org-c": Summary("org-c", contributed=5.0),
}


def _r(rid: str, site: str, run_s: float, submitted_s: float) -> Request:
    return Request(rid, f"org-{site}", site, 1.0, run_s, submitted_s)


FIRST = (
    _r("LA", "a", 10, 0),
    _r("LC", "c", 14, 0),
    _r("LC2", "c", 4, 0),
    _r("LB", "b", 4, 0),
    _r("a1", "a", 11, 1),
    _r("c1", "c", 4, 3),
    _r("c2", "c", 22, 6),
    _r("b1", "b", 6, 2),
    _r("b2", "b", 6, 5),
)
"""submitted at 0, in this order"""
STEP_AFTER = (Choice.took, "b1", "c")
"""the decision (choice, request, site) the second step waits for"""
STEP_AT_S = 14.0
"""when the model makes :data:`STEP_AFTER`"""
SECOND = (_r("a3", "a", 2, 13), _r("b3", "b", 2, 12), _r("c3", "c", 1, 12))
"""submitted in the second step, in this order, before :data:`LOST` is lost"""
LOST = "b"
SLACK_S = 2.5
"""how much longer any run may last, and how much later the second step may come, live,
without changing a choice (checked on the model)"""
LOSS_SLACK_S = 1.0
"""how much later than the second step the loss may come (checked on the model)"""

GROUPS = ((Choice.took,), (Choice.ran_locally, Choice.published), (Choice.completed,))
"""what a site's own broker logs of its own moves, compared each in its order"""
MOVED = (Choice.requeued, Choice.removed)
"""what happens to a lost site's requests (logged by whichever other broker moved them)"""

View = dict[str, list[list[tuple[str, str]]]]
Moved = list[tuple[str, str, str, str]]


def events() -> list[Event]:
    out: list[Event] = [Submit(0.0, r) for r in FIRST]
    out += [Submit(STEP_AT_S, r) for r in SECOND]
    out.append(SiteLost(STEP_AT_S, LOST))
    return out


def drive(
    extra_s: dict[str, float], step_late_s: float = 0.0, loss_late_s: float = 0.0
) -> FederationModel:
    """The sequence as the live test makes it: the second step ``step_late_s`` after the model
    logs :data:`STEP_AFTER` and the loss ``loss_late_s`` after that, each run lasting
    ``extra_s[id]`` longer than its ``run_s``."""

    def late(r: Request) -> Request:
        return dataclasses.replace(r, run_s=r.run_s + extra_s.get(r.id, 0.0))

    model = FederationModel(SITES, summaries=dict(SEEDS))
    for r in FIRST:
        model.submit(0.0, late(r))
    while not any((d.choice, d.request, d.site) == STEP_AFTER for d in model.decisions):
        model.finish_next()
    at_s = model.decisions[-1].at_s + step_late_s
    while (end_s := model.next_finish_s()) is not None and end_s <= at_s:
        model.finish_next()
    for r in SECOND:
        model.submit(at_s, late(r))
    at_s += loss_late_s
    while (end_s := model.next_finish_s()) is not None and end_s <= at_s:
        model.finish_next()
    model.site_lost(at_s, LOST)
    while model.next_finish_s() is not None:
        model.finish_next()
    return model


def view(decisions: Sequence[Decision]) -> tuple[View, Moved]:
    """What is compared: per site, each group's (choice, request id) in order; and the lost
    site's requests moved, as sorted (choice, request id, organisation, publishing site)."""
    per_site = {
        s.name: [
            [(str(d.choice), d.request) for d in decisions if d.site == s.name and d.choice in g]
            for g in GROUPS
        ]
        for s in SITES
    }
    moved = sorted(
        (str(d.choice), d.request, d.org, d.origin) for d in decisions if d.choice in MOVED
    )
    return per_site, moved


def test_the_model_speaks_the_brokers_vocabulary() -> None:
    assert {c.value for c in Choice} <= {c.value for c in live.Choice}


def test_the_sequence_leaves_no_choice_to_timing() -> None:
    """The timed sequence is the stepped one, and runs up to SLACK_S longer (each its own
    amount) with the second step up to SLACK_S late and the loss up to LOSS_SLACK_S after it
    change no choice."""
    nominal = replay(SITES, events(), SEEDS)
    assert [(str(d.choice), d.request, d.site) for d in drive({}).decisions] == [
        (str(d.choice), d.request, d.site) for d in nominal.decisions
    ]
    step = next(d for d in nominal.decisions if (d.choice, d.request, d.site) == STEP_AFTER)
    assert step.at_s == STEP_AT_S
    took = [(d.at_s, d.request, d.site) for d in nominal.decisions if d.choice == Choice.took]
    assert took == [
        (4, "c1", "b"),
        (8, "a1", "b"),
        (10, "c2", "a"),
        (14, "b1", "c"),
        (20, "c3", "c"),
        (21, "a3", "c"),
        (23, "a1", "c"),
    ]
    # c3 is published though it fits c's free core: b2 and a3 wait
    assert nominal.at("c", GROUPS[1]) == [
        ("ran-locally", "LC"),
        ("ran-locally", "LC2"),
        ("published", "c1"),
        ("published", "c2"),
        ("published", "c3"),
    ]
    want = view(nominal.decisions)
    assert want[1] == [
        ("removed", "b2", "org-b", "b"),
        ("removed", "b3", "org-b", "b"),
        ("requeued", "a1", "org-a", "a"),
    ]
    rng = random.Random(32)
    ids = [r.id for r in FIRST + SECOND]
    for _ in range(300):
        extra = {rid: rng.uniform(0.0, SLACK_S) for rid in ids}
        late_s = (rng.uniform(0.0, SLACK_S), rng.uniform(0.0, LOSS_SLACK_S))
        assert view(drive(extra, *late_s).decisions) == want, (extra, late_s)


@dataclass
class TimedProcesses(LocalProcesses):
    """Local processes that keep each finished run's measured time (what the broker counts),
    by (site, id) of its request, and the requests they started (as the broker gave them)."""

    keys: dict[str, tuple[str, str]] = field(default_factory=dict)
    ran_s: dict[tuple[str, str], float] = field(default_factory=dict)
    started: list[LiveRequest] = field(default_factory=list)

    def start(self, name: str, request: LiveRequest) -> None:
        self.keys[name] = (request.site, request.id)
        self.started.append(request)
        super().start(name, request)

    def finished(self) -> list[Finished]:
        done = super().finished()
        for f in done:
            self.ran_s[self.keys[f.name]] = f.ran_s
        return done


@dataclass
class LiveSite:
    broker: Broker
    zk: KazooClient
    handler: TimedProcesses


@pytest.fixture
def sites(zookeeper_hosts: str, zk_root: str) -> Iterator[dict[str, LiveSite]]:
    """The three sites' brokers, started (each its own session), stopped afterwards."""
    made: dict[str, LiveSite] = {}
    try:
        for site in SITES:
            zk = client(zookeeper_hosts)
            handler = TimedProcesses(site.name, site.cores)
            settings = BrokerSettings(site.name, site.org, site.threshold, zk_root, tick_s=0.1)
            made[site.name] = LiveSite(Broker(zk, settings, handler), zk, handler)
            made[site.name].broker.start()
        yield made
    finally:
        for s in made.values():
            s.broker.stop()
            s.handler.close()
            s.zk.stop()
            s.zk.close()


def _submit(broker: Broker, request: Request, base_s: float) -> None:
    """A local submit, its ``submitted_s`` taken as seconds after ``base_s`` (the brokers'
    clock), waited for until the broker has run or published it, so that the queue's entries
    are made in the sequence's order."""
    submitted_s = base_s + request.submitted_s
    broker.submit(LiveRequest(**dataclasses.asdict(request) | {"submitted_s": submitted_s}))
    fates = (live.Choice.ran_locally, live.Choice.published)
    wait_until(
        f"{request.site} to run or publish {request.id}",
        lambda: any(d.request == request.id and d.choice in fates for d in broker.decisions),
    )


def _completions(log: list[live.Decision], n: int) -> Callable[[], bool]:
    return lambda: sum(1 for d in log if d.choice == live.Choice.completed) == n


def test_three_live_brokers_make_the_models_choices(sites: dict[str, LiveSite]) -> None:
    model = replay(SITES, events(), SEEDS)
    fed = sites["a"].broker.federation
    for org, seed in SEEDS.items():
        doc = {"contributed": seed.contributed, "used": seed.used}
        fed.zk.create(fed.path("summaries", org), json.dumps(doc).encode())

    base_s = time.time()  # the brokers' clock (their default), which a requeue stamps
    for r in FIRST:
        _submit(sites[r.site].broker, r, base_s)
    choice, rid, at = STEP_AFTER
    wait_until(
        f"{at} to {choice} {rid}",
        lambda: any((d.choice, d.request) == (choice, rid) for d in sites[at].broker.decisions),
    )
    for r in SECOND:
        _submit(sites[r.site].broker, r, base_s)
    lost = sites[LOST]
    lost.broker.stop()
    lost.handler.close()
    lost.zk.stop()  # its session closes: its member node goes at once
    up = [name for name in sites if name != LOST]
    for name in up:
        n = sum(1 for d in model.decisions if d.site == name and d.choice == Choice.completed)
        wait_until(f"{name}'s {n} completions", _completions(sites[name].broker.decisions, n))

    timed: dict[tuple[str, str], float] = {}
    for s in sites.values():
        timed |= s.handler.ran_s
    runs = {r.key: r.run_s for r in FIRST + SECOND}
    overshoot = {key[1]: round(ran_s - runs[key], 3) for key, ran_s in timed.items()}
    assert all(v >= 0 for v in overshoot.values()), overshoot
    want_sites, want_moved = view(model.decisions)
    for name, s in sites.items():
        got = [
            [(str(d.choice), d.request) for d in s.broker.decisions if d.choice in g]
            for g in GROUPS
        ]
        assert got == want_sites[name], (name, overshoot)
    moved = sorted(
        (str(d.choice), d.request, d.org, d.site)
        for name in up
        for d in sites[name].broker.decisions
        if d.choice in MOVED
    )
    assert moved == want_moved, overshoot  # each once: sorted lists, duplicates show
    # requeued "as if just submitted": a1 reran at c stamped with the loss, after a3
    rerun = {r.id: r.submitted_s - base_s for r in sites["c"].handler.started}
    assert rerun["a3"] == pytest.approx(13) and rerun["a1"] > STEP_AT_S, rerun

    # the summaries: the model counting the measured run times, to 1e-6
    measured = replay(SITES, events(), SEEDS, used_s=timed)
    assert view(measured.decisions) == view(model.decisions)
    fed.sync()  # the other sites completed through their own sessions
    sums = fed.summaries()
    assert set(sums) == set(measured.summaries)
    for org, want in measured.summaries.items():
        assert sums[org].contributed == pytest.approx(want.contributed, rel=1e-6), org
        assert sums[org].used == pytest.approx(want.used, rel=1e-6), org
    assert fed.queued() == [] and fed.running() == {}
