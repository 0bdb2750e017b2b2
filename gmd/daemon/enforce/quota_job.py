"""Bringing customers' compute quotas in line with their throttle levels, and auditing it.

Runs on its own schedule, outside any accounting transaction (it talks to remote APIs). For
each customer, the wanted number of quota steps is its level's ``quota_steps``; the original
quota is read from the cloud (Nova's quota, or Keystone's limits and which of them were
defaults) and stored in the ledger *before* the first write, so that whatever happens after,
exactly the original can be put back. Every write is read back by the backend; a write that
does not take effect disables further writes to that cloud until the daemon is reconfigured
(restarted), and says so once.

In dry-run the originals are read and stored (``applied`` False) and "would" actions are
recorded once per change of wanted steps; nothing is written to Nova.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, insert, select, text, update

from gmd.daemon.enforce.quota_backends import QuotaBackend, build_backend
from gmd.daemon.enforce.quotas import (
    RESOURCES,
    QuotaError,
    QuotaErrorKind,
    QuotaFailure,
    QuotaOriginal,
    QuotaSet,
    QuotaStep,
    lowered,
)
from gmd.daemon.enforce.settings import EnforcementConfig
from gmd.ledger_schema.kinds import ActionKind, ActionStatus
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import (
    actions as _actions,
    customers as _customers,
    levels as _levels,
    quota_originals as _originals,
)
from gmd.openstack.client import OpenStackError
from gmd.wire import PlanMode

log = logging.getLogger(__name__)

# "gmd-quot": the advisory lock of the quota job, beside the accountant's "gmd-acct".
QUOTA_LOCK = int.from_bytes(b"gmd-quot", "big", signed=True)


@dataclass(frozen=True)
class QuotaRun:
    lowered: int = 0
    restored: int = 0
    failed: int = 0
    would: int = 0


class QuotaReconciler:
    """One cloud's quotas. ``adapter`` is built lazily (and can be injected by tests)."""

    def __init__(
        self,
        engine: Engine,
        config: EnforcementConfig,
        adapter_factory: Callable[[], QuotaBackend] | None = None,
    ) -> None:
        self.engine, self.config = engine, config
        q = config.quota
        self.cloud = q.cloud
        self.step = QuotaStep(cores=q.step_cores, ram=q.step_ram, instances=q.step_instances)
        self.floor = QuotaSet(q.floor_cores, q.floor_ram_mb, q.floor_instances)
        self._factory = adapter_factory or (
            lambda: build_backend(
                q.backend,
                q.cloud,
                limits_cloud=q.limits_cloud,
                timeout_s=q.timeout_s,
                retries=q.retries,
            )
        )
        self._adapter: QuotaBackend | None = None
        self._disabled_said = False

    @property
    def adapter(self) -> QuotaBackend:
        if self._adapter is None:
            self._adapter = self._factory()
        return self._adapter

    def close(self) -> None:
        if self._adapter is not None:
            self._adapter.close()

    def wanted_steps(self) -> dict[str, tuple[int, int, int]]:
        """Customer name → (customer id, level, wanted steps), for levels and held quotas."""
        policy = self.config.policy
        with self.engine.connect() as conn:
            levels = {
                name: (cid, level)
                for cid, name, level in conn.execute(
                    select(_customers.c.id, _customers.c.name, _levels.c.level).join(
                        _levels, _levels.c.customer_id == _customers.c.id
                    )
                )
            }
            held = {
                name: cid
                for cid, name in conn.execute(
                    select(_customers.c.id, _customers.c.name)
                    .join(_originals, _originals.c.customer_id == _customers.c.id)
                    .where(_originals.c.cloud == self.cloud)
                )
            }
        out = {}
        for name, (cid, level) in levels.items():
            out[name] = (cid, level, policy.effect(level).quota_steps)
        for name, cid in held.items():
            out.setdefault(name, (cid, 0, 0))
        return out

    def run(self) -> QuotaRun:
        """One pass over every customer whose quota should change; on PostgreSQL only one
        daemon at a time (an advisory lock), so several daemons never write twice."""
        if self.config.mode == PlanMode.off or not self.cloud:
            return QuotaRun()
        with self.engine.connect() as lock:
            if lock.dialect.name == "postgresql":
                got = lock.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": QUOTA_LOCK})
                if not got.scalar():
                    return QuotaRun()
            try:
                return self._run()
            finally:
                if lock.dialect.name == "postgresql":
                    lock.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": QUOTA_LOCK})
                    lock.commit()

    def _run(self) -> QuotaRun:
        dry = self.config.mode == PlanMode.dry_run
        counts = {"lowered": 0, "restored": 0, "failed": 0, "would": 0}
        with self.engine.connect() as conn:
            originals = {
                r.customer_id: r
                for r in conn.execute(select(_originals).where(_originals.c.cloud == self.cloud))
            }
        for project, (cid, level, steps) in sorted(self.wanted_steps().items()):
            row = originals.get(cid)
            held = 0 if row is None else row.steps
            applied = row is not None and row.applied
            if steps == 0 and (row is None or (dry and applied and held == 0)):
                continue
            if steps > 0 and steps == held and (dry or applied):
                continue
            try:
                if steps == 0:
                    self._restore(project, cid, level, row, dry, counts)
                else:
                    self._lower(project, cid, level, steps, row, dry, counts)
            except (OpenStackError, QuotaError) as exc:
                counts["failed"] += 1
                self._failed(project, cid, level, steps, exc)
        return QuotaRun(**counts)

    def _lower(
        self,
        project: str,
        cid: int,
        level: int,
        steps: int,
        row: Any,
        dry: bool,
        counts: dict[str, int],
    ) -> None:
        if row is None:
            kept = self.adapter.original(project)
            original = kept.quota
            with writer(self.engine).begin() as conn:
                conn.execute(
                    insert(_originals).values(
                        customer_id=cid,
                        cloud=self.cloud,
                        cores=original.cores,
                        ram_mb=original.ram_mb,
                        instances=original.instances,
                        unset=",".join(r for r in RESOURCES if r in kept.unset),
                        steps=0,
                        applied=False,
                    )
                )
        else:
            original = QuotaSet(row.cores, row.ram_mb, row.instances)
        target = lowered(original, steps, self.step, self.floor)
        reason = (
            f"level {level} ≥ quota_level {self.config.policy.quota_level}: {steps} step(s) of"
            f" {self.step.cores:g}/{self.step.ram:g}/{self.step.instances:g} of the original"
            f" (cores/ram/instances), floor {self.floor}"
        )
        if dry:
            self._record(
                cid, ActionKind.quota_lower, ActionStatus.would, True, original, target, reason
            )
            self._hold(cid, steps, applied=False)
            counts["would"] += 1
            return
        write = self.adapter.apply(project, target)
        self._hold(cid, steps, applied=True, backend=write.backend.value)
        reason += f"; written to {write.backend.value}"
        self._record(
            cid, ActionKind.quota_lower, ActionStatus.ok, False, write.before, write.after, reason
        )
        counts["lowered"] += 1
        log.info(
            "project %s: compute quota %s → %s (%s)", project, write.before, write.after, reason
        )

    def _restore(
        self,
        project: str,
        cid: int,
        level: int,
        row: Any,
        dry: bool,
        counts: dict[str, int],
    ) -> None:
        """Write the original back if gmd had lowered the quota; forget it once restored."""
        assert row is not None
        original = QuotaSet(row.cores, row.ram_mb, row.instances)
        unset = frozenset(r for r in row.unset.split(",") if r)
        applied, held = row.applied, row.steps
        reason = f"level {level} < quota_level {self.config.policy.quota_level}: original back"
        if unset:
            reason += f" (no project limit of its own for {', '.join(sorted(unset))})"
        if applied and not dry:
            write = self.adapter.restore(project, QuotaOriginal(original, unset))
            reason += f"; written to {write.backend.value}"
            self._record(
                cid,
                ActionKind.quota_restore,
                ActionStatus.ok,
                False,
                write.before,
                write.after,
                reason,
            )
            counts["restored"] += 1
            log.info("project %s: compute quota restored to %s", project, write.after)
        elif held > 0:
            self._record(
                cid, ActionKind.quota_restore, ActionStatus.would, True, None, original, reason
            )
            counts["would"] += 1
        if applied and dry:
            # Nova still holds the lowered quota: keep the original until "on" restores it.
            self._hold(cid, 0, applied=True)
            return
        with writer(self.engine).begin() as conn:
            conn.execute(
                delete(_originals).where(
                    _originals.c.customer_id == cid, _originals.c.cloud == self.cloud
                )
            )

    def _hold(self, cid: int, steps: int, *, applied: bool, backend: str | None = None) -> None:
        values: dict[str, Any] = {"steps": steps, "applied": applied}
        if backend is not None:
            values["backend"] = backend
        with writer(self.engine).begin() as conn:
            conn.execute(
                update(_originals)
                .where(_originals.c.customer_id == cid, _originals.c.cloud == self.cloud)
                .values(**values)
            )

    def _failed(self, project: str, cid: int, level: int, steps: int, exc: QuotaFailure) -> None:
        if exc.kind == QuotaErrorKind.disabled:
            if not self._disabled_said:
                log.error("quota writes to cloud %s are disabled: %s", self.cloud, exc)
                self._disabled_said = True
            return
        log.warning("project %s: quota change to %d step(s) failed: %s", project, steps, exc)
        detail = getattr(exc, "write", None)
        self._record(
            cid,
            ActionKind.quota_lower if steps else ActionKind.quota_restore,
            ActionStatus.failed,
            False,
            None if detail is None else detail.before,
            None if detail is None else detail.after,
            f"{exc.kind}: {exc} (level {level}, {steps} step(s))",
        )

    def _record(
        self,
        cid: int,
        kind: ActionKind,
        status: ActionStatus,
        dry: bool,
        before: QuotaSet | None,
        after: QuotaSet | None,
        reason: str,
    ) -> None:
        with writer(self.engine).begin() as conn:
            conn.execute(
                insert(_actions).values(
                    customer_id=cid,
                    kind=kind.value,
                    status=status.value,
                    dry_run=dry,
                    before=None if before is None else json.dumps(before.as_nova()),
                    after=None if after is None else json.dumps(after.as_nova()),
                    reason=f"cloud {self.cloud}: {reason}",
                )
            )
