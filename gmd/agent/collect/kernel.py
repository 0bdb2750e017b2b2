"""The kernel-counter collector: libvirt to list and describe domains, the kernel's files for
the counters (issue 19).

The libvirt collector's ``getAllDomainStats`` asks every QEMU over its monitor socket, every
tick: ~5–7 ms of libvirtd and QEMU time per VM. The kernel already keeps the same counters, so
per tick this collector makes one cheap libvirt call (``listAllDomains``: ids and uuids, no
QEMU involved) and otherwise only reads files:

- CPU: the domain's cgroup (the parent of QEMU's ``emulator`` cgroup, which also holds the
  ``vcpuN`` cgroups): v1 ``cpuacct.usage`` (ns) when QEMU sits in a cpuacct group, else v2
  ``cpu.stat`` ``usage_usec``, which every v2 cgroup has even without the cpu controller (on a
  hybrid host such as the project's machines, where libvirt leaves cpuacct at the root, that is
  the file libvirt itself reads for ``cpu.time``);
- memory: the QEMU process's resident set, ``/proc/<pid>/statm`` (resident pages), which is
  the counter libvirt reports as ``balloon.rss`` (it reads ``/proc/<pid>/stat``), so switching
  collectors does not change what the GM charges for memory. The cgroup's own figures differ:
  v1 ``memory.stat`` ``total_rss`` (anonymous, huge pages included — ``rss_huge`` is a part of
  it, not an addend) and v2 ``anon`` leave out the shared libraries QEMU maps, ~20 MB per QEMU
  here, charged to whichever cgroup touched them first;
- network: ``/sys/class/net/<tap>/statistics/{rx,tx}_bytes``, swapped to the guest's view as
  libvirt swaps them (what the host's tap receives, the guest transmitted);
- disk: the domain cgroup's v1 ``blkio.throttle.io_service_bytes`` or v2 ``io.stat``
  (``rbytes``/``wbytes``), per host block device (``host:MAJ:MIN``). These count what reached
  the host's block layer — not what the guest asked of its virtual disks, as libvirt's
  ``block.N.rd/wr.bytes`` do: reads served from the host's page cache are missing, writes are
  counted when written back, and network storage (RBD) does not appear at all.

What the counters need (the QEMU pid from libvirt's pid file, its cgroups from
``/proc/<pid>/cgroup`` and the mount table, the taps and the owner from the domain XML) is
cached per domain and read again every ``describe_every_s``, when the domain's id changes (its
process restarted) and when a domain appears.

A VM whose files cannot be read is read through libvirt for the tick (the reading's
``fallbacks`` names it; the agent counts them; logged once per VM). Because the two collectors'
disk counters measure different things, a VM's disk counters come from one source for its
process's whole life: the kernel's if they could be read at its first reading, else libvirt's.
A kernel-read VM falling back for a tick reports no disk counters then; its next kernel reading
measures from its last, so nothing is lost or counted twice.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

import libvirt

from gmd.agent.collect.base import HostReading, HostResources, Ownership, VmReading
from gmd.agent.collect.libvirt import LibvirtCollector, describe
from gmd.agent.libvirt_conn import CONNECTION_LOST, DOMAIN_GONE, open_connection

log = logging.getLogger(__name__)

PROC = Path("/proc")
SYS_CLASS_NET = Path("/sys/class/net")
LIBVIRT_QEMU_RUN = Path("/run/libvirt/qemu")
"""where the system QEMU driver writes ``<domain name>.pid``"""
EMULATOR = "emulator"
UNIFIED = ""
"""the controller key of the cgroup v2 hierarchy (``0::/path`` in ``/proc/<pid>/cgroup``)"""


class CpuFile(Enum):
    """Where a domain's cumulative CPU time is read."""

    CPUACCT_USAGE = "cpuacct.usage"
    """cgroup v1, nanoseconds"""
    CPU_STAT = "cpu.stat"
    """cgroup v2, ``usage_usec``"""


class IoFile(Enum):
    """Where a domain's cumulative block-device bytes are read."""

    BLKIO_SERVICE_BYTES = "blkio.throttle.io_service_bytes"
    """cgroup v1: ``MAJ:MIN Read|Write N`` lines"""
    IO_STAT = "io.stat"
    """cgroup v2: ``MAJ:MIN rbytes=N wbytes=N …`` lines"""


class DiskSource(Enum):
    """Which collector a VM's disk counters come from for its process's life (see the module
    docstring)."""

    KERNEL = "kernel"
    LIBVIRT = "libvirt"


class KernelReadError(Exception):
    """A counter file of one VM is missing, unreadable or not as expected; names the file."""


# --- where the files are (pure) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupMounts:
    """Where each cgroup hierarchy is mounted: v1 controllers by name, and the v2 mount."""

    v1: Mapping[str, Path]
    v2: Path | None


def parse_mountinfo(text: str) -> CgroupMounts:
    """The cgroup mounts of a ``/proc/self/mountinfo``. A v1 mount lists its controllers in
    its super options (``rw,cpu,cpuacct``); fields after `` - `` are fstype, source, options."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mountpoint = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2" and v2 is None:
            v2 = mountpoint
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                v1.setdefault(option, mountpoint)
    return CgroupMounts(v1, v2)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``controller → path`` from ``/proc/<pid>/cgroup`` (``ID:ctl1,ctl2:/path`` lines); the v2
    hierarchy's path under :data:`UNIFIED`. ``name=systemd`` and the like are kept as named."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        for controller in controllers.split(",") if controllers else [UNIFIED]:
            out[controller] = path
    return out


def domain_cgroup(path: str) -> PurePosixPath | None:
    """The domain's cgroup from QEMU's: libvirt puts the main process in ``…/emulator`` and the
    vCPU threads in ``…/vcpuN`` beside it, so the domain is the parent. ``None`` for the root
    (libvirt did not use the controller)."""
    p = PurePosixPath(path)
    if p.name == EMULATOR:
        p = p.parent
    return None if p == PurePosixPath("/") else p


@dataclass(frozen=True, slots=True)
class CgroupFiles:
    """The counter files of one domain's cgroups."""

    cpu: tuple[CpuFile, Path]
    io: tuple[IoFile, Path] | None
    """``None``: no io/blkio group (the VM's disks are then read through libvirt)"""


def _under(mount: Path, cgroup: PurePosixPath) -> Path:
    return mount / str(cgroup).lstrip("/")


def locate(proc_cgroup: Mapping[str, str], mounts: CgroupMounts) -> CgroupFiles:
    """The files to read for a QEMU process in the cgroups ``proc_cgroup``: v1 where QEMU sits
    in a group of that controller, else v2. Raises :class:`KernelReadError` without a CPU file."""

    def group(controller: str, mount: Path | None) -> Path | None:
        path = proc_cgroup.get(controller)
        cg = domain_cgroup(path) if path is not None else None
        return None if cg is None or mount is None else _under(mount, cg)

    unified = group(UNIFIED, mounts.v2)
    cpuacct = group("cpuacct", mounts.v1.get("cpuacct"))
    if cpuacct is not None:
        cpu = (CpuFile.CPUACCT_USAGE, cpuacct / CpuFile.CPUACCT_USAGE.value)
    elif unified is not None:
        cpu = (CpuFile.CPU_STAT, unified / CpuFile.CPU_STAT.value)
    else:
        raise KernelReadError("QEMU is in no cpuacct (v1) nor v2 cgroup of its own")
    blkio = group("blkio", mounts.v1.get("blkio"))
    io: tuple[IoFile, Path] | None = None
    if blkio is not None:
        io = (IoFile.BLKIO_SERVICE_BYTES, blkio / IoFile.BLKIO_SERVICE_BYTES.value)
    elif unified is not None:
        io = (IoFile.IO_STAT, unified / IoFile.IO_STAT.value)
    return CgroupFiles(cpu, io)


# --- the counter files (pure parsers) --------------------------------------------------------


def parse_cpuacct_usage(text: str) -> int:
    """v1 ``cpuacct.usage``: one integer, nanoseconds."""
    return int(text.strip())


def _keyed(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines() if " " in line)


def parse_cpu_stat(text: str) -> int:
    """v2 ``cpu.stat``'s ``usage_usec``, as nanoseconds."""
    usec = _keyed(text).get("usage_usec")
    if usec is None:
        raise ValueError("no usage_usec")
    return int(usec) * 1000


def parse_statm_resident(text: str, page_size: int) -> int:
    """``/proc/<pid>/statm``'s second field (resident pages), in bytes."""
    return int(text.split()[1]) * page_size


def parse_blkio_service_bytes(text: str) -> dict[str, tuple[int, int]]:
    """v1 ``blkio.throttle.io_service_bytes``: ``{"host:MAJ:MIN": (read, written)}``. A device
    appears once it has done I/O; the ``Total`` line is the sum of the others."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[1] not in ("Read", "Write"):
            continue
        pair = out.setdefault(f"host:{parts[0]}", [0, 0])
        pair[parts[1] == "Write"] = int(parts[2])
    return {dev: (r, w) for dev, (r, w) in out.items()}


def parse_io_stat(text: str) -> dict[str, tuple[int, int]]:
    """v2 ``io.stat``: ``{"host:MAJ:MIN": (rbytes, wbytes)}``."""
    out = {}
    for line in text.splitlines():
        dev, _, rest = line.partition(" ")
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        if dev and "rbytes" in fields and "wbytes" in fields:
            out[f"host:{dev}"] = (int(fields["rbytes"]), int(fields["wbytes"]))
    return out


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode()
    except OSError as exc:
        raise KernelReadError(f"{path}: {exc.strerror or exc}") from None


class OpenFiles:
    """Counter files kept open between ticks, each read again from its start.

    cgroupfs, sysfs and procfs make a file's content anew when it is read from offset 0, so
    one ``pread`` per file and tick replaces an open, a read and a close: a third of the
    syscalls, and no path lookup (the profile of a tick: five opens per VM, ~7.5 µs each).
    A file that fails to read is closed and opened again by path at its next reading; one not
    read in a tick (its VM gone, or described anew) is closed by :meth:`sweep`. A removed
    cgroup's or tap's open file fails to read (ENODEV): no counter of another VM is read
    through it.
    """

    CHUNK = 4096

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._read: set[Path] = set()

    def read(self, path: Path) -> str:
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._read.add(path)
            data = os.pread(fd, self.CHUNK, 0)
            while len(data) % self.CHUNK == 0 and data:
                more = os.pread(fd, self.CHUNK, len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            self._close(path)
            raise KernelReadError(f"{path}: {exc.strerror or exc}") from None
        return data.decode()

    def sweep(self) -> None:
        """Close the files not read since the last sweep."""
        for path in set(self._fds) - self._read:
            self._close(path)
        self._read = set()

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)

    def _close(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)


def _parsed(path: Path, parse: Callable[[str], Any], read: Callable[[Path], str] = _read) -> Any:
    text = read(path)
    try:
        return parse(text)
    except (ValueError, IndexError) as exc:
        raise KernelReadError(f"{path}: unexpected content ({exc})") from None


@functools.lru_cache(maxsize=4096)
def _tap_files(sys_class_net: Path, tap: str) -> tuple[Path, Path]:
    stats = sys_class_net / tap / "statistics"
    return stats / "rx_bytes", stats / "tx_bytes"


@dataclass(frozen=True, slots=True)
class KernelSources:
    """Everything one VM's kernel reading needs, learned when it is described."""

    cgroups: CgroupFiles
    statm: Path
    taps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KernelCounters:
    cpu_time_ns: int
    memory_rss_bytes: int
    disks: dict[str, tuple[int, int]]
    nics: dict[str, tuple[int, int]]


def read_counters(
    sources: KernelSources,
    *,
    sys_class_net: Path = SYS_CLASS_NET,
    page_size: int | None = None,
    read: Callable[[Path], str] = _read,
) -> KernelCounters:
    """One VM's counters from the kernel's files (each read by ``read``, e.g. an
    :class:`OpenFiles`); :class:`KernelReadError` names the first file that could not be read.
    Without an io file the disks are left empty."""
    cpu_kind, cpu_path = sources.cgroups.cpu
    cpu_ns = _parsed(
        cpu_path,
        parse_cpuacct_usage if cpu_kind is CpuFile.CPUACCT_USAGE else parse_cpu_stat,
        read,
    )
    rss = _parsed(
        sources.statm,
        functools.partial(parse_statm_resident, page_size=page_size or os.sysconf("SC_PAGE_SIZE")),
        read,
    )
    disks: dict[str, tuple[int, int]] = {}
    if sources.cgroups.io is not None:
        io_kind, io_path = sources.cgroups.io
        disks = _parsed(
            io_path,
            parse_blkio_service_bytes if io_kind is IoFile.BLKIO_SERVICE_BYTES else parse_io_stat,
            read,
        )
    nics = {}
    for tap in sources.taps:
        rx, tx = _tap_files(sys_class_net, tap)
        # The guest receives what the host's tap transmits.
        nics[tap] = (_parsed(tx, int, read), _parsed(rx, int, read))
    return KernelCounters(cpu_ns, rss, disks, nics)


# --- the collector -------------------------------------------------------------------------


@dataclass
class KernelDescription:
    """What one domain's XML and process say, cached per process (domain id)."""

    run_id: int
    fetched_s: float
    name: str
    owner: Ownership
    sources: KernelSources | None
    """``None``: the files could not be located (``problem`` says why): read through libvirt"""
    problem: str = ""
    disk_source: DiskSource | None = None
    """decided at the first reading of this process, kept across refreshes"""


class KernelCollector:
    """Reads every running domain's counters from the kernel (see the module docstring).

    ``opener`` opens the libvirt connection (read-only by default); ``proc``, ``sys_class_net``,
    ``run_dir`` and ``mountinfo`` point at the files, for tests on a laid-out tree.
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
        backoff_max_s: float = 60.0,
        proc: Path = PROC,
        sys_class_net: Path = SYS_CLASS_NET,
        run_dir: Path = LIBVIRT_QEMU_RUN,
        mountinfo: Path | None = None,
    ) -> None:
        self.default_customer = default_customer
        self._clock, self._monotonic = clock, monotonic
        self.describe_every_s = describe_every_s
        self.proc, self.sys_class_net, self.run_dir = proc, sys_class_net, run_dir
        self.mountinfo = mountinfo or proc / "self" / "mountinfo"
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._libvirt = LibvirtCollector(
            uri,
            default_customer=default_customer,
            opener=opener or functools.partial(open_connection, read_only=True),
            clock=clock,
            monotonic=monotonic,
            describe_every_s=describe_every_s,
            backoff_max_s=backoff_max_s,
        )
        self._descriptions: dict[str, KernelDescription] = {}
        self._logged: set[str] = set()
        self._files = OpenFiles()

    def resources(self) -> HostResources | None:
        return self._libvirt.resources()

    def close(self) -> None:
        self._files.close()
        self._libvirt.close()

    def collect(self) -> HostReading:
        lv = self._libvirt
        conn = lv.connection()
        if conn is None:
            return HostReading(self._clock(), False, errors=(lv.down_reason,))
        try:
            domains = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        except libvirt.libvirtError as exc:
            lv.lost(exc, "listing domains")
            return HostReading(self._clock(), False, errors=(lv.down_reason,))
        taken_s = self._clock()
        listed = {dom.UUIDString(): dom for dom in domains}
        vms: list[VmReading] = []
        gone: set[str] = set()
        errors: list[str] = []
        fallback: dict[str, Any] = {}
        mounts: CgroupMounts | None = None
        for uuid, dom in listed.items():
            run_id = dom.ID()
            d = self._descriptions.get(uuid)
            if (
                d is None
                or d.run_id != run_id
                or self._monotonic() - d.fetched_s >= (self.describe_every_s)
            ):
                try:
                    xml = dom.XMLDesc(0)
                except libvirt.libvirtError as exc:
                    code = exc.get_error_code()
                    if code in DOMAIN_GONE:
                        gone.add(uuid)
                        continue
                    if code in CONNECTION_LOST:
                        lv.lost(exc, f"describing domain {uuid}")
                        return HostReading(taken_s, False, errors=(lv.down_reason,))
                    errors.append(f"domain {uuid}: {exc}")
                    continue
                if mounts is None:
                    mounts = self._mounts()
                d = self._describe(xml, run_id, d, mounts)
                self._descriptions[uuid] = d
            reading = self._kernel_reading(uuid, d, taken_s)
            if reading is None:
                fallback[uuid] = dom
            else:
                vms.append(reading)
        if fallback:
            more, more_gone, more_errors = self._fallback(fallback, taken_s)
            vms.extend(more)
            gone |= more_gone
            errors.extend(more_errors)
        for uuid in set(self._descriptions) - set(listed):
            del self._descriptions[uuid]
        self._files.sweep()
        self._logged &= set(listed)
        return HostReading(
            taken_s,
            True,
            tuple(vms),
            frozenset(listed),
            frozenset(gone),
            tuple(errors),
            fallbacks=frozenset(fallback) - gone,
        )

    def _mounts(self) -> CgroupMounts:
        try:
            return parse_mountinfo(_read(self.mountinfo))
        except KernelReadError as exc:
            log.warning("cannot read the cgroup mounts: %s", exc)
            return CgroupMounts({}, None)

    def _describe(
        self, xml: str, run_id: int, before: KernelDescription | None, mounts: CgroupMounts
    ) -> KernelDescription:
        name, owner, _disks, nics = describe(xml, self.default_customer)
        sources: KernelSources | None = None
        problem = ""
        try:
            pid = int(_read(self.run_dir / f"{name}.pid").strip() or "x")
        except (KernelReadError, ValueError) as exc:
            problem = f"no QEMU pid for {name}: {exc}"
        else:
            try:
                proc_cgroup = parse_proc_cgroup(_read(self.proc / str(pid) / "cgroup"))
                sources = KernelSources(
                    locate(proc_cgroup, mounts), self.proc / str(pid) / "statm", nics
                )
            except KernelReadError as exc:
                problem = str(exc)
        disk_source = before.disk_source if before is not None and before.run_id == run_id else None
        return KernelDescription(
            run_id, self._monotonic(), name, owner, sources, problem, disk_source
        )

    def _kernel_reading(self, uuid: str, d: KernelDescription, taken_s: float) -> VmReading | None:
        """The VM's reading from the kernel, or ``None`` when it must be read through libvirt
        this tick. The first reading of a process decides where its disk counters come from."""
        if d.sources is None:
            self._cannot(uuid, d, d.problem)
            return None
        if d.disk_source is DiskSource.LIBVIRT:
            return None
        try:
            c = read_counters(
                d.sources,
                sys_class_net=self.sys_class_net,
                page_size=self._page_size,
                read=self._files.read,
            )
        except KernelReadError as exc:
            self._cannot(uuid, d, str(exc))
            return None
        if d.sources.cgroups.io is None:
            self._cannot(uuid, d, "QEMU is in no blkio (v1) nor v2 cgroup of its own")
            return None
        d.disk_source = DiskSource.KERNEL
        return VmReading(
            uuid=uuid,
            run_id=d.run_id,
            taken_s=taken_s,
            cpu_time_ns=c.cpu_time_ns,
            memory_rss_bytes=c.memory_rss_bytes,
            disks=c.disks,
            nics=c.nics,
            owner=d.owner,
            name=d.name,
        )

    def _cannot(self, uuid: str, d: KernelDescription, why: str) -> None:
        """Mark the VM for libvirt this tick; a VM not yet read from the kernel in this process
        takes its disk counters from libvirt for the process's life. Logged once per VM."""
        if d.disk_source is None:
            d.disk_source = DiskSource.LIBVIRT
        if uuid not in self._logged:
            self._logged.add(uuid)
            log.warning(
                "VM %s (%s): read through libvirt instead of the kernel's files: %s%s",
                uuid,
                d.name,
                why,
                " (its disk counters come from libvirt until its process restarts)"
                if d.disk_source is DiskSource.LIBVIRT
                else "",
            )

    def _fallback(
        self, domains: dict[str, Any], taken_s: float
    ) -> tuple[list[VmReading], set[str], list[str]]:
        """Read ``domains`` through libvirt, one call per counter as the libvirt collector
        does when bulk stats lack them. A VM whose disks come from the kernel reports no disk
        counters here: its next kernel reading measures them from its last one."""
        vms, gone, errors = self._libvirt.read_listed(
            {uuid: (dom, {}) for uuid, dom in domains.items()}, taken_s
        )
        out = []
        for reading in vms:
            d = self._descriptions.get(reading.uuid)
            if d is not None and d.disk_source is DiskSource.KERNEL:
                reading = dataclasses.replace(reading, disks={})
            out.append(reading)
        return out, gone, errors
