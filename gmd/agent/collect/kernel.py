"""The kernel-counter collector: libvirt to list and describe domains, the kernel's files for
the counters (issue 19).

The libvirt collector's ``getAllDomainStats`` asks every QEMU over its monitor socket for
every counter, every tick: ~5–7 ms of libvirtd and QEMU time per VM. The kernel already keeps
the CPU, memory and network counters, so per tick this collector reads files for those, and
asks libvirt only for the disks' bytes, in one call for every VM; it lists the domains
(``listAllDomains``: ids and uuids, no QEMU involved) only after a lifecycle event
(:mod:`gmd.agent.collect.lifecycle`) or every ``describe_every_s``. Per VM it reads two or
three files, and one file for every VM's network (:mod:`gmd.agent.collect.kernel_files` says
which and why, :mod:`gmd.agent.collect.kernel_parsers` parses them): the CPU time of the
domain's cgroup, the resident set of its QEMU process, its taps' bytes in ``/proc/net/dev``;
its disks' bytes are its cgroup's where QEMU opens them ``O_DIRECT``, else QEMU's block stats,
with QEMU's figures checking the cgroup's (:mod:`gmd.agent.collect.kernel_disks`).

What the counters need (the QEMU pid, its cgroups, the taps and the owner) is cached per
domain and read again when it may have changed (:mod:`gmd.agent.collect.kernel_domains`). The
files are kept open while it runs, and a tick in which no domain started, stopped or is due to
be described does nothing but read them (:class:`~gmd.agent.collect.kernel_domains.TickPlan`):
issue 33 holds the tick's own CPU within 1.5 times that of the ``pread`` of its files.

A domain about to end is read at its lifecycle event: when the guest shut down (QEMU has
stopped its vCPUs and libvirt is about to kill it) or was paused (at the end of an outgoing
migration), so the use between the last tick and its end is sent with the next tick instead
of being lost with its process. A domain destroyed outright (``virsh destroy``, Nova deleting
a running server) gives no such moment: libvirt removes its cgroups before it says it
stopped, so its use since the last tick (at most one tick's) is lost, as with the libvirt
collector. Its disks' bytes since the last tick are lost in both cases: QEMU's block stats are
not asked at an event. The read at SHUTDOWN races libvirt, which kills QEMU right after sending
the event: an agent whose event thread comes late finds the files gone, loses that tick's use
as for a destroyed domain, and logs "too late to read" (INFO) for the domain.

A VM whose files cannot be read is read through libvirt for the tick (the reading's
``fallbacks`` names it; the agent counts them; logged once per VM). Its disks are QEMU's block
stats either way, named by the guest's devices (``vda``), so a VM read now from its files and
now through libvirt is measured from its last counters: nothing lost or counted twice.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import libvirt

from gmd.agent.cgroups import (
    LIBVIRT_QEMU_RUN,
    PROC,
    CgroupLocator,
    CgroupMounts,
    CgroupNotFound,
)
from gmd.agent.collect.base import (
    FailureKind,
    HostReading,
    HostResources,
    Ownership,
    ReadFailure,
    VmReading,
    host_failure,
    vm_reading,
)
from gmd.agent.collect.host import HostCpu
from gmd.agent.collect.kernel_disks import DiskCheck, DiskVerdict, why_they_disagree
from gmd.agent.collect.kernel_domains import (
    NO_DISKS,
    DomainDescriber,
    KernelDescription,
    TickPlan,
)
from gmd.agent.collect.kernel_files import (
    CounterFiles,
    IoFile,
    KeptFile,
    KernelReadError,
    read_text,
)
from gmd.agent.collect.kernel_parsers import NetCounters, NetDevParser
from gmd.agent.collect.libvirt import LibvirtCollector, bulk_devices
from gmd.agent.collect.lifecycle import (
    LAST_MOMENTS,
    Lifecycle,
    LifecycleWatch,
    start_event_loop,
)
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter
from gmd.agent.disks import SYS_DEV_BLOCK
from gmd.agent.libvirt_conn import CONNECTION_LOST, DOMAIN_GONE_OR_INVALID, LibvirtConnection

log = logging.getLogger(__name__)

_FilesRead = tuple[
    str,
    int,
    KernelDescription,
    CounterFiles,
    int,
    int,
    Mapping[str, tuple[int, int]],
    Mapping[str, tuple[int, int]],
    Ownership,
    str,
]
"""one VM's files as a tick read them: uuid, its id, description and files; its CPU time,
resident set, cgroup's disk bytes and taps' bytes; its owner and name"""


def kernel_collector_fits(uri: str, proc: Path = PROC, run_dir: Path = LIBVIRT_QEMU_RUN) -> str:
    """Why the kernel collector cannot read this host, or ``""`` when it can: libvirt's
    system QEMU driver on this machine (its pid files in ``run_dir``, its VMs' files in this
    machine's ``/proc`` and cgroups), with a cgroup hierarchy that counts CPU."""
    parts = urlsplit(uri)
    if parts.scheme != "qemu" or parts.netloc or parts.path.rstrip("/") != "/system":
        return f"{uri} is not this machine's system QEMU driver (qemu:///system)"
    if not run_dir.is_dir():
        return f"no {run_dir}: libvirt's QEMU driver does not run here"
    try:
        mounts = CgroupLocator(proc=proc, run_dir=run_dir).mounts()
        read_text(proc / "net" / "dev")
    except (CgroupNotFound, KernelReadError) as exc:
        return str(exc)
    if "cpuacct" not in mounts.v1 and mounts.v2 is None:
        return "no cgroup hierarchy counts CPU (neither v1 cpuacct nor v2 is mounted)"
    return ""


class KernelCollector:
    """Reads every running domain's counters from the kernel (see the module docstring).

    ``opener`` opens the libvirt connection (read-only by default); ``proc``, ``run_dir``,
    ``mountinfo`` and ``sys_dev_block`` (the host's block devices by number) point at the
    files, for tests on a laid-out tree. ``check_every_s``: how often QEMU's block stats are
    asked of the VMs whose disks their cgroups count, for the check alone (every tick for the
    others, whose disk use they are): QEMU's monitor is the costly part of a tick.
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
        check_every_s: float = 60.0,
        backoff_max_s: float = 60.0,
        proc: Path = PROC,
        run_dir: Path = LIBVIRT_QEMU_RUN,
        mountinfo: Path | None = None,
        sys_dev_block: Path = SYS_DEV_BLOCK,
        domains: DomainFilter = EVERY_DOMAIN,
    ) -> None:
        self.domains = domains
        self._clock, self._monotonic = clock, monotonic
        self.describe_every_s = describe_every_s
        self.check_every_s = check_every_s
        self._check_due_s = 0.0
        self.net_dev = proc / "net" / "dev"
        self._describer = DomainDescriber(
            CgroupLocator(proc=proc, run_dir=run_dir, mountinfo=mountinfo),
            proc=proc,
            sys_dev_block=sys_dev_block,
            default_customer=default_customer,
        )
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        # Before the connection is opened: a connection opened earlier delivers no events.
        start_event_loop()
        self.conn = LibvirtConnection(
            uri, read_only=True, opener=opener, monotonic=monotonic, backoff_max_s=backoff_max_s
        )
        self._events = LifecycleWatch(self._on_event)
        self.conn.on_open(self._events.watch)
        self.conn.on_close(lambda _conn: self._events.unwatch())
        self._libvirt = LibvirtCollector(
            uri,
            default_customer=default_customer,
            clock=clock,
            monotonic=monotonic,
            describe_every_s=describe_every_s,
            connection=self.conn,
        )
        """reads the VMs the kernel's files cannot, through the same connection"""
        self._domains: dict[str, tuple[Any, int]] = {}
        """uuid → (domain, its id) at the last listing"""
        self._listed_s: float | None = None
        self._descriptions: dict[str, KernelDescription] = {}
        self._last: dict[str, VmReading] = {}
        """readings taken at a lifecycle event, not yet superseded or sent (see _on_event)"""
        self._logged: set[str] = set()
        self._disagreeing: set[str] = set()
        """the VMs whose cgroup's disk bytes disagree with QEMU's at their latest verdict"""
        self._net_dev = KeptFile(self.net_dev)
        self._net_dev_parser = NetDevParser()
        self._host_cpu = HostCpu(proc / "stat")
        self._lock = threading.Lock()
        """held while the files are read, by a tick or at an event: the two readings of one
        VM are then in the order of their times"""
        self._plan: TickPlan | None = None
        """the last tick's, while it holds (:class:`TickPlan`)"""

    def resources(self) -> HostResources | None:
        return self._libvirt.resources()

    def close(self) -> None:
        self.conn.close()  # first: no lifecycle event may arrive while the files close
        with self._lock:
            for d in self._descriptions.values():
                if d.files is not None:
                    d.files.close()
            self._net_dev.close()
            self._host_cpu.close()
        self._libvirt.close()

    def collect(self) -> HostReading:
        conn = self.conn.get()
        if conn is None:
            return HostReading(self._clock(), False, errors=(host_failure(self.conn.down_reason),))
        if (
            self._events.take_changed()
            or self._listed_s is None
            or self._monotonic() - self._listed_s >= self.describe_every_s
        ):
            try:
                domains = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
            except libvirt.libvirtError as exc:
                self.conn.lost(exc, "listing domains")
                return HostReading(
                    self._clock(), False, errors=(host_failure(self.conn.down_reason),)
                )
            # A domain's id changes only with its process, which sends events: kept with it.
            # Names the domain filter refuses are not even described.
            self._domains = {
                dom.UUIDString(): (dom, dom.ID())
                for dom in domains
                if self.domains.admits_name(dom.name())
            }
            self._listed_s = self._monotonic()
        with self._lock:
            return self._read(conn, self._domains)

    def _read(self, conn: Any, listed: dict[str, tuple[Any, int]]) -> HostReading:
        """One tick, under the lock: the plan (made again when due), every planned VM's files
        (:meth:`_read_files`), QEMU's block stats of those that need them, the readings
        (:meth:`_readings`), then the VMs read through libvirt instead and the readings
        taken at lifecycle events."""
        taken_s = self._clock()
        host_cpu_s = self._host_cpu.read()
        describe_before = self._monotonic() - self.describe_every_s
        gone: set[str] = set()
        errors: list[ReadFailure] = []
        busy: set[str] = set()
        net = self._net()
        plan = self._plan
        if plan is None or plan.listed is not listed or plan.describe_at <= describe_before:
            plan = self._make_plan(listed, describe_before, gone, errors)
            if plan is None:
                return HostReading(taken_s, False, errors=(host_failure(self.conn.down_reason),))
            # A VM that could not be described is tried again at the next tick.
            self._plan = None if gone or errors else plan
        read, fallback, asked = self._read_files(plan, net)
        qemu: dict[str, Mapping[str, tuple[int, int]]] = {}
        if asked:
            qemu, failed = self._block_stats(conn, asked)
            errors.extend(failed)
        vms = self._readings(read, qemu, taken_s)
        if fallback:
            more, more_gone, more_errors, busy = self._fallback(fallback, taken_s)
            vms.extend(more)
            gone |= more_gone
            errors.extend(more_errors)
        if self._last:
            vms = self._last_moments(vms, listed, gone) + vms
        return HostReading(
            taken_s,
            True,
            tuple(vms),
            plan.measured,
            frozenset(gone),
            tuple(errors),
            fallbacks=frozenset(fallback) - gone,
            busy=frozenset(busy),
            host_cpu_s=host_cpu_s,
            disk_disagreements=frozenset(self._disagreeing),
        )

    def _read_files(
        self, plan: TickPlan, net: NetCounters | None
    ) -> tuple[list[_FilesRead], dict[str, Any], dict[str, Any]]:
        """Every planned VM's counter files: what was read, the domains to read through
        libvirt instead (their files could not be located or read), and the domains whose
        disks QEMU's block stats are asked for this tick."""
        read: list[_FilesRead] = []
        fallback: dict[str, Any] = {}
        asked: dict[str, Any] = {}
        # The loop below runs for every VM and tick: what it calls is looked up once.
        page_size, keep = self._page_size, read.append
        checking = self._monotonic() >= self._check_due_s
        if checking:
            self._check_due_s = self._monotonic() + self.check_every_s
        for uuid, dom, run_id, d, files, first, has_disks, owner, name in plan.vms:
            if files is None:
                self._cannot(uuid, d, d.problem)
                fallback[uuid] = dom
                continue
            try:
                cpu_ns, rss, cgroup, nics = files.counters(net, page_size)
            except KernelReadError as exc:
                self._cannot(uuid, d, str(exc))
                if not files.is_open:
                    self._describe_again(d)
                fallback[uuid] = dom
                continue
            if first:  # its process's first reading: read at its events from now on
                d.kernel_read = True
                self._plan = None
            keep((uuid, run_id, d, files, cpu_ns, rss, cgroup, nics, owner, name))
            if has_disks and (checking or d.check is None):
                asked[uuid] = dom
        return read, fallback, asked

    def _readings(
        self,
        read: list[_FilesRead],
        qemu: Mapping[str, Mapping[str, tuple[int, int]]],
        taken_s: float,
    ) -> list[VmReading]:
        """The readings of the VMs whose files were read, with their disks (QEMU's block
        stats, or their cgroup's where it is checked), each checked VM's cgroup looked at
        again after QEMU's figures and judged against them."""
        vms: list[VmReading] = []
        append, disks_of = vms.append, qemu.get
        for uuid, run_id, d, files, cpu_ns, rss, cgroup, nics, owner, name in read:
            disks = guest = disks_of(uuid, NO_DISKS)
            check = d.check
            if check is not None:
                # its local disks, opened O_DIRECT: what reached the host's disk, which is
                # what contends it (QEMU's figures check it)
                disks = {dev: cgroup[dev] for dev in check.devices if dev in cgroup}
            append(vm_reading(uuid, run_id, taken_s, cpu_ns, rss, disks, nics, owner, name))
            if check is not None and guest:
                try:  # the cgroup's second look, after QEMU's figures
                    after = files.io_again()
                except KernelReadError:  # not checked this tick; its next reading finds out
                    if not files.is_open:
                        self._describe_again(d)
                    continue
                verdict = check.observe(taken_s, cgroup, guest, after)
                if verdict is not None:
                    self._judged(uuid, d, check, verdict)
        return vms

    def _make_plan(
        self,
        listed: dict[str, tuple[Any, int]],
        describe_before: float,
        gone: set[str],
        errors: list[ReadFailure],
    ) -> TickPlan | None:
        """What this tick reads of the ``listed`` domains: each one described (again) when it
        is new, its process changed or its description is older than ``describe_before``;
        the descriptions of domains no longer listed dropped, their files closed. Adds to
        ``gone`` and ``errors`` the domains that could not be described (left out of the
        plan); ``None`` when the connection was lost."""
        descriptions = self._descriptions
        mounts: CgroupMounts | None = None
        vms = []
        excluded = set()
        for uuid, (dom, run_id) in listed.items():
            d = descriptions.get(uuid)
            if d is None or d.run_id != run_id or d.fetched_s <= describe_before:
                try:
                    xml = dom.XMLDesc(0)
                except libvirt.libvirtError as exc:
                    code = exc.get_error_code()
                    if code in DOMAIN_GONE_OR_INVALID:
                        gone.add(uuid)
                        continue
                    if code in CONNECTION_LOST:
                        self.conn.lost(exc, f"describing domain {uuid}")
                        return None
                    errors.append(ReadFailure(FailureKind.domain, f"domain {uuid}: {exc}", uuid))
                    continue
                if mounts is None:
                    mounts = self._describer.mounts()
                d = self._describer.describe(xml, run_id, d, mounts, self._monotonic())
                descriptions[uuid] = d
                if d.check is None or d.check.agree is not False:
                    self._disagreeing.discard(uuid)  # a new process, or no longer checked
            if not self.domains.admits_owner(d.owner):
                excluded.add(uuid)
                continue
            first, has_disks = not d.kernel_read, bool(d.disks.block_stats)
            vms.append((uuid, dom, run_id, d, d.files, first, has_disks, d.owner, d.name))
        stale = descriptions.keys() - listed.keys()
        for uuid in stale:
            files = descriptions.pop(uuid).files
            if files is not None:
                files.close()
        if stale:
            self._logged &= listed.keys()
            self._disagreeing &= listed.keys()
        return TickPlan(
            listed,
            min((d.fetched_s for d in descriptions.values()), default=math.inf),
            tuple(vms),
            frozenset(listed) - excluded,
        )

    def _block_stats(
        self, conn: Any, domains: dict[str, Any]
    ) -> tuple[dict[str, Mapping[str, tuple[int, int]]], list[ReadFailure]]:
        """The kernel-read ``domains``' disk counters (:func:`plan_disks`), from QEMU's block
        stats: one bulk call for them all, the only one that reaches QEMU's monitor (three QMP
        commands per domain). Skips a busy domain (``NOWAIT``); a disk not read this tick
        keeps its last counters, and its next reading measures from them."""
        try:
            pairs = conn.domainListGetStats(
                list(domains.values()),
                libvirt.VIR_DOMAIN_STATS_BLOCK,
                libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT,
            )
        except libvirt.libvirtError as exc:
            why = f"the block stats of {len(domains)} VMs not read this tick: {exc}"
            log.warning("%s", why)
            return {}, [ReadFailure(FailureKind.block_stats, why)]
        read: dict[str, Mapping[str, tuple[int, int]]] = {}
        for dom, stats in pairs:
            uuid = dom.UUIDString()
            wanted = self._descriptions[uuid].disks.block_stats
            disks = bulk_devices(stats, "block", "rd.bytes", "wr.bytes")
            if disks:
                read[uuid] = {dev: rw for dev, rw in disks.items() if dev in wanted}
        return read, []

    def _judged(
        self, uuid: str, d: KernelDescription, check: DiskCheck, verdict: DiskVerdict
    ) -> None:
        """A VM's cgroup came to disagree with its QEMU's block stats, or to agree again:
        logged, once per change, and kept for the readings (``disk_disagreements``)."""
        (host_r, host_w), (guest_r, guest_w) = verdict.cgroup, verdict.qemu
        devices = ", ".join(dev.removeprefix("host:") for dev in check.devices)
        if verdict.agree:
            self._disagreeing.discard(uuid)
            log.info(
                "VM %s (%s): its cgroup's disk bytes agree with QEMU's block stats again"
                " (%d read, %d written over %.0f s)",
                uuid,
                d.name,
                guest_r,
                guest_w,
                verdict.span_s,
            )
            return
        self._disagreeing.add(uuid)
        io = None if d.files is None else d.files.sources.cgroups.io
        why = why_they_disagree(
            verdict, blkio_v1=io is not None and io[0] is IoFile.BLKIO_SERVICE_BYTES
        )
        log.warning(
            "VM %s (%s): its cgroup counted %d bytes read and %d written on host device %s"
            " over %.0f s, QEMU's block stats of its disks %d and %d: its disk use is the"
            " cgroup's figure (the I/O that reached the disk), QEMU's only checks it; %s."
            " Logged again when they agree.",
            uuid,
            d.name,
            host_r,
            host_w,
            devices,
            verdict.span_s,
            guest_r,
            guest_w,
            why,
        )

    def _net(self) -> NetCounters | None:
        """Every interface's counters, one file for all the VMs' taps; ``None`` (each VM with
        a tap then falls back) when it cannot be read."""
        try:
            return self._net_dev_parser(self._net_dev.read_bytes(whole=True))
        except (KernelReadError, ValueError, IndexError) as exc:
            log.warning("cannot read the host's interface counters: %s", exc)
            return None

    def _on_event(self, uuid: str, kind: Lifecycle, dom: Any) -> None:
        """On the event loop's thread. A domain about to end (:data:`LAST_MOMENTS`) is read
        at once, so the use between the last tick and its end is not lost with its process.
        The reading is kept until a tick supersedes it (the domain still runs) or sends it
        (the domain is gone, or runs as another process, see :meth:`_last_moments`)."""
        log.debug("domain %s: %s", uuid, kind.name)
        if kind not in LAST_MOMENTS:
            return
        d = self._descriptions.get(uuid)
        if d is None or d.files is None or not d.kernel_read:
            return  # never read from the kernel (or outside the domain filter)
        with self._lock:
            if self._descriptions.get(uuid) is not d or d.run_id != dom.ID():
                # a tick let go of it meanwhile (it stopped)
                log.info("domain %s (%s) %s: too late to read: gone", uuid, d.name, kind.name)
                return
            taken_s = self._clock()
            try:
                c = d.files.counters(self._net(), self._page_size)
            except KernelReadError as exc:
                log.info("domain %s (%s) %s: too late to read: %s", uuid, d.name, kind.name, exc)
                if not d.files.is_open:
                    self._describe_again(d)
                return
            self._last[uuid] = d.event_reading(uuid, taken_s, c)
        log.info("domain %s (%s) %s: its counters read", uuid, d.name, kind.name)

    def _last_moments(
        self, vms: list[VmReading], listed: Mapping[str, tuple[Any, int]], gone: set[str]
    ) -> list[VmReading]:
        """The readings taken at events that this tick sends: those of a process that this
        tick did not read and that no longer runs. One that this tick read again is
        superseded (its times are before the tick's: the lock orders them); one still running
        but not read this tick waits for the next. They go before the tick's readings: a VM
        restarted since reads its old process's end before its new process."""
        out = []
        read = {(v.uuid, v.run_id) for v in vms}
        for uuid, last in list(self._last.items()):
            if (uuid, last.run_id) in read:
                del self._last[uuid]
                continue
            running = uuid in listed and uuid not in gone and listed[uuid][1] == last.run_id
            if not running:
                out.append(self._last.pop(uuid))
        return out

    def _describe_again(self, d: KernelDescription) -> None:
        """At the next tick, before its files are opened again: they failed to read (a
        removed cgroup's file gives ENODEV, a dead process's ESRCH), and the paths they were
        opened by may now name another process's or VM's files (a recycled pid, a cgroup
        made again). Described again, a VM's paths are those of its QEMU of the moment (its
        pid file, that process's cgroups), or none when it has no process."""
        d.fetched_s = -math.inf
        self._plan = None

    def _cannot(self, uuid: str, d: KernelDescription, why: str) -> None:
        """The VM is read through libvirt this tick: logged once per VM."""
        if uuid not in self._logged:
            self._logged.add(uuid)
            log.warning(
                "VM %s (%s): read through libvirt instead of the kernel's files: %s",
                uuid,
                d.name,
                why,
            )

    def _fallback(
        self, domains: dict[str, Any], taken_s: float
    ) -> tuple[list[VmReading], set[str], list[ReadFailure], set[str]]:
        """Read ``domains`` through libvirt, one call per counter as the libvirt collector
        does when bulk stats lack them: its disks are QEMU's block stats, as at any tick."""
        return self._libvirt.read_listed(
            {uuid: (dom, {}) for uuid, dom in domains.items()}, taken_s
        )
