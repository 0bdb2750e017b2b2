"""The daemon's cached view of Placement, and the check of one batch against it.

Per host: its provider's uuid, its inventory and the set of consumers with allocations on it
(one ``GET /resource_providers/{uuid}/allocations`` per refresh). Per consumer: the provider
whose snapshot listed it last (a consumer has allocations on one compute provider; after a
live migration the destination's snapshot takes it) and its project, asked once per consumer
ever (a server never changes project). A consumer that leaves a host's snapshot (deleted, or
migrated away) is still taken from that host for ``remember_s`` (the longest a batch may come
late, and an interval): the host's batch that carries its last seconds comes after Nova has
already dropped its allocations, and refusing it would lose every VM's usage of that batch.
Such a VM's row is not moved by that batch (:attr:`Verdict.departed`): it stays where Placement
puts it now. A batch is checked against this in memory; Placement
is asked during a batch only when the host was never seen, or when the batch names a VM the
cache does not place on the host, or claims more than the cached inventory, and then at most
once per host per ``miss_s``. The rest is refreshed by the daemon's job (:meth:`refresh`),
stale snapshots first, every host at most once per ``refresh_s``.

The capacity bound (docs/api.md): per resource Placement counts, a host's capacity may be at
most ``total × max(1, allocation_ratio) × (1 + daemon.plausibility_margin)`` of its
provider's inventory: cpu_cores against VCPU plus PCPU, memory_bytes against MEMORY_MB. The
agent reports what the host has (libvirt's count of CPUs and its memory, where Nova reads its
inventory from too), so ``total`` bounds it; the ratio widens the bound where Nova sells more
than the host has (a ``cpu_shared_set`` that leaves cores to the host makes ``total``
smaller than the host), and ``reserved``, the host's own share, is still the host's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gmd.daemon.config import PlacementConfig
from gmd.daemon.enforce.quotas import QuotaError
from gmd.daemon.placement.client import Inventory, PlacementClient
from gmd.daemon.project_names import project_key
from gmd.wire import CAPACITY_FIELDS

log = logging.getLogger(__name__)

INVENTORY_EVERY = 12
"""A host's inventory is read again every this many refreshes of its allocations (and on a
capacity miss): inventories change when hardware does, allocations with every boot."""

_CAPACITY_CLASSES: dict[str, tuple[tuple[str, float], ...]] = {
    "cpu_cores": (("VCPU", 1.0), ("PCPU", 1.0)),
    "memory_bytes": (("MEMORY_MB", float(2**20)),),
}
"""Per capacity field, the resource classes that bound it and the unit of one."""


class Disagreement(StrEnum):
    """Why Placement refuses a batch: the ``reason`` of ``gmd_placement_refused_batches_total``
    and ``gmd_placement_quarantined_batches_total``."""

    unknown_host = "unknown_host"
    """Placement has no resource provider for the host"""
    not_on_host = "not_on_host"
    """a VM has no allocations on the host's provider (elsewhere, or nowhere)"""
    other_project = "other_project"
    """a VM belongs to another project than the batch claims"""
    over_inventory = "over_inventory"
    """the host's capacity exceeds its provider's inventory"""


@dataclass(frozen=True)
class Refusal:
    reason: Disagreement
    message: str


@dataclass(frozen=True)
class Verdict:
    """What Placement says of a batch: ``refusal`` when it disagrees; ``unreachable`` (why)
    when it could not be asked, and the batch is to be verified later."""

    refusal: Refusal | None = None
    unreachable: str | None = None
    departed: frozenset[str] = frozenset()
    """VMs taken because they left the host within ``remember_s`` (deleted, or migrated away):
    their samples count, their rows stay where they are"""

    @property
    def verified(self) -> bool:
        return self.refusal is None and self.unreachable is None


VERIFIED = Verdict()
_NOWHERE = ("", 0.0)


@dataclass
class _Host:
    provider: str | None
    """None: Placement has no provider of the host's name"""
    inventory: dict[str, Inventory] = field(default_factory=dict)
    consumers: frozenset[str] = frozenset()
    fetched: float = 0.0
    """when the consumers were read (monotonic)"""
    inventory_fetched: float = 0.0
    refreshes: int = 0
    missed: float = float("-inf")
    """when a batch's miss last made Placement be asked"""
    used: float = 0.0
    """when a batch last named the host"""
    generation: int = 0
    """moves on whenever what the host's batches are checked against changes: its provider,
    inventory or consumers, or a consumer another host's snapshot took since"""
    vouched: tuple[int, tuple[float, ...], list[str], list[str]] | None = None
    """the host's last batch found good (generation, capacity, VMs, their projects): a host
    posts the same VMs interval after interval, and comparing two lists costs a hundredth of
    checking 500 VMs again"""


class PlacementView:
    """The cache and the checks. Thread-safe: ingest threads check, the daemon's job refreshes."""

    def __init__(
        self,
        config: PlacementConfig,
        client: PlacementClient,
        margin: float,
        clock: Callable[[], float] = time.monotonic,
        remember_s: float = 0.0,
    ) -> None:
        self.config, self.client, self.margin, self.clock = config, client, margin, clock
        self.remember_s = remember_s
        self._hosts: dict[str, _Host] = {}
        self._where: dict[str, tuple[str, float]] = {}
        """consumer → (provider, when the snapshot that listed it was read)"""
        self._left: dict[str, tuple[str, float]] = {}
        """consumer → (the provider it left, when that was seen), for ``remember_s``"""
        self._projects: dict[str, str] = {}
        """consumer → its project, as Keystone writes ids (:func:`project_key`)"""
        self._host_of: dict[str, str] = {}
        """provider uuid → host name, for messages"""
        self._lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    # -- reading Placement -----------------------------------------------------------------

    def _fetch_host(self, host: str, known: _Host | None, inventory: bool) -> _Host:
        """Read the host's provider (once), inventory (when asked) and consumers."""
        now = self.clock()
        name = self.config.provider_name(host)
        provider = known.provider if known is not None else None
        if provider is None:
            provider = self.client.provider(name)
            if provider is None:
                entry = _Host(None, fetched=now, used=now)
                with self._lock:
                    self._hosts[host] = entry
                return entry
        assert provider is not None
        if known is None or known.provider is None or inventory:
            inv, inv_at = self.client.inventories(provider), now
        else:
            inv, inv_at = known.inventory, known.inventory_fetched
        consumers = self.client.consumers_on(provider)
        with self._lock:
            previous = self._hosts.get(host)
            same = (
                previous is not None
                and previous.provider == provider
                and previous.consumers == consumers
                and previous.inventory == inv
            )
            entry = _Host(
                provider,
                inv,
                consumers,
                now,
                inv_at,
                (previous.refreshes + 1) if previous is not None else 0,
                previous.missed if previous is not None else float("-inf"),
                previous.used if previous is not None else now,
                (previous.generation + (0 if same else 1)) if previous is not None else 0,
                previous.vouched if previous is not None and same else None,
            )
            self._hosts[host] = entry
            self._host_of[provider] = host
            if previous is not None:
                for gone in previous.consumers - consumers:
                    self._left[gone] = (provider, now)
                    where = self._where.get(gone)
                    if where is not None and where[0] == provider:
                        # Deleted (or moved to a host not read since); its project is kept
                        # while it is remembered as having left (_forget_departed).
                        del self._where[gone]
            for c in consumers:
                where = self._where.get(c)
                if where is None or where[1] <= now:
                    if where is not None and where[0] != provider:
                        # Taken from another host (a migration): its batches are checked anew.
                        self._left[c] = (where[0], now)
                        other = self._hosts.get(self._host_of.get(where[0], ""))
                        if other is not None:
                            other.generation += 1
                            other.vouched = None
                    self._where[c] = (provider, now)
        return entry

    def _forget_departed(self, now: float) -> None:
        """Let go of consumers that left their host more than ``remember_s`` ago (and of the
        projects of those placed nowhere now), so that the cache holds the cloud's servers,
        not every server it ever ran. Called with the lock held."""
        for uuid in [u for u, (_, at) in self._left.items() if now - at > self.remember_s]:
            del self._left[uuid]
            if uuid not in self._where:
                self._projects.pop(uuid, None)

    def _project(self, uuid: str) -> str | None:
        with self._lock:
            known = self._projects.get(uuid)
        if known is not None:
            return known
        consumer = self.client.consumer(uuid)
        if consumer.project_id is None:
            return None
        project = project_key(consumer.project_id)
        with self._lock:
            self._projects[uuid] = project
        return project

    def refresh(self, budget_s: float | None = None) -> int:
        """Read again the snapshots older than ``refresh_s``, stalest first, within
        ``budget_s``; forget hosts no batch named for ``3 × refresh_s``. Returns how many were
        read; raises :class:`QuotaError` when Placement fails (the job logs it)."""
        now = self.clock()
        with self._lock:
            for host in [
                h for h, e in self._hosts.items() if now - e.used > 3 * self.config.refresh_s
            ]:
                del self._hosts[host]
            self._forget_departed(now)
            stale = sorted(
                (e.fetched, h, e)
                for h, e in self._hosts.items()
                if now - e.fetched >= self.config.refresh_s
            )
        done = 0
        began = self.clock()
        for _, host, entry in stale:
            if budget_s is not None and self.clock() - began > budget_s:
                break
            fresh = self._fetch_host(
                host, entry, inventory=(entry.refreshes + 1) % INVENTORY_EVERY == 0
            )
            done += 1
            # The projects of servers booted since, asked here rather than by their first
            # batch.
            with self._lock:
                unknown = sorted(fresh.consumers - self._projects.keys())
            for uuid in unknown:
                self._project(uuid)
        return done

    # -- checking a batch ------------------------------------------------------------------

    def check(
        self,
        host: str,
        capacity: Sequence[float],
        uuids: Sequence[str],
        customers: Sequence[str],
    ) -> Verdict:
        """Whether Placement vouches for a batch of ``host``: its capacity (one per
        :data:`~gmd.wire.CAPACITY_FIELDS`) and its VMs with the projects it names."""
        try:
            return self._check(host, capacity, uuids, customers)
        except QuotaError as exc:
            return Verdict(unreachable=str(exc))

    def _check(
        self,
        host: str,
        capacity: Sequence[float],
        uuids: Sequence[str],
        customers: Sequence[str],
    ) -> Verdict:
        now = self.clock()
        miss_s = self.config.miss_s
        with self._lock:
            entry = self._hosts.get(host)
            if entry is not None:
                entry.used = now

        def may_ask() -> bool:
            assert entry is not None
            if now - entry.missed < miss_s:
                return False
            entry.missed = now
            return True

        if entry is None:
            entry = self._fetch_host(host, None, inventory=True)
        elif entry.provider is not None and now - entry.fetched >= 2 * self.config.refresh_s:
            # No job keeps this daemon's snapshots fresh (it does not account, so it runs no
            # jobs): the host's batch reads its host again, once per 2 × refresh_s.
            entry = self._fetch_host(
                host, entry, inventory=(entry.refreshes + 1) % INVENTORY_EVERY == 0
            )
        if entry.provider is None and now - entry.fetched >= miss_s and may_ask():
            entry = self._fetch_host(host, None, inventory=True)
        vouched = entry.vouched
        if (
            vouched is not None
            and vouched[0] == entry.generation
            and vouched[1] == tuple(capacity)
            and vouched[2] == uuids
            and vouched[3] == customers
        ):
            return VERIFIED
        generation = entry.generation
        name = self.config.provider_name(host)
        if entry.provider is None:
            return _refused(
                Disagreement.unknown_host,
                f"host {host} has no resource provider named {name!r} in Placement: it is not"
                " a compute host of this cloud ([placement.providers] maps a host to its"
                " provider's name)",
            )
        over = self._over(entry, capacity)
        if over and now - entry.inventory_fetched >= miss_s and may_ask():
            entry = self._fetch_host(host, entry, inventory=True)
            over = self._over(entry, capacity)
        if over:
            return _refused(Disagreement.over_inventory, f"host {host}: {over}")
        misplaced = self._misplaced(entry, uuids)
        if misplaced and now - entry.fetched >= miss_s and may_ask():
            entry = self._fetch_host(host, entry, inventory=False)
            misplaced = self._misplaced(entry, uuids)
        departed = self._departed(entry, misplaced, now)
        misplaced = [u for u in misplaced if u not in departed]
        if misplaced:
            uuid = misplaced[0]
            more = f" (and {len(misplaced) - 1} more)" if len(misplaced) > 1 else ""
            return _refused(
                Disagreement.not_on_host,
                f"VM {uuid} {self._elsewhere(uuid)} in Placement, not on {host}"
                f" (provider {entry.provider}){more}",
            )
        # Projects as Keystone writes ids (project_key), compared once per batch's customer.
        claimed = {c: project_key(c) for c in set(customers)}
        with self._lock:
            projects = [self._projects.get(u.lower()) for u in uuids]
        for uuid, customer, project in zip(uuids, customers, projects, strict=True):
            if project is None:
                project = self._project(uuid.lower())
            if project is None:
                return _refused(
                    Disagreement.not_on_host,
                    f"VM {uuid} has no allocations in Placement, not on {host}",
                )
            if project != claimed[customer]:
                return _refused(
                    Disagreement.other_project,
                    f"VM {uuid} on {host} belongs to project {project} in Placement, not to"
                    f" {customer} as the batch says",
                )
        if departed:
            # Not remembered as vouched: once the VM is gone from the host's batches, or
            # remember_s is over, the host's batch is checked again.
            return Verdict(departed=frozenset(departed))
        entry.vouched = (generation, tuple(capacity), list(uuids), list(customers))
        return VERIFIED

    def _misplaced(self, entry: _Host, uuids: Sequence[str]) -> list[str]:
        """The VMs the cache does not place on the host's provider."""
        provider = entry.provider
        with self._lock:
            where = self._where
            return [u for u in uuids if where.get(u.lower(), _NOWHERE)[0] != provider]

    def _departed(self, entry: _Host, misplaced: Sequence[str], now: float) -> set[str]:
        """Of the VMs not placed on the host, those that left it within ``remember_s``."""
        provider = entry.provider
        with self._lock:
            left = self._left
            return {
                u
                for u in misplaced
                if (gone := left.get(u.lower())) is not None
                and gone[0] == provider
                and now - gone[1] <= self.remember_s
            }

    def _elsewhere(self, uuid: str) -> str:
        """Where Placement puts ``uuid``, for a refusal: from the cache, else by one request."""
        with self._lock:
            where = self._where.get(uuid.lower())
        providers: frozenset[str] = frozenset()
        if where is not None:
            providers = frozenset({where[0]})
        else:
            consumer = self.client.consumer(uuid.lower())
            providers = consumer.providers
            if consumer.project_id is not None:
                with self._lock:
                    self._projects[uuid.lower()] = project_key(consumer.project_id)
        if not providers:
            return "has no allocations"
        with self._lock:
            named = [
                f"provider {p} (host {self._host_of[p]})" if p in self._host_of else f"provider {p}"
                for p in sorted(providers)
            ]
        return "is on " + " and ".join(named)

    def _over(self, entry: _Host, capacity: Sequence[float]) -> str | None:
        """What of ``capacity`` is beyond the bound of the provider's inventory, or None."""
        problems = []
        for k, field_name in enumerate(CAPACITY_FIELDS):
            classes = _CAPACITY_CLASSES.get(field_name)
            if classes is None:
                continue
            found = [
                (rc, unit, entry.inventory[rc]) for rc, unit in classes if rc in entry.inventory
            ]
            if not found:
                continue
            bound = sum(
                inv.total * unit * max(1.0, inv.allocation_ratio) for _, unit, inv in found
            ) * (1 + self.margin)
            if capacity[k] > bound:
                said = " + ".join(
                    f"{rc} total {inv.total:g} × allocation_ratio {inv.allocation_ratio:g}"
                    for rc, _, inv in found
                )
                problems.append(
                    f"capacity.{field_name} = {capacity[k]:.6g} is more than its provider's"
                    f" inventory in Placement allows ({said}, × (1 + daemon.plausibility_margin"
                    f" {self.margin:g}) = {bound:.6g})"
                )
        return "; ".join(problems) or None


def _refused(reason: Disagreement, message: str) -> Verdict:
    return Verdict(refusal=Refusal(reason, message))
