"""Writing what agents report into the ledger: one batch, one transaction.

A batch either lands whole or not at all. Its key makes a retry count once; its digest tells a
retry from a different batch that reuses the key. Its samples are rows of its own (so that
accounting can leave one batch out), and the host's capacity for the interval is the one its
first batch gave: another batch may not change what an interval is, or was, accounted from.
Customers, VMs, hosts and organizations are created on first sight; their ids are cached per
process once committed, which saves most round trips on the hot path. An id changes only when
retention has purged a customer or VM unseen past raw retention and it comes back. Once a
day per host (at a time of day its name decides, so that hosts do not all do it at once), a
batch moves ``last_seen_s`` of its VMs and customers on and finds, in the same transaction,
whether their rows are still there (:meth:`LedgerStore._mark_seen`); a row gone is created
again under a new id. Retention deletes only rows unseen for a day longer than its cutoff
(:data:`~gmd.ledger_schema.models.SEEN_PERIOD_S`), so no row a batch names without marking it
can be gone.

Concurrency: the batch takes a shared lock on its interval's row, and closing an interval
takes an exclusive one, so a batch is either in before the interval closes (on time) or sees
it closed and is stored as late. Names are inserted in sorted order so that concurrent batches
take row locks in the same order and cannot deadlock each other; the rare deadlock with other
writers, and a connection the server dropped, are retried (the key makes a retry after a
commit whose answer was lost a duplicate, never a second copy).

Round trips: at the end of every interval all hosts post at once, and a daemon then spends
most of a batch's time waiting on the database, so the common case (a known host, VMs and
customers, an interval that exists) is three statements between BEGIN and COMMIT. The batch's
row is inserted first, in one statement that also locks the interval and reads whether it is
still open, and that inserts nothing when the key is already used in any interval; only then
does ingest look at why (a retry, a reused key, or an interval that does not exist yet). The
host's capacity for the interval is inserted unless a batch already gave it, and read back
only then; on PostgreSQL the same statement records that the host was seen. The samples are
the third: on PostgreSQL one row of arrays, by binary COPY (:mod:`.sample_store`). A host's VMs
and their owners are looked up once, not per batch, while its batches list the same ones.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import numpy as np
from sqlalchemy import (
    Boolean,
    Column,
    ColumnElement,
    Connection,
    Double,
    Engine,
    Integer,
    String,
    Table,
    any_,
    bindparam,
    case,
    exists,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.dml import Insert

from gmd import GmdError
from gmd.common.units import DAY_S
from gmd.daemon.ledger import sample_store
from gmd.daemon.ledger.partitions import ensure_days
from gmd.daemon.ledger.quarantine import quarantine
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.models import (
    ID64,
    SEEN_PERIOD_S,
    IntervalState,
    NameSource,
)
from gmd.ledger_schema.tables import (
    batches as _batches,
    customers as _customers,
    host_intervals as _host_intervals,
    hosts as _hosts,
    intervals as _intervals,
    organizations as _organizations,
    vms as _vms,
)
from gmd.wire import CAPACITY_FIELDS, BatchStatus

log = logging.getLogger(__name__)

CAPACITY_COLUMNS = CAPACITY_FIELDS


DIGEST_PREFIX = "v2:"
"""Marks a batch digest taken over the parsed columns (see ``record_of``)."""


class KeyReused(GmdError, ValueError):
    """A batch key arrived again with different content: a bug or a clash between agents."""


class CapacityConflict(GmdError, ValueError):
    """A batch gives its host another capacity than the host's first batch for the interval:
    accepting it would change what the interval is (or was) accounted from."""


class BeforeOrigin(GmdError, ValueError):
    """A batch for an interval before the first one of a ledger that has begun accounting:
    there is no standing to add it to."""


@dataclass(frozen=True)
class BatchRecord:
    """One host's interval, columnar: ``use`` is VMs × :data:`USE_COLUMNS`, ``flavor`` VMs ×
    :data:`FLAVOR_COLUMNS` with NaN where the flavor gives no amount."""

    key: str
    digest: str
    host: str
    interval_start_s: int
    interval_s: int
    capacity: tuple[float, ...]  # one per CAPACITY_FIELDS
    vm_uuids: list[str]
    customers: list[str]
    use: np.ndarray
    flavor: np.ndarray
    created_s: list[int | None]
    customer_names: dict[str, str] = field(default_factory=dict)
    """customer → its project's name from the Nova metadata, where the agent read one"""
    host_cpu_s: float | None = None
    """the host's busy CPU seconds in the interval (:attr:`gmd.wire.SampleBatch.host_cpu_s`)"""


Admit = Callable[[int, int], None]
"""Told, of a new batch, the customers and VMs new to the ledger it would create; raises to
refuse it."""


@dataclass(frozen=True)
class IngestResult:
    status: BatchStatus
    samples: int
    late: int


_NEW_VMS_FROM_ARRAYS = text(
    f"INSERT INTO {_vms.name} (uuid, customer_id, host_id, created_s, last_seen_s)"
    " SELECT u, c, CAST(:host_id AS int4), m, CAST(:seen_s AS int8)"
    " FROM unnest(CAST(:uuids AS varchar[]), CAST(:customers AS int4[]),"
    " CAST(:created AS int8[])) AS t(u, c, m)"
    " ON CONFLICT DO NOTHING RETURNING uuid, id, customer_id, host_id"
)
"""A batch's new VMs, made from three arrays (PostgreSQL): a short text, the same for any
number of VMs, where a row of parameters per VM made a statement of several kilobytes that the
driver parsed anew for every batch (1 ms of a first-seen batch's 5)."""


def _id_in(conn: Connection, column: Column[int], ids: list[int]) -> ColumnElement[bool]:
    """``column`` is one of ``ids``: an array on PostgreSQL (one parameter, planned once),
    a list elsewhere."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam("ids", ids, type_=postgresql.ARRAY(Integer)))
    return column.in_(ids)


def upsert(conn: Connection, table: Table) -> Any:
    """The dialect's INSERT that can say ON CONFLICT (SQLite and PostgreSQL spell it alike)."""
    return _upsert(conn.dialect.name, table)


def _upsert(dialect_name: str, table: Table) -> Any:
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    return dialect.insert(table)


@dataclass(frozen=True)
class _Statements:
    """The hot path's statements, built once per dialect: built per batch, SQLAlchemy would
    compute each one's cache key again every time."""

    batch: Insert
    """the batch's row, if its interval exists and its key is unused: (id, late)"""
    capacity: Insert
    """the host's capacity for the interval, unless a batch gave it: a row if it was new"""


@cache
def _statements(dialect_name: str) -> _Statements:
    open_state = bindparam("open_state", IntervalState.open.value, String())
    # FOR SHARE OF intervals: closing the interval (an UPDATE) waits for this transaction, and
    # this one for a close that began first. The key is looked up in every interval, not only
    # this one, so that a key reused for another interval is refused (the unique constraint
    # holds per interval only: batches are partitioned by interval).
    fresh = (
        select(
            bindparam("key", type_=String()),
            bindparam("digest", type_=String()),
            bindparam("host_id", type_=Integer()),
            _intervals.c.id,
            bindparam("samples", type_=Integer()),
            (_intervals.c.state != open_state).label("late"),
            bindparam("host_cpu_s", type_=Double()),
            bindparam("unverified", type_=Boolean()),
        )
        .where(
            _intervals.c.id == bindparam("interval_id", type_=ID64),
            ~exists().where(_batches.c.key == bindparam("key")),
        )
        .with_for_update(read=True, of=_intervals)
    )
    batch = (
        _upsert(dialect_name, _batches)
        .from_select(
            [
                "key",
                "digest",
                "host_id",
                "interval_id",
                "samples",
                "late",
                "host_cpu_s",
                "unverified",
            ],
            fresh,
        )
        .on_conflict_do_nothing(index_elements=["key", "interval_id"])
        .returning(_batches.c.id, _batches.c.late)
    )
    capacity = (
        _upsert(dialect_name, _host_intervals)
        .values(
            interval_id=bindparam("interval_id"),
            host_id=bindparam("host_id"),
            organization_id=bindparam("owner_id"),
            **{c: bindparam(c) for c in CAPACITY_COLUMNS},
        )
        .on_conflict_do_nothing()
        .returning(_host_intervals.c.host_id)
    )
    if dialect_name == "postgresql":
        # A statement of its own would cost a round trip per batch; PostgreSQL runs an UPDATE
        # in a WITH whether or not the statement reads it (SQLite has no round trips). No
        # parameter may be named as a column of hosts: the UPDATE would SET it too.
        seen = (
            update(_hosts)
            .where(_hosts.c.id == bindparam("host_id"))
            .values(last_seen_s=bindparam("now_s"))
            .cte("seen")
        )
        capacity = capacity.add_cte(seen)
    return _Statements(batch, capacity)


SteadyStore = Callable[[Engine, Mapping[str, Any], Mapping[str, bytes]], tuple[int, bool] | None]
"""``steady_batch.store``: a known host's batch in one statement, or None"""

RECALL_INTERVALS = 10
"""How many of the ledger's latest intervals :meth:`LedgerStore.recall` reads: a host that
posted in none of them is looked up when it posts again."""


@dataclass(frozen=True)
class Recalled:
    """What :meth:`LedgerStore.recall` remembered: hosts, their VMs, and how long it took."""

    hosts: int
    vms: int
    seconds: float


@dataclass(frozen=True)
class _HostVms:
    """A host's VMs and their owners as its last batch listed them, with their ids, taken
    when the cache was at ``generation``."""

    uuids: list[str]
    customers: list[str]
    vm_ids: list[int]
    customer_ids: list[int]
    generation: int
    period: int
    """the host's marking period (:func:`mark_period`) in which these VMs and customers were
    all marked seen"""
    held: bool = False
    """an unverified batch left some of these VMs on another host or owner: not to be
    remembered, so that the host's next (verified) batch looks them up and moves them"""
    named: bool = True
    """the customers' names from the Nova metadata have been applied by this process (a
    memory recalled from the ledger has not: the host's next batch that names them does it,
    as a daemon names a customer the first time it sees it)"""


def _phase_s(host: str) -> int:
    """When in the day ``host``'s marking periods begin, fixed by its name."""
    return zlib.crc32(host.encode()) % SEEN_PERIOD_S


def mark_period(host: str, t_s: int) -> int:
    """Which of ``host``'s marking periods time ``t_s`` falls in: periods of
    :data:`SEEN_PERIOD_S` that begin at a time of day fixed by the host's name, so that the
    marking of a cloud's VMs spreads over the day instead of falling on every host's first
    batch after midnight (5,000 batches at the burst of one interval's end)."""
    return (t_s + _phase_s(host)) // SEEN_PERIOD_S


def marked_in(marked: Mapping[int, int], ids: Iterable[int], host: str, t_s: int) -> list[int]:
    """Of ``ids``, those ``marked`` (id → the interval it was last marked in) does not show
    marked in the host's period of ``t_s``."""
    phase = _phase_s(host)
    period = (t_s + phase) // SEEN_PERIOD_S
    return sorted(
        {i for i in ids if (m := marked.get(i)) is None or (m + phase) // SEEN_PERIOD_S != period}
    )


@dataclass
class _Ids:
    """Committed ids by name. Guarded by a lock: the API serves batches on several threads.

    ``last`` remembers each host's VMs: a host's next batch almost always lists the same VMs
    with the same owners, and comparing the lists costs a hundredth of looking 500 VMs and
    owners up one by one. ``generation`` counts the VMs this process saw move to another host
    or owner, and the rows it forgot; a memory taken at an older generation is not used (one of
    its VMs may have moved meanwhile). What is new (a VM, a customer, a host) is in no memory
    and changes no generation.
    """

    customers: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, tuple[int, int]] = field(default_factory=dict)
    organizations: dict[str, int] = field(default_factory=dict)
    vms: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    last: dict[int, _HostVms] = field(default_factory=dict)
    generation: int = 0
    vm_marked: dict[int, int] = field(default_factory=dict)
    """VM id → the start of the interval in which this process last marked it seen"""
    customer_marked: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, vm_uuids: Iterable[str], customer_names: Iterable[str]) -> None:
        """Drop VMs and customers whose rows are gone (purged): their next batch creates them
        again."""
        with self.lock:
            for uuid in vm_uuids:
                vm = self.vms.pop(uuid, None)
                if vm is not None:
                    self.vm_marked.pop(vm[0], None)
            for name in customer_names:
                cid = self.customers.pop(name, None)
                if cid is not None:
                    self.customer_marked.pop(cid, None)
            self.generation += 1

    def unmarked(
        self, host: str, t_s: int, vm_ids: Iterable[int], customer_ids: Iterable[int]
    ) -> tuple[list[int], list[int]]:
        """Of these ids, the ones not marked seen in the host's period of ``t_s``."""
        with self.lock:
            return (
                marked_in(self.vm_marked, vm_ids, host, t_s),
                marked_in(self.customer_marked, customer_ids, host, t_s),
            )

    def saw(self, t_s: int, vm_ids: Iterable[int], customer_ids: Iterable[int]) -> None:
        """Remember, once committed, what a batch of interval ``t_s`` marked seen."""
        with self.lock:
            for marked, ids in ((self.vm_marked, vm_ids), (self.customer_marked, customer_ids)):
                for i in ids:
                    if marked.get(i, t_s) <= t_s:
                        marked[i] = t_s

    def same_vms(self, host_id: int, record: BatchRecord) -> _HostVms | None:
        """The host's last VMs if ``record`` lists the same ones, owned alike, and nothing has
        changed since."""
        with self.lock:
            last = self.last.get(host_id)
            if last is None or last.generation != self.generation:
                return None
        if last.uuids == record.vm_uuids and last.customers == record.customers:
            return last
        return None


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
        self.owner_of = owner_of
        self.organization_customers = dict(organization_customers or {})
        self._ids = _Ids()
        self._partition_days: set[int] = set()
        self._steady: SteadyStore | None = None
        """how a known host's batch is stored in one statement, where it can be (PostgreSQL)"""
        if engine.dialect.name == "postgresql":
            # Imported here: it speaks to psycopg, which a SQLite-only installation lacks.
            from gmd.daemon.ledger import steady_batch

            self._steady = steady_batch.store

    def forget(self, vm_uuids: Sequence[str], customer_names: Sequence[str]) -> None:
        """Let go of VMs and customers retention purged (:func:`~gmd.daemon.ledger.retention.
        purge`'s ``forget``): a batch that names one again creates it anew, and the cache does
        not grow with every VM a cloud ever ran."""
        self._ids.forget(vm_uuids, customer_names)

    def recall(self, intervals: int = RECALL_INTERVALS) -> Recalled:
        """Remember what the ledger's latest ``intervals`` intervals say of each host: its id
        and owner, and its VMs and their owners as its latest batch listed them, with when
        each was last marked seen. Run as the daemon starts: a daemon restarted, or one of
        several sharing a port that has not served a host yet, would otherwise take every
        host's first batch down the general path (a look-up of all its VMs and customers: a
        burst of 5,000 hosts took twice as long), while it now stores it by one statement.
        A host whose VMs have moved since to another host or owner is left to be looked up."""
        started = time.perf_counter()
        with self.engine.connect() as conn:
            latest = conn.execute(
                select(_intervals.c.id, _intervals.c.length_s)
                .order_by(_intervals.c.id.desc())
                .limit(1)
            ).first()
            if latest is None:
                return Recalled(0, 0, 0.0)
            lists = sample_store.latest_lists(conn, latest.id - intervals * latest.length_s)
            organizations = {
                name: i
                for name, i in conn.execute(select(_organizations.c.name, _organizations.c.id))
            }
            hosts = {
                i: (name, org)
                for i, name, org in conn.execute(
                    select(_hosts.c.id, _hosts.c.name, _hosts.c.organization_id)
                )
            }
            customers = {
                i: (name, seen)
                for i, name, seen in conn.execute(
                    select(_customers.c.id, _customers.c.name, _customers.c.last_seen_s)
                )
            }
            listed = {v for vms, _ in lists.values() for v in vms}
            vms = {
                i: (uuid, owner, host, seen)
                for i, uuid, owner, host, seen in conn.execute(
                    select(
                        _vms.c.id,
                        _vms.c.uuid,
                        _vms.c.customer_id,
                        _vms.c.host_id,
                        _vms.c.last_seen_s,
                    )
                )
                if i in listed
            }
        recalled = remembered = 0
        with self._ids.lock:
            generation = self._ids.generation
            self._ids.organizations.update(organizations)
            for host_id, (vm_ids, customer_ids) in lists.items():
                host = hosts.get(host_id)
                try:
                    rows = [vms[v] for v in vm_ids]
                    owners = [customers[c] for c in customer_ids]
                except KeyError:  # purged since
                    continue
                moved = any(
                    (r[1], r[2]) != (c, host_id) for r, c in zip(rows, customer_ids, strict=True)
                )
                if host is None or moved:
                    continue
                name = host[0]
                marks = [r[3] for r in rows] + [o[1] for o in owners]
                # The period in which all of them were marked seen (none: mark them first).
                period = min((mark_period(name, m) for m in marks if m is not None), default=-1)
                if None in marks:
                    period = -1
                self._ids.hosts[name] = (host_id, host[1])
                for v, (uuid, owner, at, seen) in zip(vm_ids, rows, strict=True):
                    self._ids.vms[uuid] = (v, owner, at)
                    if seen is not None:
                        self._ids.vm_marked[v] = seen
                # Customers' ids are not remembered by name: the general path looks a
                # customer up once per process, and names it from the metadata then.
                for c, (_customer, seen) in zip(customer_ids, owners, strict=True):
                    if seen is not None:
                        self._ids.customer_marked[c] = seen
                self._ids.last[host_id] = _HostVms(
                    [r[0] for r in rows],
                    [o[0] for o in owners],
                    list(vm_ids),
                    list(customer_ids),
                    generation,
                    period,
                    named=False,
                )
                recalled += 1
                remembered += len(vm_ids)
        return Recalled(recalled, remembered, time.perf_counter() - started)

    # -- organizations -------------------------------------------------------------------------

    def sync_organizations(self, names: Iterable[str]) -> None:
        """Create the configured organizations and link those that are also customers."""
        with self.writer.begin() as conn:
            for name in sorted(set(names) | set(self.organization_customers)):
                org_id = self._organization_id(conn, name, {})
                customer = self.organization_customers.get(name)
                if customer is not None:
                    cid = self._customer_ids(conn, [customer], {})[customer]
                    conn.execute(
                        update(_organizations)
                        .where(_organizations.c.id == org_id)
                        .values(customer_id=cid)
                    )

    def _organization_id(self, conn: Connection, name: str, new: dict[str, int]) -> int:
        cached = self._ids.organizations.get(name) or new.get(name)
        if cached is not None:
            return cached
        conn.execute(upsert(conn, _organizations).values(name=name).on_conflict_do_nothing())
        org_id = conn.execute(
            select(_organizations.c.id).where(_organizations.c.name == name)
        ).scalar_one()
        new[name] = org_id
        return org_id

    # -- ids -----------------------------------------------------------------------------------

    def _customer_ids(
        self,
        conn: Connection,
        names: Iterable[str],
        new: dict[str, int],
        shown: Mapping[str, str] | None = None,
        seen_s: int | None = None,
        in_ledger: Mapping[str, int | None] | None = None,
        created: set[int] | None = None,
    ) -> dict[str, int]:
        """Ids by name, creating the customers not seen yet (seen at ``seen_s``, the interval
        of the sample that names them; None: named by configuration, never purged). ``shown``
        (customer → project name from the Nova metadata) names a customer the first time this
        daemon sees it, if nothing has named it yet: Keystone's names, read by the daemon
        itself, come first, and a customer is looked up here once per daemon, so names cost no
        round trip per batch. ``in_ledger``: what :meth:`_uncached` found of these names (not
        looked up again); ``created`` is given the ids of the rows made here."""
        shown = shown or {}
        wanted = set(names)
        with self._ids.lock:
            found = {n: self._ids.customers[n] for n in wanted if n in self._ids.customers}
        missing = sorted(wanted - found.keys())
        if in_ledger is not None:
            there = {n: i for n in missing if (i := in_ledger.get(n)) is not None}
            self._name_customers(conn, {n: shown[n] for n in there if n in shown})
            found.update(there)
            new.update(there)
            missing = [n for n in missing if n not in there]
        if missing:
            # Named as they are made; a row another transaction made first is not returned.
            made = conn.execute(
                upsert(conn, _customers)
                .on_conflict_do_nothing()
                .returning(_customers.c.name, _customers.c.id),
                [
                    {
                        "name": n,
                        "last_seen_s": seen_s,
                        "display_name": shown.get(n),
                        "display_source": NameSource.nova if n in shown else None,
                    }
                    for n in missing
                ],
            ).all()
            fetched = {n: i for n, i in made}
            if created is not None:
                created.update(fetched.values())
            rest = [n for n in missing if n not in fetched]
            if rest:
                self._name_customers(conn, {n: shown[n] for n in rest if n in shown})
                fetched.update(
                    conn.execute(
                        select(_customers.c.name, _customers.c.id).where(
                            _customers.c.name.in_(rest)
                        )
                    ).all()
                )
            found.update(fetched)
            new.update(fetched)
        return found

    @staticmethod
    def _name_customers(conn: Connection, shown: Mapping[str, str]) -> None:
        """Name customers as the Nova metadata does (customer → project name), unless
        Keystone has named them (its names come first); a name already so is not written."""
        if not shown:
            return
        conn.execute(
            update(_customers)
            .where(
                _customers.c.name == bindparam("customer"),
                or_(
                    _customers.c.display_name.is_(None),
                    _customers.c.display_source == NameSource.nova,
                ),
                or_(
                    _customers.c.display_name.is_(None),
                    _customers.c.display_name != bindparam("shown"),
                ),
            )
            .values(display_name=bindparam("shown"), display_source=NameSource.nova),
            [{"customer": n, "shown": v} for n, v in sorted(shown.items())],
        )

    def _host_id(
        self, conn: Connection, name: str, new: dict[str, tuple[int, int]]
    ) -> tuple[int, int]:
        """The host's id and its owner organization's, created or re-owned as configured."""
        owner = self.owner_of(name)
        new_orgs: dict[str, int] = {}
        org_id = self._organization_id(conn, owner, new_orgs)
        with self._ids.lock:
            self._ids.organizations.update(new_orgs)
            cached = self._ids.hosts.get(name)
        if cached is not None and cached[1] == org_id:
            return cached
        stmt = upsert(conn, _hosts).values(name=name, organization_id=org_id)
        host_id = conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["name"], set_={"organization_id": stmt.excluded.organization_id}
            ).returning(_hosts.c.id)
        ).scalar_one()
        new[name] = (host_id, org_id)
        return host_id, org_id

    def _vm_ids(
        self,
        conn: Connection,
        record: BatchRecord,
        host_id: int,
        customer_ids: dict[str, int],
        new: dict[str, tuple[int, int, int]],
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        in_ledger: Mapping[str, tuple[int, int, int] | None] | None = None,
        created: set[int] | None = None,
    ) -> tuple[list[int], bool]:
        """The batch's VMs' ids, created where new; a VM the ledger has on another host or
        owner is moved to the batch's, unless the batch is ``unverified`` or the VM is in
        ``hold`` (then the VM keeps its row, and the second value says some were held).
        ``in_ledger``: what :meth:`_uncached` found of these VMs (not looked up again);
        ``created`` is given the ids of the rows made here."""
        with self._ids.lock:
            known = {u: self._ids.vms[u] for u in record.vm_uuids if u in self._ids.vms}
        missing = sorted(set(record.vm_uuids) - known.keys())
        if in_ledger is not None:
            there = {u: row for u in missing if (row := in_ledger.get(u)) is not None}
            known.update(there)
            new.update(there)
            missing = [u for u in missing if u not in there]
        if missing:
            made_s = dict(zip(record.vm_uuids, record.created_s, strict=True))
            owner = dict(zip(record.vm_uuids, record.customers, strict=True))
            # A row another transaction made first is not returned: looked up below.
            if conn.dialect.name == "postgresql":
                made = conn.execute(
                    _NEW_VMS_FROM_ARRAYS,
                    {
                        "host_id": host_id,
                        "seen_s": record.interval_start_s,
                        "uuids": missing,
                        "customers": [customer_ids[owner[u]] for u in missing],
                        "created": [made_s[u] for u in missing],
                    },
                )
            else:
                made = conn.execute(
                    upsert(conn, _vms)
                    .on_conflict_do_nothing()
                    .returning(_vms.c.uuid, _vms.c.id, _vms.c.customer_id, _vms.c.host_id),
                    [
                        {
                            "uuid": u,
                            "customer_id": customer_ids[owner[u]],
                            "host_id": host_id,
                            "created_s": made_s[u],
                            "last_seen_s": record.interval_start_s,
                        }
                        for u in missing
                    ],
                )
            rows = list(made)
            if created is not None:
                created.update(i for _, i, _, _ in rows)
            rest = sorted(set(missing).difference(u for u, _, _, _ in rows))
            if rest:
                rows += conn.execute(
                    select(_vms.c.uuid, _vms.c.id, _vms.c.customer_id, _vms.c.host_id).where(
                        _vms.c.uuid.in_(rest)
                    )
                ).all()
            known.update({u: (i, c, h) for u, i, c, h in rows})
            new.update({u: (i, c, h) for u, i, c, h in rows})
        moved = []
        held = False
        for uuid, customer in zip(record.vm_uuids, record.customers, strict=True):
            vm_id, cid, hid = known[uuid]
            now = (vm_id, customer_ids[customer], host_id)
            if (cid, hid) != now[1:]:
                if unverified or uuid in hold:
                    held = True
                    continue
                moved.append({"vid": vm_id, "cid": now[1], "hid": host_id})
                known[uuid] = new[uuid] = now
        if moved:
            conn.execute(
                update(_vms)
                .where(_vms.c.id == bindparam("vid"))
                .values(customer_id=bindparam("cid"), host_id=bindparam("hid")),
                moved,
            )
        return [known[u][0] for u in record.vm_uuids], held

    def _mark_seen(self, conn: Connection, table: Table, ids: list[int], seen_s: int) -> set[int]:
        """Move ``last_seen_s`` of rows ``ids`` (of ``vms`` or ``customers``) on to ``seen_s``
        (never back); the ids that have no row any more (retention purged them).

        One statement that locks each row it finds, in the batch's transaction, before the
        samples that name them are written: retention's delete of a row either comes first
        (the row is not found here, and is made again) or waits for this batch and then finds
        the row seen and leaves it. An array, not a list of 500 parameters, on PostgreSQL:
        2 ms instead of 23 for a host's VMs."""
        if not ids:
            return set()
        last = table.c.last_seen_s
        found = conn.execute(
            update(table)
            .where(_id_in(conn, table.c.id, ids))
            .values(last_seen_s=case((last > seen_s, last), else_=seen_s))
            .returning(table.c.id)
        ).scalars()
        return set(ids).difference(found)

    def _uncached(
        self, conn: Connection, record: BatchRecord
    ) -> tuple[dict[str, int | None], dict[str, tuple[int, int, int] | None]]:
        """The batch's customers and VMs this process has not cached, each with what the
        ledger holds of it (a customer's id; a VM's id, owner and host), None where the ledger
        does not know it: one look-up of each kind, which tells how many rows the batch would
        create before any is made, and spares looking up again those it finds."""
        # Membership tests, not ``set - dict.keys()``: that difference iterates the whole dict
        # (every VM this process knows: 100,000 in a large cloud) for each batch, under the
        # lock every ingest thread takes.
        with self._ids.lock:
            names = sorted({c for c in record.customers if c not in self._ids.customers})
            uuids = sorted({u for u in record.vm_uuids if u not in self._ids.vms})
        customers: dict[str, int | None] = dict.fromkeys(names)
        vms: dict[str, tuple[int, int, int] | None] = dict.fromkeys(uuids)
        if names:
            named = conn.execute(
                select(_customers.c.name, _customers.c.id).where(_customers.c.name.in_(names))
            )
            customers.update({n: i for n, i in named})
        if uuids:
            rows = conn.execute(
                select(_vms.c.uuid, _vms.c.id, _vms.c.customer_id, _vms.c.host_id).where(
                    _vms.c.uuid.in_(uuids)
                )
            )
            vms.update({u: (i, c, h) for u, i, c, h in rows})
        return customers, vms

    # -- intervals -----------------------------------------------------------------------------

    def _interval(self, conn: Connection, start_s: int, length_s: int) -> tuple[int, bool]:
        """The interval's id and whether it still takes on-time samples (locked FOR SHARE)."""
        query = (
            select(_intervals.c.id, _intervals.c.state)
            .where(_intervals.c.start_s == start_s)
            .with_for_update(read=True)
        )
        row = conn.execute(query).first()
        if row is None:
            frontier = conn.execute(
                select(func.max(_intervals.c.start_s)).where(
                    _intervals.c.state != IntervalState.open
                )
            ).scalar_one()
            # Before the closed frontier, an interval is history already: accounting has gone
            # past it, so its samples can only be late ones.
            behind = frontier is not None and start_s < frontier
            if behind:
                origin = conn.execute(select(func.min(_intervals.c.start_s))).scalar_one()
                if start_s < origin:
                    raise BeforeOrigin(
                        f"interval {start_s} is before the ledger's first interval ({origin}),"
                        " and accounting has begun: there is nothing to add it to"
                    )
            conn.execute(
                upsert(conn, _intervals)
                .values(
                    id=start_s,
                    start_s=start_s,
                    length_s=length_s,
                    state=IntervalState.accounted if behind else IntervalState.open,
                    ledger_rows=0 if behind else None,
                )
                .on_conflict_do_nothing()
            )
            row = conn.execute(query).one()
        return row.id, row.state == IntervalState.open

    # -- the batch -----------------------------------------------------------------------------

    def ingest(
        self,
        record: BatchRecord,
        now_s: float | None = None,
        admit: Admit | None = None,
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        aside: str | None = None,
    ) -> IngestResult:
        """Store one batch, or recognize it as a retry. Raises :class:`KeyReused`.

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
            steady = self._ingest_steady(record, now_s, admit, unverified)
            if steady is not None:
                return steady
        else:
            hold = frozenset(record.vm_uuids)
        for attempt in range(5):
            try:
                return self._ingest_once(
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
                if attempt == 4:
                    raise
            except DBAPIError as exc:
                if not _retryable(exc) or attempt == 4:
                    raise
                log.info("batch %s for %s: %s; retrying", record.key, record.host, exc.orig)
            time.sleep(0.01 * 2**attempt)
        raise AssertionError("unreachable")

    def _ingest_steady(
        self,
        record: BatchRecord,
        now_s: float | None,
        admit: Admit | None,
        unverified: bool,
    ) -> IngestResult | None:
        """Store the batch of a known host that lists the VMs this process remembers it
        listing, all marked seen in this period, in one statement
        (:mod:`~gmd.daemon.ledger.steady_batch`, PostgreSQL); None when it is not such a batch
        or the statement stored nothing, for the general path to decide. ``admit`` is told
        before the write: a batch that ends up not stored here is told again by the general
        path, or not at all (a retry), and the caller keeps only the last claim of a stored
        batch. A batch ``admit`` refuses goes to the general path too, which tells a retry
        (acknowledged, not counted) from a batch over the bound (refused there)."""
        if not self._steady or not record.vm_uuids:
            return None
        owner = self.owner_of(record.host)
        with self._ids.lock:
            org_id = self._ids.organizations.get(owner)
            host = self._ids.hosts.get(record.host)
        if host is None or host[1] != org_id:
            return None
        host_id = host[0]
        known = self._ids.same_vms(host_id, record)
        if known is None or known.period != mark_period(record.host, record.interval_start_s):
            return None
        if not known.named and record.customer_names:
            return None
        self._partition_for(record.interval_start_s)
        if admit is not None:
            try:
                admit(0, 0)
            except Exception:
                # Perhaps a retry, which is not refused: the general path tells.
                return None
        stored = self._steady(
            self.writer,
            {
                "key": record.key,
                "digest": record.digest,
                "host_id": host_id,
                "owner_id": org_id,
                "interval_id": record.interval_start_s,
                "samples": len(record.vm_uuids),
                "host_cpu_s": record.host_cpu_s,
                "unverified": unverified,
                "now_s": int(time.time() if now_s is None else now_s),
                **dict(zip(CAPACITY_COLUMNS, record.capacity, strict=True)),
            },
            sample_store.batch_arrays(known.vm_ids, known.customer_ids, record.use, record.flavor),
        )
        if stored is None:
            return None
        n = len(record.vm_uuids)
        return IngestResult("accepted", n, n if stored[1] else 0)

    def _partition_for(self, start_s: int) -> None:
        """The raw tables' partition of the interval's day, made if it is missing (PostgreSQL;
        the daemon makes them ahead, so this is a set lookup but for a replay of old days)."""
        day = start_s // DAY_S
        if day in self._partition_days:
            return
        ensure_days(self.engine, [day])
        self._partition_days.add(day)

    def _ingest_once(
        self,
        record: BatchRecord,
        now_s: float,
        admit: Admit | None = None,
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        aside: str | None = None,
    ) -> IngestResult:
        self._partition_for(record.interval_start_s)
        n = len(record.vm_uuids)
        new_customers: dict[str, int] = {}
        new_hosts: dict[str, tuple[int, int]] = {}
        new_vms: dict[str, tuple[int, int, int]] = {}
        period = mark_period(record.host, record.interval_start_s)
        with self._ids.lock:
            generation = self._ids.generation
        known: _HostVms | None = None
        marked: tuple[list[int], list[int]] = ([], [])
        with self.writer.begin() as conn:
            host_id, org_id = self._host_id(conn, record.host, new_hosts)
            stored = self._insert_batch(conn, record, host_id, unverified)
            if stored is None:
                result = IngestResult("duplicate", n, 0)
            else:
                batch_id, on_time = stored
                self._fix_capacity(conn, record, host_id, org_id, now_s)
                known = self._ids.same_vms(host_id, record)
                if known is not None and not known.named and record.customer_names:
                    self._name_customers(conn, record.customer_names)
                    known = replace(known, named=True)
                if known is not None and known.period != period:
                    known, marked = self._still_there(conn, record, known)
                if known is None:
                    known, marked = self._look_up(
                        conn,
                        record,
                        host_id,
                        generation,
                        new_customers,
                        new_vms,
                        unverified,
                        hold,
                        admit,
                    )
                elif admit is not None:
                    admit(0, 0)
                if n:
                    self._write_samples(
                        conn, record, host_id, batch_id, known.vm_ids, known.customer_ids, on_time
                    )
                if aside is not None:
                    quarantine(
                        conn,
                        {batch_id: aside},
                        cause="Placement contradicts these VMs of the host's batch",
                        by="placement",
                    )
                    known = None  # not the host's roster: its next batch is not compared to it
                result = IngestResult("accepted", n, 0 if on_time else n)
        with self._ids.lock:
            # Only a VM this process knew, now on another host or owner, can make a host's
            # memory wrong. A VM, customer or host new to the process is in no memory: in a
            # cloud where VMs start every minute somewhere, counting those too sent every
            # host's next batch down the slow path.
            moved = any(
                (was := self._ids.vms.get(uuid)) is not None and was != now
                for uuid, now in new_vms.items()
            )
            self._ids.customers.update(new_customers)
            self._ids.hosts.update(new_hosts)
            self._ids.vms.update(new_vms)
            if moved:
                # This batch's memory stays at the old generation: it is not used, and the
                # host's next batch makes a current one.
                self._ids.generation += 1
            if known is not None and not known.held:
                self._ids.last[host_id] = known
        self._ids.saw(record.interval_start_s, *marked)
        return result

    def _still_there(
        self, conn: Connection, record: BatchRecord, known: _HostVms
    ) -> tuple[_HostVms | None, tuple[list[int], list[int]]]:
        """The host's memory, its VMs and customers marked seen in the batch's period, and the
        ids marked; None if retention purged any of them (forgotten: the batch looks them all
        up again)."""
        start_s = record.interval_start_s
        vms, customers = self._ids.unmarked(record.host, start_s, known.vm_ids, known.customer_ids)
        gone_customers = self._mark_seen(conn, _customers, customers, start_s)
        gone_vms = self._mark_seen(conn, _vms, vms, start_s)
        if gone_vms or gone_customers:
            self._ids.forget(
                [u for u, i in zip(known.uuids, known.vm_ids, strict=True) if i in gone_vms],
                [
                    c
                    for c, i in zip(known.customers, known.customer_ids, strict=True)
                    if i in gone_customers
                ],
            )
            return None, ([], [])
        return replace(known, period=mark_period(record.host, start_s)), (vms, customers)

    def _look_up(
        self,
        conn: Connection,
        record: BatchRecord,
        host_id: int,
        generation: int,
        new_customers: dict[str, int],
        new_vms: dict[str, tuple[int, int, int]],
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        admit: Admit | None = None,
    ) -> tuple[_HostVms, tuple[list[int], list[int]]]:
        """The batch's VMs and customers by id, created where new (or purged: a cached id
        whose row is gone is forgotten and the row made again), marked seen in the host's
        period; and the ids marked. ``admit`` is told how many rows the batch would create
        before any is made. A row made here is not marked: it is made seen in the period."""
        start_s = record.interval_start_s
        customers_there, vms_there = self._uncached(conn, record)
        if admit is not None:
            admit(
                sum(i is None for i in customers_there.values()),
                sum(row is None for row in vms_there.values()),
            )
        made_customers: set[int] = set()
        customer_ids = self._customer_ids(
            conn,
            record.customers,
            new_customers,
            record.customer_names,
            start_s,
            customers_there,
            made_customers,
        )
        _, marked_customers = self._ids.unmarked(record.host, start_s, (), customer_ids.values())
        gone = self._mark_seen(
            conn, _customers, [c for c in marked_customers if c not in made_customers], start_s
        )
        if gone:
            self._ids.forget((), [c for c, i in customer_ids.items() if i in gone])
            customer_ids = self._customer_ids(
                conn, record.customers, new_customers, record.customer_names, start_s
            )
            marked_customers = sorted(set(customer_ids.values()))
        made_vms: set[int] = set()
        vm_ids, held = self._vm_ids(
            conn, record, host_id, customer_ids, new_vms, unverified, hold, vms_there, made_vms
        )
        marked_vms, _ = self._ids.unmarked(record.host, start_s, vm_ids, ())
        gone = self._mark_seen(conn, _vms, [v for v in marked_vms if v not in made_vms], start_s)
        if gone:
            self._ids.forget(
                [u for u, i in zip(record.vm_uuids, vm_ids, strict=True) if i in gone], ()
            )
            vm_ids, held = self._vm_ids(
                conn, record, host_id, customer_ids, new_vms, unverified, hold
            )
            marked_vms = sorted(set(vm_ids))
        known = _HostVms(
            record.vm_uuids,
            record.customers,
            vm_ids,
            [customer_ids[c] for c in record.customers],
            generation,
            mark_period(record.host, start_s),
            held,
        )
        return known, (marked_vms, marked_customers)

    def _insert_batch(
        self, conn: Connection, record: BatchRecord, host_id: int, unverified: bool = False
    ) -> tuple[int, bool] | None:
        """The new batch's id and whether it is on time; ``None`` for a retry of a stored
        batch. Raises :class:`KeyReused` for a key used by another batch, and
        :class:`BeforeOrigin` (from :meth:`_interval`) for an interval that cannot be made."""
        params = {
            "key": record.key,
            "digest": record.digest,
            "host_id": host_id,
            "interval_id": record.interval_start_s,
            "samples": len(record.vm_uuids),
            "host_cpu_s": record.host_cpu_s,
            "unverified": unverified,
        }
        statement = _statements(conn.dialect.name).batch
        for _ in range(2):
            row = conn.execute(statement, params).first()
            if row is not None:
                return row.id, not row.late
            seen = conn.execute(
                select(_batches.c.interval_id, _batches.c.digest)
                .where(_batches.c.key == record.key)
                .limit(1)
            ).first()
            if seen is not None:
                if seen.interval_id != record.interval_start_s or not _same_content(
                    seen.digest, record.digest
                ):
                    raise KeyReused(
                        f"batch key {record.key!r} was already used for a different batch;"
                        f" a retry must resend the same content (host {record.host},"
                        f" interval {record.interval_start_s})"
                    )
                return None
            # Neither the key nor the interval: the first batch of the interval makes it.
            self._interval(conn, record.interval_start_s, record.interval_s)
        raise AssertionError(f"interval {record.interval_start_s} was made but is not there")

    def _fix_capacity(
        self, conn: Connection, record: BatchRecord, host_id: int, org_id: int, now_s: float
    ) -> None:
        """Record the host's capacity for the interval, unless a batch already did: then it must
        be the same (raises :class:`CapacityConflict`), since accounting may have used it. The
        host is seen now (on PostgreSQL by the same statement)."""
        cap = dict(zip(CAPACITY_COLUMNS, record.capacity, strict=True))
        inserted = conn.execute(
            _statements(conn.dialect.name).capacity,
            {
                "interval_id": record.interval_start_s,
                "host_id": host_id,
                "owner_id": org_id,
                "now_s": int(now_s),
                **cap,
            },
        ).first()
        if conn.dialect.name != "postgresql":
            conn.execute(
                update(_hosts).where(_hosts.c.id == host_id).values(last_seen_s=int(now_s))
            )
        if inserted is not None:
            return
        stored = conn.execute(
            select(*(_host_intervals.c[c] for c in CAPACITY_COLUMNS)).where(
                _host_intervals.c.interval_id == record.interval_start_s,
                _host_intervals.c.host_id == host_id,
            )
        ).one()
        differ = [
            f"{c} {theirs:g} (first batch: {ours:g})"
            for c, ours, theirs in zip(CAPACITY_COLUMNS, stored, record.capacity, strict=True)
            if not math.isclose(ours, theirs, rel_tol=1e-12)
        ]
        if differ:
            raise CapacityConflict(
                f"batch {record.key} gives host {record.host} another capacity for interval"
                f" {record.interval_start_s} than its first batch did: {', '.join(differ)};"
                " a host's capacity is fixed for an interval by its first batch"
            )

    def _write_samples(
        self,
        conn: Connection,
        record: BatchRecord,
        host_id: int,
        batch_id: int,
        vm_ids: list[int],
        customer_ids: list[int],
        on_time: bool,
    ) -> None:
        # A second batch for the same VM, host and interval (an agent restarted mid-interval)
        # gets samples of its own; accounting adds them up.
        sample_store.write_batch(
            conn,
            interval_id=record.interval_start_s,
            batch_id=batch_id,
            host_id=host_id,
            late=not on_time,
            vm_ids=vm_ids,
            customer_ids=customer_ids,
            use=record.use,
            flavor=record.flavor,
        )


def _same_content(stored: str, digest: str) -> bool:
    """Whether a stored batch's digest and a new one's say the same content. A digest of the
    first kind (before :data:`DIGEST_PREFIX`) cannot be compared: a batch that reuses its key
    for the same interval is taken as the retry it almost surely is (an agent retrying across
    the daemon's upgrade), not refused."""
    return stored == digest or not stored.startswith(DIGEST_PREFIX)


def _retryable(exc: DBAPIError) -> bool:
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
