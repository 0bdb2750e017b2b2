"""Reading what the broker tests check: the journal the federation's local process handler
(gmd.broker.handlers.LocalProcesses) writes, and the completions the brokers' ledgers hold."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def journal_lines(path: Path) -> list[tuple[str, str, str]]:
    """The journal's ``(site, request id, start|end)`` lines, in the order written."""
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]


def counted_completions(urls: list[str]) -> Counter[str]:
    """The request ids whose completion each cloud's ledger holds as counted by ZooKeeper,
    over the ledgers of ``urls`` (each counted once in all, if the federation is right)."""
    from sqlalchemy import and_, create_engine, select

    from gmd.daemon.ledger.tables import federation_events as events

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
