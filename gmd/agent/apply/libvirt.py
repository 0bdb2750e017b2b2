"""The default applier: LIVE libvirt tuning, never the persistent definition.

``VIR_DOMAIN_AFFECT_LIVE`` only (the binding refuses LIVE|CONFIG together): ``cpu_shares``,
``vcpu_quota``/``vcpu_period`` (setSchedulerParametersFlags), blkio ``weight``
(setBlkioParameters) and per-disk ``read_bytes_sec``/``write_bytes_sec`` (setBlockIoTune). Disk
caps go through ``blockIoTune`` rather than blkio's ``device_read_bytes_sec``: blkio throttles
need the *host* block device behind a disk ("/dev/sda,BYTES"), which a file on a shared
filesystem or a Ceph/iSCSI disk opened by QEMU itself does not have, while QEMU's own I/O
throttling works per guest disk whatever backs it (it is what Nova's ``quota:disk_*`` flavor
keys use too). A VM's cap is split evenly over its disks, so the VM as a whole stays under it.
Interface bandwidth is not applied: it needs ``tc`` (kernel modules absent on these hosts, and
a failed live change can leave a VM's NIC half-configured); the plan carries no network cap
today and the applier logs that once.

Weights are relative to the VM's own original value: the plan's scale has 100 = normal, so a
weight of 25 sets a quarter of what the VM had. On cgroup v2 a normal VM has ``cpu_shares``
100 and gets exactly the plan's number; on cgroup v1 (default 1024) or with a flavor's
``quota:cpu_shares`` the proportion is what is kept, which is what "a weight factor" means.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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
from gmd.agent.apply.limits import (
    BLKIO_WEIGHT_DEFAULT_BFQ,
    CFS_PERIOD_DEFAULT_US,
    SHARES_MAX,
    SHARES_MIN,
    WEIGHT_DEFAULT,
    WEIGHT_MAX,
    cpu_quota_to_us,
    io_weight_to_blkio,
    round_half_up,
)
from gmd.agent.apply.state import EnforceBackend, Settings
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter
from gmd.agent.libvirt_conn import (
    CONNECTION_LOST,
    NO_SUCH_DOMAIN,
    LibvirtConnection,
    gone,
    reason,
)
from gmd.wire import Knob, KnobSupport, VmPlanItem

log = logging.getLogger(__name__)

LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE
SCHED_KEYS = ("cpu_shares", "vcpu_quota", "vcpu_period")
IOTUNE_KEYS = ("total_bytes_sec", "read_bytes_sec", "write_bytes_sec")

# One libvirt call that changes a group of knobs: what to call it in an error, its knobs, the call.
Write = tuple[str, list[str], Callable[[], Any]]

# The groups of settings read (and written) by one call each, and the knobs each serves.
GROUP_KNOBS: dict[str, tuple[Knob, ...]] = {
    "sched": (Knob.cpu_weight, Knob.cpu_cap),
    "blkio": (Knob.disk_weight,),
    "disks": (Knob.disk_limit,),
    "disk": (Knob.disk_limit,),
}


def setting_knob(setting: str) -> Knob | None:
    """The knob a setting of this applier belongs to (``vda.read_bytes_sec``: a disk limit)."""
    if setting == "cpu_shares":
        return Knob.cpu_weight
    if setting in ("vcpu_quota", "vcpu_period"):
        return Knob.cpu_cap
    if setting == "blkio_weight":
        return Knob.disk_weight
    return Knob.disk_limit if "." in setting else None


@dataclass
class Read:
    """The LIVE settings of a VM: the values, per group that could not be read why, and the
    knobs libvirt refused to read for the running VM (this host lacks them)."""

    values: Settings = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unsupported: dict[Knob, str] = field(default_factory=dict)


def scaled_shares(original: int, weight: int) -> int:
    """``cpu_shares`` for plan weight ``weight`` (100 = normal) relative to the VM's original:
    on cgroup v2 (original 100) the plan's number itself, on v1 (1024) the same proportion.
    Bounded by what the kernel takes: 2..10000 on v2 scales, up to 262144 on v1 ones."""
    base = original if original > 0 else WEIGHT_DEFAULT
    high = WEIGHT_MAX if base <= WEIGHT_MAX else SHARES_MAX
    return max(SHARES_MIN, min(high, round_half_up(base * weight / WEIGHT_DEFAULT)))


def scaled_blkio_weight(original: int, weight: int) -> int:
    """blkio ``weight`` for plan weight ``weight`` relative to the VM's original (0, as the
    test driver reports an unset weight, counts as BFQ's default 100), within 10..1000."""
    return io_weight_to_blkio(weight, original if original > 0 else BLKIO_WEIGHT_DEFAULT_BFQ)


def disk_caps(
    original: dict[str, int], read_cap: float | None, write_cap: float | None, disks: int
) -> dict[str, int]:
    """A disk's ``blockIoTune`` bytes limits under the VM's caps, split over its ``disks``.

    Never looser than what the disk had: a direction already capped lower keeps its cap. QEMU
    refuses ``total_bytes_sec`` together with a per-direction limit, so a disk that had only a
    total gets it as the cap of each direction while gmd's caps hold, and back when they lift.
    """
    total = int(original.get("total_bytes_sec") or 0)
    out = {k: int(original.get(k) or 0) for k in IOTUNE_KEYS}
    if read_cap is None and write_cap is None:
        return out
    for key, cap in (("read_bytes_sec", read_cap), ("write_bytes_sec", write_cap)):
        had = out[key] or total
        if cap is not None:
            share = max(1, math.floor(cap / max(disks, 1)))
            out[key] = share if had == 0 else min(had, share)
        else:
            out[key] = had
    out["total_bytes_sec"] = 0
    return out


def live_disks(xml: str) -> list[str]:
    """Target names of the domain's disks that have a source (an empty CD-ROM drive has no
    I/O to cap, and libvirt refuses to tune it)."""
    root = ET.fromstring(xml)
    out = []
    for disk in root.iterfind("devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        dev = target.get("dev") if target is not None else None
        if dev and disk.get("device", "disk") == "disk" and source is not None and source.attrib:
            out.append(dev)
    return out


def applier_connection(conn_or_uri: Any, *, read_only: bool) -> LibvirtConnection:
    """An applier's connection: tried again at every round (a round is already
    ``plan_every_s`` apart, so no backoff of its own)."""
    return LibvirtConnection(conn_or_uri, read_only=read_only, backoff_max_s=0)


def connect(conn: LibvirtConnection) -> Any:
    """The open connection; without one, nothing more can be done this round."""
    opened = conn.get()
    if opened is None:
        raise BackendUnavailable(conn.down_reason)
    return opened


class LibvirtApplier(PlanApplier):
    """LIVE libvirt tuning (see the module docstring). ``conn_or_uri``: an open read-write
    connection (kept open, not closed here) or a URI opened on first use and reopened after a
    lost connection."""

    backend = EnforceBackend.libvirt

    def __init__(
        self,
        conn_or_uri: Any = "qemu:///system",
        *,
        state_path: Path,
        clock: Callable[[], float] = time.time,
        domains: DomainFilter = EVERY_DOMAIN,
    ) -> None:
        super().__init__(state_path, clock=clock, domains=domains)
        self._libvirt = applier_connection(conn_or_uri, read_only=False)
        self.uri = self._libvirt.uri
        log.info(
            "enforcement through libvirt %s (LIVE only): cpu_shares, vcpu_quota, blkio weight,"
            " per-disk blockIoTune; interface bandwidth is not applied (needs tc, not reliable"
            " live)",
            self.uri,
        )

    knob_of = staticmethod(setting_knob)

    def _lost(self, exc: libvirt.libvirtError, during: str) -> BackendUnavailable:
        self._libvirt.lost(exc, during)
        return BackendUnavailable(self._libvirt.down_reason)

    def close(self) -> None:
        self._libvirt.close()

    def refused_knobs(self, uuids: Iterable[str]) -> dict[Knob, tuple[KnobSupport, str]]:
        from gmd.agent.capabilities import refine_with_libvirt

        for uuid in uuids:
            try:
                vm = self._find(uuid)
            except BackendUnavailable:
                return {}
            if vm is not None:
                return refine_with_libvirt(vm.handle)
        return {}

    def _find(self, uuid: str) -> VmRef | None:
        conn = connect(self._libvirt)
        try:
            dom = conn.lookupByUUIDString(uuid)
            if not dom.isActive():
                return None
            return VmRef(uuid, dom.name(), dom.ID(), dom)
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            if code in NO_SUCH_DOMAIN:
                return None
            if code in CONNECTION_LOST:
                raise self._lost(exc, f"looking up VM {uuid}") from None
            raise BackendUnavailable(f"libvirt {self.uri}: looking up VM {uuid}: {exc}") from None

    # -- reading -----------------------------------------------------------------------------------

    def _call(self, vm: VmRef, what: str, fn: Callable[[], Any]) -> Any:
        """One libvirt call on ``vm``: a vanished VM raises VmGone, a lost connection
        BackendUnavailable, anything else libvirtError (for the caller to report: a call
        refused for the running VM is the knob's, not the VM's)."""
        try:
            return fn()
        except libvirt.libvirtError as exc:
            if gone(vm.handle, exc):
                raise VmGone(vm.uuid) from None
            if exc.get_error_code() in CONNECTION_LOST:
                raise self._lost(exc, f"{what} of VM {vm.uuid} ({vm.name})") from None
            raise

    def _read(self, vm: VmRef, skip: frozenset[Knob] = frozenset()) -> Read:
        """Every knob's current LIVE value (but those of ``skip``, which this host lacks)."""
        dom = vm.handle
        read = Read()
        values = read.values
        try:
            sched = self._call(vm, "reading", lambda: dom.schedulerParametersFlags(LIVE))
            for key in SCHED_KEYS:
                values[key] = int(sched[key])
        except (libvirt.libvirtError, KeyError) as exc:
            read.failed["sched"] = f"schedulerParametersFlags: {reason(exc)}"
        if Knob.disk_weight not in skip:
            try:
                blkio = self._call(vm, "reading", lambda: dom.blkioParameters(LIVE))
                values["blkio_weight"] = int(blkio["weight"])
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID:
                    # refused for a running VM: no BFQ/CFQ behind the weight on this host
                    read.unsupported[Knob.disk_weight] = f"libvirt: {reason(exc)}"
                else:
                    read.failed["blkio"] = f"blkioParameters: {reason(exc)}"
            except KeyError as exc:
                read.failed["blkio"] = f"blkioParameters: {reason(exc)}"
        try:
            disks = live_disks(self._call(vm, "reading", lambda: dom.XMLDesc(0)))
        except (libvirt.libvirtError, ET.ParseError) as exc:
            read.failed["disks"] = f"XMLDesc: {reason(exc)}"
            disks = []
        for dev in disks if Knob.disk_limit not in skip else []:
            try:
                tune = self._call(vm, "reading", functools.partial(dom.blockIoTune, dev, LIVE))
                for key in IOTUNE_KEYS:
                    values[f"{dev}.{key}"] = int(tune[key])
            except (libvirt.libvirtError, KeyError) as exc:
                read.failed[f"disk {dev}"] = f"blockIoTune({dev}): {reason(exc)}"
        return read

    def _snapshot(self, vm: VmRef, known: dict[str, Any]) -> dict[str, Any]:
        return {**self._read(vm).values, **known}

    # -- targets -----------------------------------------------------------------------------------

    def _targets(
        self, vm: VmRef, item: VmPlanItem, originals: dict[str, Any]
    ) -> tuple[Settings, list[str]]:
        """The value every remembered knob should have under ``item``."""
        desired: Settings = {}
        errors: list[str] = []
        if all(k in originals for k in SCHED_KEYS):
            desired["cpu_shares"] = scaled_shares(originals["cpu_shares"], item.cpu_weight)
            desired.update(self._quota(vm, item, originals, errors))
        if "blkio_weight" in originals:
            desired["blkio_weight"] = scaled_blkio_weight(originals["blkio_weight"], item.io_weight)
        disks = sorted({k.split(".", 1)[0] for k in originals if k.endswith(".read_bytes_sec")})
        for dev in disks:
            original = {k: originals.get(f"{dev}.{k}", 0) for k in IOTUNE_KEYS}
            caps = disk_caps(
                original, item.disk_read_bytes_per_s, item.disk_write_bytes_per_s, len(disks)
            )
            desired.update({f"{dev}.{k}": v for k, v in caps.items()})
        return desired, errors

    def _quota(
        self, vm: VmRef, item: VmPlanItem, originals: dict[str, Any], errors: list[str]
    ) -> Settings:
        """``vcpu_quota``/``vcpu_period`` under ``item``: libvirt's quota is per vCPU, the
        plan's for the whole VM. Nothing when the vCPUs cannot be counted (in ``errors``)."""
        if item.cpu_quota_cores is None:
            return {k: originals[k] for k in ("vcpu_quota", "vcpu_period")}
        period = originals["vcpu_period"] or CFS_PERIOD_DEFAULT_US
        try:
            vcpus = int(self._call(vm, "reading", lambda: vm.handle.info())[3])
        except libvirt.libvirtError as exc:
            errors.append(f"vcpu_quota: cannot count its vCPUs: {reason(exc)}")
            return {}
        if vcpus <= 0:
            return {}
        quota = cpu_quota_to_us(item.cpu_quota_cores / vcpus, period)
        orig_quota = originals["vcpu_quota"]
        if 0 < orig_quota < quota and originals["vcpu_period"] == period:
            quota = orig_quota  # never looser than a cap the VM already had
        return {"vcpu_quota": quota, "vcpu_period": period}

    def _apply(
        self,
        vm: VmRef,
        item: VmPlanItem,
        originals: dict[str, Any],
        *,
        dry: bool,
        skip: frozenset[Knob] = frozenset(),
    ) -> ChangeOutcome:
        desired, errors = self._targets(vm, item, originals)
        asked = set(item.asks())
        outcome = ChangeOutcome()
        for error in errors:
            outcome.knob_failed(Knob.cpu_cap, error)
        capping = Knob.disk_limit in asked and Knob.disk_limit not in skip
        if capping and not any(k.endswith(".read_bytes_sec") for k in originals):
            error = "disk caps: the VM has no disk to cap"
            errors.append(error)
            outcome.knob_failed(Knob.disk_limit, error)
        for knob in skip:
            desired = {k: v for k, v in desired.items() if setting_knob(k) != knob}
        return self._converge(vm, desired, errors, asked - skip, outcome, dry=dry, skip=skip)

    def _restore(self, vm: VmRef, originals: dict[str, Any], *, dry: bool) -> ChangeOutcome:
        return self._converge(vm, dict(originals), [], set(), ChangeOutcome(), dry=dry)

    # -- converging --------------------------------------------------------------------------------

    def _converge(
        self,
        vm: VmRef,
        desired: Settings,
        errors: list[str],
        needs: set[Knob],
        outcome: ChangeOutcome,
        *,
        dry: bool,
        skip: frozenset[Knob] = frozenset(),
    ) -> ChangeOutcome:
        """Write the settings whose LIVE value differs from ``desired``, group by group, and
        read them back. A group that cannot be read is not written, and is reported when the
        plan needs one of its knobs (``needs``) or gmd has originals to put back; a knob
        libvirt refuses for the running VM is reported unsupported, and the rest applied."""
        read = self._read(vm, skip)
        current = read.values
        outcome.unsupported.update(read.unsupported)
        for group, why in read.failed.items():
            knobs = _unreadable(group, desired, needs)
            if knobs:
                error = f"{_knobs(group)}: cannot read: {why}"
                errors.append(error)
                for knob in knobs:
                    outcome.knob_failed(knob, error)
        diff = {k: v for k, v in desired.items() if k in current and current[k] != v}
        before = {k: current[k] for k in diff}
        if dry or not diff:
            outcome.before, outcome.after, outcome.errors = before, diff, prefixed(vm, errors)
            return outcome
        failed_keys: set[str] = set()
        for what, keys, call in _writes(vm.handle, diff, desired):
            try:
                self._call(vm, "changing", call)
            except libvirt.libvirtError as exc:
                error = f"{what} failed: {reason(exc)}"
                errors.append(error)
                failed_keys.update(keys)
                for written in {k for k in map(setting_knob, keys) if k is not None}:
                    outcome.knob_failed(written, error)
        after_all = self._read(vm, skip).values
        after: Settings = {}
        for key, want in diff.items():
            got = after_all.get(key)
            if got != before[key]:
                after[key] = got
            if got != want and key not in failed_keys:
                error = f"{key}: reads {got!r} after setting {want!r}"
                errors.append(error)
                read_back = setting_knob(key)
                if read_back is not None:
                    outcome.knob_failed(read_back, error)
        outcome.before = {k: before[k] for k in after}
        outcome.after, outcome.errors = after, prefixed(vm, errors)
        return outcome


def _unreadable(group: str, desired: Settings, needs: set[Knob]) -> list[Knob]:
    """The knobs of a group that could not be read which matter: gmd has a value for them,
    or the plan asks something of them."""
    return [
        knob
        for knob in GROUP_KNOBS.get(group.split(" ", 1)[0], ())
        if knob in needs or any(setting_knob(k) == knob for k in desired)
    ]


def _writes(dom: Any, diff: Settings, desired: Settings) -> list[Write]:
    """The libvirt calls that bring the knobs in ``diff`` to their values, one per group."""
    writes: list[Write] = []
    sched = {k: diff[k] for k in SCHED_KEYS if k in diff}
    if "vcpu_quota" in sched or "vcpu_period" in sched:
        # the kernel checks a quota against the period in force: send them together
        sched["vcpu_quota"], sched["vcpu_period"] = desired["vcpu_quota"], desired["vcpu_period"]
    if sched:
        writes.append(
            (
                "cpu_shares/vcpu_quota/vcpu_period: setSchedulerParametersFlags",
                list(sched),
                lambda: dom.setSchedulerParametersFlags(sched, LIVE),
            )
        )
    if "blkio_weight" in diff:
        weight = {"weight": diff["blkio_weight"]}
        writes.append(
            (
                "blkio weight: setBlkioParameters",
                ["blkio_weight"],
                lambda: dom.setBlkioParameters(weight, LIVE),
            )
        )
    for dev in sorted({k.split(".", 1)[0] for k in diff if "." in k}):
        tune = {k: int(desired[f"{dev}.{k}"] or 0) for k in IOTUNE_KEYS}
        writes.append(
            (
                f"disk {dev} bytes caps: setBlockIoTune",
                [f"{dev}.{k}" for k in IOTUNE_KEYS],
                functools.partial(dom.setBlockIoTune, dev, tune, LIVE),
            )
        )
    return writes


def _knobs(group: str) -> str:
    return {
        "sched": "cpu_shares/vcpu_quota/vcpu_period",
        "blkio": "blkio weight",
        "disks": "disk caps",
    }.get(group, f"{group} caps")
