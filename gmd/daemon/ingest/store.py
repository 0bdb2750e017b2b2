"""Writing what agents report into the ledger: one batch, one transaction, behind one front.

A known host's batch (the same VMs as its last, all marked seen today) is stored by one
statement in one round trip where the ledger is PostgreSQL (:mod:`.one_statement`); any other
batch, and any that statement does not store, by the general path (:mod:`.batch_writer`), which
makes what is new and tells a retry from a reused key; both name hosts, VMs and customers by
the ids :mod:`.ids` makes and caches. The front retries what a database may answer for a
moment: the rare deadlock with other writers, and a connection the server dropped (the key
makes a retry after a commit whose answer was lost a duplicate, never a second copy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from gmd.common.units import DAY_S
from gmd.daemon.ingest.batch_writer import BatchWriter
from gmd.daemon.ingest.ids import RECALL_INTERVALS, LedgerIds, Recalled
from gmd.daemon.ingest.record import Admit, BatchRecord, IngestResult
from gmd.daemon.ledger.partitions import ensure_days
from gmd.ledger_schema.migrate import writer

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""How many times a batch is tried when the database answers what may pass (a deadlock, a
dropped connection, a key stored concurrently)."""


class LedgerStore:
    """The write side of ingest. ``owner_of(host)`` names the organization owning a host;
    ``organization_customers`` links organizations to the customer account they also are."""

    def __init__(
        self,
        engine: Engine,
        owner_of: Callable[[str], str],
        organization_customers: Mapping[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self.writer = writer(engine)
        self.ids = LedgerIds(owner_of, organization_customers)
        self._partition_days: set[int] = set()
        self.general = BatchWriter(self.writer, self.ids, self._partition_for)
        self.one_statement = None
        """how a known host's batch is stored in one statement, where it can be (PostgreSQL)"""
        if engine.dialect.name == "postgresql":
            # Imported here: it speaks to psycopg, which a SQLite-only installation lacks.
            from gmd.daemon.ingest.one_statement import OneStatement

            self.one_statement = OneStatement(self.writer, self.ids, self._partition_for)

    def forget(self, vm_uuids: Sequence[str], customer_names: Sequence[str]) -> None:
        """Let go of VMs and customers retention purged (:func:`~gmd.daemon.ledger.retention.
        purge`'s ``forget``): a batch that names one again creates it anew, and the cache does
        not grow with every VM a cloud ever ran."""
        self.ids.cache.forget(vm_uuids, customer_names)

    def recall(self, intervals: int = RECALL_INTERVALS) -> Recalled:
        """What the ledger's latest intervals say of each host, remembered as the daemon
        starts (:meth:`~gmd.daemon.ingest.ids.LedgerIds.recall`)."""
        return self.ids.recall(self.engine, intervals)

    def sync_organizations(self, names: Iterable[str]) -> None:
        """Create the configured organizations and link those that are also customers."""
        self.ids.sync_organizations(self.writer, names)

    def ingest(
        self,
        record: BatchRecord,
        now_s: float | None = None,
        admit: Admit | None = None,
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        aside: str | None = None,
    ) -> IngestResult:
        """Store one batch, or recognize it as a retry. Raises
        :class:`~gmd.daemon.ingest.record.KeyReused`.

        ``admit(customers, vms)`` is told of every new batch (not of a retry) how many customers
        and VMs new to the ledger it would create, before they are written; what it raises
        undoes the batch. ``unverified``: Placement could not vouch for the batch (it could not
        be reached); it is stored marked so, and moves no VM to its host or owner: a VM's row
        keeps the host and project it had until a verified batch names it. ``hold``: VMs whose
        rows this batch must not move either (Placement took them because they left the host
        lately: deleted, or migrated away). ``aside``: the VMs of a host's batch Placement
        contradicts, and why; stored quarantined in the same transaction (no accounting or
        report reads them), moving no VM's row, for the operator to see, release or drop."""
        if aside is None:
            if self.one_statement is not None:
                stored = self.one_statement.store(record, now_s, admit, unverified)
                if stored is not None:
                    return stored
        else:
            hold = frozenset(record.vm_uuids)
        for attempt in range(ATTEMPTS):
            last = attempt == ATTEMPTS - 1
            try:
                return self.general.write(
                    record,
                    time.time() if now_s is None else now_s,
                    admit,
                    unverified,
                    hold,
                    aside,
                )
            except IntegrityError:
                # A concurrent transaction stored the same key (or created the same name)
                # first; the next attempt sees its committed result.
                if last:
                    raise
            except DBAPIError as exc:
                if not retryable(exc) or last:
                    raise
                log.info("batch %s for %s: %s; retrying", record.key, record.host, exc.orig)
            time.sleep(0.01 * 2**attempt)
        raise AssertionError("unreachable")

    def _partition_for(self, start_s: int) -> None:
        """The raw tables' partition of the interval's day, made if it is missing (PostgreSQL;
        the daemon makes them ahead, so this is a set lookup but for a replay of old days)."""
        day = start_s // DAY_S
        if day in self._partition_days:
            return
        ensure_days(self.engine, [day])
        self._partition_days.add(day)


def retryable(exc: DBAPIError) -> bool:
    """Deadlocks and serialization failures (PostgreSQL), a busy database (SQLite), and a
    connection the server or the network dropped: the engine does not ping connections before
    use (a round trip per batch), so a connection that died while idle in the pool is found
    here, and SQLAlchemy has then discarded it and the pool's older ones."""
    code = getattr(exc.orig, "sqlstate", None)
    return (
        exc.connection_invalidated
        or code in ("40P01", "40001")
        or "database is locked" in str(exc.orig)
    )
