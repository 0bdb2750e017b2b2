"""Where a VM's cgroups are: one answer, found from its QEMU process, for the collector that
reads them and the applier that writes them.

Both used to answer on their own — the kernel collector from the process, the cgroup applier
from a configured path template and a guess of the cgroup version per host — so on a host where
the two disagreed (a hybrid host, a libvirt that nests its groups one level further down) the
agent measured a VM in one group and throttled it in another. Now both ask :class:`CgroupLocator`:
libvirt's pid file gives the QEMU process, ``/proc/<pid>/cgroup`` its group per controller, and
the mount table where each hierarchy is. Per controller, the v1 group where QEMU sits in one of
its own, and the v2 group; the reader and the writer then pick their files from the same
directories.

libvirt puts QEMU's main thread in ``…/emulator`` and each vCPU in ``…/vcpuN`` beside it, so a
domain's group is the parent of ``emulator``: limits written there bound every thread of the
VM, and the counters there count them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gmd import GmdError

PROC = Path("/proc")
LIBVIRT_QEMU_RUN = Path("/run/libvirt/qemu")
"""where the system QEMU driver writes ``<domain name>.pid``"""
EMULATOR = "emulator"
UNIFIED = ""
"""the controller key of the cgroup v2 hierarchy (``0::/path`` in ``/proc/<pid>/cgroup``)"""


class CgroupNotFound(GmdError):
    """A VM's cgroups cannot be found: no QEMU pid, an unreadable ``/proc`` file, or a process
    in no group of its own; the message names the file or the controller."""


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
    """The domain's cgroup from QEMU's: the parent of ``…/emulator`` (see the module
    docstring). ``None`` for the root (libvirt did not use the controller)."""
    p = PurePosixPath(path)
    if p.name == EMULATOR:
        p = p.parent
    return None if p == PurePosixPath("/") else p


@dataclass(frozen=True, slots=True)
class DomainCgroups:
    """One domain's cgroup directories, as its QEMU process sits in them."""

    v1: Mapping[str, Path]
    """v1 controller → the domain's directory in that hierarchy, for each controller whose
    hierarchy QEMU sits in a group of its own in (not the root)"""
    unified: Path | None
    """the domain's directory in the v2 hierarchy, ``None`` when QEMU is at its root or v2 is
    not mounted"""


def _under(mount: Path, cgroup: PurePosixPath) -> Path:
    return mount / str(cgroup).lstrip("/")


def domain_cgroups(proc_cgroup: Mapping[str, str], mounts: CgroupMounts) -> DomainCgroups:
    """The domain directories of a QEMU process in the cgroups ``proc_cgroup`` (pure)."""
    v1: dict[str, Path] = {}
    for controller, mount in mounts.v1.items():
        path = proc_cgroup.get(controller)
        cg = domain_cgroup(path) if path is not None else None
        if cg is not None:
            v1[controller] = _under(mount, cg)
    path = proc_cgroup.get(UNIFIED)
    cg = domain_cgroup(path) if path is not None else None
    unified = None if cg is None or mounts.v2 is None else _under(mounts.v2, cg)
    return DomainCgroups(v1, unified)


def read_text(path: Path) -> str:
    """A small kernel file, or :class:`CgroupNotFound` naming it."""
    try:
        with open(path, "rb") as f:
            return f.read().decode()
    except OSError as exc:
        raise CgroupNotFound(f"{path}: {exc.strerror or exc}") from None


class CgroupLocator:
    """Finds running domains' cgroups on this host; ``proc``, ``run_dir`` and ``mountinfo``
    point at the files (canned trees in tests)."""

    def __init__(
        self,
        *,
        proc: Path = PROC,
        run_dir: Path = LIBVIRT_QEMU_RUN,
        mountinfo: Path | None = None,
    ) -> None:
        self.proc, self.run_dir = proc, run_dir
        self.mountinfo = mountinfo or proc / "self" / "mountinfo"

    def mounts(self) -> CgroupMounts:
        """The host's cgroup mounts (read each time: cheap, and a remount shows at once)."""
        return parse_mountinfo(read_text(self.mountinfo))

    def pid(self, name: str) -> int:
        """The QEMU pid of running domain ``name``, from libvirt's pid file."""
        path = self.run_dir / f"{name}.pid"
        text = read_text(path).strip()
        if not text.isdigit():
            raise CgroupNotFound(f"{path}: {text[:40]!r} is not a pid")
        return int(text)

    def of_process(self, pid: int, mounts: CgroupMounts | None = None) -> DomainCgroups:
        """The domain directories of QEMU process ``pid``."""
        text = read_text(self.proc / str(pid) / "cgroup")
        return domain_cgroups(parse_proc_cgroup(text), mounts or self.mounts())

    def of_domain(self, name: str, mounts: CgroupMounts | None = None) -> DomainCgroups:
        """The domain directories of running domain ``name``."""
        return self.of_process(self.pid(name), mounts)
