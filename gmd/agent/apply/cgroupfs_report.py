"""What the cgroup backend remembers and reports of a VM's control files: the originals,
taken before gmd writes (:class:`Snapshot`, JSON-serialisable so the agent can keep it on disk
across restarts), and what one apply or restore did, file by file (:class:`ApplyReport`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gmd.agent.apply.cgroupfs import CgroupError, CgroupVersion

DISK_WEIGHT_UNSUPPORTED = "disk_weight"
"""the key of :attr:`ApplyReport.unsupported` when no disk weight file exists"""


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
