"""The host side of enforcement: bring this host's VMs to the daemon's plan, and back.

The agent fetches a :class:`~gmd.wire.HostPlan` and hands it to
:meth:`PlanApplier.sync`, which returns what to report back (:class:`VmApplyResult`). Two
implementations share the plan logic of :class:`PlanApplier` and differ in how they touch a VM:
:class:`~gmd.agent.apply.libvirt.LibvirtApplier` (the default, LIVE libvirt tuning) and
:class:`~gmd.agent.apply.cgroup.CgroupApplier` (the VM's cgroup files).

What gmd changes is remembered on disk (:class:`~gmd.agent.apply.state.EnforcementState`, a
JSON file): the original values of every knob, read before the first change and written to the
file *before* any change, so that an agent restart still restores exactly. Policy:

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
still goes on; the same failure is reported once, not at every fetch. Each result says per knob
(:class:`~gmd.wire.Knob`) what became of it: applied (restored), unsupported on this host (the
probe's reason, or libvirt's refusal: not a failure, the rest is applied) or failed (its error).
A VM that vanished (stopped, undefined, migrated away) is forgotten: its live settings left
with it.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gmd import GmdError
from gmd.agent.apply.state import EnforceBackend, EnforcementState, Settings, VmRecord
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter, ownership_from_xml
from gmd.agent.disks import block_device, disk_sources
from gmd.wire import (
    ApplyAction,
    HostCapabilities,
    HostPlan,
    Knob,
    KnobOutcome,
    KnobResult,
    KnobSupport,
    PlanMode,
    VmApplyResult,
    VmPlanItem,
)

log = logging.getLogger(__name__)


class BackendUnavailable(GmdError):
    """The hypervisor cannot be reached at all: this round stops, nothing is forgotten."""


class VmGone(GmdError):
    """The VM stopped or disappeared while it was being changed."""


@dataclass(frozen=True)
class VmRef:
    """A running VM as the backend found it; ``run_id`` is libvirt's domain id, which changes
    whenever the VM's process starts (a restart, or a migration in)."""

    uuid: str
    name: str
    run_id: int
    handle: Any = None


@dataclass
class ChangeOutcome:
    """What a change did (or, dry, would do): the settings that differed, before and after;
    the errors (every one, for the report's ``error``), and per knob the errors that are that
    knob's and the knobs found missing on this host (not errors: the rest still applies)."""

    before: Settings = field(default_factory=dict)
    after: Settings = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    knob_errors: dict[Knob, list[str]] = field(default_factory=dict)
    unsupported: dict[Knob, str] = field(default_factory=dict)
    knobs: list[KnobResult] = field(default_factory=list)
    """filled by :class:`PlanApplier`: what became of each knob asked of, or put back on, the VM"""

    @property
    def changed(self) -> bool:
        return bool(self.after)

    def knob_failed(self, knob: Knob, error: str) -> None:
        """Record ``error`` as ``knob``'s. The caller puts it into :attr:`errors` too (where
        it is prefixed with the VM, as every error of the report)."""
        self.knob_errors.setdefault(knob, []).append(error)


def knob_results(
    asked: tuple[Knob, ...] | list[Knob],
    outcome: ChangeOutcome,
    done: KnobOutcome,
    touched: set[Knob],
) -> list[KnobResult]:
    """Each knob of ``asked`` (and of ``touched``: those whose settings changed) as the report
    carries it: unsupported here (why), failed (its errors), else ``done``."""
    out = []
    for knob in Knob:
        if knob not in asked and knob not in touched and knob not in outcome.knob_errors:
            continue
        if knob in outcome.unsupported:
            out.append(_knob(knob, KnobOutcome.unsupported, outcome.unsupported[knob]))
        elif knob in outcome.knob_errors:
            out.append(_knob(knob, KnobOutcome.failed, "; ".join(outcome.knob_errors[knob])))
        else:
            out.append(_knob(knob, done, ""))
    return out


def _knob(knob: Knob, outcome: KnobOutcome, detail: str) -> KnobResult:
    return KnobResult(knob=knob, outcome=outcome, detail=detail[:500])


def prefixed(vm: VmRef, errors: list[str]) -> list[str]:
    """Errors named after their VM, since one report holds those of many."""
    return [f"VM {vm.uuid} ({vm.name}): {e}" for e in errors]


class PlanApplier(ABC):
    """Applies plans to this host's VMs and remembers originals; see the module docstring.

    Subclasses say how to find a VM, read its originals, and converge it.
    """

    backend: ClassVar[EnforceBackend]

    def __init__(
        self,
        state_path: Path,
        *,
        clock: Callable[[], float] = time.time,
        domains: DomainFilter = EVERY_DOMAIN,
    ) -> None:
        self.state = EnforcementState(state_path, self.backend)
        self._clock = clock
        self.domains = domains
        self.interrupted: str | None = None
        """why the latest round stopped short (the hypervisor could not be reached), or None"""
        self._pending: list[VmApplyResult] = []
        self.capabilities: HostCapabilities | None = None
        """what the host's probe found (:mod:`gmd.agent.capabilities`): a knob it cannot set is
        not tried, and is reported unsupported with the probe's reason"""

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
        self,
        vm: VmRef,
        item: VmPlanItem,
        originals: dict[str, Any],
        *,
        dry: bool,
        skip: frozenset[Knob] = frozenset(),
    ) -> ChangeOutcome:
        """Bring the VM to the plan's targets (knobs the plan leaves free: to the originals);
        the knobs in ``skip`` (this host lacks them) are left as they are. A knob the host
        turns out to lack goes into :attr:`ChangeOutcome.unsupported`, a knob's failure into
        :meth:`ChangeOutcome.knob_failed` as well as :attr:`ChangeOutcome.errors`."""

    @staticmethod
    @abstractmethod
    def knob_of(setting: str) -> Knob | None:
        """The knob a remembered setting (``cpu_shares``, ``cpu.max``…) belongs to."""

    @abstractmethod
    def _restore(self, vm: VmRef, originals: dict[str, Any], *, dry: bool) -> ChangeOutcome:
        """Put every remembered knob back to its original value."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release the backend's connections."""

    def refused_knobs(self, uuids: Iterable[str]) -> dict[Knob, tuple[KnobSupport, str]]:
        """What the backend itself refuses on one of the running VMs ``uuids`` (libvirt's word
        on a knob outranks the files: :func:`gmd.agent.capabilities.refine_with_libvirt`)."""
        return {}

    def disk_devices(self, uuids: Iterable[str]) -> list[str] | None:
        """``MAJ:MIN`` of the host's whole disks under the local disks of the running VMs
        ``uuids``: the disks whose schedulers decide whether a disk weight does anything
        (:mod:`gmd.agent.capabilities`). None when none can be told (no VM runs, libvirt is
        away, only network disks)."""
        devices: set[str] = set()
        for uuid in uuids:
            try:
                vm = self._find(uuid)
                if vm is None:
                    continue
                sources = disk_sources(self._xml(vm))
            except BackendUnavailable:
                return None
            except Exception as exc:  # one VM's XML: the others still tell
                log.debug("VM %s: its disks cannot be read for the probe: %s", uuid, exc)
                continue
            devices.update(d for d in map(block_device, sources) if d is not None)
        return sorted(devices) or None

    def _xml(self, vm: VmRef) -> str:
        """The domain's XML, for its owner (both backends find VMs through libvirt)."""
        return str(vm.handle.XMLDesc(0))

    # -- the plan ----------------------------------------------------------------------------------

    def sync(self, plan: HostPlan) -> list[VmApplyResult]:
        """Apply ``plan``; the results worth reporting (changes, first failures, would-dos)."""
        if plan.mode == PlanMode.off:
            return self._off()
        dry = plan.mode == PlanMode.dry_run
        wanted = {item.uuid: item for item in plan.vms}
        # A VM whose item was refused keeps its settings: what the daemon wants for it is
        # unknown, and no news is not "lift the throttle".
        unknown = self._refused(plan, dry=dry)
        self.interrupted = None
        try:
            for uuid in sorted(self.state.records):
                if (dry or uuid not in wanted) and uuid not in unknown:
                    self._restore_one(uuid)
            for uuid, item in wanted.items():
                if uuid not in unknown:
                    self._apply_one(uuid, item, dry=dry)
            self._settle_dry_run(wanted, dry=dry)
        except BackendUnavailable as exc:
            self.interrupted = str(exc)
            log.warning("enforcement: %s; the rest of the plan waits for the next round", exc)
        finally:
            self.state.save()
        return self._take_results()

    def _refused(self, plan: HostPlan, *, dry: bool) -> set[str]:
        """Report the plan's refused items (:attr:`HostPlan.refused`) as failed applies, once
        per distinct reason; the VMs they name."""
        named = set()
        for refused in plan.refused:
            if refused.uuid is None:
                log.error(
                    "enforcement: plan of %d: item refused: %s", plan.generated_s, refused.reason
                )
                continue
            named.add(refused.uuid)
            error = f"VM {refused.uuid}: plan item refused, settings kept: {refused.reason}"
            self._result(
                refused.uuid, "would_apply" if dry else "apply", ChangeOutcome(errors=[error])
            )
        return named

    def restore_all(self) -> list[VmApplyResult]:
        """Put back every VM gmd changed (mode "off", ``gmd-agent --restore-all``)."""
        if self.state.records:
            log.info("enforcement: restoring %d VM(s) gmd changed", len(self.state.records))
        self.interrupted = None
        try:
            for uuid in sorted(self.state.records):
                self._restore_one(uuid)
        except BackendUnavailable as exc:
            self.interrupted = str(exc)
            log.warning("enforcement: %s; restoring the rest waits for the next round", exc)
        finally:
            self.state.save()
        return self._take_results()

    @property
    def remembered(self) -> dict[str, VmRecord]:
        """The VMs whose originals are kept (gmd changed them, or is about to)."""
        return dict(self.state.records)

    def _off(self) -> list[VmApplyResult]:
        """Mode "off" ends a dry run too: its would-dos no longer describe anything."""
        results = self.restore_all()
        if self.state.dry_run:
            self.state.dry_run.clear()
            self.state.save()
        return results

    def _settle_dry_run(self, wanted: dict[str, VmPlanItem], *, dry: bool) -> None:
        """A VM that left a dry-run plan would have been put back: say so once. Leaving dry
        run drops what it would have done, which the real changes now replace."""
        if not dry:
            self.state.dry_run.clear()
            return
        for uuid in sorted(set(self.state.dry_run) - set(wanted)):
            was = self.state.dry_run.pop(uuid)
            self._result(uuid, "would_restore", ChangeOutcome(was["after"], was["before"]))

    # -- one VM ------------------------------------------------------------------------------------

    def _apply_one(self, uuid: str, item: VmPlanItem, *, dry: bool) -> None:
        vm = self._find(uuid)
        if vm is None:
            self._not_running(uuid)
            return
        if not self._admitted(vm):
            self._outside(vm, dry=dry)
            return
        record = self._same_process(uuid, vm)
        missing = self._missing(item)
        try:
            originals = self._originals(uuid, vm, record, dry=dry)
            outcome = self._apply(vm, item, originals, dry=dry, skip=frozenset(missing))
        except VmGone:
            if uuid in self.state.records:
                self._forget(uuid, "vanished while being changed")
            return
        except (ArithmeticError, ValueError, TypeError) as exc:
            # A number no knob takes (a backend's conversion or binding refused it): this VM's
            # failure, not the plan's; the other VMs still get theirs.
            log.exception("enforcement: VM %s (%s): applying its plan item failed", uuid, vm.name)
            error = f"{type(exc).__name__}: {exc}"
            outcome = ChangeOutcome(errors=prefixed(vm, [f"cannot apply the plan item: {error}"]))
            for knob in item.asks():
                outcome.knob_failed(knob, error)
        outcome.unsupported = {**missing, **outcome.unsupported}
        touched = {k for k in map(self.knob_of, outcome.after) if k is not None}
        outcome.knobs = knob_results(item.asks(), outcome, KnobOutcome.applied, touched)
        if dry:
            self._note_dry_run(uuid, outcome)
        elif outcome.changed or outcome.errors or outcome.unsupported:
            self._result(uuid, "apply", outcome)

    def _missing(self, item: VmPlanItem) -> dict[Knob, str]:
        """The knobs ``item`` asks that the host's probe found missing, with why."""
        if self.capabilities is None:
            return {}
        lacking = self.capabilities.unsupported()
        return {k: lacking[k] for k in item.asks() if k in lacking}

    def _admitted(self, vm: VmRef) -> bool:
        """Whether the agent's domain filter lets gmd touch ``vm``; a VM whose owner cannot
        be read is left alone when the filter needs it."""
        if not self.domains.admits_name(vm.name):
            return False
        if not self.domains.by_owner:
            return True
        try:
            owner = ownership_from_xml(self._xml(vm))
        except Exception as exc:
            log.warning("enforcement: VM %s (%s): cannot read its owner: %s", vm.uuid, vm.name, exc)
            return False
        return self.domains.admits_owner(owner)

    def _outside(self, vm: VmRef, *, dry: bool) -> None:
        """A planned VM the domain filter keeps gmd from: put back if gmd changed it before
        the filter was set, and say once why it is not throttled."""
        if vm.uuid in self.state.records and not dry:
            self._restore_one(vm.uuid)
        error = f"VM {vm.uuid} ({vm.name}): outside this agent's {self.domains.words()}: left alone"
        self._result(vm.uuid, "would_apply" if dry else "apply", ChangeOutcome(errors=[error]))

    def _not_running(self, uuid: str) -> None:
        if uuid in self.state.records:
            self._forget(uuid, "no longer runs on this host")
        else:
            log.debug("enforcement: VM %s in the plan does not run here; skipped", uuid)

    def _same_process(self, uuid: str, vm: VmRef) -> VmRecord | None:
        """The VM's record, dropped if the VM restarted since: the originals it holds went with
        the old process, and the new one's must be read afresh."""
        record = self.state.records.get(uuid)
        if record is None or record.run_id == vm.run_id:
            return record
        log.info(
            "enforcement: VM %s (%s) restarted (domain id %d → %d): its live settings were"
            " reset; reading its originals afresh and applying the plan again",
            uuid,
            vm.name,
            record.run_id,
            vm.run_id,
        )
        del self.state.records[uuid]
        return None

    def _originals(
        self, uuid: str, vm: VmRef, record: VmRecord | None, *, dry: bool
    ) -> dict[str, Any]:
        originals = self._snapshot(vm, record.originals if record is not None else {})
        if not dry and (record is None or originals != record.originals):
            # Remembered on disk before anything changes, so a crash cannot lose them.
            self.state.records[uuid] = VmRecord(vm.name, vm.run_id, self._clock(), originals)
            self.state.save()
        return originals

    def _note_dry_run(self, uuid: str, outcome: ChangeOutcome) -> None:
        """Keep what a dry run would change, so that it can say what it would put back."""
        if outcome.changed:
            self.state.dry_run[uuid] = {"before": outcome.before, "after": outcome.after}
        else:
            self.state.dry_run.pop(uuid, None)
        if outcome.changed or outcome.errors or outcome.unsupported:
            self._result(uuid, "would_apply", outcome)

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
        touched = {k for k in map(self.knob_of, [*outcome.after, *outcome.before]) if k}
        outcome.knobs = knob_results((), outcome, KnobOutcome.restored, touched)
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

    # -- reporting ---------------------------------------------------------------------------------

    def _result(self, uuid: str, action: ApplyAction, outcome: ChangeOutcome) -> None:
        """Queue a result, unless it repeats the failure or would-do last reported for the VM."""
        error = "; ".join(outcome.errors) or None
        signature = _signature(action, error, outcome)
        # A knob missing here is said once, not at every fetch: with the change that first
        # met it, or alone when nothing changed.
        lacking = json.dumps([action, sorted(outcome.unsupported)]) if outcome.unsupported else None
        if signature is None and lacking is not None and not outcome.changed:
            signature = lacking
        if signature is not None and self.state.reported.get(uuid) == signature:
            log.debug("enforcement: VM %s: %s unchanged since reported", uuid, action)
            return
        remembered = signature or lacking
        if remembered is None:
            self.state.reported.pop(uuid, None)
        else:
            self.state.reported[uuid] = remembered
        _log_result(uuid, action, error, outcome)
        self._pending.append(
            VmApplyResult(
                uuid=uuid,
                action=action,
                ok=error is None,
                error=error[:2000] if error else None,
                before=outcome.before,
                after=outcome.after,
                knobs=outcome.knobs,
            )
        )

    def _take_results(self) -> list[VmApplyResult]:
        out, self._pending = self._pending, []
        return out


def _signature(action: str, error: str | None, outcome: ChangeOutcome) -> str | None:
    """What makes a result a repeat: a would-do's change and error, a failure's error. A
    successful change is never a repeat (``None``)."""
    if action.startswith("would_"):
        return json.dumps([action, error, outcome.after], sort_keys=True, default=str)
    if error is not None:
        return json.dumps([action, error], default=str)
    return None


def _log_result(uuid: str, action: str, error: str | None, outcome: ChangeOutcome) -> None:
    for knob, why in sorted(outcome.unsupported.items()):
        log.info(
            "enforcement: VM %s: %s: %s not supported on this host: %s",
            uuid,
            action,
            knob.words,
            why,
        )
    if error is not None:
        log.warning("enforcement: VM %s: %s incomplete: %s", uuid, action, error)
        return
    log.info(
        "enforcement: VM %s: %s %s → %s",
        uuid,
        action,
        json.dumps(outcome.before, sort_keys=True),
        json.dumps(outcome.after, sort_keys=True),
    )
