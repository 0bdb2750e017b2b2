"""The ledger's ids of what batches name, made on first sight and cached per process.

Customers, VMs, hosts and organizations are created on first sight; their ids are cached per
process once committed, which saves most round trips on the hot path. An id changes only when
retention has purged a customer or VM unseen past raw retention and it comes back. Once a day
per host (at a time of day its name decides, so that hosts do not all do it at once), a batch
moves ``last_seen_s`` of its VMs and customers on and finds, in the same transaction, whether
their rows are still there (:meth:`LedgerIds.mark_seen`); a row gone is created again under a
new id. Retention deletes only rows unseen for a day longer than its cutoff
(:data:`~gmd.ledger_schema.models.SEEN_PERIOD_S`), so no row a batch names without marking it
can be gone. Names are inserted in sorted order so that concurrent batches take row locks in
the same order and cannot deadlock each other. A host's VMs and their owners are looked up
once, not per batch, while its batches list the same ones (:meth:`IdCache.same_vms`).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Table,
    any_,
    bindparam,
    case,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql

from gmd.daemon.ingest.record import Admit, BatchRecord
from gmd.daemon.ledger import sample_store
from gmd.ledger_schema.kinds import NameSource
from gmd.ledger_schema.models import SEEN_PERIOD_S
from gmd.ledger_schema.tables import (
    customers as _customers,
    hosts as _hosts,
    intervals as _intervals,
    organizations as _organizations,
    upsert,
    vms as _vms,
)

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
class HostVms:
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
class Found:
    """The ids one batch made or looked up, kept apart until its transaction commits (then
    :meth:`IdCache.learn`): a batch rolled back must leave the cache as it was."""

    customers: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, tuple[int, int]] = field(default_factory=dict)
    vms: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class IdCache:
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
    last: dict[int, HostVms] = field(default_factory=dict)
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

    def same_vms(self, host_id: int, record: BatchRecord) -> HostVms | None:
        """The host's last VMs if ``record`` lists the same ones, owned alike, and nothing has
        changed since."""
        with self.lock:
            last = self.last.get(host_id)
            if last is None or last.generation != self.generation:
                return None
        if last.uuids == record.vm_uuids and last.customers == record.customers:
            return last
        return None

    def learn(
        self,
        found: Found,
        host_id: int,
        known: HostVms | None,
        t_s: int,
        marked: tuple[list[int], list[int]],
    ) -> None:
        """Remember, once the batch of interval ``t_s`` committed, the ids it ``found`` (made
        or looked up), the host's VMs as ``known`` (None: not its roster), and what it marked
        seen."""
        with self.lock:
            # Only a VM this process knew, now on another host or owner, can make a host's
            # memory wrong. A VM, customer or host new to the process is in no memory: in a
            # cloud where VMs start every minute somewhere, counting those too sent every
            # host's next batch down the slow path.
            moved = any(
                (was := self.vms.get(uuid)) is not None and was != now
                for uuid, now in found.vms.items()
            )
            self.customers.update(found.customers)
            self.hosts.update(found.hosts)
            self.vms.update(found.vms)
            if moved:
                # This batch's memory stays at the old generation: it is not used, and the
                # host's next batch makes a current one.
                self.generation += 1
            if known is not None and not known.held:
                self.last[host_id] = known
        self.saw(t_s, *marked)


class LedgerIds:
    """The ledger's ids of what batches name (hosts, their owners, VMs, customers), made on
    first sight and cached (:class:`IdCache`); and, once a day per host, whether the rows a
    batch names are still there (retention may have purged them). ``owner_of(host)`` names
    the organization owning a host; ``organization_customers`` links organizations to the
    customer account they also are."""

    def __init__(
        self,
        owner_of: Callable[[str], str],
        organization_customers: Mapping[str, str] | None = None,
    ) -> None:
        self.owner_of = owner_of
        self.organization_customers = dict(organization_customers or {})
        self.cache = IdCache()

    def recall(self, engine: Engine, intervals: int = RECALL_INTERVALS) -> Recalled:
        """Remember what the ledger's latest ``intervals`` intervals say of each host: its id
        and owner, and its VMs and their owners as its latest batch listed them, with when
        each was last marked seen. Run as the daemon starts: a daemon restarted, or one of
        several sharing a port that has not served a host yet, would otherwise take every
        host's first batch down the general path (a look-up of all its VMs and customers: a
        burst of 5,000 hosts took twice as long), while it now stores it by one statement.
        A host whose VMs have moved since to another host or owner is left to be looked up."""
        started = time.perf_counter()
        with engine.connect() as conn:
            latest = _read_latest(conn, intervals)
        if latest is None:
            return Recalled(0, 0, 0.0)
        recalled = remembered = 0
        with self.cache.lock:
            generation = self.cache.generation
            self.cache.organizations.update(latest.organizations)
            for host_id, (vm_ids, customer_ids) in latest.lists.items():
                if self._remember(latest, host_id, vm_ids, customer_ids, generation):
                    recalled += 1
                    remembered += len(vm_ids)
        return Recalled(recalled, remembered, time.perf_counter() - started)

    def _remember(
        self,
        latest: _Latest,
        host_id: int,
        vm_ids: list[int],
        customer_ids: list[int],
        generation: int,
    ) -> bool:
        """Remember one host's latest list (the cache's lock held); False for a host whose VMs
        were purged or moved since, or that is gone."""
        host = latest.hosts.get(host_id)
        try:
            rows = [latest.vms[v] for v in vm_ids]
            owners = [latest.customers[c] for c in customer_ids]
        except KeyError:  # purged since
            return False
        moved = any((r[1], r[2]) != (c, host_id) for r, c in zip(rows, customer_ids, strict=True))
        if host is None or moved:
            return False
        name = host[0]
        marks = [r[3] for r in rows] + [o[1] for o in owners]
        # The period in which all of them were marked seen (none: mark them first).
        period = min((mark_period(name, m) for m in marks if m is not None), default=-1)
        if None in marks:
            period = -1
        self.cache.hosts[name] = (host_id, host[1])
        for v, (uuid, owner, at, seen) in zip(vm_ids, rows, strict=True):
            self.cache.vms[uuid] = (v, owner, at)
            if seen is not None:
                self.cache.vm_marked[v] = seen
        # Customers' ids are not remembered by name: the general path looks a customer up once
        # per process, and names it from the metadata then.
        for c, (_customer, seen) in zip(customer_ids, owners, strict=True):
            if seen is not None:
                self.cache.customer_marked[c] = seen
        self.cache.last[host_id] = HostVms(
            [r[0] for r in rows],
            [o[0] for o in owners],
            list(vm_ids),
            list(customer_ids),
            generation,
            period,
            named=False,
        )
        return True

    # -- organizations -------------------------------------------------------------------------

    def sync_organizations(self, writer: Engine, names: Iterable[str]) -> None:
        """Create the configured organizations and link those that are also customers."""
        with writer.begin() as conn:
            for name in sorted(set(names) | set(self.organization_customers)):
                org_id = self.organization_id(conn, name, {})
                customer = self.organization_customers.get(name)
                if customer is not None:
                    cid = self.customer_ids(conn, [customer], {})[customer]
                    conn.execute(
                        update(_organizations)
                        .where(_organizations.c.id == org_id)
                        .values(customer_id=cid)
                    )

    def organization_id(self, conn: Connection, name: str, new: dict[str, int]) -> int:
        cached = self.cache.organizations.get(name) or new.get(name)
        if cached is not None:
            return cached
        conn.execute(upsert(conn, _organizations).values(name=name).on_conflict_do_nothing())
        org_id = conn.execute(
            select(_organizations.c.id).where(_organizations.c.name == name)
        ).scalar_one()
        new[name] = org_id
        return org_id

    # -- ids -----------------------------------------------------------------------------------

    def customer_ids(
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
        with self.cache.lock:
            found = {n: self.cache.customers[n] for n in wanted if n in self.cache.customers}
        missing = sorted(wanted - found.keys())
        if in_ledger is not None:
            there = {n: i for n in missing if (i := in_ledger.get(n)) is not None}
            self.name_customers(conn, {n: shown[n] for n in there if n in shown})
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
                self.name_customers(conn, {n: shown[n] for n in rest if n in shown})
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
    def name_customers(conn: Connection, shown: Mapping[str, str]) -> None:
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

    def host_id(
        self, conn: Connection, name: str, new: dict[str, tuple[int, int]]
    ) -> tuple[int, int]:
        """The host's id and its owner organization's, created or re-owned as configured."""
        owner = self.owner_of(name)
        new_orgs: dict[str, int] = {}
        org_id = self.organization_id(conn, owner, new_orgs)
        with self.cache.lock:
            self.cache.organizations.update(new_orgs)
            cached = self.cache.hosts.get(name)
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

    def vm_ids(
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
        with self.cache.lock:
            known = {u: self.cache.vms[u] for u in record.vm_uuids if u in self.cache.vms}
        missing = sorted(set(record.vm_uuids) - known.keys())
        if in_ledger is not None:
            there = {u: row for u in missing if (row := in_ledger.get(u)) is not None}
            known.update(there)
            new.update(there)
            missing = [u for u in missing if u not in there]
        if missing:
            rows = _make_vms(conn, record, host_id, customer_ids, missing)
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

    def mark_seen(self, conn: Connection, table: Table, ids: list[int], seen_s: int) -> set[int]:
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

    def uncached(
        self, conn: Connection, record: BatchRecord
    ) -> tuple[dict[str, int | None], dict[str, tuple[int, int, int] | None]]:
        """The batch's customers and VMs this process has not cached, each with what the
        ledger holds of it (a customer's id; a VM's id, owner and host), None where the ledger
        does not know it: one look-up of each kind, which tells how many rows the batch would
        create before any is made, and spares looking up again those it finds."""
        # Membership tests, not ``set - dict.keys()``: that difference iterates the whole dict
        # (every VM this process knows: 100,000 in a large cloud) for each batch, under the
        # lock every ingest thread takes.
        with self.cache.lock:
            names = sorted({c for c in record.customers if c not in self.cache.customers})
            uuids = sorted({u for u in record.vm_uuids if u not in self.cache.vms})
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

    def still_there(
        self, conn: Connection, record: BatchRecord, known: HostVms
    ) -> tuple[HostVms | None, tuple[list[int], list[int]]]:
        """The host's memory, its VMs and customers marked seen in the batch's period, and the
        ids marked; None if retention purged any of them (forgotten: the batch looks them all
        up again)."""
        start_s = record.interval_start_s
        vms, customers = self.cache.unmarked(record.host, start_s, known.vm_ids, known.customer_ids)
        gone_customers = self.mark_seen(conn, _customers, customers, start_s)
        gone_vms = self.mark_seen(conn, _vms, vms, start_s)
        if gone_vms or gone_customers:
            self.cache.forget(
                [u for u, i in zip(known.uuids, known.vm_ids, strict=True) if i in gone_vms],
                [
                    c
                    for c, i in zip(known.customers, known.customer_ids, strict=True)
                    if i in gone_customers
                ],
            )
            return None, ([], [])
        return replace(known, period=mark_period(record.host, start_s)), (vms, customers)

    def look_up(
        self,
        conn: Connection,
        record: BatchRecord,
        host_id: int,
        generation: int,
        found: Found,
        unverified: bool = False,
        hold: frozenset[str] = frozenset(),
        admit: Admit | None = None,
    ) -> tuple[HostVms, tuple[list[int], list[int]]]:
        """The batch's VMs and customers by id, created where new (or purged: a cached id
        whose row is gone is forgotten and the row made again), marked seen in the host's
        period; and the ids marked. ``admit`` is told how many rows the batch would create
        before any is made. A row made here is not marked: it is made seen in the period."""
        start_s = record.interval_start_s
        customers_there, vms_there = self.uncached(conn, record)
        if admit is not None:
            admit(
                sum(i is None for i in customers_there.values()),
                sum(row is None for row in vms_there.values()),
            )
        made_customers: set[int] = set()
        customer_ids = self.customer_ids(
            conn,
            record.customers,
            found.customers,
            record.customer_names,
            start_s,
            customers_there,
            made_customers,
        )
        _, marked_customers = self.cache.unmarked(record.host, start_s, (), customer_ids.values())
        gone = self.mark_seen(
            conn, _customers, [c for c in marked_customers if c not in made_customers], start_s
        )
        if gone:
            self.cache.forget((), [c for c, i in customer_ids.items() if i in gone])
            customer_ids = self.customer_ids(
                conn, record.customers, found.customers, record.customer_names, start_s
            )
            marked_customers = sorted(set(customer_ids.values()))
        made_vms: set[int] = set()
        vm_ids, held = self.vm_ids(
            conn, record, host_id, customer_ids, found.vms, unverified, hold, vms_there, made_vms
        )
        marked_vms, _ = self.cache.unmarked(record.host, start_s, vm_ids, ())
        gone = self.mark_seen(conn, _vms, [v for v in marked_vms if v not in made_vms], start_s)
        if gone:
            self.cache.forget(
                [u for u, i in zip(record.vm_uuids, vm_ids, strict=True) if i in gone], ()
            )
            vm_ids, held = self.vm_ids(
                conn, record, host_id, customer_ids, found.vms, unverified, hold
            )
            marked_vms = sorted(set(vm_ids))
        known = HostVms(
            record.vm_uuids,
            record.customers,
            vm_ids,
            [customer_ids[c] for c in record.customers],
            generation,
            mark_period(record.host, start_s),
            held,
        )
        return known, (marked_vms, marked_customers)


@dataclass(frozen=True)
class _Latest:
    """What the ledger's latest intervals say of the hosts that posted in them."""

    lists: dict[int, tuple[list[int], list[int]]]
    """host id → its latest batch's VM ids and their customer ids, in the batch's order"""
    organizations: dict[str, int]
    hosts: dict[int, tuple[str, int]]
    """host id → (name, owner organization id)"""
    customers: dict[int, tuple[str, int | None]]
    """customer id → (name, last seen)"""
    vms: dict[int, tuple[str, int, int, int | None]]
    """VM id → (uuid, customer id, host id, last seen), of the VMs the lists name"""


def _read_latest(conn: Connection, intervals: int) -> _Latest | None:
    """:class:`_Latest` of the ledger's latest ``intervals`` intervals; None for a ledger
    without one."""
    latest = conn.execute(
        select(_intervals.c.id, _intervals.c.length_s).order_by(_intervals.c.id.desc()).limit(1)
    ).first()
    if latest is None:
        return None
    lists = sample_store.latest_lists(conn, latest.id - intervals * latest.length_s)
    listed = {v for vms, _ in lists.values() for v in vms}
    vm_columns = (_vms.c.id, _vms.c.uuid, _vms.c.customer_id, _vms.c.host_id, _vms.c.last_seen_s)
    return _Latest(
        lists,
        {name: i for name, i in conn.execute(select(_organizations.c.name, _organizations.c.id))},
        {
            i: (name, org)
            for i, name, org in conn.execute(
                select(_hosts.c.id, _hosts.c.name, _hosts.c.organization_id)
            )
        },
        {
            i: (name, seen)
            for i, name, seen in conn.execute(
                select(_customers.c.id, _customers.c.name, _customers.c.last_seen_s)
            )
        },
        {
            i: (uuid, owner, host, seen)
            for i, uuid, owner, host, seen in conn.execute(select(*vm_columns))
            if i in listed
        },
    )


def _make_vms(
    conn: Connection,
    record: BatchRecord,
    host_id: int,
    customer_ids: Mapping[str, int],
    missing: list[str],
) -> list[tuple[str, int, int, int]]:
    """Rows made for the batch's VMs ``missing`` from the ledger, on its host, owned as it
    says, seen in its interval: (uuid, id, customer id, host id) of each row made here. A row
    another transaction made first is not returned (the caller looks it up)."""
    made_s = dict(zip(record.vm_uuids, record.created_s, strict=True))
    owner = dict(zip(record.vm_uuids, record.customers, strict=True))
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
    return [(u, i, c, h) for u, i, c, h in made]
