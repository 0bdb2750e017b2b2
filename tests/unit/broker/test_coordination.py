"""The federation's shared state on a real ZooKeeper ensemble (gmd.broker.coordination):
requests published, claimed and consumed exactly once by concurrent brokers, a broker whose
session expired unable to consume, the priority order, completion into the summaries, and the
site-lost rule."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from gmd.broker.coordination import (
    COMPLETE_TRIES,
    Contended,
    Federation,
    FederationError,
    Moved,
    Queued,
    Request,
    ordered,
)
from tests.support.polling import wait_until
from tests.support.zookeeper_fixtures import client

pytest_plugins = ("tests.support.zookeeper_fixtures",)


@pytest.fixture
def brokers(zookeeper_hosts: str, zk_root: str) -> Iterator[Any]:
    """A factory of Federation views, one kazoo client (session) each, closed afterwards."""
    made: list[KazooClient] = []

    def make(site: str, org: str | None = None) -> Federation:
        zk = client(zookeeper_hosts)
        made.append(zk)
        federation = Federation(zk, site, org or f"org-{site}", root=zk_root)
        federation.ensure()
        return federation

    yield make
    for zk in made:
        zk.stop()
        zk.close()


def request(site: str, k: int, org: str | None = None, submitted_s: float = 0.0) -> Request:
    return Request(f"{site}-{k}", org or f"org-{site}", site, 1.0, 60.0, submitted_s or k)


def test_three_brokers_racing_consume_each_request_exactly_once(brokers: Any) -> None:
    a = brokers("a")
    names = [a.publish(request("a", k)) for k in range(30)]
    racers = [brokers(s) for s in ("b", "c", "d")]
    taken: dict[str, list[str]] = {r.site: [] for r in racers}

    def race(f: Federation) -> None:
        while True:
            waiting = f.queued()
            if not waiting:
                return
            for q in waiting:
                claim = f.claim(q.name)
                if claim is not None and f.consume(claim) is not None:
                    taken[f.site].append(q.name)

    threads = [threading.Thread(target=race, args=(f,)) for f in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    everyone = [n for got in taken.values() for n in got]
    assert sorted(everyone) == sorted(names)  # each once: none lost, none twice
    a.sync()  # a's session reads its server, which may be behind the racers' writes
    running = a.running()
    assert set(running) == set(names)
    assert {running[n][0].site for n in taken["b"]} <= {"b"}
    assert a.queued() == []


def test_a_broker_whose_session_expired_cannot_consume_its_claim(
    brokers: Any, zookeeper_hosts: str
) -> None:
    a, b = brokers("a"), brokers("b")
    name = brokers("p").publish(request("p", 1))
    claim = a.claim(name)
    assert claim is not None
    assert b.claim(name) is None  # a's claim came first
    # Expire a's session as the ensemble would after a partition: another connection with its
    # id and password, closed (ZooKeeper ends the session, its ephemeral claim goes).
    session_id, password = a.zk.client_id
    twin = KazooClient(hosts=zookeeper_hosts, client_id=(session_id, password))
    twin.start(timeout=30)
    twin.stop()
    twin.close()
    b_claim = None
    for _ in range(200):
        b_claim = b.claim(name)
        if b_claim is not None:
            break
        threading.Event().wait(0.05)
    assert b_claim is not None, "a's claim never went with its session"
    # a's client reconnects with a new session; its old claim path is gone: no consume. (Polled
    # for the new session, not for "connected": a client still on its expired session until
    # the server drops it would raise SessionExpiredError here, which flaked under load.)
    wait_until(
        "a's new session",
        lambda: a.zk.connected and a.zk.client_id and a.zk.client_id[0] != session_id,
    )
    assert a.consume(claim) is None
    taken = b.consume(b_claim)
    assert taken is not None and taken.site == "b"
    a.sync()
    assert set(a.running()) == {name}


def test_a_claim_whose_answer_was_lost_is_withdrawn_by_its_own_session_only(
    brokers: Any,
) -> None:
    """A claim made but never heard back about (the connection dropped after the create) stands
    first for its request: no claim after it, its own session's included, goes on, until that
    session withdraws it. Another session's claim is not its to withdraw."""
    a, b = brokers("a"), brokers("b")
    name = brokers("p").publish(request("p", 1))
    other = brokers("p").publish(request("p", 2))
    lost = a.zk.create(a.path("claims", f"{name}-c-"), b"a", ephemeral=True, sequence=True)
    b_first = b.claim(other)
    assert b_first is not None
    assert a.claim(name) is None and b.claim(name) is None
    assert a.withdraw_claims() == 1
    assert a.zk.exists(lost) is None
    assert b.zk.exists(b_first.path) is not None  # b's own claim stands
    taken = b.claim(name)
    assert taken is not None and b.consume(taken) is not None
    assert a.withdraw_claims() == 0


def test_the_highest_priority_organisation_first_then_the_longest_waiting() -> None:
    def q(name: str, org: str, submitted_s: float) -> Queued:
        return Queued(name, Request(name, org, "s", 1.0, 1.0, submitted_s))

    waiting = [q("r1", "low", 1), q("r2", "high", 5), q("r3", "high", 2), q("r4", "new", 0)]
    chosen = ordered(waiting, {"low": -10.0, "high": 3.0})
    assert [x.name for x in chosen] == ["r3", "r2", "r4", "r1"]


def test_completion_sums_what_one_organisation_lent_and_the_other_used(brokers: Any) -> None:
    home, lender = brokers("home", "org-home"), brokers("lender", "org-lender")
    name = home.publish(Request("job", "org-home", "home", 2.0, 100.0, 1.0))
    claim = lender.claim(name)
    assert claim is not None and lender.consume(claim) is not None
    assert home.complete(name, 50.0) is None  # not home's to complete
    done = lender.complete(name, 50.0)
    assert done is not None and done.request.id == "job"
    assert (done.seq, done.core_seconds) == (1, 100.0)  # the lender's first completion
    # Asked again, as after a lost answer: the same completion, counted once.
    assert lender.complete(name, 50.0) == done
    record = lender.site_record()
    assert (record.seq, record.last) == (1, done)
    home.sync()
    sums = home.summaries()
    assert (sums["org-lender"].contributed, sums["org-lender"].used) == (100.0, 0.0)
    assert (sums["org-home"].contributed, sums["org-home"].used) == (0.0, 100.0)
    assert sums["org-home"].priority == -100.0
    # A site running its own organisation's request lends nothing.
    own = home.publish(Request("own", "org-home", "home", 1.0, 10.0, 2.0))
    claim = home.claim(own)
    assert claim is not None and home.consume(claim) is not None
    own_done = home.complete(own, 10.0)
    assert own_done is not None and (own_done.seq, own_done.core_seconds) == (1, 0.0)
    assert home.summaries()["org-home"].used == 100.0


def test_a_completion_that_loses_to_other_writes_reads_again_and_then_says_later(
    brokers: Any,
) -> None:
    """A completion's transaction is fenced by the versions of what it read; another session
    writes one of them between the reads and the commit of every try (the running node, which
    a third site rewrites from its own session, through whichever server it has). Once the
    writes stop, the completion is made and counted once; while they go on, ``Contended`` says
    "later" after ``COMPLETE_TRIES`` tries and nothing was made: the request still runs at the
    lender, uncounted. Before, the broker took that for a completion that would never be made."""
    home, lender, rival = brokers("home", "org-home"), brokers("lender"), brokers("rival")
    tries: list[int] = []

    def lend(rid: str) -> str:
        name = home.publish(Request(rid, "org-home", "home", 2.0, 100.0, 1.0))
        claim = lender.claim(name)
        assert claim is not None and lender.consume(claim) is not None
        return name

    def rewritten_by_rival(name: str, writes: int) -> Any:
        path = lender.path("running", name)
        tries.clear()

        def before(completion: Any) -> None:
            tries.append(completion.seq)
            if len(tries) <= writes:
                rival.zk.set(path, rival.zk.get(path)[0])  # same bytes, a new version

        return before

    busy = lend("busy")
    with pytest.raises(Contended, match="later"):
        lender.complete(busy, 50.0, rewritten_by_rival(busy, writes=COMPLETE_TRIES))
    assert tries == [1] * COMPLETE_TRIES
    running = lender.running()
    assert set(running) == {busy} and running[busy][0].site == "lender"
    assert lender.site_record().seq == 0
    assert all(s.contributed == s.used == 0.0 for s in lender.summaries().values())
    # The writes stop after three tries: the fourth is made, once.
    done = lender.complete(busy, 50.0, rewritten_by_rival(busy, writes=3))
    assert done is not None and (done.seq, done.core_seconds) == (1, 100.0)
    assert tries == [1, 1, 1, 1]
    assert lender.running() == {} and lender.site_record().seq == 1
    assert lender.summaries()["org-lender"].contributed == 100.0


def test_a_lost_sites_foreign_work_is_requeued_and_its_queue_removed(brokers: Any) -> None:
    lost, other, watcher = brokers("lost"), brokers("other"), brokers("watcher")
    foreign = other.publish(request("other", 1))
    claim = lost.claim(foreign)
    assert claim is not None and lost.consume(claim) is not None
    queued_by_lost = lost.publish(request("lost", 2))
    kept = other.publish(request("other", 3))
    # Two brokers apply the rule at once: each request moves once.
    results: list[tuple[list[Moved], list[Moved]]] = []
    appliers = [brokers("x"), watcher]
    now = time.time()
    threads = [
        threading.Thread(target=lambda f=f: results.append(f.site_lost("lost", now)))
        for f in appliers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    requeued = [m.name for r, _ in results for m in r]
    removed = [m.name for _, r in results for m in r]
    assert requeued == [foreign] and removed == [queued_by_lost]
    watcher.sync()  # the other applier may have made every move
    waiting = watcher.queued()
    assert {q.request.id for q in waiting} == {"other-1", "other-3"}
    assert kept in {q.name for q in waiting}
    assert watcher.running() == {}
    assert lost.complete(foreign, 10.0) is None  # the lost site cannot count it any more
    # The requeued request is "treated as if just submitted": it waits behind other-3 now.
    assert [q.request.id for q in ordered(waiting, {})] == ["other-3", "other-1"]
    assert next(q for q in waiting if q.request.id == "other-1").request.submitted_s == now


def test_garbage_in_the_queue_stops_no_broker_and_bad_requests_are_refused(
    brokers: Any,
) -> None:
    f = brokers("a")
    f.zk.create(f.path("queue", "req-"), b"\xff not json", sequence=True)
    f.zk.create(f.path("queue", "req-"), b'{"id": "x"}', sequence=True)
    f.zk.create(f.path("queue", "req-"), b"[1, 2]", sequence=True)
    good = f.publish(request("a", 1))
    assert [q.name for q in f.queued()] == [good]
    for bad in (
        {"id": "a/b"},
        {"cores": float("nan")},
        {"run_s": -1.0},
        {"org": ""},
        {"submitted_s": "soon"},
    ):
        fields = {"id": "r", "org": "o", "site": "a", "cores": 1.0, "run_s": 1.0}
        with pytest.raises(FederationError):
            Request(**{**fields, "submitted_s": 0.0, **bad})
    with pytest.raises(FederationError, match="cannot publish"):
        f.publish(request("b", 1))


def test_a_request_is_published_once_until_its_publisher_knows(brokers: Any) -> None:
    """The marker written with the queue node refuses the same request again (a retry after a
    lost answer), wherever the request went meanwhile; once the publisher knows, it goes."""
    home, taker = brokers("home"), brokers("taker")
    r = request("home", 1)
    name = home.publish(r)
    assert name is not None
    claim = taker.claim(name)
    assert claim is not None and taker.consume(claim) is not None
    assert taker.complete(name, 1.0) is not None  # run and completed elsewhere
    assert home.publish(r) is None  # the retry: refused, not queued again
    assert home.queued() == [] and home.running() == {}
    home.published(r)
    assert home.zk.get_children(home.path("published", "home")) == []
    assert home.publish(request("home", 2)) is not None
    assert home.forget_published() == 1


def test_one_site_one_broker(brokers: Any) -> None:
    first, second = brokers("a"), brokers("a")
    first.join(4.0)
    first.join(4.0)  # its own node: fine
    with pytest.raises(FederationError, match="already a member"):
        second.join(4.0)
    assert first.members()["a"]["free_cores"] == 4.0
