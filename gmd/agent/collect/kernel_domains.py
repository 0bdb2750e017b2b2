"""Each domain as the kernel collector knows it between ticks, and what a tick reads.

What a domain's XML and its QEMU process say is its :class:`KernelDescription`, made by
:class:`DomainDescriber`; what a tick reads of them all, its :class:`TickPlan`.

What the counters need (the QEMU pid from libvirt's pid file, its cgroups from
``/proc/<pid>/cgroup`` and the mount table, the taps and the owner from the domain XML) is
cached per domain and read again every ``describe_every_s``, when the domain's id changes (its
process restarted), when a domain appears, and when its files fail to read (a removed cgroup's
give ENODEV, a dead process's ESRCH): they are opened again only by the paths its QEMU of the
moment gives, never by the old ones, which a recycled pid or a cgroup made again may now give
to another process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmd.agent.cgroups import CgroupLocator, CgroupMounts, CgroupNotFound
from gmd.agent.collect.base import Ownership, VmReading, vm_reading
from gmd.agent.collect.kernel_disks import (
    DiskCheck,
    DiskPlan,
    enable_io_accounting,
    host_device,
    plan_disks,
)
from gmd.agent.collect.kernel_files import (
    CounterFiles,
    IoFile,
    KernelReadError,
    KernelSources,
    counter_files,
)
from gmd.agent.collect.libvirt import describe

log = logging.getLogger(__name__)


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
            uuid, self.run_id, taken_s, cpu_ns, rss, NO_DISKS, nics, self.owner, self.name
        )


NO_DISKS: Mapping[str, tuple[int, int]] = {}
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


class DomainDescriber:
    """Makes a domain's :class:`KernelDescription`: its name, owner and disks from its XML,
    its counter files from its QEMU process (libvirt's pid file, that process's cgroups under
    ``cgroups``' mounts, ``proc``), and the disk check its disks allow (their host devices
    under ``sys_dev_block``). Remembers across domains the devices whose v1 I/O accounting it
    set up, so each is set up once per agent process."""

    def __init__(
        self,
        cgroups: CgroupLocator,
        *,
        proc: Path,
        sys_dev_block: Path,
        default_customer: str | None,
    ) -> None:
        self.cgroups = cgroups
        self.proc = proc
        self.sys_dev_block = sys_dev_block
        self.default_customer = default_customer
        self._io_counted: set[str] = set()
        """host devices whose v1 I/O accounting this describer set up (:meth:`_count_io`)"""

    def mounts(self) -> CgroupMounts:
        """The host's cgroup mounts, read once per round of descriptions (none when they
        cannot be read: every domain then falls back to libvirt, said per VM)."""
        try:
            return self.cgroups.mounts()
        except CgroupNotFound as exc:
            log.warning("cannot read the cgroup mounts: %s", exc)
            return CgroupMounts({}, None)

    def describe(
        self,
        xml: str,
        run_id: int,
        before: KernelDescription | None,
        mounts: CgroupMounts,
        fetched_s: float,
    ) -> KernelDescription:
        """The domain of ``xml`` whose process is ``run_id``, described at ``fetched_s``
        (monotonic). What ``before`` (its last description) holds of the same process is
        kept: its open files while their paths are the same, its disk check, whether a tick
        has read it."""
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
            fetched_s,
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
