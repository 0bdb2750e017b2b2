"""The kernel collector's counter files: which files of a domain's cgroups and process hold
its counters, and how they are read, tick after tick, from descriptors kept open.

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
- network: the taps' lines of ``/proc/net/dev`` (what libvirt reads for ``net.N.*`` too),
  swapped to the guest's view as libvirt swaps them (what the host's tap receives, the guest
  transmitted);
- disk: the cgroup's I/O file (v1 ``blkio.throttle.io_service_bytes``, v2 ``io.stat``), where
  :mod:`gmd.agent.collect.kernel_disks` says it is the measure.

The bytes are parsed by :mod:`gmd.agent.collect.kernel_parsers`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from gmd import GmdError
from gmd.agent.cgroups import DomainCgroups
from gmd.agent.collect.kernel_parsers import (
    NetCounters,
    blkio_devices,
    cpu_stat_ns,
    io_stat_devices,
)


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


class KernelReadError(GmdError):
    """A counter file of one VM is missing, unreadable or not as expected; names the file."""


@dataclass(frozen=True, slots=True)
class CgroupFiles:
    """The counter files of one domain's cgroups."""

    cpu: tuple[CpuFile, Path]
    io: tuple[IoFile, Path] | None
    """``None``: no io/blkio group (the VM's disks are then read through libvirt)"""


def counter_files(groups: DomainCgroups) -> CgroupFiles:
    """The files to read in a domain's cgroups (found by :mod:`gmd.agent.cgroups`): v1 where
    QEMU sits in a group of that controller, else v2. :class:`KernelReadError` without a CPU
    file."""
    cpuacct = groups.v1.get("cpuacct")
    if cpuacct is not None:
        cpu = (CpuFile.CPUACCT_USAGE, cpuacct / CpuFile.CPUACCT_USAGE.value)
    elif groups.unified is not None:
        cpu = (CpuFile.CPU_STAT, groups.unified / CpuFile.CPU_STAT.value)
    else:
        raise KernelReadError("QEMU is in no cpuacct (v1) nor v2 cgroup of its own")
    blkio = groups.v1.get("blkio")
    io: tuple[IoFile, Path] | None = None
    if blkio is not None:
        io = (IoFile.BLKIO_SERVICE_BYTES, blkio / IoFile.BLKIO_SERVICE_BYTES.value)
    elif groups.unified is not None:
        io = (IoFile.IO_STAT, groups.unified / IoFile.IO_STAT.value)
    return CgroupFiles(cpu, io)


def read_text(path: Path) -> str:
    """A file's text at once (not kept open); :class:`KernelReadError` names it."""
    try:
        with open(path, "rb") as f:
            return f.read().decode()
    except OSError as exc:
        raise KernelReadError(f"{path}: {exc.strerror or exc}") from None


_pread = os.pread
"""``os.pread`` as a module global, for the loop over the VMs: three calls per VM"""
_CHUNK = 4096
"""what a counter file is read by (:class:`KeptFile`): a page, which holds any one record"""


def _rest(fd: int, data: bytes, *, whole: bool = False) -> bytes:
    """``data``, the file's first chunk, with the rest of the file after it."""
    while data and (whole or len(data) % KeptFile.CHUNK == 0):
        more = os.pread(fd, KeptFile.CHUNK, len(data))
        if not more:
            break
        data += more
    return data


class KeptFile:
    """A counter file kept open between ticks and read again from its start.

    cgroupfs, sysfs and procfs make a file's content anew when it is read from offset 0, so
    one ``pread`` per file and tick replaces an open, a read and a close: a third of the
    syscalls, and no path lookup (the profile of a tick: five opens per VM, ~7.5 µs each).
    A file that fails to read is closed and opened again by path at its next reading. A
    removed cgroup's open file fails to read (ENODEV): no counter of another VM is read
    through it.

    A counter file is one record, which the kernel hands out whole up to the size asked: a
    read shorter than ``CHUNK`` is the end. A file of many records (``/proc/net/dev``) comes a
    page's worth of whole records at a time, shorter than asked: ``whole=True`` reads it to
    its end.
    """

    __slots__ = ("_fd", "path")
    CHUNK = _CHUNK

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def read(self, *, whole: bool = False) -> str:
        return self.read_bytes(whole=whole).decode()

    def read_bytes(self, *, whole: bool = False) -> bytes:
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._fd, self.CHUNK, 0)
            if whole or len(data) == self.CHUNK:
                data = _rest(self._fd, data, whole=whole)
        except OSError as exc:
            self.close()
            raise KernelReadError(f"{self.path}: {exc.strerror or exc}") from None
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True, slots=True)
class KernelSources:
    """Everything one VM's kernel reading needs, learned when it is described."""

    cgroups: CgroupFiles
    statm: Path
    taps: tuple[str, ...]


class KernelCounters(NamedTuple):
    """One VM's counters as :meth:`CounterFiles.read` read them (a tuple: one per VM and
    tick)."""

    cpu_time_ns: int
    memory_rss_bytes: int
    disks: Mapping[str, tuple[int, int]]
    nics: Mapping[str, tuple[int, int]]


class CounterFiles:
    """One VM's counter files (:class:`KernelSources`), kept open while its process lives and
    read again from their start, as :class:`KeptFile` reads one file.

    Read once per VM and tick, so this is the agent's hot path, held close to the ``pread``
    of the files (``bench/agent.py --qemu``, issue 33): the three reads are written out here
    rather than through a call each, and the bytes are parsed without being decoded. What
    an idle VM's files repeat tick after tick is not parsed again: the memory and disk
    figures are parsed only when the file's bytes differ from the last reading's, and the
    interfaces' mapping is made again only when
    :class:`~gmd.agent.collect.kernel_parsers.NetDevParser` made their counters anew. Each is
    a function of the bytes alone, so this changes no figure; the mappings are then the last
    reading's objects, which is safe because readings never change their mappings (the agent
    copies them, :mod:`gmd.agent.collect.counters`). The state a reading
    needs is in this object's own slots, not in lists and tuples beside it: a tick comes ten
    seconds after the last, its objects no longer in the CPU's caches, and each object a VM's
    reading touches is another miss.

    A file that fails to read closes them all; the next reading opens them again by path. A
    removed cgroup's open file fails to read (ENODEV), so a file is never read through a
    descriptor of a cgroup that is gone, and one opened again is parsed as what it now
    says: the bytes remembered are only compared with.
    """

    __slots__ = (
        "_cpu_fd",
        "_cpu_stat",
        "_disks",
        "_guest",
        "_io",
        "_io_fd",
        "_io_v2",
        "_nics",
        "_pages",
        "_paths",
        "_statm",
        "_statm_fd",
        "_tap",
        "_tap_key",
        "_taps",
        "sources",
    )

    def __init__(self, sources: KernelSources) -> None:
        self.sources = sources
        io = sources.cgroups.io
        self._paths = (sources.cgroups.cpu[1], sources.statm) + (() if io is None else (io[1],))
        self._cpu_stat = sources.cgroups.cpu[0] is CpuFile.CPU_STAT
        self._io_v2 = io is not None and io[0] is IoFile.IO_STAT
        self._cpu_fd = self._statm_fd = self._io_fd = -1
        """open while ``_cpu_fd`` is; ``_io_fd`` stays -1 without an I/O file"""
        self._statm: bytes | None = None
        """the ``statm`` bytes last parsed, and their resident pages"""
        self._pages = 0
        self._io: bytes = b""
        """the I/O file's bytes last parsed (none: no device), and their disks"""
        self._disks: Mapping[str, tuple[int, int]] = {}
        self._taps = tuple((tap, tap.encode()) for tap in sources.taps)
        """every tap, with its name in /proc/net/dev (:data:`NetCounters`)"""
        tap = sources.taps[0] if len(sources.taps) == 1 else ""
        self._tap, self._tap_key = tap, tap.encode()
        """the only tap of a VM with one (most), read without a loop; else empty"""
        self._guest: tuple[int, int] | None = None
        """the only tap's counters last read, and the interfaces' mapping made of them"""
        self._nics: dict[str, tuple[int, int]] = {}

    @property
    def is_open(self) -> bool:
        """Whether the files are open: closed until the first reading, and after a reading
        that failed to read one (not one that only failed to parse it)."""
        return self._cpu_fd >= 0

    def read(self, net: NetCounters | None, page_size: int) -> KernelCounters:
        """The counters, with every interface's ``net``
        (:class:`~gmd.agent.collect.kernel_parsers.NetDevParser`, read once per tick for every
        VM); :class:`KernelReadError` names the first file that could not be read or parsed.
        Without an io file the disks are left empty."""
        return KernelCounters._make(self.counters(net, page_size))

    def counters(
        self, net: NetCounters | None, page_size: int
    ) -> tuple[int, int, Mapping[str, tuple[int, int]], Mapping[str, tuple[int, int]]]:
        """:meth:`read`'s counters as a plain tuple, for the tick (cheaper to make)."""
        at = 0
        try:
            if self._cpu_fd < 0:
                self._open()
            cpu = _pread(self._cpu_fd, _CHUNK, 0)
            at = 1
            statm = _pread(self._statm_fd, _CHUNK, 0)
            if self._io_fd >= 0:
                at = 2
                io = _pread(self._io_fd, _CHUNK, 0)
                if len(io) == _CHUNK:  # dozens of devices: the rest of the record
                    io = _rest(self._io_fd, io)
            else:
                io = b""
        except OSError as exc:
            self.close()
            raise KernelReadError(f"{self._paths[at]}: {exc.strerror or exc}") from None
        try:
            at = 0
            cpu_ns = cpu_stat_ns(cpu) if self._cpu_stat else int(cpu)
            if statm != self._statm:
                at = 1
                self._pages = int(statm.split(None, 2)[1])
                self._statm = statm
            if io != self._io:
                at = 2
                self._disks = io_stat_devices(io) if self._io_v2 else blkio_devices(io)
                self._io = io
        except (ValueError, IndexError) as exc:
            raise KernelReadError(f"{self._paths[at]}: unexpected content ({exc})") from None
        # The guest's view (NetCounters): what the host's tap transmits, the guest received.
        if self._tap:
            try:
                guest = net[self._tap_key]  # type: ignore[index]
            except (KeyError, TypeError):  # not there, or /proc/net/dev unread (None)
                raise KernelReadError(self._no_tap(self._tap)) from None
            if guest is not self._guest:
                self._nics = {self._tap: guest}
                self._guest = guest
            return cpu_ns, self._pages * page_size, self._disks, self._nics
        nics = {}
        for tap, key in self._taps:
            guest = None if net is None else net.get(key)
            if guest is None:
                raise KernelReadError(self._no_tap(tap))
            nics[tap] = guest
        return cpu_ns, self._pages * page_size, self._disks, nics

    def io_again(self) -> Mapping[str, tuple[int, int]]:
        """The I/O file's devices read again, alone (parsed only when its bytes changed): the
        disk check's second look, after QEMU's figures
        (:class:`~gmd.agent.collect.kernel_disks.DiskCheck`). Empty without an I/O file;
        :class:`KernelReadError` when it cannot be read or parsed (a file that failed to read
        closes them all, as at :meth:`counters`)."""
        if self._io_fd < 0:
            return {}
        try:
            io = _pread(self._io_fd, _CHUNK, 0)
            if len(io) == _CHUNK:
                io = _rest(self._io_fd, io)
        except OSError as exc:
            self.close()
            raise KernelReadError(f"{self._paths[2]}: {exc.strerror or exc}") from None
        if io != self._io:
            try:
                self._disks = io_stat_devices(io) if self._io_v2 else blkio_devices(io)
            except (ValueError, IndexError) as exc:
                raise KernelReadError(f"{self._paths[2]}: unexpected content ({exc})") from None
            self._io = io
        return self._disks

    @staticmethod
    def _no_tap(tap: str) -> str:
        return f"interface {tap} is not among the host's (/proc/net/dev)"

    def _open(self) -> None:
        fds = []
        for path in self._paths:
            try:
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                raise KernelReadError(f"{path}: {exc.strerror or exc}") from None
        self._cpu_fd, self._statm_fd = fds[0], fds[1]
        self._io_fd = fds[2] if len(fds) > 2 else -1

    def close(self) -> None:
        for fd in (self._cpu_fd, self._statm_fd, self._io_fd):
            if fd >= 0:
                os.close(fd)
        self._cpu_fd = self._statm_fd = self._io_fd = -1
