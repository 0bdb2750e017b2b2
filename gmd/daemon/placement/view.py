"""The daemon's cached view of Placement, and the check of one batch against it.

Per host: its provider's uuid, its inventory and the consumers with allocations on it, with
what each holds there (one ``GET /resource_providers/{uuid}/allocations`` per refresh). Per
consumer: the provider whose snapshot listed it last (a consumer has allocations on one
compute provider; after a live migration the destination's snapshot takes it) and its
project, asked once per consumer ever (a server never changes project).

Per VM of a batch, Placement must place it on the reporting host, in the project the batch
names, with the flavor the batch gives (vCPUs against VCPU + PCPU, memory against MEMORY_MB;
a figure not given is not compared). A VM it contradicts is set aside (:attr:`Verdict.set_aside`)
and costs only itself; the message says what is wrong with the host's claim, never where the
VM is or whose. A consumer that leaves a host's snapshot (deleted, or migrated away) is still
taken from that host for ``remember_s`` (the longest a batch may come late, and an interval),
and only for intervals that began before its going was seen: the host's batch that carries
its last seconds comes after Nova has already dropped its allocations, and refusing it would
lose that VM's last use. Such a VM's row is not moved by that batch (:attr:`Verdict.departed`):
it stays where Placement puts it now.

A batch is checked against this in memory; Placement is asked during a batch only when the
host was never seen, or when the batch names a VM the cache does not place on the host (or
with another flavor), or claims more than the cached inventory, and then at most once per host
per ``miss_s``. The rest is refreshed by the daemon's job (:meth:`refresh`), stale snapshots
first, every host at most once per ``refresh_s``.

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
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from gmd.daemon.placement.settings import PlacementConfig
from gmd.openstack.client import OpenStackError
from gmd.openstack.placement import Allocation, Inventory, PlacementReader
from gmd.wire import CAPACITY_FIELDS, FLAVOR_FIELDS, canonical_customer

log = logging.getLogger(__name__)

INVENTORY_EVERY = 12
"""A host's inventory is read again every this many refreshes of its allocations (and on a
capacity miss): inventories change when hardware does, allocations with every boot."""

_CAPACITY_CLASSES: dict[str, tuple[tuple[str, float], ...]] = {
    "cpu_cores": (("VCPU", 1.0), ("PCPU", 1.0)),
    "memory_bytes": (("MEMORY_MB", float(2**20)),),
}
"""Per capacity field, the resource classes that bound it and the unit of one."""

_VCPUS, _MEMORY = FLAVOR_FIELDS.index("vcpus"), FLAVOR_FIELDS.index("memory_bytes")
_MIB = float(2**20)


class Disagreement(StrEnum):
    """What Placement contradicts: the ``reason`` of ``gmd_placement_refused_batches_total``
    (the host's own claims), ``gmd_placement_set_aside_samples_total`` (a VM's) and
    ``gmd_placement_quarantined_batches_total``."""

    unknown_host = "unknown_host"
    """Placement has no resource provider for the host"""
    not_on_host = "not_on_host"
    """a VM has no allocations on the host's provider (elsewhere, or nowhere)"""
    other_project = "other_project"
    """a VM belongs to another project than the batch claims"""
    over_inventory = "over_inventory"
    """the host's capacity exceeds its provider's inventory"""
    flavor = "flavor"
    """a VM's flavor (vCPUs, memory) is not what its allocation on the host holds"""


@dataclass(frozen=True)
class Refusal:
    reason: Disagreement
    message: str


@dataclass(frozen=True)
class Verdict:
    """What Placement says of a batch: ``refusal`` when it disagrees with the host's own claims
    (it is no compute host of the cloud, or claims more than its inventory); ``unreachable``
    (why) when it could not be asked, and the batch is to be verified later; ``set_aside``, the
    VMs it contradicts, each with why (by position in the batch), when the rest is good."""

    refusal: Refusal | None = None
    unreachable: str | None = None
    departed: frozenset[str] = frozenset()
    """VMs taken because they left the host within ``remember_s`` (deleted, or migrated away)
    and the batch's interval began before that was seen: their samples count, their rows stay
    where they are"""
    set_aside: Mapping[int, Refusal] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return self.refusal is None and self.unreachable is None and not self.set_aside


VERIFIED = Verdict()
_NOWHERE: tuple[str, float] = ("", 0.0)


@dataclass
class _Host:
    provider: str | None
    """None: Placement has no provider of the host's name"""
    inventory: dict[str, Inventory] = field(default_factory=dict)
    consumers: dict[str, Allocation] = field(default_factory=dict)
    """every consumer with allocations on the provider, with what it holds there"""
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
    vouched: tuple[int, tuple[float, ...], list[str], list[str], bytes] | None = None
    """the host's last batch found good (generation, capacity, VMs, their projects, their
    flavors): a host posts the same VMs interval after interval, and comparing two lists costs
    a hundredth of checking 500 VMs again"""


class PlacementView:
    """The cache and the checks. Thread-safe: ingest threads check, the daemon's job refreshes."""

    def __init__(
        self,
        config: PlacementConfig,
        client: PlacementReader,
        margin: float,
        clock: Callable[[], float] = time.monotonic,
        remember_s: float = 0.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.client, self.margin, self.clock = config, client, margin, clock
        self.remember_s = remember_s
        self.wall = wall
        """the time of day, to compare when a VM left a host with a batch's interval"""
        self._hosts: dict[str, _Host] = {}
        self._where: dict[str, tuple[str, float]] = {}
        """consumer → (provider, when the snapshot that listed it was read)"""
        self._left: dict[str, tuple[str, float, float]] = {}
        """consumer → (the provider it left, when that was seen: monotonic, and the time of
        day), for ``remember_s``"""
        self._projects: dict[str, str] = {}
        """consumer → its project, as the ledger spells it (:func:`canonical_customer`)"""
        self._host_of: dict[str, str] = {}
        """provider uuid → host name, for messages"""
        self._lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    # -- reading Placement -----------------------------------------------------------------

    def _fetch_host(self, host: str, known: _Host | None, inventory: bool) -> _Host:
        """Read the host's provider (once), inventory (when asked) and consumers."""
        now, wall = self.clock(), self.wall()
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
                for gone in previous.consumers.keys() - consumers.keys():
                    if self._left.get(gone, _NOWHERE)[0] != provider:
                        # The first sight of its going counts: a later read of this host
                        # must not let it charge the VM for longer.
                        self._left[gone] = (provider, now, wall)
                    where = self._where.get(gone)
                    if where is not None and where[0] == provider:
                        # Deleted (or moved to a host not read since); its project is kept
                        # while it is remembered as having left (_forget_departed).
                        del self._where[gone]
            for c in consumers:
                if self._left.get(c, _NOWHERE)[0] == provider:
                    del self._left[c]  # back on the host it had left
                where = self._where.get(c)
                if where is None or where[1] <= now:
                    if where is not None and where[0] != provider:
                        # Taken from another host (a migration): its batches are checked anew.
                        self._left[c] = (where[0], now, wall)
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
        for uuid in [u for u, (_, at, _) in self._left.items() if now - at > self.remember_s]:
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
        project = canonical_customer(consumer.project_id)
        with self._lock:
            self._projects[uuid] = project
        return project

    def refresh(self, budget_s: float | None = None) -> int:
        """Read again the snapshots older than ``refresh_s``, stalest first, within
        ``budget_s``; forget hosts no batch named for ``3 × refresh_s``. Returns how many were
        read; raises :class:`~gmd.openstack.client.OpenStackError` when Placement fails (the
        job logs it)."""
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
                unknown = sorted(fresh.consumers.keys() - self._projects.keys())
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
        flavor: np.ndarray | None = None,
        start_s: int | None = None,
    ) -> Verdict:
        """Whether Placement vouches for a batch of ``host``: its capacity (one per
        :data:`~gmd.wire.CAPACITY_FIELDS`) and its VMs with the projects it names and their
        flavors (a row per VM in the order of :data:`~gmd.wire.FLAVOR_FIELDS`, NaN where not
        given), for the interval that began at ``start_s``."""
        try:
            return self._check(host, capacity, uuids, customers, flavor, start_s)
        except OpenStackError as exc:
            return Verdict(unreachable=str(exc))

    def _check(
        self,
        host: str,
        capacity: Sequence[float],
        uuids: Sequence[str],
        customers: Sequence[str],
        flavor: np.ndarray | None,
        start_s: int | None,
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
        flavors = b"" if flavor is None else flavor.tobytes()
        vouched = entry.vouched
        if (
            vouched is not None
            and vouched[0] == entry.generation
            and vouched[1] == tuple(capacity)
            and vouched[2] == uuids
            and vouched[3] == customers
            and vouched[4] == flavors
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
        aside, departed = self._contradicted(entry, host, uuids, customers, flavor, start_s, now)
        if (
            any(r.reason is not Disagreement.other_project for r in aside.values())
            and now - entry.fetched >= miss_s
            and may_ask()
        ):
            # The snapshot may be older than a boot, a migration or a resize: read it again.
            entry = self._fetch_host(host, entry, inventory=False)
            aside, departed = self._contradicted(
                entry, host, uuids, customers, flavor, start_s, now
            )
        if aside or departed:
            # Not remembered as vouched: the host's next batch is checked again (the VM gone
            # from it, or remember_s over).
            return Verdict(departed=frozenset(departed), set_aside=aside)
        entry.vouched = (generation, tuple(capacity), list(uuids), list(customers), flavors)
        return VERIFIED

    def _contradicted(
        self,
        entry: _Host,
        host: str,
        uuids: Sequence[str],
        customers: Sequence[str],
        flavor: np.ndarray | None,
        start_s: int | None,
        now: float,
    ) -> tuple[dict[int, Refusal], set[str]]:
        """The VMs of the batch Placement contradicts, each with why (by position), and those
        taken because they left the host lately. A refusal speaks of the host's own claim
        only: never where another VM is, nor whose it is."""
        provider = entry.provider
        with self._lock:
            placed = [self._where.get(u.lower(), _NOWHERE)[0] == provider for u in uuids]
            left = {
                u: self._left.get(u.lower()) for u, p in zip(uuids, placed, strict=True) if not p
            }
            projects = [self._projects.get(u.lower()) for u in uuids]
        claimed = {c: canonical_customer(c) for c in set(customers)}
        aside: dict[int, Refusal] = {}
        departed: set[str] = set()

        def not_here(uuid: str) -> Refusal:
            return Refusal(
                Disagreement.not_on_host,
                f"VM {uuid}: Placement allocates it nothing on host {host} (provider {provider})",
            )

        for i, uuid in enumerate(uuids):
            if not placed[i]:
                gone = left[uuid]
                if (
                    gone is None
                    or gone[0] != provider
                    or now - gone[1] > self.remember_s
                    or (start_s is not None and start_s >= gone[2])
                ):
                    aside[i] = not_here(uuid)
                    continue
                departed.add(uuid)
            project = projects[i]
            if project is None:
                project = self._project(uuid.lower())
            if project is None:
                aside[i] = not_here(uuid)
            elif project != claimed[customers[i]]:
                aside[i] = Refusal(
                    Disagreement.other_project,
                    f"VM {uuid} on {host}: Placement has it in another project than {customers[i]}",
                )
            elif placed[i] and flavor is not None:
                held = entry.consumers.get(uuid.lower())
                why = None if held is None else _flavor_contradicted(flavor[i], held)
                if why is not None:
                    aside[i] = Refusal(Disagreement.flavor, f"VM {uuid} on {host}: {why}")
        return aside, departed

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


def _flavor_contradicted(claimed: np.ndarray, held: Allocation) -> str | None:
    """What of a VM's flavor (a row of :data:`~gmd.wire.FLAVOR_FIELDS`) its allocation on the
    host contradicts, or None. A figure not given (NaN), or a resource the allocation does not
    hold, is not compared. Memory is compared in MiB, Placement's unit."""
    problems = []
    vcpus = float(claimed[_VCPUS])
    if not math.isnan(vcpus) and held.vcpus is not None and vcpus != held.vcpus:
        problems.append(f"flavor.vcpus = {vcpus:g}, but Placement allocates it {held.vcpus:g} VCPU")
    memory = float(claimed[_MEMORY])
    if (
        not math.isnan(memory)
        and held.memory_mb is not None
        and abs(memory / _MIB - held.memory_mb) >= 0.5
    ):
        problems.append(
            f"flavor.memory_bytes = {memory:.6g}, but Placement allocates it"
            f" {held.memory_mb:g} MEMORY_MB"
        )
    return "; ".join(problems) or None
