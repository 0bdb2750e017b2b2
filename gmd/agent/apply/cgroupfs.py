r"""Where a VM's cgroup control files are, for the cgroup backend, which holds a VM to a
:class:`~gmd.agent.apply.limits.VmLimits` by writing them directly, for hosts where the agent
is configured not to go through libvirt.

Two layouts exist in the field and both are handled:

- cgroup v2 (most production hosts): one directory per VM holding ``cpu.weight``, ``cpu.max``,
  ``io.weight`` (or ``io.bfq.weight``), ``io.max`` and ``memory.high``.
- cgroup v1: every controller is its own hierarchy, so the VM has one directory per controller
  (``cpu/``, ``blkio/``, ``memory/`` under the root) holding ``cpu.shares``,
  ``cpu.cfs_quota_us``, ``blkio.bfq.weight`` or ``blkio.weight``,
  ``blkio.throttle.{read,write}_bps_device`` and ``memory.soft_limit_in_bytes``.

Where a VM's cgroup is: by default, where its QEMU process sits (:func:`from_domain`, through
:class:`gmd.agent.cgroups.CgroupLocator`, which also tells the kernel collector where to read
the VM's counters, so that a VM is measured and throttled in the same group). v1 when QEMU
sits in v1 groups of ``cpu``, ``blkio`` and ``memory`` (this machine's hybrid layout, e.g.
``/sys/fs/cgroup/cpu/machine/qemu-15-gmd-test-spin-31259.libvirt-qemu``), else its v2 group
(recent libvirt on v2: ``machine.slice/machine-qemu\x2d{id}\x2d{name}.scope/libvirt``, whose
limits bound the ``emulator`` and ``vcpuN`` groups below it).

Where the agent cannot see QEMU's processes (a containerised agent without the host's
``/proc``), a configured template relative to a root says where (:func:`from_template`; one
template serves every v1 controller, since libvirt uses the same relative path in each).
Fields: ``{name}`` (domain name), ``{uuid}``, ``{id}`` (libvirt's domain id, changes at every
start), ``{machine}`` (libvirt's machine name ``qemu-{id}-{name}``) and ``{machine_unit}`` (the
same, escaped as systemd escapes unit names: ``-`` becomes ``\x2d``). What libvirt creates:

- with systemd (v1 or v2): ``machine.slice/machine-qemu\x2d{id}\x2d{name}.scope``, i.e.
  :data:`SYSTEMD_TEMPLATE`. Note that a ``-`` inside the domain name is escaped too
  (``instance-0000002a`` -> ``instance\x2d0000002a``), which ``{machine_unit}`` does and a
  literal ``\x2d{name}`` does not.
- without systemd: ``machine/qemu-{id}-{name}.libvirt-qemu`` (:data:`LIBVIRT_TEMPLATE`; old
  libvirt releases used ``machine/{name}.libvirt-qemu``).

libvirt drops characters that are not valid in a host name from ``{machine}`` and cuts it at 64
characters; :func:`libvirt_machine_name` follows that for ordinary names, but a host with
unusual domain names should be checked against its own tree (``systemd-cgls``, ``ls``). The
version of a templated root is detected (:func:`detect`) unless configured.

What is done there is the other cgroupfs modules': a control file's content as a state
(:mod:`gmd.agent.apply.cgroupfs_formats`), the state each of the limits asks of each file per
cgroup version (:mod:`gmd.agent.apply.cgroupfs_knobs`), and the writes, the snapshots taken
first and the restores (:mod:`gmd.agent.apply.cgroupfs_writes`), which report file by file
(:mod:`gmd.agent.apply.cgroupfs_report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from gmd import GmdError
from gmd.agent.cgroups import DomainCgroups

CgroupVersion = Literal["v1", "v2"]

SYSTEMD_TEMPLATE = "machine.slice/machine-{machine_unit}.scope"
LIBVIRT_TEMPLATE = "machine/{machine}.libvirt-qemu"

V1_CONTROLLERS = ("cpu", "blkio", "memory")

V2_FILES = ("cpu.weight", "cpu.max", "io.weight", "io.bfq.weight", "io.max", "memory.high")
V1_FILES = (
    "cpu.shares",
    "cpu.cfs_quota_us",
    "blkio.weight",
    "blkio.bfq.weight",
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
    "memory.soft_limit_in_bytes",
)

_MACHINE_NAME_MAX = 64


class CgroupError(GmdError):
    """The host or the configuration does not fit (no cgroup at the root, a bad template, a
    snapshot from another cgroup version); the message names the path or value."""


def detect(root: Path) -> CgroupVersion:
    """Which cgroup version is mounted at ``root``: v2 has ``cgroup.controllers`` at its root,
    v1 has one directory per controller. Hybrid hosts (v1 controllers under a tmpfs, an almost
    empty cgroup2 under ``unified/``) are v1 for the backend's purposes."""
    if (root / "cgroup.controllers").is_file():
        return "v2"
    if any((root / controller).is_dir() for controller in V1_CONTROLLERS):
        return "v1"
    raise CgroupError(
        f"{root}: no cgroup found (neither cgroup.controllers for v2 nor a "
        f"{'/, '.join(V1_CONTROLLERS)}/ directory for v1)"
    )


@dataclass(frozen=True, slots=True)
class VmIdentity:
    """What the agent knows about a VM, enough to find its cgroup."""

    name: str
    uuid: str = ""
    id: int | None = None


def systemd_escape(text: str) -> str:
    r"""Escape ``text`` as systemd does inside a unit name: letters, digits, ``:``, ``_`` and
    ``.`` (not leading) stay, everything else becomes ``\xNN`` per UTF-8 byte."""
    out = []
    for i, char in enumerate(text):
        if (char.isascii() and char.isalnum()) or char in ":_" or (char == "." and i > 0):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(out)


def libvirt_machine_name(domain_id: int | None, name: str, driver: str = "qemu") -> str:
    """libvirt's machine name ``qemu-ID-NAME``: characters invalid in a host name dropped, a
    leading dot dropped, cut at 64 characters."""
    prefix = f"{driver}-{domain_id}-" if domain_id is not None else f"{driver}-"
    kept = [
        c
        for i, c in enumerate(name)
        if (c.isascii() and c.isalnum()) or c == "-" or (c == "." and i > 0)
    ]
    return (prefix + "".join(kept))[:_MACHINE_NAME_MAX]


def render_template(template: str, vm: VmIdentity) -> PurePosixPath:
    """The VM's cgroup path relative to the root, from the configured template."""
    machine = libvirt_machine_name(vm.id, vm.name)
    fields = {
        "name": vm.name,
        "uuid": vm.uuid,
        "id": "" if vm.id is None else str(vm.id),
        "machine": machine,
        "machine_unit": systemd_escape(machine),
    }
    try:
        rendered = template.format_map(fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise CgroupError(
            f"cgroup path template {template!r}: {exc!r}; fields are {sorted(fields)}"
        ) from exc
    relative = PurePosixPath(rendered.lstrip("/"))
    if not rendered.strip("/") or ".." in relative.parts:
        raise CgroupError(
            f"cgroup path template {template!r} gives {rendered!r} for VM {vm.name!r}: "
            "must be a path below the root without '..'"
        )
    return relative


@dataclass(frozen=True, slots=True)
class VmCgroup:
    """One VM's cgroup: a single directory on v2, one per controller on v1."""

    version: CgroupVersion
    label: str
    dirs: Mapping[str, Path]

    def file(self, filename: str) -> Path:
        """Where control file ``filename`` (e.g. ``cpu.shares``) lives for this VM."""
        if self.version == "v2":
            return self.dirs[""] / filename
        return self.dirs[filename.split(".", 1)[0]] / filename

    @property
    def filenames(self) -> tuple[str, ...]:
        return V2_FILES if self.version == "v2" else V1_FILES


def from_template(
    root: Path, template: str, vm: VmIdentity, version: CgroupVersion | None = None
) -> VmCgroup:
    """The VM's cgroup under ``root`` by a configured path template (``agent.cgroup_template``,
    for hosts where the agent cannot see QEMU's processes); its directories need not exist: a
    missing one shows up as ENOENT in the report of whatever is done with it."""
    version = version or detect(root)
    relative = render_template(template, vm)
    if version == "v2":
        dirs = {"": root / relative}
    else:
        dirs = {controller: root / controller / relative for controller in V1_CONTROLLERS}
    return VmCgroup(version=version, label=str(relative), dirs=dirs)


def from_domain(groups: DomainCgroups) -> VmCgroup:
    """The VM's cgroup where its QEMU process sits (:class:`gmd.agent.cgroups.CgroupLocator`,
    the collector's answer too): v1 when QEMU is in v1 groups of the controllers written
    (libvirt uses all three or none), else its v2 group."""
    placed = [c for c in V1_CONTROLLERS if c in groups.v1]
    if placed:
        missing = [c for c in V1_CONTROLLERS if c not in groups.v1]
        if missing:
            raise CgroupError(
                f"QEMU is in v1 groups of its own for {', '.join(placed)} but not for "
                f"{', '.join(missing)}"
            )
        dirs = {c: groups.v1[c] for c in V1_CONTROLLERS}
        return VmCgroup(version="v1", label=str(dirs["cpu"]), dirs=dirs)
    if groups.unified is None:
        raise CgroupError("QEMU is in no cpu/blkio/memory (v1) nor v2 cgroup of its own")
    return VmCgroup(version="v2", label=str(groups.unified), dirs={"": groups.unified})
