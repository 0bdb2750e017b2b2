"""What the broker tests share: the ``federation`` fixture (live brokers on the test
ensemble, each with local processes and, if asked, a ledger of its own), the journal those
processes write (gmd.broker.handlers.LocalProcesses), and the completions the brokers' ledgers
hold. A test module uses the fixture with ``pytest_plugins = ("tests.support.zookeeper_fixtures",
"tests.support.broker_support")``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from gmd.broker.broker import Broker, BrokerSettings
from gmd.broker.handlers import LocalProcesses
from gmd.broker.history import History
from gmd.ledger_schema import migrate
from tests.support.zookeeper_fixtures import client


def journal_lines(path: Path) -> list[tuple[str, str, str]]:
    """The journal's ``(site, request id, start|end)`` lines, in the order written."""
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]


def counted_completions(urls: list[str]) -> Counter[str]:
    """The request ids whose completion each cloud's ledger holds as counted by ZooKeeper,
    over the ledgers of ``urls`` (each counted once in all, if the federation is right)."""
    from sqlalchemy import and_, create_engine, select

    from gmd.ledger_schema.tables import federation_events as events

    found: Counter[str] = Counter()
    for url in urls:
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                query = select(events.c.request).where(
                    and_(events.c.choice == "completed", events.c.counted.is_(True))
                )
                found.update(conn.execute(query).scalars())
        finally:
            engine.dispose()
    return found


@pytest.fixture
def federation(zookeeper_hosts: str, zk_root: str, tmp_path: Path) -> Iterator[Any]:
    """A factory of started brokers (site, cores, org, threshold), stopped afterwards; with
    ``ledger``, each files its history in a SQLite ledger of its own
    (``<tmp_path>/<site>/ledger.db``) and reads the standings every 0.2 s. ``.journal``: the
    file their processes write ``site request start|end`` lines to."""
    journal = tmp_path / "journal"
    made: list[tuple[Broker, KazooClient, LocalProcesses]] = []

    def make(
        site: str,
        cores: float,
        org: str | None = None,
        threshold: float = 1.0,
        ledger: bool = False,
    ) -> Broker:
        zk = client(zookeeper_hosts)
        handler = LocalProcesses(site, cores, journal=journal)
        settings = BrokerSettings(
            site, org or f"org-{site}", threshold, root=zk_root, tick_s=0.1, standings_s=0.2
        )
        history = None
        if ledger:
            engine = migrate.engine_for(f"sqlite:///{tmp_path / site / 'ledger.db'}")
            migrate.upgrade(engine)
            history = History(engine, site)
        broker = Broker(zk, settings, handler, history=history)
        broker.start()
        made.append((broker, zk, handler))
        return broker

    make.journal = journal  # type: ignore[attr-defined]
    yield make
    for broker, zk, handler in made:
        broker.stop()
        handler.close()
        zk.stop()
        zk.close()
