"""The libvirt collector: one bulk ``getAllDomainStats`` call per tick, per-domain calls for
what the driver leaves out.

On QEMU the bulk call returns every counter the agent needs (``cpu.time``, ``balloon.rss``,
``block.N.rd.bytes``/``wr.bytes``, ``net.N.rx.bytes``/``tx.bytes``) for all running domains in
one round trip. Drivers that give less (the test driver gives only ``state.*``) are completed
per domain: ``info()`` for CPU time and memory, ``memoryStats()`` for RSS where it has it,
``blockStats``/``interfaceStats`` per device. Each domain's XML (owner, flavor, devices) is
read when the domain is first seen, when its process restarts, and every ``describe_every_s``.

Failures are contained: a domain that vanishes between the listing and its reading is
reported gone, another domain error is reported and the rest of the tick is still read, and
a lost connection is reopened with exponential backoff while ticks report the host unreadable
(the next good reading measures from the last one, so no use is lost).

One stuck domain cannot stall a tick: the bulk call asks with
``VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT``, so libvirtd skips the monitor for a domain whose
job another caller holds (a migration, a snapshot, a QEMU that stopped answering) instead of
waiting up to 30 s for it. On QEMU, whose bulk reply is otherwise complete, such a domain is
reported busy for the tick and keeps its previous counters (its next reading measures from
them); it is not read per domain, which would wait for the same job.
"""

from __future__ import annotations

import logging
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import libvirt

from gmd import GmdError
from gmd.agent.collect.base import (
    FailureKind,
    HostReading,
    HostResources,
    Ownership,
    ReadFailure,
    VmReading,
    host_failure,
)
from gmd.agent.collect.host import HostCpu, local_hypervisor
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter, ownership
from gmd.agent.libvirt_conn import (
    CONNECTION_LOST,
    DOMAIN_BUSY,
    DOMAIN_GONE_OR_INVALID,
    LibvirtConnection,
)

log = logging.getLogger(__name__)

STATS = (
    # Only what the agent uses: the state (a domain shut off mid-tick), CPU time, the resident
    # set (balloon.rss), and the bytes of interfaces and disks.
    libvirt.VIR_DOMAIN_STATS_STATE
    | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL
    | libvirt.VIR_DOMAIN_STATS_BALLOON
    | libvirt.VIR_DOMAIN_STATS_INTERFACE
    | libvirt.VIR_DOMAIN_STATS_BLOCK
)
KIB = 1024
BULK_FLAGS = (
    libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE
    | libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT
)
COMPLETE_DRIVERS = frozenset({"QEMU"})
"""Drivers whose bulk reply holds every counter of a domain that is not busy: a gap there
means a busy domain, not a driver to complete per domain."""


class DomainBusy(GmdError):
    """The bulk reply left out a domain's monitor counters: another libvirt job holds it."""


@dataclass
class Description:
    """What a domain's XML says, cached per process (domain id) and refreshed now and then."""

    run_id: int
    fetched_s: float
    name: str
    owner: Ownership
    disks: tuple[str, ...]
    nics: tuple[str, ...]
    memory_stats_rss: bool = True
    """whether ``memoryStats()`` reports ``rss`` (the test driver's returns nothing)"""


def describe(
    xml: str, default_customer: str | None
) -> tuple[str, Ownership, tuple[str, ...], tuple[str, ...]]:
    """Name, owner, and the disk and interface devices to ask for counters, from domain XML.

    Disks without a source (an empty CD-ROM drive) have no counters; an interface without a
    target device is asked for by MAC address.
    """
    root = ET.fromstring(xml)
    disks = [dev for _disk, dev in counted_disks(root)]
    nics: list[str] = []
    for iface in root.iterfind("devices/interface"):
        target, mac = iface.find("target"), iface.find("mac")
        name = (target.get("dev") if target is not None else None) or (
            mac.get("address") if mac is not None else None
        )
        if name:
            nics.append(name)
    return root.findtext("name", ""), ownership(root, default_customer), tuple(disks), tuple(nics)


def counted_disks(root: ET.Element) -> Iterator[tuple[ET.Element, str]]:
    """A domain's ``<disk>`` elements that have counters, each with its target device: those
    with a source (an empty CD-ROM drive has none)."""
    for disk in root.iterfind("devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        dev = target.get("dev") if target is not None else None
        if dev and source is not None and source.attrib:
            yield disk, dev


def bulk_devices(stats: dict[str, Any], group: str, first: str, second: str) -> dict | None:
    """``{device: (first, second)}`` from a bulk stats record's ``block.*`` or ``net.*``
    keys, or ``None`` when the driver did not report the group."""
    count = stats.get(f"{group}.count")
    if count is None:
        return None
    out = {}
    for i in range(count):
        name = stats.get(f"{group}.{i}.name")
        a, b = stats.get(f"{group}.{i}.{first}"), stats.get(f"{group}.{i}.{second}")
        if name is not None and a is not None and b is not None:
            out[name] = (int(a), int(b))
    return out


class LibvirtCollector:
    """Reads every running domain of one libvirt connection (see the module docstring).

    ``opener`` opens the connection (default: read-only, the agent never changes a domain);
    tests pass one that wraps it. ``bulk=False`` lists domains and reads each one per call,
    for drivers without ``getAllDomainStats``.
    """

    def __init__(
        self,
        uri: str,
        *,
        default_customer: str | None = None,
        opener: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        describe_every_s: float = 300.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        bulk: bool = True,
        domains: DomainFilter = EVERY_DOMAIN,
        connection: LibvirtConnection | None = None,
    ) -> None:
        self.uri = uri
        self.default_customer = default_customer
        self.domains = domains
        self.conn = connection or LibvirtConnection(
            uri,
            read_only=True,
            opener=opener,
            monotonic=monotonic,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
        )
        """the connection's owner; a kernel collector lends its own"""
        self.conn.on_open(self._opened)
        self._clock, self._monotonic = clock, monotonic
        self.describe_every_s = describe_every_s
        self.bulk = bulk
        self._descriptions: dict[str, Description] = {}
        self._complete = False
        self._host_cpu = HostCpu() if local_hypervisor(uri) else None
        """the host's busy time, where the domains run on this machine"""

    def _opened(self, conn: Any) -> None:
        """Which driver a new connection reaches: some report every counter in bulk."""
        try:
            self._complete = conn.getType() in COMPLETE_DRIVERS
        except libvirt.libvirtError:
            self._complete = False

    def close(self) -> None:
        self.conn.close()
        if self._host_cpu is not None:
            self._host_cpu.close()

    # -- reading ----------------------------------------------------------------------------

    def resources(self) -> HostResources | None:
        """Cores and RAM of the host (``virNodeGetInfo``: active CPUs, memory in MiB)."""
        conn = self.conn.get()
        if conn is None:
            return None
        try:
            info = conn.getInfo()
        except libvirt.libvirtError as exc:
            self.conn.lost(exc, "reading the host's cores and memory")
            return None
        return HostResources(cpu_cores=float(info[2]), memory_bytes=float(info[1]) * 2**20)

    def collect(self) -> HostReading:
        conn = self.conn.get()
        if conn is None:
            return HostReading(self._clock(), False, errors=(host_failure(self.conn.down_reason),))
        try:
            if self.bulk:
                pairs = conn.getAllDomainStats(STATS, BULK_FLAGS)
            else:
                active = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
                pairs = [(dom, {}) for dom in active]
            taken_s = self._clock()
            host_cpu_s = None if self._host_cpu is None else self._host_cpu.read()
        except libvirt.libvirtError as exc:
            self.conn.lost(exc, "listing domains")
            return HostReading(self._clock(), False, errors=(host_failure(self.conn.down_reason),))

        everything = {dom.UUIDString(): (dom, stats) for dom, stats in pairs}
        listed = self.admitted(everything)
        vms, gone, errors, busy = self.read_listed(listed, taken_s)
        for uuid in set(self._descriptions) - set(everything):
            del self._descriptions[uuid]
        return HostReading(
            taken_s,
            True,
            tuple(vms),
            frozenset(listed),
            frozenset(gone),
            tuple(errors),
            busy=frozenset(busy),
            host_cpu_s=host_cpu_s,
        )

    def admitted(self, listed: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
        """The listed domains that :attr:`domains` admits: the others are neither read nor
        reported. With ``only_nova`` a domain is described (cached, as for its reading) to
        know its owner; one that cannot be is kept, for its reading to say why."""
        if self.domains == EVERY_DOMAIN:
            return listed
        out = {}
        for uuid, (dom, extra) in listed.items():
            try:
                if not self.domains.admits_name(dom.name()):
                    continue
                if self.domains.by_owner:
                    owner = self._describe(dom, uuid, dom.ID()).owner
                    if not self.domains.admits_owner(owner):
                        continue
            except libvirt.libvirtError:
                pass
            out[uuid] = (dom, extra)
        return out

    def read_listed(
        self, listed: dict[str, tuple[Any, dict[str, Any]]], taken_s: float
    ) -> tuple[list[VmReading], set[str], list[ReadFailure], set[str]]:
        """Read each listed ``uuid → (domain, bulk stats)``: the readings, the domains found
        gone, the errors, and the domains found busy (not read this tick, not an error). A lost
        connection stops the loop (the rest stay unread); the kernel collector calls this for
        the domains it must read through libvirt."""
        vms: list[VmReading] = []
        gone: set[str] = set()
        errors: list[ReadFailure] = []
        busy: set[str] = set()
        for uuid, (dom, stats) in listed.items():
            try:
                reading = self._read(dom, uuid, stats, taken_s)
            except DomainBusy as exc:
                busy.add(uuid)
                log.info("domain %s: %s", uuid, exc)
                continue
            except libvirt.libvirtError as exc:
                code = exc.get_error_code()
                if code in DOMAIN_GONE_OR_INVALID:
                    log.info("domain %s stopped while being read: %s", uuid, exc)
                    gone.add(uuid)
                    continue
                if code in CONNECTION_LOST:
                    self.conn.lost(exc, f"reading domain {uuid}")
                    errors.append(host_failure(self.conn.down_reason))
                    break
                if code in DOMAIN_BUSY:
                    busy.add(uuid)
                    log.info("domain %s: busy, not read this tick: %s", uuid, exc)
                    continue
                errors.append(ReadFailure(FailureKind.domain, f"domain {uuid}: {exc}", uuid))
                log.warning("cannot read domain %s: %s (libvirt error %s)", uuid, exc, code)
                continue
            if reading is None:
                gone.add(uuid)
            else:
                vms.append(reading)
        return vms, gone, errors, busy

    def _describe(self, dom: Any, uuid: str, run_id: int) -> Description:
        d = self._descriptions.get(uuid)
        now = self._monotonic()
        if d is None or d.run_id != run_id or now - d.fetched_s >= self.describe_every_s:
            name, owner, disks, nics = describe(dom.XMLDesc(0), self.default_customer)
            memory_stats_rss = d.memory_stats_rss if d is not None else True
            d = Description(run_id, now, name, owner, disks, nics, memory_stats_rss)
            self._descriptions[uuid] = d
        return d

    def _read(self, dom: Any, uuid: str, stats: dict[str, Any], taken_s: float) -> VmReading | None:
        """One domain's counters, or ``None`` if it turns out to be shut off."""
        if stats.get("state.state") == libvirt.VIR_DOMAIN_SHUTOFF:
            return None
        run_id = dom.ID()
        d = self._describe(dom, uuid, run_id)
        cpu_ns = stats.get("cpu.time")
        rss_kib = stats.get("balloon.rss")
        disks = bulk_devices(stats, "block", "rd.bytes", "wr.bytes")
        nics = bulk_devices(stats, "net", "rx.bytes", "tx.bytes")
        if cpu_ns is None or rss_kib is None or disks is None or nics is None:
            if self._complete and stats:
                raise DomainBusy(
                    "busy (another libvirt job holds it), not read this tick; its next reading"
                    " counts from its last"
                )
            # Per-domain fallback: timed by its own calls, not the bulk call's.
            taken_s = self._clock()
            state, _max_kib, current_kib, _vcpus, info_cpu_ns = dom.info()
            if state == libvirt.VIR_DOMAIN_SHUTOFF:
                return None
            if cpu_ns is None:
                cpu_ns = info_cpu_ns
            if rss_kib is None and d.memory_stats_rss:
                rss_kib = dom.memoryStats().get("rss")
                d.memory_stats_rss = rss_kib is not None
            if rss_kib is None:
                rss_kib = current_kib
            if disks is None:
                disks = {}
                for dev in d.disks:
                    counters = self._device(dom.blockStats, uuid, "disk", dev)
                    if counters is not None:
                        disks[dev] = (counters[1], counters[3])
            if nics is None:
                nics = {}
                for dev in d.nics:
                    counters = self._device(dom.interfaceStats, uuid, "interface", dev)
                    if counters is not None:
                        nics[dev] = (counters[0], counters[4])
        return VmReading(
            uuid=uuid,
            run_id=run_id,
            taken_s=taken_s,
            cpu_time_ns=None if cpu_ns is None else int(cpu_ns),
            memory_rss_bytes=None if rss_kib is None else int(rss_kib) * KIB,
            disks=disks,
            nics=nics,
            owner=d.owner,
            name=d.name,
        )

    @staticmethod
    def _device(call: Callable[[str], Any], uuid: str, kind: str, dev: str) -> Any:
        """One device's counters; a device-only failure skips the device, not the domain
        (its previous counters are kept, so nothing is lost when it reads again)."""
        try:
            return call(dev)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in DOMAIN_GONE_OR_INVALID | CONNECTION_LOST:
                raise
            log.warning("domain %s: cannot read %s %s: %s", uuid, kind, dev, exc)
            return None
