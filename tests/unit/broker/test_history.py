"""The federation's history in each cloud's ledger (SQLite and PostgreSQL), reconciled with
ZooKeeper's summaries on a real ensemble: a completion filed before it is counted and settled
after, a broker stopped between the two, a ZooKeeper that lost its data refilled from the
ledgers once, a ledger behind ZooKeeper marked; three live brokers with their own ledgers
count each completion once; the standings reach gmd-admin and the read API."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kazoo.client import KazooClient
from sqlalchemy import Engine, select

from gmd.broker.broker import Broker, Choice
from gmd.broker.coordination import Federation, Request
from gmd.broker.history import BEHIND, History
from gmd.ledger_schema import migrate
from gmd.ledger_schema.tables import federation_events, federation_standings
from tests.support.daemon_support import gmd_admin, make_config, serving
from tests.support.polling import wait_until
from tests.support.zookeeper_fixtures import client

pytest_plugins = ("tests.support.zookeeper_fixtures", "tests.support.broker_support")


def ledger(url: str) -> Engine:
    engine = migrate.engine_for(url)
    migrate.upgrade(engine)
    return engine


@pytest.fixture
def sites(zookeeper_hosts: str, zk_root: str) -> Iterator[Any]:
    """A factory of (Federation, its client) per site, clients closed afterwards."""
    made: list[KazooClient] = []

    def make(site: str, org: str) -> Federation:
        zk = client(zookeeper_hosts)
        made.append(zk)
        federation = Federation(zk, site, org, root=zk_root)
        federation.ensure()
        federation.join()
        return federation

    yield make
    for zk in made:
        zk.stop()
        zk.close()


def lend(home: Federation, lender: Federation, rid: str, cores: float = 2.0) -> str:
    """``home`` publishes a request and ``lender`` takes it: its running node's name."""
    name = home.publish(Request(rid, home.org, home.site, cores, 10.0, time.time()))
    claim = lender.claim(name)
    assert claim is not None and lender.consume(claim) is not None
    return name


def rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        query = select(federation_events).order_by(federation_events.c.id)
        return [dict(r._mapping) for r in conn.execute(query)]


def test_a_completion_is_filed_before_it_counts_and_settled_after(
    sites: Any, database_url: str
) -> None:
    home, lender = sites("home", "org-home"), sites("lender", "org-lender")
    history = History(ledger(database_url), "lender")
    name = lend(home, lender, "j1")
    seen: list[list[dict[str, Any]]] = []

    def file_first(completion: Any) -> None:
        history.begin(completion, time.time())
        seen.append(rows(history.engine))

    done = lender.complete(name, 10.0, before=file_first)
    assert done is not None
    # When ZooKeeper was asked, the ledger already had the row, unsettled.
    assert [(r["seq"], r["counted"], r["core_seconds"]) for r in seen[0]] == [(1, None, 20.0)]
    history.settle(done.seq, True)
    (row,) = rows(history.engine)
    assert (row["choice"], row["request"], row["org"], row["node"]) == (
        "completed",
        "j1",
        "org-home",
        name,
    )
    assert (row["seq"], row["counted"], row["core_seconds"]) == (1, True, 20.0)
    assert history.counted() == (1, 20.0, {"org-home": 20.0})
    home.sync()  # the lender completed through its own session
    assert home.summaries()["org-lender"].contributed == 20.0


def test_a_broker_stopped_between_filing_and_counting_settles_on_its_return(
    sites: Any, database_url: str
) -> None:
    home, lender = sites("home", "org-home"), sites("lender", "org-lender")
    history = History(ledger(database_url), "lender")
    # Stopped after ZooKeeper counted it, before the ledger was told: counted on return.
    first = lend(home, lender, "j1")
    assert lender.complete(first, 5.0, lambda c: history.begin(c, time.time())) is not None
    # Stopped after filing, before ZooKeeper was asked: refused on return.
    second = lend(home, lender, "j2")
    running, _ = lender.running()[second]
    record = lender.site_record()
    from gmd.broker.coordination import Completion

    history.begin(Completion(record.seq + 1, second, running.request, 10.0), time.time())
    assert [r["counted"] for r in rows(history.engine)] == [None, None]

    found = history.reconcile(lender.site_record(), lender.reseed, time.time())
    assert (found.settled_counted, found.settled_refused, found.reseeded) == (1, 1, False)
    assert [(r["seq"], r["counted"]) for r in rows(history.engine)] == [(1, True), (None, False)]
    # The refused number goes to the next completion, which the ledger files and settles.
    third = lender.complete(second, 5.0, lambda c: history.begin(c, time.time()))
    assert third is not None and third.seq == 2
    history.settle(third.seq, True)
    assert history.counted() == (2, 20.0, {"org-home": 20.0})
    home.sync()
    assert home.summaries()["org-home"].used == 20.0


def test_a_zookeeper_that_lost_its_data_is_refilled_from_the_ledgers_once(
    sites: Any, database_url: str, tmp_path: Path, zookeeper_hosts: str, zk_root: str
) -> None:
    home = sites("home", "org-home")
    lenders = [sites("l1", "org-l1"), sites("l2", "org-l2")]
    # Each lender its own ledger: one of the kind under test, one SQLite file.
    histories = [
        History(ledger(database_url), "l1"),
        History(ledger(f"sqlite:///{tmp_path / 'l2.db'}"), "l2"),
    ]
    for k, (lender, history) in enumerate(zip(lenders, histories, strict=True)):
        for j in range(k + 2):
            name = lend(home, lender, f"r{k}{j}", cores=1.0 + j)
            done = lender.complete(name, 7.0, lambda c, h=history: h.begin(c, time.time()))
            assert done is not None
            history.settle(done.seq, True)
    home.sync()
    before = home.summaries()
    assert before["org-home"].used == 7.0 * (1 + 2 + 1 + 2 + 3)

    zk = client(zookeeper_hosts)
    try:
        zk.delete(zk_root, recursive=True)  # the federation's data is gone
    finally:
        zk.stop()
        zk.close()
    for f in (home, *lenders):  # each session's server may still hold the deleted data
        f.sync()
    home.ensure()
    for lender, history in zip(lenders, histories, strict=True):
        found = history.reconcile(lender.site_record(), lender.reseed, time.time())
        assert found.reseeded
    home.sync()
    assert home.summaries() == before
    assert [f.site_record().seq for f in lenders] == [2, 3]
    # Once: coming back again changes nothing.
    for lender, history in zip(lenders, histories, strict=True):
        assert not history.reconcile(lender.site_record(), lender.reseed, time.time()).reseeded
    assert home.summaries() == before


def test_a_ledger_behind_zookeeper_is_marked_once(sites: Any, database_url: str) -> None:
    home, lender = sites("home", "org-home"), sites("lender", "org-lender")
    for k in range(3):  # counted in ZooKeeper by a ledger that is then lost
        assert lender.complete(lend(home, lender, f"j{k}"), 1.0) is not None
    history = History(ledger(database_url), "lender")  # restored from an empty copy
    for _ in range(2):
        found = history.reconcile(lender.site_record(), lender.reseed, time.time())
        assert found.missing == 3
    gaps = [r for r in rows(history.engine) if r["choice"] == BEHIND]
    assert [g["request"] for g in gaps] == ["completions 1-3"]
    home.sync()
    assert home.summaries()["org-lender"].contributed == 3 * 2.0  # ZooKeeper's kept


def test_three_brokers_file_each_completion_once_and_the_standings_reach_the_readers(
    federation: Any, tmp_path: Path
) -> None:
    """a has no core of its own: it publishes every request (with cores, how many it ran itself
    depended on how fast its requests ended: on a busy CI machine it ran four of six, published
    two, and the test, waiting for four completions, timed out). b and c lend."""
    a = federation("a", 0, threshold=0.0, ledger=True)
    b, c = federation("b", 2, ledger=True), federation("c", 2, ledger=True)
    jobs = [f"job{k}" for k in range(6)]
    for k, job in enumerate(jobs):
        a.submit(Request(job, "org-a", "a", 1.0, 0.5, float(k)))
    everyone = (a, b, c)

    def completed() -> Counter[str]:
        return Counter(
            r["request"]
            for broker in everyone
            for r in rows(broker.history.engine)  # type: ignore[union-attr]
            if r["choice"] == Choice.completed and r["counted"]
        )

    def seen() -> object:
        decided = {b.settings.site: [(d.choice, d.request) for d in b.decisions] for b in everyone}
        return decided, sorted(a.federation.running()), completed()

    # At least six, then exactly which: a completion filed twice fails below by its name.
    wait_until("six completions filed", lambda: sum(completed().values()) >= 6, seen=seen)
    published = [d.request for d in a.decisions if d.choice == Choice.published]
    assert sorted(published) == jobs
    assert completed() == Counter(dict.fromkeys(jobs, 1)), seen()
    # The ledgers' sums are ZooKeeper's.
    lent = {
        broker.settings.org: broker.history.counted()[1]  # type: ignore[union-attr]
        for broker in everyone
    }
    a.federation.sync()
    sums = a.federation.summaries()

    def contributed(org: str) -> float:
        return sums[org].contributed if org in sums else 0.0

    assert lent["org-b"] == contributed("org-b") and lent["org-c"] == contributed("org-c")
    assert lent["org-b"] + lent["org-c"] == pytest.approx(sums["org-a"].used)
    assert lent["org-a"] == 0.0
    # Each broker's ledger has its own decisions only.
    for broker in everyone:
        assert {r["site"] for r in rows(broker.history.engine)} == {  # type: ignore[union-attr]
            broker.settings.site
        }
    assert [r["choice"] for r in rows(a.history.engine)].count("published") == 6  # type: ignore[union-attr]
    # The readers read the ledger of the lender that completed more (at least three of six).
    reader = max((b, c), key=lambda lender: lent[lender.settings.org])

    def standings(broker: Broker) -> dict[str, dict[str, Any]]:
        with broker.history.engine.connect() as conn:  # type: ignore[union-attr]
            return {r.org: dict(r._mapping) for r in conn.execute(select(federation_standings))}

    def settled() -> bool:
        filed = standings(reader)
        return set(filed) == {"org-a", "org-b", "org-c"} and all(
            filed[o]["contributed"] == contributed(o) and filed[o]["running"] == 0 for o in filed
        )

    wait_until("the reader's ledger to hold the standings", settled)
    for broker in everyone:  # what the readers compare stays put
        broker.stop()
    # gmd-admin and the read API show the reader's ledger's standings, the same document.
    url = f"sqlite:///{tmp_path / reader.settings.site / 'ledger.db'}"
    config_file = tmp_path / "admin.toml"
    config_file.write_text(f'[database]\nurl = "{url}"\n')
    shown = gmd_admin(config_file, "federation", "standings")
    assert shown["organizations"][0]["org"] in ("org-b", "org-c")  # lenders first
    assert shown["organizations"][-1]["org"] == "org-a"
    assert shown["organizations"][-1]["priority"] == pytest.approx(-sums["org-a"].used)
    log = gmd_admin(config_file, "federation", "log")["events"]
    assert {e["choice"] for e in log} >= {"took", "completed"}
    assert all(e["site"] == reader.settings.site for e in log)
    config = make_config(url, {}, daemon={"bind": "127.0.0.1"}, read_api={"auth": "local"})
    with serving(config) as d:
        served = httpx.get(f"{d.url}/v1/federation", timeout=60).json()
        events = httpx.get(f"{d.url}/v1/federation/events", timeout=60).json()
        bad = httpx.get(f"{d.url}/v1/federation/events", params={"from": "soon"}, timeout=60)
    assert served == gmd_admin(config_file, "federation", "standings")
    assert events == gmd_admin(config_file, "federation", "log")
    assert bad.status_code == 400 and "from" in bad.text


def test_a_zookeeper_that_lost_completions_it_counted_is_caught_up_and_completions_go_on(
    federation: Any, zk_root: str, zookeeper_hosts: str
) -> None:
    """The federation's soak, seed 5: ZooKeeper 3.8 lost writes it had acknowledged (a
    follower took a new epoch before it had logged what it synced, then led: ZOOKEEPER-4643's
    kind), and its count of a lender's completions went back below the lender's ledger. Each
    later completion took a number the ledger held counted: IntegrityError, "the ledger:
    later", for good, and the lender completed nothing again. The rollback is played by
    writing the site's record and the summaries back as they were after the first
    completion; the broker must put back what ZooKeeper lost, once, and complete the next."""
    home = federation("home", 0, ledger=True)
    lender = federation("lender", 1, ledger=True)
    zk = client(zookeeper_hosts)
    try:

        def completions() -> list[str]:
            return [d.request for d in lender.decisions if d.choice == Choice.completed]

        def state() -> dict[str, bytes]:
            paths = [f"{zk_root}/sites/lender"]
            paths += [f"{zk_root}/summaries/{o}" for o in zk.get_children(f"{zk_root}/summaries")]
            return {p: zk.get(p)[0] for p in paths}

        home.submit(Request("a", "org-home", "home", 1.0, 0.1, 1.0))
        wait_until("a completed", lambda: completions() == ["a"])
        after_one = state()
        home.submit(Request("b", "org-home", "home", 1.0, 0.1, 2.0))
        wait_until("b completed", lambda: completions() == ["a", "b"])
        wait_until("b settled", lambda: lender.history.counted()[0] == 2)
        after_two = state()
        for path, data in after_one.items():  # ZooKeeper's lost writes
            zk.set(path, data)
        home.submit(Request("c", "org-home", "home", 1.0, 0.1, 3.0))
        wait_until("c completed", lambda: completions() == ["a", "b", "c"], timeout_s=20)
        wait_until("c settled", lambda: lender.history.counted()[0] == 3)
        record = lender.federation.site_record()
        assert record.seq == 3
        assert record.last is not None and record.last.request.id == "c"
        # the summaries: what they were before the rollback, and c's once
        sums = lender.federation.summaries()
        lent = lender.history.counted()[1]
        assert sums["org-lender"].contributed == pytest.approx(lent)
        assert sums["org-home"].used == pytest.approx(lent)
        assert json.loads(after_two[f"{zk_root}/summaries/org-lender"])["contributed"] < lent
    finally:
        zk.stop()
        zk.close()
