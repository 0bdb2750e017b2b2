"""The cgroup applier, for hosts configured not to go through libvirt's tuning: it writes the
VM's cgroup files through :mod:`gmd.agent.apply.cgroupfs_writes` (v1 or v2, where its QEMU
process sits: the groups the kernel collector reads), and libvirt (read-only) only tells it
which VMs run, under which name, domain id and disks."""

from __future__ import annotations

import errno
import logging
import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import libvirt

from gmd.agent.apply.base import (
    BackendUnavailable,
    ChangeOutcome,
    PlanApplier,
    VmGone,
    VmRef,
    prefixed,
)
from gmd.agent.apply.cgroupfs import CgroupError, CgroupVersion, VmIdentity
from gmd.agent.apply.cgroupfs_report import DISK_WEIGHT_UNSUPPORTED, ApplyReport, Snapshot
from gmd.agent.apply.cgroupfs_writes import (
    CgroupBackend,
    CgroupIO,
    apply as cgroup_apply,
    dry_run,
    restore as cgroup_restore,
)
from gmd.agent.apply.libvirt import applier_connection, connect
from gmd.agent.apply.limits import LimitsError, VmLimits
from gmd.agent.apply.state import EnforceBackend
from gmd.agent.cgroups import CgroupLocator
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter
from gmd.agent.disks import block_device, disk_sources
from gmd.agent.libvirt_conn import NO_SUCH_DOMAIN, gone, reason
from gmd.wire import Knob, VmPlanItem

log = logging.getLogger(__name__)


class _DryIO(CgroupIO):
    """Reads the real files and keeps writes in memory, merging per-device lines as cgroupfs
    does, so that :func:`cgroups.apply` run through it reports what it would write and what
    the files would then read, and the real files stay as they are."""

    def __init__(self, real: CgroupIO) -> None:
        self.real = real
        self.files: dict[Path, str] = {}

    def read(self, path: Path) -> str:
        return self.files[path] if path in self.files else self.real.read(path)

    def write(self, path: Path, line: str) -> None:
        removal = _KEYED_REMOVAL.get(path.name)
        if removal is None:
            self.files[path] = line + "\n"
            return
        lines = {ln.split()[0]: ln for ln in self.read(path).splitlines() if ln.strip()}
        key, _, value = line.partition(" ")
        if removal(value):
            lines.pop(key, None)
        else:
            lines[key] = line
        self.files[path] = "".join(f"{ln}\n" for ln in lines.values())


# Files with one line per device, and the value that removes a device's line.
_KEYED_REMOVAL: dict[str, Callable[[str], bool]] = {
    "io.weight": lambda value: value == "default",
    "io.bfq.weight": lambda value: value == "default",
    "io.max": lambda value: all(f.endswith("=max") for f in value.split()),
    "blkio.throttle.read_bps_device": lambda value: value == "0",
    "blkio.throttle.write_bps_device": lambda value: value == "0",
}


_FILE_KNOBS = {
    "cpu.shares": Knob.cpu_weight,
    "cpu.weight": Knob.cpu_weight,
    "cpu.cfs_quota_us": Knob.cpu_cap,
    "cpu.max": Knob.cpu_cap,
    "blkio.weight": Knob.disk_weight,
    "blkio.bfq.weight": Knob.disk_weight,
    "io.weight": Knob.disk_weight,
    "io.bfq.weight": Knob.disk_weight,
    "blkio.throttle.read_bps_device": Knob.disk_limit,
    "blkio.throttle.write_bps_device": Knob.disk_limit,
    "io.max": Knob.disk_limit,
}


def file_knob(setting: str) -> Knob | None:
    """The knob a control file serves (``memory.*``: none of the plan's)."""
    return _FILE_KNOBS.get(setting)


class CgroupApplier(PlanApplier):
    """Writes cgroup files directly (:class:`gmd.agent.apply.cgroupfs_writes.CgroupBackend`);
    libvirt (read-only) says which VMs run and under which name, domain id and disks."""

    backend = EnforceBackend.cgroup

    def __init__(
        self,
        root: Path,
        template: str | None = None,
        *,
        state_path: Path,
        libvirt_conn_or_uri: Any = "qemu:///system",
        locator: CgroupLocator | None = None,
        version: CgroupVersion | None = None,
        io: CgroupIO | None = None,
        clock: Callable[[], float] = time.time,
        domains: DomainFilter = EVERY_DOMAIN,
    ) -> None:
        super().__init__(state_path, clock=clock, domains=domains)
        self.cgroups = CgroupBackend(Path(root), template, locator=locator, version=version, io=io)
        self._libvirt = applier_connection(libvirt_conn_or_uri, read_only=True)
        self.uri = self._libvirt.uri
        log.info("enforcement through cgroup files: %s", self.cgroups.describe())

    def close(self) -> None:
        self._libvirt.close()

    def _find(self, uuid: str) -> VmRef | None:
        conn = connect(self._libvirt)
        try:
            dom = conn.lookupByUUIDString(uuid)
            if not dom.isActive():
                return None
            return VmRef(uuid, dom.name(), dom.ID(), dom)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in NO_SUCH_DOMAIN:
                return None
            self._libvirt.close()
            raise BackendUnavailable(f"libvirt {self.uri}: looking up VM {uuid}: {exc}") from None

    def _identity(self, vm: VmRef) -> VmIdentity:
        return VmIdentity(name=vm.name, uuid=vm.uuid, id=vm.run_id)

    def _snapshot(self, vm: VmRef, known: dict[str, Any]) -> dict[str, Any]:
        if known:
            return known
        return self.cgroups.read_current(self._identity(vm)).to_dict()

    def _limits(
        self, vm: VmRef, item: VmPlanItem, skip: frozenset[Knob] = frozenset()
    ) -> tuple[VmLimits, list[str]]:
        """What to hold the VM to (the knobs of ``skip``, which this host lacks, left free)."""
        errors: list[str] = []
        io = {} if Knob.disk_limit in skip else self._disk_caps(vm, item, errors)
        try:
            limits = VmLimits(
                cpu_weight=None if Knob.cpu_weight in skip else item.cpu_weight,
                cpu_quota=None if Knob.cpu_cap in skip else item.cpu_quota_cores,
                io_weight=None if Knob.disk_weight in skip else item.io_weight,
                io_bytes_per_s=io,
            )
        except LimitsError as exc:
            errors.append(f"plan item unusable: {exc}")
            limits = VmLimits()
        return limits, errors

    def _disk_caps(
        self, vm: VmRef, item: VmPlanItem, errors: list[str]
    ) -> dict[str, tuple[int | None, int | None]]:
        """The plan's disk caps per host block device behind the VM's disks, split evenly so
        that the VM as a whole stays under them; why there are none goes to ``errors``."""
        read, write = item.disk_read_bytes_per_s, item.disk_write_bytes_per_s
        if read is None and write is None:
            return {}
        try:
            sources = disk_sources(vm.handle.XMLDesc(0))
        except (libvirt.libvirtError, ET.ParseError) as exc:
            if isinstance(exc, libvirt.libvirtError) and gone(vm.handle, exc):
                raise VmGone(vm.uuid) from None
            errors.append(f"disk caps: cannot read the domain XML: {reason(exc)}")
            return {}
        devices = sorted({d for d in map(block_device, sources) if d is not None})
        if not devices:
            errors.append("disk caps: no local block device behind its disks; not applied")
            return {}
        share = [None if c is None else max(1, math.floor(c / len(devices))) for c in (read, write)]
        return {d: (share[0], share[1]) for d in devices}

    knob_of = staticmethod(file_knob)

    def _apply(
        self,
        vm: VmRef,
        item: VmPlanItem,
        originals: dict[str, Any],
        *,
        dry: bool,
        skip: frozenset[Knob] = frozenset(),
    ) -> ChangeOutcome:
        limits, errors = self._limits(vm, item, skip)
        outcome = self._run(vm, originals, limits, list(errors), dry=dry)
        for error in errors:  # the plan item's own: disk caps without a device, bad limits
            for knob in [Knob.disk_limit] if error.startswith("disk") else item.asks():
                outcome.knob_failed(knob, error)
        return outcome

    def _restore(self, vm: VmRef, originals: dict[str, Any], *, dry: bool) -> ChangeOutcome:
        return self._run(vm, originals, None, [], dry=dry)

    def _run(
        self,
        vm: VmRef,
        originals: dict[str, Any],
        limits: VmLimits | None,
        errors: list[str],
        *,
        dry: bool,
    ) -> ChangeOutcome:
        try:
            cg = self.cgroups.locate(self._identity(vm))
            snapshot = Snapshot.from_dict(originals)
            io = _DryIO(self.cgroups.io) if dry else self.cgroups.io
            with dry_run() if dry else nullcontext():
                if limits is None:
                    report = cgroup_restore(cg, snapshot, io=io)
                else:
                    report = cgroup_apply(cg, limits, snapshot, io=io)
        except CgroupError as exc:
            outcome = ChangeOutcome(errors=prefixed(vm, [*errors, str(exc)]))
            for knob in _asked(limits):
                outcome.knob_failed(knob, str(exc))
            return outcome
        if not dry and not errors and _vanished(vm, report):
            raise VmGone(vm.uuid)
        outcome = ChangeOutcome()
        for error in errors:
            outcome.knob_failed(
                Knob.disk_limit if error.startswith("disk") else Knob.cpu_cap, error
            )
        for r in report.results:
            name = Path(r.path).name
            if r.changed:
                outcome.before[name], outcome.after[name] = r.before, r.after
            if not r.ok and r.error:
                errors.append(r.error)
                failed = file_knob(name)
                if failed is not None:
                    outcome.knob_failed(failed, r.error)
        if DISK_WEIGHT_UNSUPPORTED in report.unsupported:
            outcome.unsupported[Knob.disk_weight] = report.unsupported[DISK_WEIGHT_UNSUPPORTED]
        outcome.errors = prefixed(vm, errors)
        return outcome


def _asked(limits: VmLimits | None) -> list[Knob]:
    if limits is None:
        return []
    asked = []
    if limits.cpu_weight is not None:
        asked.append(Knob.cpu_weight)
    if limits.cpu_quota is not None:
        asked.append(Knob.cpu_cap)
    if limits.io_weight is not None:
        asked.append(Knob.disk_weight)
    if limits.io_bytes_per_s:
        asked.append(Knob.disk_limit)
    return asked


def _vanished(vm: VmRef, report: ApplyReport) -> bool:
    """Every file failed for want of a cgroup directory, under a VM that no longer runs."""
    failures = [r for r in report.results if not r.ok and r.error]
    if not failures or any(r.errno != errno.ENOENT for r in failures):
        return False
    try:
        return not vm.handle.isActive()
    except libvirt.libvirtError:
        return True
