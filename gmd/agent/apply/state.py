"""What the appliers remember on disk: every changed VM's original settings, kept so that an
agent restart (or ``gmd-agent --restore-all``) still puts each VM back exactly."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmd import GmdError

STATE_VERSION = 1

Value = int | float | str | None
Settings = dict[str, Value]


class EnforceBackend(enum.StrEnum):
    """How the agent applies the daemon's plan (``agent.enforce_backend``)."""

    libvirt = "libvirt"
    """libvirt's LIVE tuning of each domain"""
    cgroup = "cgroup"
    """the VMs' cgroup files, written directly"""
    none = "none"
    """no plan fetched or applied: the agent only measures"""


class EnforcementStateError(GmdError):
    """The state file cannot be used; the message names it and says what to do."""


@dataclass
class VmRecord:
    """A VM gmd has (or may have) changed: its original settings and which process it was."""

    name: str
    run_id: int
    since_s: float
    originals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "run_id": self.run_id,
            "since_s": self.since_s,
            "originals": self.originals,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VmRecord:
        return cls(
            name=str(data["name"]),
            run_id=int(data["run_id"]),
            since_s=float(data["since_s"]),
            originals=dict(data["originals"]),
        )


class EnforcementState:
    """What the applier must not forget across restarts, in one small JSON file::

        {"version": 1, "backend": "libvirt",
         "vms": {UUID: {"name", "run_id", "since_s", "originals": {knob: value}}},
         "dry_run": {UUID: {"before": {...}, "after": {...}}},
         "reported": {UUID: signature of the last failure or would_* reported}}

    Written whole to a temporary file, fsynced and renamed over the old one, so a crash leaves
    the old or the new file, never half of one. JSON rather than SQLite: a few hundred VMs at
    most, read by an operator in an emergency (``jq``), rewritten only when something changes.
    """

    def __init__(self, path: Path, backend: EnforceBackend) -> None:
        self.path, self.backend = Path(path), backend
        self.records: dict[str, VmRecord] = {}
        self.dry_run: dict[str, dict[str, Settings]] = {}
        self.reported: dict[str, str] = {}
        self._saved: str | None = None
        self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self._saved = self.to_json()  # nothing to remember yet: no file until there is
            return
        except OSError as exc:
            raise EnforcementStateError(f"{self.path}: cannot read: {exc.strerror}") from None
        backend, records, dry_run, reported = self._parse(text)
        if backend != self.backend and records:
            raise EnforcementStateError(
                f"{self.path}: remembers {len(records)} VM(s) changed through the"
                f" {backend!r} backend, but this agent uses {str(self.backend)!r}: put them"
                " back first (gmd-agent --restore-all with the old agent.enforce_backend)"
            )
        self.records, self.dry_run, self.reported = records, dry_run, reported
        self._saved = text

    def _parse(
        self, text: str
    ) -> tuple[Any, dict[str, VmRecord], dict[str, dict[str, Settings]], dict[str, str]]:
        """The file's backend, records, dry-run changes and reported signatures."""
        try:
            doc = json.loads(text)
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"version {doc.get('version')!r}, expected {STATE_VERSION}")
            records = {u: VmRecord.from_dict(r) for u, r in doc.get("vms", {}).items()}
            dry_run = {
                u: {"before": d["before"], "after": d["after"]}
                for u, d in doc.get("dry_run", {}).items()
            }
            reported = {str(u): str(s) for u, s in doc.get("reported", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EnforcementStateError(
                f"{self.path}: not a gmd enforcement state file ({exc}); it holds the original"
                " settings of throttled VMs: repair it, or move it away once those VMs are"
                " known to be as they should"
            ) from None
        return doc.get("backend"), records, dry_run, reported

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": STATE_VERSION,
                "backend": self.backend,
                "vms": {u: r.to_dict() for u, r in sorted(self.records.items())},
                "dry_run": dict(sorted(self.dry_run.items())),
                "reported": dict(sorted(self.reported.items())),
            },
            indent=1,
            sort_keys=True,
        )

    def save(self) -> None:
        """Write the file if anything changed since the last write, atomically: a crash
        must leave the originals readable."""
        text = self.to_json()
        if text == self._saved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._saved = text
