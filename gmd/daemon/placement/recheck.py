"""The daemon's Placement job: snapshots kept fresh, and unverified batches verified.

A batch stored while Placement could not be reached is marked ``unverified`` (its VMs' rows
stay as they were). Once Placement answers, this job checks each such batch as ingest would
have (against Placement as it is then) and either clears the mark, or quarantines the batch
(:func:`~gmd.daemon.ledger.quarantine.quarantine`) with Placement's reason, in the
enforcement log, for the operator to release or drop. Accounting waits for an interval's
unverified batches (:func:`~gmd.daemon.ledger.accounting.account_next`), so what this job
quarantines in time was never accounted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import Engine, func, select, update

from gmd.daemon.ledger.quarantine import quarantine
from gmd.daemon.placement.view import Disagreement, PlacementView, Refusal
from gmd.ledger_schema.kinds import BatchState
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.models import FLAVOR_COLUMNS
from gmd.ledger_schema.tables import (
    batches as _batches,
    customers as _customers,
    host_intervals as _host_intervals,
    hosts as _hosts,
    samples as _samples,
    vms as _vms,
)
from gmd.openstack.client import OpenStackError
from gmd.wire import CAPACITY_FIELDS

log = logging.getLogger(__name__)

BATCHES_PER_RUN = 200
"""Unverified batches one run checks at most (the next run takes the rest)."""


@dataclass(frozen=True)
class Pending:
    """An unverified batch, as the check needs it."""

    id: int
    key: str
    host: str
    interval_id: int
    state: BatchState
    capacity: tuple[float, ...]


@dataclass
class RecheckReport:
    refreshed: int = 0
    verified: list[str] = field(default_factory=list)
    quarantined: list[tuple[str, Disagreement, str]] = field(default_factory=list)
    waiting: int = 0
    unreachable: str | None = None


def pending(engine: Engine, limit: int = BATCHES_PER_RUN) -> list[Pending]:
    """The oldest unverified batches, with their host and its capacity for the interval."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                _batches.c.id,
                _batches.c.key,
                _hosts.c.name,
                _batches.c.interval_id,
                _batches.c.state,
                *(_host_intervals.c[c] for c in CAPACITY_FIELDS),
            )
            .join(_hosts, _hosts.c.id == _batches.c.host_id)
            .join(
                _host_intervals,
                (_host_intervals.c.host_id == _batches.c.host_id)
                & (_host_intervals.c.interval_id == _batches.c.interval_id),
            )
            .where(_batches.c.unverified.is_(True))
            .order_by(_batches.c.id)
            .limit(limit)
        ).all()
    return [
        Pending(int(r[0]), r[1], r[2], int(r[3]), BatchState(r[4]), tuple(float(v) for v in r[5:]))
        for r in rows
    ]


def waiting_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(_batches).where(_batches.c.unverified.is_(True))
            ).scalar_one()
        )


def _claims(engine: Engine, batch: Pending) -> tuple[list[str], list[str], np.ndarray]:
    """The batch's VMs, the projects it named for them and their flavors, from its stored
    samples."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(_vms.c.uuid, _customers.c.name, *(_samples.c[c] for c in FLAVOR_COLUMNS))
            .select_from(_samples)
            .join(_vms, _vms.c.id == _samples.c.vm_id)
            .join(_customers, _customers.c.id == _samples.c.customer_id)
            .where(_samples.c.interval_id == batch.interval_id, _samples.c.batch_id == batch.id)
        ).all()
    flavor = np.array(
        [[np.nan if v is None else float(v) for v in r[2:]] for r in rows], dtype=np.float64
    ).reshape(len(rows), len(FLAVOR_COLUMNS))
    return [r[0] for r in rows], [r[1] for r in rows], flavor


class Rechecker:
    """One run: refresh stale snapshots, then verify waiting batches while Placement answers."""

    def __init__(self, engine: Engine, view: PlacementView, budget_s: float = 30.0) -> None:
        self.engine, self.view, self.budget_s = engine, view, budget_s

    def run(self) -> RecheckReport:
        report = RecheckReport()
        try:
            report.refreshed = self.view.refresh(self.budget_s)
        except OpenStackError as exc:
            report.unreachable = str(exc)
        for batch in [] if report.unreachable else pending(self.engine):
            if batch.state != BatchState.accepted:
                # Quarantined (or released, dropped) meanwhile: the operator decides now.
                self._settle(batch, None)
                continue
            uuids, customers, flavor = _claims(self.engine, batch)
            verdict = self.view.check(
                batch.host, batch.capacity, uuids, customers, flavor, batch.interval_id
            )
            if verdict.unreachable is not None:
                report.unreachable = verdict.unreachable
                break
            refusal = verdict.refusal
            if refusal is None and verdict.set_aside:
                # Stored whole while Placement was away: the batch is quarantined whole, its
                # good VMs' samples with it (the operator releases them: gmd-admin batches).
                first = min(verdict.set_aside)
                more = len(verdict.set_aside) - 1
                refusal = Refusal(
                    verdict.set_aside[first].reason,
                    verdict.set_aside[first].message + (f" (and {more} more VMs)" if more else ""),
                )
            self._settle(batch, refusal)
            if refusal is None:
                report.verified.append(batch.key)
            else:
                report.quarantined.append((batch.key, refusal.reason, refusal.message))
                log.error(
                    "batch %s from %s, accepted while Placement could not be reached,"
                    " quarantined: %s",
                    batch.key,
                    batch.host,
                    refusal.message,
                )
        if report.unreachable:
            log.warning("Placement: %s; unverified batches wait", report.unreachable)
        elif report.verified:
            log.info(
                "Placement verified %d batch(es) accepted while it could not be reached",
                len(report.verified),
            )
        report.waiting = waiting_count(self.engine)
        return report

    def _settle(self, batch: Pending, refusal: Refusal | None) -> None:
        with writer(self.engine).begin() as conn:
            if refusal is not None:
                quarantine(
                    conn,
                    {batch.id: refusal.message},
                    cause="Placement disagrees with this batch (accepted while it could not"
                    " be reached)",
                    by="placement",
                )
            conn.execute(
                update(_batches)
                .where(_batches.c.id == batch.id, _batches.c.interval_id == batch.interval_id)
                .values(unverified=False)
            )
