"""What the kernel collector counts as a VM's disk use, and how QEMU's figures check it.

Disk use is what reached the host's disk, which is what contends it and what its capacity
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
"""

from __future__ import annotations

import contextlib
import os
import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gmd.agent.collect.libvirt import counted_disks
from gmd.agent.disks import SYS_DEV_BLOCK, whole_disk

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


def why_they_disagree(verdict: DiskVerdict, *, blkio_v1: bool) -> str:
    """For the log: why a VM's cgroup may have come to disagree with its QEMU's block stats
    (a disagreeing :class:`DiskVerdict`), as far as the figures tell. ``blkio_v1``: its I/O
    file is v1's ``blkio.throttle.io_service_bytes``."""
    if verdict.unseen:
        why = (
            f"its cgroup has no line for {', '.join(verdict.unseen)}: the kernel counted"
            " none of its I/O there"
        )
        if blkio_v1:
            why += (
                " (under cgroup v1, Linux 6.10 and later count a device's I/O in"
                " blkio.throttle.* only once a throttle limit has been set on that"
                " device, by anyone, and from then on)"
            )
        return why
    if sum(verdict.cgroup) < sum(verdict.qemu):
        return (
            "the host did less I/O than the guest asked (a sparse image's holes cost"
            " none) or its cgroup missed some"
        )
    return (
        "the host did more I/O than the guest asked (an image format's metadata,"
        " another process in the VM's cgroup)"
    )
