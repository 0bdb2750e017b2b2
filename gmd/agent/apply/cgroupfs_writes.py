"""The cgroup backend's writes: hold a VM to a :class:`~gmd.agent.apply.limits.VmLimits` by
writing its cgroup control files directly (found by :mod:`gmd.agent.apply.cgroupfs`), for hosts
where the agent is configured not to go through libvirt.

Every write is one line per ``write()`` call, which cgroupfs needs for files holding one line
per device. Writes are skipped when the file already holds the wanted value, so applying the
same limits twice writes nothing the second time. A failing file (ENOENT, EINVAL, EBUSY,
EACCES, ...) is recorded in the :class:`~gmd.agent.apply.cgroupfs_report.ApplyReport`, errno
included, and the other files are still written; nothing here raises for a per-file failure.

The originals are remembered as a :class:`~gmd.agent.apply.cgroupfs_report.Snapshot` (the raw
text of every file the backend may touch) by :func:`read_current`, and put back exactly by
:func:`restore`.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gmd.agent.apply.cgroupfs import (
    CgroupError,
    CgroupVersion,
    VmCgroup,
    VmIdentity,
    detect,
    from_domain,
    from_template,
)
from gmd.agent.apply.cgroupfs_formats import ControlFormat, State, control_format, render_state
from gmd.agent.apply.cgroupfs_knobs import (
    V1_WEIGHT_FILES,
    WEIGHT_FILES,
    Transform,
    v1_transforms,
    v2_transforms,
)
from gmd.agent.apply.cgroupfs_report import (
    DISK_WEIGHT_UNSUPPORTED,
    ApplyReport,
    FileResult,
    Snapshot,
)
from gmd.agent.apply.limits import CFS_PERIOD_DEFAULT_US, VmLimits
from gmd.agent.cgroups import CgroupLocator, CgroupNotFound

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


def _diff_lines(fmt: ControlFormat, current: State, desired: State) -> list[str]:
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
    fmt = control_format(filename)
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
    fmt: ControlFormat,
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
    fmt: ControlFormat,
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
            f"{path} reads {render_state(after_state)!r} after writing {written}, "
            f"expected {render_state(desired)!r}"
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
        transforms = v2_transforms(limits, page_size)
    else:
        period = CFS_PERIOD_DEFAULT_US if limits.cpu_quota is None else _cfs_period(cg, io)
        transforms = v1_transforms(limits, page_size, period)
    results = _run(cg, io, transforms, baseline)
    weight_file_seen = any(Path(r.path).name in V1_WEIGHT_FILES for r in results)
    unsupported = {}
    if cg.version == "v1" and limits.io_weight is not None and not weight_file_seen:
        dirpath = cg.dirs["blkio"]
        why = f"{dirpath}: neither {' nor '.join(V1_WEIGHT_FILES)} exists (no BFQ or CFQ)"
        log.info("cgroup %s: disk weight not set: %s", cg.label, why)
        unsupported[DISK_WEIGHT_UNSUPPORTED] = why
    return _report(cg, "apply", results, unsupported)


def _cfs_period(cg: VmCgroup, io: CgroupIO) -> int:
    """A v1 cgroup's CPU period, which its quota is a share of; the kernel's default when it
    cannot be read (said in the log)."""
    period_path = cg.file("cpu.cfs_period_us")
    try:
        return int(io.read(period_path).strip())
    except (OSError, ValueError) as exc:
        period = CFS_PERIOD_DEFAULT_US
        log.warning(
            "cgroup %s: cannot read %s (%s); assuming %d us",
            cg.label,
            period_path,
            exc,
            period,
        )
        return period


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
                base = control_format(filename).parse(original)
            except ValueError as exc:
                path = cg.file(filename)
                results.append(
                    _failed(cg, path, f"{path}: snapshot text {original!r} unusable: {exc}")
                )
                continue
        if transform is None and base is None:
            continue  # gmd asks nothing of this file and has nothing to put back
        result = _converge(cg, io, filename, base, transform, optional=filename in WEIGHT_FILES)
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
