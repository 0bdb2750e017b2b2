r"""The cgroup backend: hold a VM to a :class:`~gmd.agent.apply.limits.VmLimits` by writing its
cgroup files directly, for hosts where the agent is configured not to go through libvirt.

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

Every write is one line per ``write()`` call, which cgroupfs needs for files holding one line
per device. Writes are skipped when the file already holds the wanted value, so applying the
same limits twice writes nothing the second time. A failing file (ENOENT, EINVAL, EBUSY,
EACCES, ...) is recorded in the :class:`ApplyReport`, errno included, and the other files are
still written; nothing here raises for a per-file failure.

The originals are remembered as a :class:`Snapshot` (the raw text of every file the backend may
touch, JSON-serialisable so the agent can keep it on disk across restarts) and put back exactly
by :func:`restore`.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from gmd import GmdError
from gmd.agent.apply.limits import (
    BLKIO_WEIGHT_DEFAULT_BFQ,
    BLKIO_WEIGHT_DEFAULT_CFQ,
    CFS_PERIOD_DEFAULT_US,
    VmLimits,
    cpu_quota_to_us,
    cpu_weight_to_shares,
    io_weight_to_blkio,
    round_down_to_page,
)
from gmd.agent.cgroups import CgroupLocator, CgroupNotFound, DomainCgroups

log = logging.getLogger(__name__)

_DRY: ContextVar[bool] = ContextVar("gmd_cgroupfs_dry_run", default=False)


class _DryRunSaysNothing(logging.Filter):
    """In a dry run nothing is written: what this module says of its writes (and of the
    failures a write would meet) would read as done, at every plan round. The backend says
    what it would do instead, once per change (:mod:`gmd.agent.apply.base`); here those lines
    are debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _DRY.get():
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return log.isEnabledFor(logging.DEBUG)


log.addFilter(_DryRunSaysNothing())


@contextmanager
def dry_run() -> Iterator[None]:
    """Within it, this module's lines are debug (see :class:`_DryRunSaysNothing`)."""
    token = _DRY.set(True)
    try:
        yield
    finally:
        _DRY.reset(token)


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
# Which of them exists depends on the I/O schedulers the kernel has (CFQ was removed in Linux
# 5.0, BFQ is often not built: then neither); a missing one is not a failure. Whether a weight
# written does anything depends on each disk's scheduler: gmd.agent.capabilities decides, and
# the applier then does not ask for a weight at all.
_V1_WEIGHT_FILES = ("blkio.weight", "blkio.bfq.weight")
_WEIGHT_FILES = (*_V1_WEIGHT_FILES, "io.bfq.weight")
DISK_WEIGHT_UNSUPPORTED = "disk_weight"
"""the key of :attr:`ApplyReport.unsupported` when no disk weight file exists"""

IO_MAX_KEYS = ("rbps", "wbps", "riops", "wiops")

_MACHINE_NAME_MAX = 64


class CgroupError(GmdError):
    """The host or the configuration does not fit (no cgroup at the root, a bad template, a
    snapshot from another cgroup version); the message names the path or value."""


# --- where things are -------------------------------------------------------------------------


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


# --- file access ------------------------------------------------------------------------------


class CgroupIO:
    """Reads and writes control files; replaceable so tests can stand in for the kernel.

    A write is one ``write()`` call of one line: cgroupfs parses one line per call in files
    that hold one line per device. The file is opened without O_CREAT so a missing control
    file is ENOENT instead of a new regular file.
    """

    def read(self, path: Path) -> str:
        return path.read_text()

    def write(self, path: Path, line: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__
    return f"{name} ({exc.strerror or exc})"


# --- file contents ----------------------------------------------------------------------------
# A file's content is parsed into a state: item -> value, where the item is "" for one-value
# files, "default" or "MAJ:MIN" for files with one line per device. Comparing states, not text,
# is what makes writes idempotent and restores exact.

State = dict[str, str]


@dataclass(frozen=True, slots=True)
class _Format:
    parse: Callable[[str], State]
    line: Callable[[str, str], str]
    removal: Callable[[str], str] | None = None


def _parse_scalar(text: str) -> State:
    return {"": " ".join(text.split())}


def _parse_keyed(text: str) -> State:
    state: State = {}
    for raw in text.splitlines():
        parts = raw.split()
        if not parts:
            continue
        if len(parts) == 1:  # io.weight on some kernels: a bare default weight
            state["default"] = parts[0]
        elif len(parts) == 2:
            state[parts[0]] = parts[1]
        else:
            raise ValueError(f"unexpected line {raw!r}")
    return state


def _io_max_fields(value: str) -> dict[str, str]:
    fields = dict.fromkeys(IO_MAX_KEYS, "max")
    for token in value.split():
        key, sep, val = token.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"unexpected io.max field {token!r}")
        fields[key] = val
    return fields


def _io_max_value(fields: Mapping[str, str]) -> str:
    return " ".join(f"{key}={fields[key]}" for key in IO_MAX_KEYS)


def _parse_io_max(text: str) -> State:
    state: State = {}
    for raw in text.splitlines():
        device, _, rest = raw.strip().partition(" ")
        if not device:
            continue
        fields = _io_max_fields(rest)
        if any(v != "max" for v in fields.values()):  # the kernel does not list all-max devices
            state[device] = _io_max_value(fields)
    return state


_SCALAR = _Format(parse=_parse_scalar, line=lambda _item, value: value)
_IO_WEIGHT = _Format(
    parse=_parse_keyed,
    line=lambda item, value: f"{item} {value}",
    removal=lambda item: f"{item} default",
)
_IO_MAX = _Format(
    parse=_parse_io_max,
    line=lambda item, value: f"{item} {value}",
    removal=lambda item: f"{item} {_io_max_value(dict.fromkeys(IO_MAX_KEYS, 'max'))}",
)
# blkio.throttle.*_device: "MAJ:MIN BYTES" per line; writing "MAJ:MIN 0" removes the limit.
_V1_DEVICE = _Format(
    parse=_parse_keyed,
    line=lambda item, value: f"{item} {value}",
    removal=lambda item: f"{item} 0",
)


def _parse_cfs_quota(text: str) -> State:
    # The kernel stores any negative quota as -1 ("no cap"), so they all mean the same.
    value = text.strip()
    return {"": "-1" if value.startswith("-") else value}


_CFS_QUOTA = _Format(parse=_parse_cfs_quota, line=lambda _item, value: value)

_FORMATS: dict[str, _Format] = {
    "cpu.cfs_quota_us": _CFS_QUOTA,
    "io.weight": _IO_WEIGHT,
    "io.bfq.weight": _IO_WEIGHT,
    "io.max": _IO_MAX,
    "blkio.throttle.read_bps_device": _V1_DEVICE,
    "blkio.throttle.write_bps_device": _V1_DEVICE,
}


def _format(filename: str) -> _Format:
    return _FORMATS.get(filename, _SCALAR)


def _render(state: State) -> str:
    return "; ".join(f"{k} {v}".strip() for k, v in state.items()) or "(empty)"


# --- snapshots and reports --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The original text of every file the backend may touch, keyed by file name (not path, so
    it still applies after the VM restarts and gets a new domain id); ``None`` for a file that
    does not exist there."""

    version: CgroupVersion
    label: str
    files: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "label": self.label, "files": dict(self.files)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        version = data.get("version")
        if version not in ("v1", "v2"):
            raise CgroupError(f"snapshot version {version!r}: must be 'v1' or 'v2'")
        files = data.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in files.items()
        ):
            raise CgroupError(f"snapshot files {files!r}: must map file names to text or null")
        return cls(version=version, label=str(data.get("label", "")), files=dict(files))


@dataclass(frozen=True, slots=True)
class FileResult:
    """What happened to one control file: its text before and after (as read back from the
    kernel), the lines written, and if a step failed, the message for the report and the
    ``errno`` of the first OS error, for callers that must tell a vanished cgroup (ENOENT) from
    a refused value without reading the message."""

    path: str
    before: str | None
    after: str | None
    ok: bool
    error: str | None = None
    errno: int | None = None
    written: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.written)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "before": self.before,
            "after": self.after,
            "ok": self.ok,
            "error": self.error,
            "errno": self.errno,
            "written": list(self.written),
        }


@dataclass
class _Failures:
    """The failed steps of one file, in order; the first OS error among them is its errno."""

    messages: list[str] = field(default_factory=list)
    errno: int | None = None

    def add(self, message: str, exc: BaseException | None = None) -> None:
        self.messages.append(message)
        if self.errno is None and isinstance(exc, OSError):
            self.errno = exc.errno

    @property
    def message(self) -> str | None:
        return "; ".join(self.messages) or None


def _failed(
    cg: VmCgroup, path: Path, error: str, *, before: str | None = None, code: int | None = None
) -> FileResult:
    """A file left as it was (``before``) because of ``error``, which is logged."""
    log.warning("cgroup %s: %s", cg.label, error)
    return FileResult(
        path=str(path), before=before, after=before, ok=False, error=error, errno=code
    )


@dataclass(frozen=True, slots=True)
class ApplyReport:
    """The outcome of one apply or restore on one VM, file by file, to log and report back."""

    vm: str
    action: Literal["apply", "restore"]
    results: tuple[FileResult, ...]
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """what was asked and this cgroup has no file for (:data:`DISK_WEIGHT_UNSUPPORTED`), and
    why: not a failure, the other files were written"""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.results)

    @property
    def failures(self) -> tuple[FileResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    def result(self, filename: str) -> FileResult | None:
        """The result for control file ``filename`` (e.g. ``cpu.max``), if it was looked at."""
        for r in self.results:
            if Path(r.path).name == filename:
                return r
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "vm": self.vm,
            "action": self.action,
            "ok": self.ok,
            "results": [r.to_dict() for r in self.results],
        }


# --- reading, applying, restoring -------------------------------------------------------------


def read_current(cg: VmCgroup, io: CgroupIO | None = None) -> Snapshot:
    """Remember what the VM's files hold now, before gmd writes anything."""
    io = io or CgroupIO()
    files: dict[str, str | None] = {}
    for filename in cg.filenames:
        path = cg.file(filename)
        try:
            files[filename] = io.read(path).rstrip("\n")
        except FileNotFoundError:
            files[filename] = None
        except OSError as exc:
            # Without the original there is nothing to restore; apply leaves the file alone.
            log.warning("cgroup %s: cannot read %s: %s", cg.label, path, _describe(exc))
            files[filename] = None
    return Snapshot(version=cg.version, label=cg.label, files=files)


Transform = Callable[[State], State]


def _v2_transforms(limits: VmLimits, page_size: int) -> dict[str, Transform]:
    out: dict[str, Transform] = {}
    if limits.cpu_weight is not None:
        weight = str(limits.cpu_weight)
        out["cpu.weight"] = lambda _s: {"": weight}
    if limits.cpu_quota is not None:
        cores = limits.cpu_quota

        def cpu_max(state: State) -> State:
            parts = state.get("", "").split()
            period = int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else None
            period = period or CFS_PERIOD_DEFAULT_US
            return {"": f"{cpu_quota_to_us(cores, period)} {period}"}

        out["cpu.max"] = cpu_max
    if limits.io_weight is not None:
        io_weight = str(limits.io_weight)
        bfq_weight = str(io_weight_to_blkio(limits.io_weight, BLKIO_WEIGHT_DEFAULT_BFQ))
        out["io.weight"] = lambda s: {**s, "default": io_weight}
        out["io.bfq.weight"] = lambda s: {**s, "default": bfq_weight}
    if limits.io_bytes_per_s:
        caps = limits.io_bytes_per_s

        def io_max(state: State) -> State:
            new = dict(state)
            for device, (read, write) in caps.items():
                fields = _io_max_fields(new.get(device, ""))
                if read is not None:
                    fields["rbps"] = str(read)
                if write is not None:
                    fields["wbps"] = str(write)
                if any(v != "max" for v in fields.values()):
                    new[device] = _io_max_value(fields)
                else:
                    new.pop(device, None)
            return new

        out["io.max"] = io_max
    if limits.memory_high_bytes is not None:
        high = str(round_down_to_page(limits.memory_high_bytes, page_size))
        out["memory.high"] = lambda _s: {"": high}
    return out


def _v1_transforms(
    limits: VmLimits, page_size: int, cg: VmCgroup, io: CgroupIO
) -> dict[str, Transform]:
    out: dict[str, Transform] = {}
    if limits.cpu_weight is not None:
        shares = str(cpu_weight_to_shares(limits.cpu_weight))
        out["cpu.shares"] = lambda _s: {"": shares}
    if limits.cpu_quota is not None:
        period_path = cg.file("cpu.cfs_period_us")
        try:
            period = int(io.read(period_path).strip())
        except (OSError, ValueError) as exc:
            period = CFS_PERIOD_DEFAULT_US
            log.warning(
                "cgroup %s: cannot read %s (%s); assuming %d us",
                cg.label,
                period_path,
                exc,
                period,
            )
        quota = str(cpu_quota_to_us(limits.cpu_quota, period))
        out["cpu.cfs_quota_us"] = lambda _s: {"": quota}
    if limits.io_weight is not None:
        cfq = str(io_weight_to_blkio(limits.io_weight, BLKIO_WEIGHT_DEFAULT_CFQ))
        bfq = str(io_weight_to_blkio(limits.io_weight, BLKIO_WEIGHT_DEFAULT_BFQ))
        out["blkio.weight"] = lambda _s: {"": cfq}
        out["blkio.bfq.weight"] = lambda _s: {"": bfq}
    if limits.io_bytes_per_s:
        reads = {d: str(r) for d, (r, _w) in limits.io_bytes_per_s.items() if r is not None}
        writes = {d: str(w) for d, (_r, w) in limits.io_bytes_per_s.items() if w is not None}
        if reads:
            out["blkio.throttle.read_bps_device"] = lambda s: {**s, **reads}
        if writes:
            out["blkio.throttle.write_bps_device"] = lambda s: {**s, **writes}
    if limits.memory_high_bytes is not None:
        soft = str(round_down_to_page(limits.memory_high_bytes, page_size))
        out["memory.soft_limit_in_bytes"] = lambda _s: {"": soft}
    return out


def _diff_lines(fmt: _Format, current: State, desired: State) -> list[str]:
    lines = [fmt.line(item, value) for item, value in desired.items() if current.get(item) != value]
    if fmt.removal is not None:
        lines.extend(fmt.removal(item) for item in current if item not in desired)
    return lines


def _converge(
    cg: VmCgroup,
    io: CgroupIO,
    filename: str,
    base: State | None,
    transform: Transform | None,
    *,
    optional: bool,
) -> FileResult | None:
    """Bring one file to ``transform(base or current)``, writing only what differs."""
    path = cg.file(filename)
    fmt = _format(filename)
    try:
        before = io.read(path).rstrip("\n")
    except OSError as exc:
        if optional and exc.errno == errno.ENOENT:
            return None
        return _failed(cg, path, f"{_describe(exc)} reading {path}", code=exc.errno)
    try:
        current = fmt.parse(before)
        start = base if base is not None else current
        desired = transform(start) if transform is not None else start
    except ValueError as exc:
        return _failed(cg, path, f"{path}: cannot use its content {before!r}: {exc}", before=before)
    lines = _diff_lines(fmt, current, desired)
    if not lines:
        return FileResult(path=str(path), before=before, after=before, ok=True)
    return _write(cg, io, path, fmt, before, desired, lines)


def _write(
    cg: VmCgroup,
    io: CgroupIO,
    path: Path,
    fmt: _Format,
    before: str,
    desired: State,
    lines: list[str],
) -> FileResult:
    """Write ``lines`` (a failing one does not stop the others) and check what the kernel kept."""
    failures = _Failures()
    written: list[str] = []
    for line in lines:
        try:
            io.write(path, line)
        except OSError as exc:
            failures.add(f"{_describe(exc)} writing {line!r} to {path}", exc)
        else:
            written.append(line)
    after = _read_back(io, path, fmt, desired, written, failures)
    error = failures.message
    if written:
        log.info("cgroup %s: %s: %r -> %r (wrote %s)", cg.label, path, before, after, written)
    if error:
        log.warning("cgroup %s: %s", cg.label, error)
    return FileResult(
        path=str(path),
        before=before,
        after=after,
        ok=error is None,
        error=error,
        errno=failures.errno,
        written=tuple(written),
    )


def _read_back(
    io: CgroupIO,
    path: Path,
    fmt: _Format,
    desired: State,
    written: list[str],
    failures: _Failures,
) -> str | None:
    """The file's text after the writes; the kernel may have refused or normalised a value
    without failing the write, which only reading it back shows."""
    try:
        after = io.read(path).rstrip("\n")
        after_state = fmt.parse(after)
    except (OSError, ValueError) as exc:
        failures.add(f"cannot read {path} back: {exc}", exc)
        return None
    if not failures.messages and after_state != desired:
        failures.add(
            f"{path} reads {_render(after_state)!r} after writing {written}, "
            f"expected {_render(desired)!r}"
        )
    return after


def apply(
    cg: VmCgroup,
    limits: VmLimits,
    baseline: Snapshot | None = None,
    *,
    io: CgroupIO | None = None,
    page_size: int | None = None,
) -> ApplyReport:
    """Hold the VM to ``limits``; returns what happened file by file, never raises for a file.

    A knob the limits leave at ``None`` goes back to its value in ``baseline`` (the snapshot
    taken before gmd first touched the VM), so lowering a throttle level also lifts the caps
    the previous level set, and a cap the operator had set before gmd stays. Without a
    baseline such knobs are left as they are. The same holds per device and direction in
    ``io_bytes_per_s``.
    """
    io = io or CgroupIO()
    page_size = page_size or os.sysconf("SC_PAGE_SIZE")
    if baseline is not None and baseline.version != cg.version:
        raise CgroupError(
            f"cgroup {cg.label}: baseline snapshot is cgroup {baseline.version}, "
            f"the host is {cg.version}"
        )
    if cg.version == "v2":
        transforms = _v2_transforms(limits, page_size)
    else:
        transforms = _v1_transforms(limits, page_size, cg, io)
    results = _run(cg, io, transforms, baseline)
    weight_file_seen = any(Path(r.path).name in _V1_WEIGHT_FILES for r in results)
    unsupported = {}
    if cg.version == "v1" and limits.io_weight is not None and not weight_file_seen:
        dirpath = cg.dirs["blkio"]
        why = f"{dirpath}: neither {' nor '.join(_V1_WEIGHT_FILES)} exists (no BFQ or CFQ)"
        log.info("cgroup %s: disk weight not set: %s", cg.label, why)
        unsupported[DISK_WEIGHT_UNSUPPORTED] = why
    return _report(cg, "apply", results, unsupported)


def restore(cg: VmCgroup, snapshot: Snapshot, *, io: CgroupIO | None = None) -> ApplyReport:
    """Put every file back to the text it had in ``snapshot``; files absent then are skipped."""
    if snapshot.version != cg.version:
        raise CgroupError(
            f"cgroup {cg.label}: snapshot is cgroup {snapshot.version}, the host is {cg.version}"
        )
    results = _run(cg, io or CgroupIO(), {}, snapshot)
    return _report(cg, "restore", results)


def _run(
    cg: VmCgroup, io: CgroupIO, transforms: dict[str, Transform], baseline: Snapshot | None
) -> list[FileResult]:
    results: list[FileResult] = []
    for filename in cg.filenames:
        transform = transforms.get(filename)
        original = baseline.files.get(filename) if baseline is not None else None
        base: State | None = None
        if original is not None:
            try:
                base = _format(filename).parse(original)
            except ValueError as exc:
                path = cg.file(filename)
                results.append(
                    _failed(cg, path, f"{path}: snapshot text {original!r} unusable: {exc}")
                )
                continue
        if transform is None and base is None:
            continue  # gmd asks nothing of this file and has nothing to put back
        result = _converge(cg, io, filename, base, transform, optional=filename in _WEIGHT_FILES)
        if result is not None:
            results.append(result)
    return results


def _report(
    cg: VmCgroup,
    action: Literal["apply", "restore"],
    results: list[FileResult],
    unsupported: Mapping[str, str] | None = None,
) -> ApplyReport:
    report = ApplyReport(
        vm=cg.label, action=action, results=tuple(results), unsupported=dict(unsupported or {})
    )
    if report.ok:
        log.info(
            "cgroup %s: %s done, %d file(s) changed",
            cg.label,
            action,
            sum(r.changed for r in results),
        )
    else:
        log.warning(
            "cgroup %s: %s incomplete, %d of %d file(s) failed",
            cg.label,
            action,
            len(report.failures),
            len(results),
        )
    return report


class CgroupBackend:
    """The backend as the agent uses it: each VM's cgroup found from its QEMU process by
    ``locator`` — or, when a ``template`` is configured, rendered from it under ``root``."""

    def __init__(
        self,
        root: Path,
        template: str | None = None,
        *,
        locator: CgroupLocator | None = None,
        version: CgroupVersion | None = None,
        io: CgroupIO | None = None,
    ) -> None:
        self.root = Path(root)
        self.template = template
        self.locator = locator or CgroupLocator()
        self.version: CgroupVersion | None = None
        if template is not None:
            self.version = version or detect(self.root)
        self.io = io or CgroupIO()

    def describe(self) -> str:
        """Where the VMs' cgroups are found, for the log."""
        if self.template is None:
            return f"found from each VM's QEMU process ({self.locator.run_dir}/NAME.pid)"
        return f"cgroup {self.version} under {self.root}, template {self.template!r}"

    def locate(self, vm: VmIdentity) -> VmCgroup:
        if self.template is not None:
            return from_template(self.root, self.template, vm, self.version)
        try:
            return from_domain(self.locator.of_domain(vm.name))
        except CgroupNotFound as exc:
            raise CgroupError(str(exc)) from None

    def read_current(self, vm: VmIdentity) -> Snapshot:
        return read_current(self.locate(vm), self.io)

    def apply(
        self, vm: VmIdentity, limits: VmLimits, baseline: Snapshot | None = None
    ) -> ApplyReport:
        return apply(self.locate(vm), limits, baseline, io=self.io)

    def restore(self, vm: VmIdentity, snapshot: Snapshot) -> ApplyReport:
        return restore(self.locate(vm), snapshot, io=self.io)
