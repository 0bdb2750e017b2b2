"""The kernel-counter collector: libvirt to list and describe domains, the kernel's files for
the counters (issue 19).

The libvirt collector's ``getAllDomainStats`` asks every QEMU over its monitor socket for
every counter, every tick: ~5–7 ms of libvirtd and QEMU time per VM. The kernel already keeps
the CPU, memory and network counters, so per tick this collector reads files for those, and
asks libvirt only for the disks' bytes, in one call for every VM (below); it lists the domains
(``listAllDomains``: ids and uuids, no QEMU involved) only after a lifecycle event
(:mod:`gmd.agent.collect.lifecycle`) or every ``describe_every_s``. Per VM it reads two or
three files, and one file for every VM's network:

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
- disk: what reached the host's disk, which is what contends it and what its capacity
  (``agent.disk_bytes_per_s``) bounds: for a VM whose local disks QEMU opens ``O_DIRECT``
  (``cache='none'``, as Nova opens them, or ``directsync``) the bytes its cgroup counted on the
  host devices under them (v1 ``blkio.throttle.io_service_bytes``, v2 ``io.stat``, named
  ``host:MAJ:MIN``); for any other disk (a network disk: socket I/O no cgroup counts; a cached
  one: the host's page cache serves it) QEMU's block stats, by the guest's device. QEMU's block
  stats (``block.N.rd.bytes``/``wr.bytes``: what the guest asked) are asked in one bulk call
  (``domainListGetStats``, the block group only, ``NOWAIT``): every tick of the VMs whose disk
  use they are, once a ``check_every_s`` of the others, for the check. They are not the measure
  where the cgroup's bytes can be had: a guest reading a sparse image's holes asks for bytes no
  disk serves (a test cloud's guests: 1 GB/s of zeroes, twice the host's disk, which the daemon
  rightly refuses as more than the host can give). Under cgroup v1, Linux 6.10 and later count a
  device's I/O in ``blkio.throttle.*`` only once a throttle limit has been set on it
  (``blk_throtl_activated``; on an untouched host they stayed at 0 while a guest read: issue
  42), so the collector sets that up for every device it reads (:func:`enable_io_accounting`),
  and says so, with the command, where it may not. QEMU's figures check the cgroup's
  (:class:`DiskCheck`): byte for byte where the kernel counts, O_DIRECT; a VM whose cgroup
  disagrees (a device not counted, a sparse image's holes) is logged once (again when they agree
  again) and named in the reading (``disk_disagreements``).

What the counters need (the QEMU pid from libvirt's pid file, its cgroups from
``/proc/<pid>/cgroup`` and the mount table, the taps and the owner from the domain XML) is
cached per domain and read again every ``describe_every_s``, when the domain's id changes (its
process restarted), when a domain appears, and when its files fail to read (a removed cgroup's
give ENODEV, a dead process's ESRCH): they are opened again only by the paths its QEMU of the
moment gives, never by the old ones, which a recycled pid or a cgroup made again may now give
to another process. The files are kept open while it runs, and a tick in which no domain
started, stopped or is due to be described does nothing but read them (:class:`TickPlan`):
issue 33 holds the tick's own CPU within 1.5 times that of the ``pread`` of its files.

A domain about to end is read at its lifecycle event: when the guest shut down (QEMU has
stopped its vCPUs and libvirt is about to kill it) or was paused (at the end of an outgoing
migration), so the use between the last tick and its end is sent with the next tick instead
of being lost with its process. A domain destroyed outright (``virsh destroy``, Nova deleting
a running server) gives no such moment: libvirt removes its cgroups before it says it
stopped, so its use since the last tick (at most one tick's) is lost, as with the libvirt
collector. Its disks' bytes since the last tick are lost in both cases: QEMU's block stats are
not asked at an event.

A VM whose files cannot be read is read through libvirt for the tick (the reading's
``fallbacks`` names it; the agent counts them; logged once per VM). Its disks are QEMU's block
stats either way, named by the guest's devices (``vda``), so a VM read now from its files and
now through libvirt is measured from its last counters: nothing lost or counted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import stat
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import libvirt

from gmd import GmdError
from gmd.agent.cgroups import (
    LIBVIRT_QEMU_RUN,
    PROC,
    CgroupLocator,
    CgroupMounts,
    CgroupNotFound,
    DomainCgroups,
)
from gmd.agent.collect.base import (
    FailureKind,
    HostReading,
    HostResources,
    Ownership,
    ReadFailure,
    VmReading,
    vm_reading,
)
from gmd.agent.collect.host import HostCpu
from gmd.agent.collect.libvirt import (
    LibvirtCollector,
    bulk_devices,
    counted_disks,
    describe,
)
from gmd.agent.collect.lifecycle import (
    LAST_MOMENTS,
    Lifecycle,
    LifecycleWatch,
    start_event_loop,
)
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter
from gmd.agent.disks import SYS_DEV_BLOCK, whole_disk
from gmd.agent.libvirt_conn import CONNECTION_LOST, DOMAIN_GONE_OR_INVALID, LibvirtConnection

log = logging.getLogger(__name__)


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


# --- which files (pure) --------------------------------------------------------------------


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


# --- the counter files (pure parsers) --------------------------------------------------------
#
# The collector parses the bytes it reads (the ``_`` functions below) without decoding them:
# every VM's files are parsed every tick. The ``parse_*`` functions take text, for the tests
# and the tools, and answer as they do.


def parse_cpuacct_usage(text: str) -> int:
    """v1 ``cpuacct.usage``: one integer, nanoseconds."""
    return int(text.strip())


def _cpu_stat_ns(data: bytes) -> int:
    """v2 ``cpu.stat``'s ``usage_usec``, as nanoseconds. The kernel prints it first: the
    first two fields are split off alone when they are that (the file has a dozen lines)."""
    head = data.split(None, 2)
    try:
        if head[0] == b"usage_usec":
            return int(head[1]) * 1000
    except (IndexError, ValueError):
        pass  # the general case says what is wrong
    fields = data.split()
    try:
        return int(fields[fields.index(b"usage_usec") + 1]) * 1000
    except ValueError:
        raise ValueError("no usage_usec") from None


def parse_cpu_stat(text: str) -> int:
    """v2 ``cpu.stat``'s ``usage_usec``, as nanoseconds."""
    return _cpu_stat_ns(text.encode())


def parse_statm_resident(text: str, page_size: int) -> int:
    """``/proc/<pid>/statm``'s second field (resident pages), in bytes."""
    return int(text.split(None, 2)[1]) * page_size


# The parsers below run for every VM and tick: one regular expression each, which finds every
# device in one call. The kernel prints a device's lines (v1: Read, Write, Sync, Async,
# Discard, Total) and fields (v2: rbytes= wbytes= rios= …) in a fixed order; a file with a
# device the expression does not match is an error rather than a VM without disk I/O.
# (Possessive quantifiers: they match what greedy ones would, without backtracking.)
_BLKIO_DEVICE = re.compile(rb"^(\S++) Read (\d++)\n\1 Write (\d++)$", re.M)
_IO_STAT_DEVICE = re.compile(rb"^(\S++) rbytes=(\d++) wbytes=(\d++)", re.M)


def _blkio_service_bytes(data: bytes) -> dict[str, tuple[int, int]]:
    out = {f"host:{dev.decode()}": (int(r), int(w)) for dev, r, w in _BLKIO_DEVICE.findall(data)}
    if len(out) != data.count(b" Read "):
        raise ValueError("a device without its Read and Write lines")
    return out


def _io_stat(data: bytes) -> dict[str, tuple[int, int]]:
    out = {f"host:{dev.decode()}": (int(r), int(w)) for dev, r, w in _IO_STAT_DEVICE.findall(data)}
    if len(out) != data.count(b" rbytes="):
        raise ValueError("a device line without rbytes= and wbytes=")
    return out


def parse_blkio_service_bytes(text: str) -> dict[str, tuple[int, int]]:
    """v1 ``blkio.throttle.io_service_bytes``: ``{"host:MAJ:MIN": (read, written)}``. A device
    appears once it has done I/O; the ``Total`` line is the sum of the others."""
    return _blkio_service_bytes(text.encode())


def parse_io_stat(text: str) -> dict[str, tuple[int, int]]:
    """v2 ``io.stat``: ``{"host:MAJ:MIN": (rbytes, wbytes)}``."""
    return _io_stat(text.encode())


def _read(path: Path) -> str:
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


NetCounters = Mapping[bytes, tuple[int, int]]
"""Every interface's bytes as its guest sees them, ``{name: (received, transmitted)}``
(:func:`net_dev_guest_view`), read once per tick for every VM's taps."""


_UNSEEN: tuple[bytes, tuple[int, int]] = (b"", (0, 0))
"""a line not parsed before (by identity)"""


class NetDevParser:
    """Parses ``/proc/net/dev``'s bytes per interface, as a guest on it as a tap sees them:
    swapped as libvirt swaps them (what the host's tap transmits, the guest received). Two
    header lines, then ``name: rx_bytes rx_packets … (8 fields) tx_bytes …``.

    The file has a line per interface of the host and is parsed every tick: on 100 VMs,
    parsing it all took a tenth of the time the ``pread`` of every VM's files takes. So names
    are left as bytes, and a line the same as at the last parse (an interface that moved no
    packet: idle taps, the host's unused devices) is not parsed again, which is safe because
    a line's parse is a function of its bytes alone. A line that changed costs a lookup more
    than before.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[bytes, tuple[bytes, tuple[int, int]] | None] = {}
        """each line of the last parse → its interface and counters (``None``: not one)"""

    def __call__(self, data: bytes) -> dict[bytes, tuple[int, int]]:
        lines = data.splitlines()
        del lines[:2]
        last: dict[bytes, tuple[bytes, tuple[int, int]] | None] = {}
        out = {}
        known = self._last.get
        for line in lines:
            item = known(line, _UNSEEN)
            if item is _UNSEEN:
                name, sep, rest = line.partition(b":")
                fields = rest.split(None, 9)  # the nine first, not the sixteen
                if sep and len(fields) >= 9:
                    item = (name.strip(), (int(fields[8]), int(fields[0])))
                else:
                    item = None
            last[line] = item
            if item is not None:
                out[item[0]] = item[1]
        self._last = last
        return out


def net_dev_guest_view(data: bytes) -> dict[bytes, tuple[int, int]]:
    """``/proc/net/dev``'s ``{interface: (received, transmitted)}`` bytes as a guest on it as
    a tap sees them (:class:`NetDevParser`)."""
    return NetDevParser()(data)


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev``: ``{interface: (received, transmitted)}`` bytes, as the host sees
    them."""
    return {name.decode(): (rx, tx) for name, (tx, rx) in net_dev_guest_view(text.encode()).items()}


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
    interfaces' mapping is made again only when :class:`NetDevParser` made their counters
    anew. Each is a function of the bytes alone, so this changes no figure; the mappings are
    then the last reading's objects, which is safe because readings never change their
    mappings (the agent copies them, :mod:`gmd.agent.collect.counters`). The state a reading
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
        """The counters, with every interface's ``net`` (:class:`NetDevParser`, read once
        per tick for every VM); :class:`KernelReadError` names the first file that could
        not be read or parsed. Without an io file the disks are left empty."""
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
            cpu_ns = _cpu_stat_ns(cpu) if self._cpu_stat else int(cpu)
            if statm != self._statm:
                at = 1
                self._pages = int(statm.split(None, 2)[1])
                self._statm = statm
            if io != self._io:
                at = 2
                self._disks = _io_stat(io) if self._io_v2 else _blkio_service_bytes(io)
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
        disk check's second look, after QEMU's figures (:class:`DiskCheck`). Empty without an
        I/O file; :class:`KernelReadError` when it cannot be read or parsed (a file that failed
        to read closes them all, as at :meth:`counters`)."""
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
                self._disks = _io_stat(io) if self._io_v2 else _blkio_service_bytes(io)
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


DIRECT_CACHE_MODES = frozenset({"none", "directsync"})
"""Cache modes in which QEMU opens a local disk with ``O_DIRECT``: every guest request reaches
the host's block layer, so the cgroup's bytes can be checked against QEMU's (equal, byte for
byte, on a real guest where the kernel counts: ``docs/agent.md``). In the others
(``writeback``, the default, ``writethrough``, ``unsafe``) the host's page cache serves reads
and, under cgroup v1, flushes writes from its own threads: the cgroup sees little or none of
the guest's I/O, and is not checked."""
LOCAL_DISK_TYPES = frozenset({"file", "block"})


class LocalDisk(NamedTuple):
    """A local disk whose bytes the cgroup's are checked against: its target, its source's
    path, and whether that is a block device (else a file)."""

    target: str
    path: str
    block: bool


@dataclass(frozen=True, slots=True)
class DiskPlan:
    """How a domain's disks are counted: every disk with a source, by QEMU's block stats
    (``block_stats``: their targets); and the disks the cgroup's bytes are checked against
    (``checked``): its local disks when QEMU opens them all ``O_DIRECT``, else none (one left
    to the host's page cache blurs the cgroup's bytes of every disk on its device)."""

    block_stats: tuple[str, ...]
    checked: tuple[LocalDisk, ...] = ()


def plan_disks(xml: str) -> DiskPlan:
    """Every disk with a source from QEMU's block stats; the cgroup checked against the local
    ones (files and block devices) when they are all opened ``O_DIRECT``
    (:data:`DIRECT_CACHE_MODES`). Network disks (RBD, iSCSI, NBD, …: QEMU's socket I/O, which
    no cgroup file counts) and storage-pool volumes (either) are never checked."""
    every, local, unchecked = [], [], False
    for disk, dev in counted_disks(ET.fromstring(xml)):
        every.append(dev)
        kind = disk.get("type")
        if kind not in LOCAL_DISK_TYPES:
            continue
        driver, source = disk.find("driver"), disk.find("source")
        cache = driver.get("cache") if driver is not None else None
        path = source.get("dev" if kind == "block" else "file") if source is not None else None
        if cache not in DIRECT_CACHE_MODES or not path:
            unchecked = True
        else:
            local.append(LocalDisk(dev, path, kind == "block"))
    return DiskPlan(tuple(every), () if unchecked else tuple(local))


def host_device(disk: LocalDisk, sys_dev_block: Path = SYS_DEV_BLOCK) -> str | None:
    """The host block device that counts ``disk``'s I/O, as the cgroup's I/O file names it
    (``host:MAJ:MIN``: the whole disk, whose queue the kernel counts per cgroup, not a
    partition of it); ``None`` when there is none or it cannot be told: a file on a filesystem
    of no block device (NFS, tmpfs; overlay and btrfs give anonymous devices), a source that
    is not there."""
    try:
        st = os.stat(disk.path)
    except OSError:
        return None
    if disk.block and not stat.S_ISBLK(st.st_mode):
        return None
    dev = st.st_rdev if disk.block else st.st_dev
    name = f"{os.major(dev)}:{os.minor(dev)}"
    whole = whole_disk(name, sys_dev_block)
    if whole is None or (whole == name and not (sys_dev_block / name).exists()):
        return None
    return f"host:{whole}"


JUDGED_BYTES = 1 << 20
"""a direction (read, written) is judged once the cgroup or QEMU moved this many bytes in it"""
AGREE_FACTOR = 2
"""the cgroup agrees with QEMU in a direction when neither counted more than this many times
the other: the host's own I/O for a disk (a filesystem's or an image format's metadata, ~3 %
measured) is within it, a cgroup that counts nothing or a sparse image's holes are not"""
SETTLED_AFTER = 2
"""judged spans in a row that must say otherwise before a VM's check changes its mind: I/O in
flight at a tick (the cgroup counts a request when it is sent, QEMU when it is done) sways one
span, not two"""


def disk_counters_agree(
    cgroup: tuple[int, int], qemu: tuple[int, int], cgroup_high: tuple[int, int] | None = None
) -> bool | None:
    """Whether a VM's cgroup counted, over one span, the bytes (read, written) its QEMU's
    block stats counted: within :data:`AGREE_FACTOR` of each other in each direction in which
    either moved :data:`JUDGED_BYTES`; ``None`` when neither did in either direction (too
    little I/O to tell). ``cgroup_high``: where the cgroup was read twice at each end of the
    span, around QEMU's figures, the most it can have counted in the span (``cgroup`` is then
    the least): they disagree only if they do whatever it counted in between."""
    high = cgroup if cgroup_high is None else cgroup_high
    verdict = None
    for low, top, guest in zip(cgroup, high, qemu, strict=True):
        if max(low, guest) < JUDGED_BYTES:
            continue
        if AGREE_FACTOR * top < guest or low > AGREE_FACTOR * guest:
            return False
        verdict = True
    return verdict


class DiskVerdict(NamedTuple):
    """A VM's cgroup came to agree or disagree with its QEMU (:meth:`DiskCheck.observe`): over
    the spans that decided it, the bytes (read, written) each counted, and the checked devices
    that the cgroup's I/O file has no line for (the kernel counted no I/O of the VM's on them
    at all)."""

    agree: bool
    span_s: float
    cgroup: tuple[int, int]
    qemu: tuple[int, int]
    unseen: tuple[str, ...]


_Look = tuple[float, int, int, int, int, int, int]
"""both counters at one tick: when; the cgroup's bytes read and written as read before QEMU's
and after them; QEMU's bytes read and written"""


@dataclass(slots=True)
class DiskCheck:
    """The check of one VM process's disk bytes: its cgroup's on ``devices`` (``host:MAJ:MIN``)
    against QEMU's block stats of ``targets`` (its local disks, opened ``O_DIRECT``), over
    spans from one tick that read both to a later one. A span in which too little moved to
    judge (:func:`disk_counters_agree`), or in which QEMU's were not read (a busy domain), goes
    on to the next tick that reads both. The cgroup is read just before and just after QEMU's
    figures (a burst of I/O between the two reads then sways no verdict), and the check changes
    its mind only when :data:`SETTLED_AFTER` judged spans in a row say so."""

    devices: tuple[str, ...]
    targets: tuple[str, ...]
    since: _Look | None = None
    """the span's start"""
    agree: bool | None = None
    """what the check holds (``None``: nothing yet)"""
    leaning: bool | None = None
    """the verdict of the last judged spans, when it is not :attr:`agree`"""
    spans: int = 0
    """how many judged spans in a row said :attr:`leaning`"""
    leaning_from: _Look | None = None
    """the start of the first of them"""

    def observe(
        self,
        taken_s: float,
        cgroup: Mapping[str, tuple[int, int]],
        qemu: Mapping[str, tuple[int, int]],
        cgroup_after: Mapping[str, tuple[int, int]] | None = None,
    ) -> DiskVerdict | None:
        """Both counters at one tick: the cgroup's I/O file's devices (read before QEMU's, and,
        ``cgroup_after``, again after them) and QEMU's disks. The verdict when the check
        changed its mind: a first one only when it is a disagreement (agreeing is what is
        expected), then each change."""
        low_r, low_w = self._host(cgroup)
        high_r, high_w = (low_r, low_w) if cgroup_after is None else self._host(cgroup_after)
        guest_r = guest_w = 0
        for target in self.targets:
            counted = qemu.get(target)
            if counted is None:
                return None
            guest_r += counted[0]
            guest_w += counted[1]
        now = (taken_s, low_r, low_w, high_r, high_w, guest_r, guest_w)
        since = self.since
        if (
            since is None
            or high_r < since[1]
            or high_w < since[2]
            or guest_r < since[5]
            or guest_w < since[6]
        ):
            # The first look, or a counter went down (blkio.reset_stats): anew.
            self.since, self.spans = now, 0
            return None
        guest = (guest_r - since[5], guest_w - since[6])
        verdict = disk_counters_agree(
            (low_r - since[3], low_w - since[4]), guest, (high_r - since[1], high_w - since[2])
        )
        if verdict is None:
            return None
        self.since = now
        if verdict == self.agree:
            self.spans = 0
            return None
        if self.spans == 0 or verdict != self.leaning:
            self.leaning, self.spans, self.leaning_from = verdict, 0, since
        self.spans += 1
        if self.spans < SETTLED_AFTER:
            return None
        first, start = self.agree is None, self.leaning_from or since
        self.agree, self.spans = verdict, 0
        if first and verdict:
            return None
        unseen = tuple(dev for dev in self.devices if dev not in (cgroup_after or cgroup))
        host = (low_r - start[1], low_w - start[2])
        return DiskVerdict(
            verdict, taken_s - start[0], host, (guest_r - start[5], guest_w - start[6]), unseen
        )

    def _host(self, cgroup: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        read = written = 0
        for dev in self.devices:
            counted = cgroup.get(dev)
            if counted is not None:
                read += counted[0]
                written += counted[1]
        return read, written


ACCOUNTING_GROUP = "gmd-io-accounting"
"""the v1 blkio group :func:`enable_io_accounting` sets and lifts its limit in, then removes"""
NO_LIMIT_BPS = 1 << 40
"""1 TiB/s: a limit no disk reaches, set for an instant in a group of no process"""


def enable_io_accounting(blkio_root: Path, devices: Iterable[str]) -> dict[str, str]:
    """Make a v1 kernel count every cgroup's I/O on ``devices`` (``host:MAJ:MIN``).

    Since Linux 6.10 ("blk-throttle: delay initialization until configuration") a device's
    throttling is set up only when a throttle limit is first written for it, and under cgroup
    v1 ``blkio.throttle.io_service_bytes`` counts only on a device so set up; the set-up
    lasts as long as the device. So a limit no disk reaches is written for each device in a
    group of gmd's own that holds no process, lifted at once, and the group removed: nothing
    is ever throttled, and from then on the VMs' groups count their I/O there (measured:
    byte for byte with QEMU's block stats on a guest whose disk QEMU opens ``O_DIRECT``).
    Harmless on an older kernel, which counts anyway. Returns the devices it could not do
    this for, with why (the agent is not root, a device went away)."""
    group = blkio_root / ACCOUNTING_GROUP
    failed: dict[str, str] = {}
    try:
        group.mkdir(exist_ok=True)
    except OSError as exc:
        return {dev: f"{group}: {exc.strerror or exc}" for dev in devices}
    try:
        for dev in devices:
            majmin = dev.removeprefix("host:")
            path = group / "blkio.throttle.read_bps_device"
            try:
                for line in (f"{majmin} {NO_LIMIT_BPS}", f"{majmin} 0"):
                    fd = os.open(path, os.O_WRONLY)  # never creates: a control file or nothing
                    try:
                        os.write(fd, line.encode())
                    finally:
                        os.close(fd)
            except OSError as exc:
                failed[dev] = f"{path}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()
    return failed


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
        _read(proc / "net" / "dev")
    except (CgroupNotFound, KernelReadError) as exc:
        return str(exc)
    if "cpuacct" not in mounts.v1 and mounts.v2 is None:
        return "no cgroup hierarchy counts CPU (neither v1 cpuacct nor v2 is mounted)"
    return ""


# --- the collector -------------------------------------------------------------------------


@dataclass(slots=True)
class KernelDescription:
    """What one domain's XML and process say, cached per process (domain id)."""

    run_id: int
    fetched_s: float
    name: str
    owner: Ownership
    files: CounterFiles | None
    """``None``: the files could not be located (``problem`` says why): read through libvirt"""
    disks: DiskPlan
    """how this domain's disks are counted"""
    problem: str = ""
    check: DiskCheck | None = None
    """its cgroup's disk bytes against QEMU's (``None``: not checked: no local disk, one not
    opened ``O_DIRECT``, no I/O file, or a host device that cannot be told); kept across
    refreshes of one process"""
    kernel_read: bool = False
    """whether a tick has read this process from its files (set at its first reading, kept
    across refreshes): only then is it read at its lifecycle events"""

    def event_reading(
        self,
        uuid: str,
        taken_s: float,
        c: tuple[int, int, Mapping[str, tuple[int, int]], Mapping[str, tuple[int, int]]],
    ) -> VmReading:
        """The VM's reading of counters ``c`` (:meth:`CounterFiles.counters`) taken at an
        event, at ``taken_s``: without disks, whose bytes only QEMU's block stats give (its
        next reading measures them from its last)."""
        cpu_ns, rss, _cgroup, nics = c
        return vm_reading(
            uuid, self.run_id, taken_s, cpu_ns, rss, _NO_DISKS, nics, self.owner, self.name
        )


_NO_DISKS: Mapping[str, tuple[int, int]] = {}
"""a reading's disks when QEMU's block stats were not read (never changed: readings never
change their mappings)"""


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What a tick reads: the listed domains, each described, in the listing's order.

    Worked out when the listing changes, a domain is due to be described again, or a VM is
    first read from its files, and kept for the ticks in between, which then only read the
    files and ask QEMU's block stats: issue 33 (the tick's own CPU within 1.5 times the
    ``pread`` of its files) leaves no room for looking each VM's state up again every tick.
    """

    listed: dict[str, tuple[Any, int]]
    """the listing it was made of (the collector's, until it lists again)"""
    describe_at: float
    """the oldest description's time (monotonic): made again once that is due"""
    vms: tuple[
        tuple[str, Any, int, KernelDescription, CounterFiles | None, bool, bool, Ownership, str],
        ...,
    ]
    """per VM to read: uuid, domain, its id, description, the counter files to read (``None``:
    read through libvirt), whether this is its process's first reading, whether it has disks
    (asked of QEMU's block stats, :func:`plan_disks`), and its owner and name from the
    description (in the tuple, which the tick reads anyway: a tick that reads its files fine
    looks nothing else up)"""
    measured: frozenset[str]
    """the listed domains that the domain filter admits"""


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
        self.default_customer = default_customer
        self.sys_dev_block = sys_dev_block
        self.domains = domains
        self._clock, self._monotonic = clock, monotonic
        self.describe_every_s = describe_every_s
        self.check_every_s = check_every_s
        self._check_due_s = 0.0
        self.proc = proc
        self.net_dev = proc / "net" / "dev"
        self.cgroups = CgroupLocator(proc=proc, run_dir=run_dir, mountinfo=mountinfo)
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
        self._io_counted: set[str] = set()
        """host devices whose v1 I/O accounting this collector set up (:meth:`_count_io`)"""
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
            return HostReading(self._clock(), False, errors=(self.conn.failure(),))
        if (
            self._events.take_changed()
            or self._listed_s is None
            or self._monotonic() - self._listed_s >= self.describe_every_s
        ):
            try:
                domains = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
            except libvirt.libvirtError as exc:
                self.conn.lost(exc, "listing domains")
                return HostReading(self._clock(), False, errors=(self.conn.failure(),))
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
        taken_s = self._clock()
        host_cpu_s = self._host_cpu.read()
        describe_before = self._monotonic() - self.describe_every_s
        vms: list[VmReading] = []
        gone: set[str] = set()
        errors: list[ReadFailure] = []
        busy: set[str] = set()
        fallback: dict[str, Any] = {}
        asked: dict[str, Any] = {}
        read: list[
            tuple[
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
        ] = []
        net = self._net()
        plan = self._plan
        if plan is None or plan.listed is not listed or plan.describe_at <= describe_before:
            plan = self._make_plan(listed, describe_before, gone, errors)
            if plan is None:
                return HostReading(taken_s, False, errors=(self.conn.failure(),))
            # A VM that could not be described is tried again at the next tick.
            self._plan = None if gone or errors else plan
        # The loops below run for every VM and tick: what they call is looked up once.
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
        qemu: dict[str, Mapping[str, tuple[int, int]]] = {}
        if asked:
            qemu, failed = self._block_stats(conn, asked)
            errors.extend(failed)
        append, disks_of = vms.append, qemu.get
        for uuid, run_id, d, files, cpu_ns, rss, cgroup, nics, owner, name in read:
            disks = guest = disks_of(uuid, _NO_DISKS)
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
                    mounts = self._mounts()
                d = self._describe(xml, run_id, d, mounts)
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
        if verdict.unseen:
            why = (
                f"its cgroup has no line for {', '.join(verdict.unseen)}: the kernel counted"
                " none of its I/O there"
            )
            io = None if d.files is None else d.files.sources.cgroups.io
            if io is not None and io[0] is IoFile.BLKIO_SERVICE_BYTES:
                why += (
                    " (under cgroup v1, Linux 6.10 and later count a device's I/O in"
                    " blkio.throttle.* only once a throttle limit has been set on that"
                    " device, by anyone, and from then on)"
                )
        elif host_r + host_w < guest_r + guest_w:
            why = (
                "the host did less I/O than the guest asked (a sparse image's holes cost"
                " none) or its cgroup missed some"
            )
        else:
            why = (
                "the host did more I/O than the guest asked (an image format's metadata,"
                " another process in the VM's cgroup)"
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
                return  # a tick let go of it meanwhile (it stopped): too late
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

    def _count_io(self, mounts: CgroupMounts, devices: tuple[str, ...]) -> None:
        """Have the kernel count the VMs' I/O on ``devices`` in their v1 cgroups, once per
        device and process (:func:`enable_io_accounting`)."""
        new = [dev for dev in devices if dev not in self._io_counted]
        if not new:
            return
        self._io_counted.update(new)
        root = mounts.v1.get("blkio")
        if root is None:
            return
        for dev, problem in enable_io_accounting(root, new).items():
            log.warning(
                "cannot make the kernel count VMs' I/O on host device %s in their cgroups"
                " (%s): under cgroup v1, Linux 6.10 and later count it only on a device some"
                " throttle limit was set on; as root, once per boot: echo '%s 1099511627776'"
                " > %s/blkio.throttle.read_bps_device && echo '%s 0' > the same file",
                dev.removeprefix("host:"),
                problem,
                dev.removeprefix("host:"),
                root,
                dev.removeprefix("host:"),
            )

    def _mounts(self) -> CgroupMounts:
        try:
            return self.cgroups.mounts()
        except CgroupNotFound as exc:
            log.warning("cannot read the cgroup mounts: %s", exc)
            return CgroupMounts({}, None)

    def _describe(
        self, xml: str, run_id: int, before: KernelDescription | None, mounts: CgroupMounts
    ) -> KernelDescription:
        name, owner, _disks, nics = describe(xml, self.default_customer)
        plan = plan_disks(xml)
        devices = self._devices(plan)
        sources: KernelSources | None = None
        problem = ""
        try:
            pid = self.cgroups.pid(name)
        except CgroupNotFound as exc:
            problem = f"no QEMU pid for {name}: {exc}"
        else:
            try:
                cgroups = counter_files(self.cgroups.of_process(pid, mounts))
                if devices is None:  # its I/O file is not read: nothing to check there
                    cgroups = dataclasses.replace(cgroups, io=None)
                sources = KernelSources(cgroups, self.proc / str(pid) / "statm", nics)
            except (CgroupNotFound, KernelReadError) as exc:
                problem = str(exc)
        same = before is not None and before.run_id == run_id
        check = None
        if devices is not None and sources is not None and sources.cgroups.io is not None:
            targets = tuple(disk.target for disk in plan.checked)
            check = before.check if before is not None and same else None
            if check is None or (check.devices, check.targets) != (devices, targets):
                check = DiskCheck(devices, targets)
            io = sources.cgroups.io
            if io[0] is IoFile.BLKIO_SERVICE_BYTES:
                self._count_io(mounts, devices)
        files = before.files if before is not None else None
        if files is not None and (sources != files.sources or not same):
            files.close()
            files = None
        if files is None and sources is not None:
            files = CounterFiles(sources)
        return KernelDescription(
            run_id,
            self._monotonic(),
            name,
            owner,
            files,
            plan,
            problem,
            check,
            kernel_read=before is not None and same and before.kernel_read,
        )

    def _devices(self, plan: DiskPlan) -> tuple[str, ...] | None:
        """The host devices of the disks whose bytes the cgroup's are checked against
        (:func:`host_device`), or ``None`` when there are none or one cannot be told."""
        if not plan.checked:
            return None
        devices: list[str] = []
        for disk in plan.checked:
            dev = host_device(disk, self.sys_dev_block)
            if dev is None:
                log.debug("disk %s (%s): no host block device to check it on", *disk[:2])
                return None
            if dev not in devices:
                devices.append(dev)
        return tuple(devices)

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
