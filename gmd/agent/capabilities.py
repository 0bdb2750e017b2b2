"""What this host can hold a VM to: each knob of :class:`~gmd.wire.Knob`, probed, never assumed.

A knob is there or not by the kernel more than by gmd's backend: libvirt's ``cpu_shares`` is
the cgroup's ``cpu.shares`` or ``cpu.weight``, its blkio ``weight`` is BFQ's weight file, and a
weight written where no proportional I/O scheduler runs the disk is accepted and does nothing.
So the probe reads the host's own files — the cgroup mounts, the control files of a VM's group
(or of the hierarchy when no VM runs), each disk's scheduler (``/sys/block/DEV/queue/scheduler``),
v2's io cost model (``io.cost.qos``) — and, on the libvirt backend, asks a running domain what
libvirt refuses (:func:`refine_with_libvirt`). What a host has, per knob:

========================  ========================================  ==============================
knob                      cgroup v1                                 cgroup v2
========================  ========================================  ==============================
CPU weight                ``cpu.shares``                            ``cpu.weight``
CPU cap                   ``cpu.cfs_quota_us`` (CFS bandwidth)      ``cpu.max``
disk weight               ``blkio.bfq.weight`` on disks BFQ runs    ``io.weight`` with the io cost
                          (``blkio.weight``: CFQ, gone since 5.0)   model on, or ``io.bfq.weight``
                                                                    on disks BFQ runs
disk limit                ``blkio.throttle.*`` (any scheduler)      ``io.max`` (any scheduler)
network limit             none in gmd's plans (libvirt's ``<bandwidth>`` needs ``tc``)
========================  ========================================  ==============================

Through libvirt, disk limits are QEMU's own throttling (``blockIoTune``), which needs no
cgroup at all. Everything here reads files under roots a test can point at a fixture tree.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gmd.agent.apply.state import EnforceBackend
from gmd.agent.cgroups import CgroupLocator, CgroupMounts, CgroupNotFound, DomainCgroups
from gmd.agent.disks import SYS_DEV_BLOCK
from gmd.wire import HostCapabilities, Knob, KnobCapability, KnobSupport

if TYPE_CHECKING:
    from gmd.agent.apply.base import PlanApplier

log = logging.getLogger(__name__)

SYS_BLOCK = Path("/sys/block")
# Devices whose scheduler says nothing of a VM's disk: loops, RAM disks, optical drives, and
# device-mapper/md stacks (always "none": the disks under them are the ones scheduled).
_NOT_DISKS = re.compile(r"^(loop|ram|zram|sr|fd|nbd|dm-|md)\d*")
PROPORTIONAL = ("bfq", "cfq")
"""the I/O schedulers that honour a cgroup's disk weight"""


def parse_scheduler(text: str) -> tuple[str | None, tuple[str, ...]]:
    """``/sys/block/DEV/queue/scheduler`` → (the active scheduler, those offered): ``[none]
    mq-deadline kyber`` gives ``("none", ("none", "mq-deadline", "kyber"))``; a device that
    cannot schedule prints ``none`` alone."""
    offered = tuple(w.strip("[]") for w in text.split())
    active = next((w.strip("[]") for w in text.split() if w.startswith("[")), None)
    if active is None and len(offered) == 1:
        active = offered[0]
    return active, offered


@dataclass(frozen=True)
class Disk:
    """One block device and its scheduler."""

    name: str
    active: str | None
    offered: tuple[str, ...]


def disks(sys_block: Path = SYS_BLOCK, only: Iterable[str] | None = None) -> list[Disk]:
    """The host's disks and their schedulers (``only``: just these device names)."""
    wanted = set(only) if only is not None else None
    out = []
    try:
        entries = sorted(p.name for p in sys_block.iterdir())
    except OSError:
        return []
    for name in entries:
        if wanted is not None and name not in wanted:
            continue
        if wanted is None and _NOT_DISKS.match(name):
            continue
        try:
            text = (sys_block / name / "queue" / "scheduler").read_text()
        except OSError:
            continue
        active, offered = parse_scheduler(text)
        out.append(Disk(name, active, offered))
    return out


def device_name(majmin: str, sys_dev_block: Path = SYS_DEV_BLOCK) -> str | None:
    """The ``/sys/block`` name of device ``MAJ:MIN`` (``vda`` for ``254:0``)."""
    try:
        return (sys_dev_block / majmin).resolve().name
    except OSError:
        return None


def io_cost_enabled(text: str) -> set[str]:
    """The devices (``MAJ:MIN``) whose io cost model is on, from the v2 root's
    ``io.cost.qos`` (``8:0 enable=1 ctrl=auto …`` per configured device)."""
    out = set()
    for line in text.splitlines():
        parts = line.split()
        if parts and "enable=1" in parts[1:]:
            out.add(parts[0])
    return out


@dataclass(frozen=True)
class CgroupView:
    """Where the probe looked: the layout, and per control file whether it is there."""

    layout: str
    """"v1", "v2", "hybrid" or "none" """
    files: frozenset[str]
    """the control files found in the group probed"""
    where: str
    """that group, for the reasons: "the VM instance-00000001's group" or a mount point"""
    io_cost: frozenset[str] = frozenset()
    """v2: devices (MAJ:MIN) with the io cost model on"""


_V1_FILES = {
    "cpu": ("cpu.shares", "cpu.cfs_quota_us"),
    "blkio": (
        "blkio.bfq.weight",
        "blkio.weight",
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
    ),
}
_V2_FILES = ("cpu.weight", "cpu.max", "io.weight", "io.bfq.weight", "io.max")


def layout_of(mounts: CgroupMounts) -> str:
    """ "v1" (controllers each in their hierarchy), "hybrid" (those, and a v2 mount holding
    none of cpu/io), "v2" (the unified hierarchy only) or "none"."""
    v1 = any(c in mounts.v1 for c in ("cpu", "blkio"))
    if v1:
        return "hybrid" if mounts.v2 is not None else "v1"
    return "v2" if mounts.v2 is not None else "none"


def cgroup_view(mounts: CgroupMounts, group: DomainCgroups | None, label: str = "") -> CgroupView:
    """The control files of a VM's group (``group``), or of the hierarchies' roots when no VM
    runs (v2's root lists in ``cgroup.controllers`` what its children get)."""
    layout = layout_of(mounts)
    files: set[str] = set()
    where = f"the group of VM {label}" if group is not None else "the cgroup roots"
    if layout in ("v1", "hybrid"):
        for controller, names in _V1_FILES.items():
            base = group.v1.get(controller) if group is not None else None
            base = base or mounts.v1.get(controller)
            if base is not None:
                files.update(n for n in names if (base / n).exists())
    elif layout == "v2" and mounts.v2 is not None:
        base = group.unified if group is not None and group.unified is not None else None
        if base is not None:
            files.update(n for n in _V2_FILES if (base / n).exists())
        else:
            try:
                controllers = (mounts.v2 / "cgroup.controllers").read_text().split()
            except OSError:
                controllers = []
            if "cpu" in controllers:
                files.update(("cpu.weight", "cpu.max"))
            if "io" in controllers:
                files.update(("io.max", "io.weight"))
    io_cost: set[str] = set()
    if layout == "v2" and mounts.v2 is not None:
        with contextlib.suppress(OSError):
            io_cost = io_cost_enabled((mounts.v2 / "io.cost.qos").read_text())
    return CgroupView(layout, frozenset(files), where, frozenset(io_cost))


@dataclass
class Probe:
    """Everything the probe found, and the knobs it makes of it (:meth:`capabilities`)."""

    backend: EnforceBackend
    view: CgroupView
    disks: list[Disk]
    tc: bool
    libvirt: dict[Knob, tuple[KnobSupport, str]] = field(default_factory=dict)
    """what a running domain's libvirt said of a knob, which outranks the files"""
    probed_s: int = 0

    def capabilities(self) -> HostCapabilities:
        knobs = [self._knob(k) for k in Knob]
        return HostCapabilities(
            backend=str(self.backend),
            cgroup=self.view.layout,
            schedulers={d.name: d.active or "?" for d in self.disks[:256]},
            knobs=knobs,
            probed_s=self.probed_s,
        )

    def _knob(self, knob: Knob) -> KnobCapability:
        if self.backend == EnforceBackend.none:
            return _cap(knob, KnobSupport.unsupported, "", "agent.enforce_backend = none")
        support, via, reason = _decide(knob, self)
        said = self.libvirt.get(knob)
        if said is not None and said[0] == KnobSupport.unsupported:
            # libvirt's refusal is the fact; the files' reason, where they have one, the why
            reason = f"{said[1]}; {reason}" if support == KnobSupport.unsupported else said[1]
            support = said[0]
        return _cap(knob, support, via, reason)


def _cap(knob: Knob, support: KnobSupport, via: str, reason: str) -> KnobCapability:
    return KnobCapability(knob=knob, support=support, via=via[:500], reason=reason[:500])


def _decide(knob: Knob, p: Probe) -> tuple[KnobSupport, str, str]:
    """(support, via, reason) of one knob from the files and the schedulers."""
    files, layout, libvirt = p.view.files, p.view.layout, p.backend == EnforceBackend.libvirt
    v2 = layout == "v2"
    if knob == Knob.network_limit:
        tc = "tc is installed" if p.tc else "tc is not installed"
        return (
            KnobSupport.unsupported,
            "",
            f"gmd's plans carry no network cap (libvirt's interface bandwidth needs tc: {tc})",
        )
    if knob == Knob.disk_limit and libvirt:
        return KnobSupport.supported, "libvirt blockIoTune (QEMU's own I/O throttling)", ""
    if layout == "none":
        why = "no cgroup hierarchy is visible to the agent"
        if libvirt:
            return KnobSupport.unknown, "libvirt", f"{why}: libvirt decides"
        return KnobSupport.unsupported, "", why
    wanted = {
        Knob.cpu_weight: ("cpu.weight",) if v2 else ("cpu.shares",),
        Knob.cpu_cap: ("cpu.max",) if v2 else ("cpu.cfs_quota_us",),
        Knob.disk_limit: ("io.max",) if v2 else ("blkio.throttle.read_bps_device",),
    }
    if knob in wanted:
        name = wanted[knob][0]
        via = _via(name, layout, libvirt, knob)
        if name in files:
            return KnobSupport.supported, via, ""
        return KnobSupport.unsupported, "", f"no {name} in {p.view.where} ({layout})"
    return _disk_weight(p)


_LIBVIRT_NAMES = {
    Knob.cpu_weight: "libvirt cpu_shares",
    Knob.cpu_cap: "libvirt vcpu_quota",
    Knob.disk_weight: "libvirt blkio weight",
}


def _via(name: str, layout: str, libvirt: bool, knob: Knob) -> str:
    file = f"{name} (cgroup {layout})"
    return f"{_LIBVIRT_NAMES[knob]} → {file}" if libvirt and knob in _LIBVIRT_NAMES else file


def _disk_weight(p: Probe) -> tuple[KnobSupport, str, str]:
    """A disk weight takes effect only where a proportional scheduler runs every disk the
    VMs use (or, on v2, the io cost model is on for it)."""
    files, layout = p.view.files, p.view.layout
    libvirt = p.backend == EnforceBackend.libvirt
    if not p.disks:
        return KnobSupport.unknown, "", "no disk scheduler readable under /sys/block"
    if layout == "v2" and "io.weight" in files and p.view.io_cost:
        return KnobSupport.supported, _via("io.weight", layout, libvirt, Knob.disk_weight), ""
    running = sorted({d.active or "?" for d in p.disks})
    off = [d for d in p.disks if d.active not in PROPORTIONAL]
    weight_file = "io.bfq.weight" if layout == "v2" else "blkio.bfq.weight"
    if not off:
        cfq = all(d.active == "cfq" for d in p.disks)
        name = "blkio.weight" if cfq and layout != "v2" else weight_file
        if name in files:
            return KnobSupport.supported, _via(name, layout, libvirt, Knob.disk_weight), ""
        return KnobSupport.unsupported, "", f"no {name} in {p.view.where} ({layout})"
    offered = sorted({s for d in p.disks for s in d.offered})
    names = ", ".join(d.name for d in off[:8]) + (" …" if len(off) > 8 else "")
    hint = (
        "this kernel offers bfq: `echo bfq > /sys/block/DEV/queue/scheduler` would enable it"
        if "bfq" in offered
        else "this kernel offers no BFQ"
    )
    return (
        KnobSupport.unsupported,
        "",
        f"no proportional I/O scheduler on {names} (running {', '.join(running)};"
        f" offered {', '.join(offered) or 'none'}): a disk weight would do nothing; {hint}",
    )


def refine_with_libvirt(dom: Any) -> dict[Knob, tuple[KnobSupport, str]]:
    """What libvirt itself says of the knobs on a running domain ``dom``: a read it refuses
    for a live domain means the knob is not there (``blkio device weight is valid only for bfq
    or cfq scheduler``); errors that mean the domain went say nothing."""
    import libvirt

    from gmd.agent.libvirt_conn import reason

    out: dict[Knob, tuple[KnobSupport, str]] = {}
    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    for knobs, call in (
        ((Knob.disk_weight,), lambda: dom.blkioParameters(live)),
        ((Knob.cpu_weight, Knob.cpu_cap), lambda: dom.schedulerParametersFlags(live)),
    ):
        try:
            answer = call()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID and dom.isActive():
                for k in knobs:
                    out[k] = (KnobSupport.unsupported, f"libvirt: {reason(exc)}")
            continue
        except (LookupError, TypeError):
            continue
        if knobs == (Knob.disk_weight,) and "weight" not in answer:
            out[Knob.disk_weight] = (KnobSupport.unsupported, "libvirt reports no blkio weight")
        if knobs != (Knob.disk_weight,) and "vcpu_quota" not in answer:
            out[Knob.cpu_cap] = (KnobSupport.unsupported, "libvirt reports no vcpu_quota")
    return out


@dataclass
class HostProbe:
    """The probe as the agent runs it: files under these roots, a VM's group found by
    ``locator`` from one of ``domain_names`` (the first that has one)."""

    backend: EnforceBackend
    locator: CgroupLocator = field(default_factory=CgroupLocator)
    sys_block: Path = SYS_BLOCK
    sys_dev_block: Path = SYS_DEV_BLOCK
    clock: Callable[[], float] = time.time
    tc: Callable[[], bool] = lambda: shutil.which("tc") is not None

    def probe(
        self,
        domain_names: Iterable[str] = (),
        *,
        devices: Iterable[str] | None = None,
        libvirt_said: Mapping[Knob, tuple[KnobSupport, str]] | None = None,
    ) -> Probe:
        """Probe now. ``devices``: ``MAJ:MIN`` of the disks behind the VMs (their schedulers
        are the ones that matter); ``None``: every disk of the host."""
        try:
            mounts = self.locator.mounts()
        except CgroupNotFound:
            mounts = CgroupMounts({}, None)
        group, label = None, ""
        for name in domain_names:
            try:
                group, label = self.locator.of_domain(name, mounts), name
                break
            except CgroupNotFound:
                continue
        view = cgroup_view(mounts, group, label)
        names = None
        if devices is not None:
            names = {n for n in (device_name(d, self.sys_dev_block) for d in devices) if n}
        found = disks(self.sys_block, names or None)
        return Probe(
            self.backend,
            view,
            found,
            self.tc(),
            dict(libvirt_said or {}),
            int(self.clock()),
        )

    def through(
        self, applier: PlanApplier | None, names: Sequence[str], uuids: Sequence[str]
    ) -> HostCapabilities:
        """The host's knobs now, the running VMs ``names``/``uuids`` asked through
        ``applier``'s backend too: the disks under them, and what it refuses on them."""
        said = applier.refused_knobs(uuids) if applier is not None else {}
        devices = applier.disk_devices(uuids) if applier is not None else None
        return self.probe(names, devices=devices, libvirt_said=said).capabilities()


def table(caps: HostCapabilities) -> list[dict[str, str]]:
    """The capabilities as rows for ``gmd-agent --check`` and ``gmd-admin hosts``."""
    return [
        {
            "knob": k.knob.value,
            "support": k.support.value,
            "via": k.via,
            "reason": k.reason,
        }
        for k in caps.knobs
    ]


def text_table(caps: HostCapabilities) -> str:
    """:func:`table` as aligned columns of plain text (the agent has no rich tables)."""
    rows = table(caps)
    keys = ("knob", "support", "via", "reason")
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys[:-1]}
    lines = []
    for r in [dict(zip(keys, (k.upper() for k in keys), strict=True)), *rows]:
        cells = [r[k].ljust(widths[k]) for k in keys[:-1]]
        lines.append("  ".join([*cells, r["reason"]]).rstrip())
    return "\n".join(lines) + "\n"


def describe(caps: HostCapabilities) -> str:
    """One log line: "cgroup hybrid, libvirt; cpu_weight ✓, disk_weight ✗ (why) …"."""
    parts = []
    for k in caps.knobs:
        mark = {"supported": "yes", "unsupported": "no", "unknown": "unknown"}[k.support]
        why = f" ({k.reason})" if k.reason and mark != "yes" else ""
        parts.append(f"{k.knob.value} {mark}{why}")
    return f"cgroup {caps.cgroup}, backend {caps.backend}: " + "; ".join(parts)
