"""The host side of enforcement: bring this host's VMs to the daemon's plan, and back.

The agent fetches a :class:`~gmd.wire.HostPlan` and hands it to
:meth:`PlanApplier.sync`, which returns what to report back (:class:`VmApplyResult`). Two
implementations share the plan logic of :class:`PlanApplier` and differ in how they touch a VM:

- :class:`LibvirtApplier` (the default): LIVE tuning through libvirt, never the persistent
  definition (``VIR_DOMAIN_AFFECT_LIVE`` only; the binding refuses LIVE|CONFIG together).
  ``cpu_shares``, ``vcpu_quota``/``vcpu_period`` (setSchedulerParametersFlags), blkio
  ``weight`` (setBlkioParameters) and per-disk ``read_bytes_sec``/``write_bytes_sec``
  (setBlockIoTune). Disk caps go through ``blockIoTune`` rather than blkio's
  ``device_read_bytes_sec``: blkio throttles need the *host* block device behind a disk
  ("/dev/sda,BYTES"), which a file on a shared filesystem or a Ceph/iSCSI disk opened by QEMU
  itself does not have, while QEMU's own I/O throttling works per guest disk whatever backs
  it (it is what Nova's ``quota:disk_*`` flavor keys use too). A VM's cap is split evenly over
  its disks, so the VM as a whole stays under it. Interface bandwidth is not applied: it needs
  ``tc`` (kernel modules absent on these hosts, and a failed live change can leave a VM's NIC
  half-configured); the plan carries no network cap today and the applier logs that once.
- :class:`CgroupApplier`: writes the VM's cgroup files through :mod:`gmd.agent.apply.cgroups`
  (v1 or v2, detected), for hosts configured that way; libvirt (read-only) only tells it which
  VMs run, under which name and domain id.

Weights are relative to the VM's own original value: the plan's scale has 100 = normal, so a
weight of 25 sets a quarter of what the VM had. On cgroup v2 a normal VM has ``cpu_shares``
100 and gets exactly the plan's number; on cgroup v1 (default 1024) or with a flavor's
``quota:cpu_shares`` the proportion is what is kept, which is what "a weight factor" means.

What gmd changes is remembered on disk (:class:`EnforcementState`, a JSON file): the original
values of every knob, read before the first change and written to the file *before* any
change, so that an agent restart still restores exactly. Policy:

- mode "on": VMs in the plan are brought to their targets (re-applied if someone changed
  them, after a VM restart — its live settings went with the old process, so its originals are
  read afresh — and for a VM that migrated in); VMs gmd changed that left the plan are put back
  exactly as they were.
- mode "off": every VM gmd changed is put back; the daemon is telling the agent to stop.
- mode "dry-run": nothing is applied; ``would_apply``/``would_restore`` are reported once per
  distinct change. VMs gmd had changed while the mode was "on" are put back for real, so that
  a host in dry-run carries no throttle of gmd's.
- the daemon unreachable: nothing changes (the agent does not call :meth:`sync`).
- agent stopped: nothing changes; the state file keeps the originals for the next start (or
  ``gmd-agent --restore-all``, which puts every remembered VM back and exits).

A failure on one VM (or on one knob of it) is logged and reported (``ok: false``) and the rest
still goes on; the same failure is reported once, not at every fetch. A VM that vanished
(stopped, undefined, migrated away) is forgotten: its live settings left with it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import stat
import tempfile
import time
import xml.etree.ElementTree as ET
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import libvirt

from gmd.agent.apply.cgroups import (
    CgroupBackend,
    CgroupError,
    CgroupIO,
    CgroupVersion,
    Snapshot,
    VmIdentity,
    apply as cgroup_apply,
    restore as cgroup_restore,
)
from gmd.agent.apply.limits import (
    BLKIO_WEIGHT_DEFAULT_BFQ,
    CFS_PERIOD_DEFAULT_US,
    SHARES_MAX,
    SHARES_MIN,
    WEIGHT_DEFAULT,
    WEIGHT_MAX,
    LimitsError,
    VmLimits,
    cpu_quota_to_us,
    io_weight_to_blkio,
)
from gmd.wire import HostPlan, VmApplyResult, VmPlanItem

log = logging.getLogger(__name__)

LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE
# The domain stopped or was undefined between two calls.
GONE = frozenset({libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID})
# Looking up a plan's VM: these mean "no such VM here" (a uuid libvirt cannot parse included);
# anything else is libvirt failing, which must not make gmd forget what it changed.
NOT_HERE = GONE | {libvirt.VIR_ERR_INVALID_ARG}
# The connection itself failed: nothing more can be done through it in this round.
CONNECTION_LOST = frozenset(
    {
        libvirt.VIR_ERR_SYSTEM_ERROR,
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_INVALID_CONN,
        libvirt.VIR_ERR_NO_CONNECT,
    }
)
STATE_VERSION = 1

Value = int | float | str | None
Settings = dict[str, Value]


class EnforcementStateError(Exception):
    """The state file cannot be used; the message names it and says what to do."""


class BackendUnavailable(Exception):
    """The hypervisor cannot be reached at all: this round stops, nothing is forgotten."""


class VmGone(Exception):
    """The VM stopped or disappeared while it was being changed."""


# --- the state file -------------------------------------------------------------------------------


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

    def __init__(self, path: Path, backend: str) -> None:
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
        if doc.get("backend") != self.backend and records:
            raise EnforcementStateError(
                f"{self.path}: remembers {len(records)} VM(s) changed through the"
                f" {doc.get('backend')!r} backend, but this agent uses {self.backend!r}: put them"
                " back first (gmd-agent --restore-all with the old agent.enforce_backend)"
            )
        self.records, self.dry_run, self.reported = records, dry_run, reported
        self._saved = text

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
        """Write the file if anything changed since the last write (atomically)."""
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


# --- the plan logic -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VmRef:
    """A running VM as the backend found it; ``run_id`` is libvirt's domain id, which changes
    whenever the VM's process starts (a restart, or a migration in)."""

    uuid: str
    name: str
    run_id: int
    handle: Any = None


@dataclass
class Outcome:
    """What a change did (or, dry, would do): the knobs that differed, before and after."""

    before: Settings = field(default_factory=dict)
    after: Settings = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.after)


class PlanApplier(ABC):
    """Applies plans to this host's VMs and remembers originals; see the module docstring.

    Subclasses say how to find a VM, read its originals, and converge it.
    """

    backend: ClassVar[str]

    def __init__(self, state_path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.state = EnforcementState(state_path, self.backend)
        self._clock = clock
        self._pending: list[VmApplyResult] = []

    # -- what a backend provides -------------------------------------------------------------------

    @abstractmethod
    def _find(self, uuid: str) -> VmRef | None:
        """The running VM, or ``None`` when it does not run here; BackendUnavailable when the
        hypervisor cannot be asked."""

    @abstractmethod
    def _snapshot(self, vm: VmRef, known: dict[str, Any]) -> dict[str, Any]:
        """``known`` completed with the current values of knobs not yet in it (a knob gmd never
        changed still has its original value). Must not change anything."""

    @abstractmethod
    def _apply(
        self, vm: VmRef, item: VmPlanItem, originals: dict[str, Any], *, dry: bool
    ) -> Outcome:
        """Bring the VM to the plan's targets (knobs the plan leaves free: to the originals)."""

    @abstractmethod
    def _restore(self, vm: VmRef, originals: dict[str, Any], *, dry: bool) -> Outcome:
        """Put every remembered knob back to its original value."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release the backend's connections."""

    # -- the plan ----------------------------------------------------------------------------------

    def sync(self, plan: HostPlan) -> list[VmApplyResult]:
        """Apply ``plan``; the results worth reporting (changes, first failures, would-dos)."""
        if plan.mode == "off":
            results = self.restore_all()
            if self.state.dry_run:
                self.state.dry_run.clear()
                self.state.save()
            return results
        dry = plan.mode == "dry-run"
        wanted = {item.uuid: item for item in plan.vms}
        try:
            for uuid in sorted(self.state.records):
                if dry or uuid not in wanted:
                    self._restore_one(uuid)
            for uuid, item in wanted.items():
                self._apply_one(uuid, item, dry=dry)
            if dry:
                for uuid in sorted(set(self.state.dry_run) - set(wanted)):
                    was = self.state.dry_run.pop(uuid)
                    self._result(uuid, "would_restore", Outcome(was["after"], was["before"]))
            elif self.state.dry_run:
                self.state.dry_run.clear()
        except BackendUnavailable as exc:
            log.warning("enforcement: %s; the rest of the plan waits for the next round", exc)
        finally:
            self.state.save()
        return self._take_results()

    def restore_all(self) -> list[VmApplyResult]:
        """Put back every VM gmd changed (mode "off", ``gmd-agent --restore-all``)."""
        if self.state.records:
            log.info("enforcement: restoring %d VM(s) gmd changed", len(self.state.records))
        try:
            for uuid in sorted(self.state.records):
                self._restore_one(uuid)
        except BackendUnavailable as exc:
            log.warning("enforcement: %s; restoring the rest waits for the next round", exc)
        finally:
            self.state.save()
        return self._take_results()

    @property
    def remembered(self) -> dict[str, VmRecord]:
        """The VMs whose originals are kept (gmd changed them, or is about to)."""
        return dict(self.state.records)

    # -- one VM ------------------------------------------------------------------------------------

    def _apply_one(self, uuid: str, item: VmPlanItem, *, dry: bool) -> None:
        vm = self._find(uuid)
        record = self.state.records.get(uuid)
        if vm is None:
            if record is not None:
                self._forget(uuid, "no longer runs on this host")
            else:
                log.debug("enforcement: VM %s in the plan does not run here; skipped", uuid)
            return
        if record is not None and record.run_id != vm.run_id:
            log.info(
                "enforcement: VM %s (%s) restarted (domain id %d → %d): its live settings were"
                " reset; reading its originals afresh and applying the plan again",
                uuid,
                vm.name,
                record.run_id,
                vm.run_id,
            )
            del self.state.records[uuid]
            record = None
        try:
            known = record.originals if record is not None else {}
            originals = self._snapshot(vm, known)
            if not dry and (record is None or originals != record.originals):
                # Remembered on disk before anything changes, so a crash cannot lose them.
                record = VmRecord(vm.name, vm.run_id, self._clock(), originals)
                self.state.records[uuid] = record
                self.state.save()
            outcome = self._apply(vm, item, originals, dry=dry)
        except VmGone:
            if uuid in self.state.records:
                self._forget(uuid, "vanished while being changed")
            return
        if dry:
            if outcome.changed:
                self.state.dry_run[uuid] = {"before": outcome.before, "after": outcome.after}
            else:
                self.state.dry_run.pop(uuid, None)
            if outcome.changed or outcome.errors:
                self._result(uuid, "would_apply", outcome)
        elif outcome.changed or outcome.errors:
            self._result(uuid, "apply", outcome)

    def _restore_one(self, uuid: str) -> None:
        record = self.state.records[uuid]
        vm = self._find(uuid)
        if vm is None:
            self._forget(uuid, "no longer runs on this host")
            return
        if vm.run_id != record.run_id:
            self._forget(
                uuid, f"restarted (domain id {record.run_id} → {vm.run_id}): nothing to put back"
            )
            return
        try:
            outcome = self._restore(vm, record.originals, dry=False)
        except VmGone:
            self._forget(uuid, "vanished while being restored")
            return
        if not outcome.errors:
            del self.state.records[uuid]
            log.info(
                "enforcement: VM %s (%s) %s",
                uuid,
                vm.name,
                "restored to its original settings" if outcome.changed else "needed no restore",
            )
        if outcome.changed or outcome.errors:
            self._result(uuid, "restore", outcome)

    def _forget(self, uuid: str, why: str) -> None:
        record = self.state.records.pop(uuid, None)
        name = record.name if record is not None else "?"
        log.info("enforcement: VM %s (%s) %s: forgetting its original settings", uuid, name, why)
        self.state.reported.pop(uuid, None)

    def _result(self, uuid: str, action: str, outcome: Outcome) -> None:
        """Queue a result, unless it repeats the failure or would-do last reported for the VM."""
        error = "; ".join(outcome.errors) or None
        result = VmApplyResult(
            uuid=uuid,
            action=action,  # type: ignore[arg-type]
            ok=error is None,
            error=error[:2000] if error else None,
            before=outcome.before,
            after=outcome.after,
        )
        if action.startswith("would_"):
            signature = json.dumps([action, error, outcome.after], sort_keys=True, default=str)
        elif error is not None:
            signature = json.dumps([action, error], default=str)
        else:
            signature = None
        if signature is not None and self.state.reported.get(uuid) == signature:
            log.debug("enforcement: VM %s: %s unchanged since reported", uuid, action)
            return
        if signature is None:
            self.state.reported.pop(uuid, None)
        else:
            self.state.reported[uuid] = signature
        if error is not None:
            log.warning("enforcement: VM %s: %s incomplete: %s", uuid, action, error)
        else:
            log.info(
                "enforcement: VM %s: %s %s → %s",
                uuid,
                action,
                json.dumps(outcome.before, sort_keys=True),
                json.dumps(outcome.after, sort_keys=True),
            )
        self._pending.append(result)

    def _take_results(self) -> list[VmApplyResult]:
        out, self._pending = self._pending, []
        return out


# --- libvirt --------------------------------------------------------------------------------------

SCHED_KEYS = ("cpu_shares", "vcpu_quota", "vcpu_period")
IOTUNE_KEYS = ("total_bytes_sec", "read_bytes_sec", "write_bytes_sec")


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def scaled_shares(original: int, weight: int) -> int:
    """``cpu_shares`` for plan weight ``weight`` (100 = normal) relative to the VM's original:
    on cgroup v2 (original 100) the plan's number itself, on v1 (1024) the same proportion.
    Bounded by what the kernel takes: 2..10000 on v2 scales, up to 262144 on v1 ones."""
    base = original if original > 0 else WEIGHT_DEFAULT
    high = WEIGHT_MAX if base <= WEIGHT_MAX else SHARES_MAX
    return max(SHARES_MIN, min(high, _round_half_up(base * weight / WEIGHT_DEFAULT)))


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
    """Target names of the domain's disks that have a source (not an empty CD-ROM drive)."""
    root = ET.fromstring(xml)
    out = []
    for disk in root.iterfind("devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        dev = target.get("dev") if target is not None else None
        if dev and disk.get("device", "disk") == "disk" and source is not None and source.attrib:
            out.append(dev)
    return out


class LibvirtApplier(PlanApplier):
    """LIVE libvirt tuning (see the module docstring). ``conn_or_uri``: an open read-write
    connection (kept open, not closed here) or a URI opened on first use and reopened after a
    lost connection."""

    backend = "libvirt"

    def __init__(
        self,
        conn_or_uri: Any = "qemu:///system",
        *,
        state_path: Path,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(state_path, clock=clock)
        if isinstance(conn_or_uri, str):
            self.uri, self._conn, self._owned = conn_or_uri, None, True
        else:
            self.uri, self._conn, self._owned = conn_or_uri.getURI(), conn_or_uri, False
        log.info(
            "enforcement through libvirt %s (LIVE only): cpu_shares, vcpu_quota, blkio weight,"
            " per-disk blockIoTune; interface bandwidth is not applied (needs tc, not reliable"
            " live)",
            self.uri,
        )

    def _connection(self) -> Any:
        if self._conn is None:
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as exc:
                raise BackendUnavailable(
                    f"cannot connect to libvirt at {self.uri}: {exc}"
                ) from None
        return self._conn

    def _lost(self, exc: libvirt.libvirtError, during: str) -> BackendUnavailable:
        if self._owned and self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None
        return BackendUnavailable(f"libvirt connection to {self.uri} lost while {during}: {exc}")

    def close(self) -> None:
        if self._owned and self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None

    def _find(self, uuid: str) -> VmRef | None:
        conn = self._connection()
        try:
            dom = conn.lookupByUUIDString(uuid)
            if not dom.isActive():
                return None
            return VmRef(uuid, dom.name(), dom.ID(), dom)
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            if code in NOT_HERE:
                return None
            if code in CONNECTION_LOST:
                raise self._lost(exc, f"looking up VM {uuid}") from None
            raise BackendUnavailable(f"libvirt {self.uri}: looking up VM {uuid}: {exc}") from None

    # -- reading -----------------------------------------------------------------------------------

    def _call(self, vm: VmRef, what: str, fn: Callable[[], Any]) -> Any:
        """One libvirt call on ``vm``: a vanished VM raises VmGone, a lost connection
        BackendUnavailable, anything else libvirtError (for the caller to report)."""
        try:
            return fn()
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            if code in GONE:
                raise VmGone(vm.uuid) from None
            if code in CONNECTION_LOST:
                raise self._lost(exc, f"{what} of VM {vm.uuid} ({vm.name})") from None
            raise

    def _read(self, vm: VmRef) -> tuple[Settings, dict[str, str]]:
        """Every knob's current LIVE value; per group that could not be read, why."""
        dom = vm.handle
        values: Settings = {}
        failed: dict[str, str] = {}
        try:
            sched = self._call(vm, "reading", lambda: dom.schedulerParametersFlags(LIVE))
            for key in SCHED_KEYS:
                values[key] = int(sched[key])
        except (libvirt.libvirtError, KeyError) as exc:
            failed["sched"] = f"schedulerParametersFlags: {_why(exc)}"
        try:
            blkio = self._call(vm, "reading", lambda: dom.blkioParameters(LIVE))
            values["blkio_weight"] = int(blkio["weight"])
        except (libvirt.libvirtError, KeyError) as exc:
            failed["blkio"] = f"blkioParameters: {_why(exc)}"
        try:
            disks = live_disks(self._call(vm, "reading", lambda: dom.XMLDesc(0)))
        except (libvirt.libvirtError, ET.ParseError) as exc:
            failed["disks"] = f"XMLDesc: {_why(exc)}"
            disks = []
        for dev in disks:
            try:
                tune = self._call(vm, "reading", lambda d=dev: dom.blockIoTune(d, LIVE))
                for key in IOTUNE_KEYS:
                    values[f"{dev}.{key}"] = int(tune[key])
            except (libvirt.libvirtError, KeyError) as exc:
                failed[f"disk {dev}"] = f"blockIoTune({dev}): {_why(exc)}"
        return values, failed

    def _snapshot(self, vm: VmRef, known: dict[str, Any]) -> dict[str, Any]:
        current, _failed = self._read(vm)
        return {**current, **known}

    # -- converging --------------------------------------------------------------------------------

    def _targets(
        self, vm: VmRef, item: VmPlanItem, originals: dict[str, Any]
    ) -> tuple[Settings, list[str]]:
        """The value every remembered knob should have under ``item``."""
        desired: Settings = {}
        errors: list[str] = []
        if all(k in originals for k in SCHED_KEYS):
            desired["cpu_shares"] = scaled_shares(originals["cpu_shares"], item.cpu_weight)
            if item.cpu_quota_cores is None:
                desired["vcpu_quota"] = originals["vcpu_quota"]
                desired["vcpu_period"] = originals["vcpu_period"]
            else:
                period = originals["vcpu_period"] or CFS_PERIOD_DEFAULT_US
                try:
                    vcpus = int(self._call(vm, "reading", lambda: vm.handle.info())[3])
                except libvirt.libvirtError as exc:
                    vcpus = 0
                    errors.append(f"vcpu_quota: cannot count its vCPUs: {_why(exc)}")
                if vcpus > 0:
                    quota = cpu_quota_to_us(item.cpu_quota_cores / vcpus, period)
                    orig_quota = originals["vcpu_quota"]
                    if 0 < orig_quota < quota and originals["vcpu_period"] == period:
                        quota = orig_quota  # never looser than a cap the VM already had
                    desired["vcpu_quota"] = quota
                    desired["vcpu_period"] = period
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

    def _apply(
        self, vm: VmRef, item: VmPlanItem, originals: dict[str, Any], *, dry: bool
    ) -> Outcome:
        desired, errors = self._targets(vm, item, originals)
        needs = set()
        if item.cpu_weight != WEIGHT_DEFAULT or item.cpu_quota_cores is not None:
            needs.add("sched")
        if item.io_weight != WEIGHT_DEFAULT:
            needs.add("blkio")
        if item.disk_read_bytes_per_s is not None or item.disk_write_bytes_per_s is not None:
            needs.add("disk")
            if not any(k.endswith(".read_bytes_sec") for k in originals):
                errors.append("disk caps: the VM has no disk to cap")
        return self._converge(vm, desired, errors, needs, dry=dry)

    def _restore(self, vm: VmRef, originals: dict[str, Any], *, dry: bool) -> Outcome:
        return self._converge(vm, dict(originals), [], set(), dry=dry)

    def _converge(
        self, vm: VmRef, desired: Settings, errors: list[str], needs: set[str], *, dry: bool
    ) -> Outcome:
        """Write the knobs whose LIVE value differs from ``desired``, group by group, and
        read them back. A group that cannot be read is not written, and is reported when the
        plan needs it (``needs``: "sched", "blkio", "disk") or gmd has originals to put back."""
        current, failed = self._read(vm)
        for group, why in failed.items():
            kind = "disk" if group.startswith("disk") else group
            touches = (
                (kind == "sched" and any(k in desired for k in SCHED_KEYS))
                or (kind == "blkio" and "blkio_weight" in desired)
                or (kind == "disk" and any("." in k for k in desired))
            )
            if touches or kind in needs:
                errors.append(f"{_knobs(group)}: cannot read: {why}")
        diff = {k: v for k, v in desired.items() if k in current and current[k] != v}
        before = {k: current[k] for k in diff}
        if dry or not diff:
            return Outcome(before, diff, _prefixed(vm, errors))
        dom = vm.handle
        sched = {k: diff[k] for k in SCHED_KEYS if k in diff}
        if "vcpu_quota" in sched or "vcpu_period" in sched:
            # the kernel checks a quota against the period in force: send them together
            sched["vcpu_quota"], sched["vcpu_period"] = (
                desired["vcpu_quota"],
                desired["vcpu_period"],
            )
        writes: list[tuple[str, list[str], Callable[[], Any]]] = []
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
                    lambda d=dev, t=tune: dom.setBlockIoTune(d, t, LIVE),
                )
            )
        failed_keys: set[str] = set()
        for what, keys, call in writes:
            try:
                self._call(vm, "changing", call)
            except libvirt.libvirtError as exc:
                errors.append(f"{what} failed: {_why(exc)}")
                failed_keys.update(keys)
        after_all, _ = self._read(vm)
        after: Settings = {}
        for key, want in diff.items():
            got = after_all.get(key)
            if got != before[key]:
                after[key] = got
            if got != want and key not in failed_keys:
                errors.append(f"{key}: reads {got!r} after setting {want!r}")
        return Outcome({k: before[k] for k in after}, after, _prefixed(vm, errors))


def _knobs(group: str) -> str:
    return {
        "sched": "cpu_shares/vcpu_quota/vcpu_period",
        "blkio": "blkio weight",
        "disks": "disk caps",
    }.get(group, f"{group} caps")


def _prefixed(vm: VmRef, errors: list[str]) -> list[str]:
    return [f"VM {vm.uuid} ({vm.name}): {e}" for e in errors]


def _why(exc: BaseException) -> str:
    if isinstance(exc, libvirt.libvirtError):
        return str(exc.get_error_message() or exc).strip()
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} in the answer"
    return str(exc)


# --- cgroups --------------------------------------------------------------------------------------


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
    "io.max": lambda value: all(f.endswith("=max") for f in value.split()),
    "blkio.throttle.read_bps_device": lambda value: value == "0",
    "blkio.throttle.write_bps_device": lambda value: value == "0",
}


def block_device(path: str) -> str | None:
    """``MAJ:MIN`` of the whole disk holding ``path`` (a block device itself, or a file on a
    filesystem); ``None`` when there is none (a network disk, a missing file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:  # tmpfs, overlay, NFS...: no block device to throttle
        return None
    sysdir = Path(f"/sys/dev/block/{major}:{minor}")
    if (sysdir / "partition").exists():
        with contextlib.suppress(OSError):
            return (sysdir.resolve().parent / "dev").read_text().strip()
    return f"{major}:{minor}"


def disk_sources(xml: str) -> list[str]:
    """Host paths of the domain's file and block disks."""
    root = ET.fromstring(xml)
    out = []
    for disk in root.iterfind("devices/disk"):
        source = disk.find("source")
        if disk.get("device", "disk") != "disk" or source is None:
            continue
        path = source.get("file") or source.get("dev")
        if path:
            out.append(path)
    return out


class CgroupApplier(PlanApplier):
    """Writes cgroup files directly (:class:`gmd.agent.apply.cgroups.CgroupBackend`); libvirt
    (read-only) says which VMs run and under which name, domain id and disks."""

    backend = "cgroup"

    def __init__(
        self,
        root: Path,
        template: str | None = None,
        *,
        state_path: Path,
        libvirt_conn_or_uri: Any = "qemu:///system",
        version: CgroupVersion | None = None,
        io: CgroupIO | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(state_path, clock=clock)
        self.cgroups = CgroupBackend(Path(root), template, version=version, io=io)
        if isinstance(libvirt_conn_or_uri, str):
            self.uri, self._conn, self._owned = libvirt_conn_or_uri, None, True
        else:
            self.uri, self._conn, self._owned = (
                libvirt_conn_or_uri.getURI(),
                libvirt_conn_or_uri,
                False,
            )
        log.info(
            "enforcement through cgroup %s files under %s, template %r",
            self.cgroups.version,
            self.cgroups.root,
            self.cgroups.template,
        )

    def close(self) -> None:
        if self._owned and self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None

    def _find(self, uuid: str) -> VmRef | None:
        if self._conn is None:
            try:
                self._conn = libvirt.openReadOnly(self.uri)
            except libvirt.libvirtError as exc:
                raise BackendUnavailable(
                    f"cannot connect to libvirt at {self.uri}: {exc}"
                ) from None
        try:
            dom = self._conn.lookupByUUIDString(uuid)
            if not dom.isActive():
                return None
            return VmRef(uuid, dom.name(), dom.ID(), dom)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in NOT_HERE:
                return None
            if self._owned:
                with contextlib.suppress(libvirt.libvirtError):
                    self._conn.close()
                self._conn = None
            raise BackendUnavailable(f"libvirt {self.uri}: looking up VM {uuid}: {exc}") from None

    def _identity(self, vm: VmRef) -> VmIdentity:
        return VmIdentity(name=vm.name, uuid=vm.uuid, id=vm.run_id)

    def _snapshot(self, vm: VmRef, known: dict[str, Any]) -> dict[str, Any]:
        if known:
            return known
        return self.cgroups.read_current(self._identity(vm)).to_dict()

    def _limits(self, vm: VmRef, item: VmPlanItem) -> tuple[VmLimits, list[str]]:
        errors: list[str] = []
        io: dict[str, tuple[int | None, int | None]] = {}
        read, write = item.disk_read_bytes_per_s, item.disk_write_bytes_per_s
        if read is not None or write is not None:
            try:
                sources = disk_sources(vm.handle.XMLDesc(0))
            except (libvirt.libvirtError, ET.ParseError) as exc:
                if isinstance(exc, libvirt.libvirtError) and exc.get_error_code() in GONE:
                    raise VmGone(vm.uuid) from None
                sources = []
                errors.append(f"disk caps: cannot read the domain XML: {_why(exc)}")
            devices = sorted({d for d in map(block_device, sources) if d is not None})
            if devices:
                n = len(devices)
                share = [None if c is None else max(1, math.floor(c / n)) for c in (read, write)]
                io = {d: (share[0], share[1]) for d in devices}
            elif not errors:
                errors.append("disk caps: no local block device behind its disks; not applied")
        quota = item.cpu_quota_cores
        try:
            limits = VmLimits(
                cpu_weight=item.cpu_weight,
                cpu_quota=quota if quota is not None and quota > 0 else None,
                io_weight=item.io_weight,
                io_bytes_per_s=io,
            )
        except LimitsError as exc:
            errors.append(f"plan item unusable: {exc}")
            limits = VmLimits()
        return limits, errors

    def _apply(
        self, vm: VmRef, item: VmPlanItem, originals: dict[str, Any], *, dry: bool
    ) -> Outcome:
        limits, errors = self._limits(vm, item)
        return self._run(vm, originals, limits, errors, dry=dry)

    def _restore(self, vm: VmRef, originals: dict[str, Any], *, dry: bool) -> Outcome:
        return self._run(vm, originals, None, [], dry=dry)

    def _run(
        self,
        vm: VmRef,
        originals: dict[str, Any],
        limits: VmLimits | None,
        errors: list[str],
        *,
        dry: bool,
    ) -> Outcome:
        try:
            cg = self.cgroups.locate(self._identity(vm))
            snapshot = Snapshot.from_dict(originals)
            io = _DryIO(self.cgroups.io) if dry else self.cgroups.io
            if limits is None:
                report = cgroup_restore(cg, snapshot, io=io)
            else:
                report = cgroup_apply(cg, limits, snapshot, io=io)
        except CgroupError as exc:
            return Outcome(errors=_prefixed(vm, [*errors, str(exc)]))
        outcome = Outcome()
        for r in report.results:
            name = Path(r.path).name
            if r.changed:
                outcome.before[name], outcome.after[name] = r.before, r.after
            if not r.ok and r.error:
                errors.append(r.error)
        if not dry and errors and all(_vanished(vm, e) for e in errors):
            raise VmGone(vm.uuid)
        outcome.errors = _prefixed(vm, errors)
        return outcome


def _vanished(vm: VmRef, error: str) -> bool:
    """A cgroup directory that disappeared under a VM that no longer runs."""
    if errno.errorcode[errno.ENOENT] not in error:
        return False
    try:
        return not vm.handle.isActive()
    except libvirt.libvirtError:
        return True


def iter_results(results: list[VmApplyResult], size: int = 10000) -> Iterator[list[VmApplyResult]]:
    """Results in report-sized chunks (a PlanReport takes at most 10000)."""
    for i in range(0, len(results), size):
        yield results[i : i + size]
