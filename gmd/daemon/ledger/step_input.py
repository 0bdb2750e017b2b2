"""What the pure interval step takes, read from the ledger: an interval's arrays
(:mod:`.interval_samples`) and the standing it starts from, as typed
(:class:`gmd.fairness.ledger_step.LedgerStanding`) from the rows of the last interval with a
standing. Accounting, explain and a what-if all step an interval from here. Reads only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, select

from gmd.daemon.config import AccountingConfig
from gmd.daemon.ledger import reset_window
from gmd.daemon.ledger.interval_samples import (
    SAMPLE_VM,
    RawInterval,
    read_raw_interval,
    sampled_interval,
)
from gmd.fairness.interval import IntervalSettings
from gmd.fairness.ledger_step import (
    CustomerStanding,
    IntervalStep,
    LedgerStanding,
    LevelHeld,
    OrganizationStanding,
    SampledInterval,
    step_interval,
)
from gmd.fairness.policy import ThrottlePolicy
from gmd.ledger_schema.kinds import IntervalState
from gmd.ledger_schema.tables import (
    customer_ledger as _customer_ledger,
    intervals as _intervals,
    organization_ledger as _organization_ledger,
)


@dataclass(frozen=True)
class IntervalData:
    """One interval as the step takes it, and the ledger ids behind its rows (explain's
    names)."""

    sampled: SampledInterval
    standing: LedgerStanding
    reset: frozenset[int]
    """the customers whose balance was reset since the standing"""
    customer_of_organization: Mapping[int, int]
    vm_ids: np.ndarray
    """per VM row: ``vms.id``"""
    host_ids: np.ndarray
    """per host row: ``hosts.id``"""

    def step(
        self, settings: IntervalSettings, policy: ThrottlePolicy | None = None
    ) -> IntervalStep:
        """The pure step (:func:`gmd.fairness.ledger_step.step_interval`) over this interval."""
        return step_interval(
            self.standing,
            self.sampled,
            settings,
            reset=self.reset,
            customer_of_organization=self.customer_of_organization,
            policy=policy,
        )


def interval_data(
    raw: RawInterval,
    config: AccountingConfig,
    standing: LedgerStanding,
    reset: Collection[int] = (),
) -> IntervalData:
    """``raw`` as the step takes it, starting from ``standing``."""
    return IntervalData(
        sampled_interval(raw, config),
        standing,
        frozenset(reset),
        raw.customer_of_organization,
        raw.samples[:, SAMPLE_VM].astype(np.int64),
        raw.hosts[:, 0].astype(np.int64),
    )


def read_interval(
    conn: Connection,
    interval_id: int,
    config: AccountingConfig,
    batch_ids: Sequence[int] | None = None,
) -> IntervalData | None:
    """The interval (:func:`.read_raw_interval`) with the standing after the previous interval
    with rows, as the ledger holds it; None when it has no samples. Reads only."""
    raw = read_raw_interval(conn, interval_id, config, batch_ids)
    if raw is None:
        return None
    prev = previous_standing(conn, raw.start_s)
    if prev is None:
        return interval_data(raw, config, LedgerStanding.nothing())
    standing = read_standing(conn, int(prev.id), int(prev.start_s))
    reset = reset_window.reset_customers(conn, prev.start_s, raw.start_s)
    return interval_data(raw, config, standing, reset)


def previous_standing(conn: Connection, start_s: int) -> Any:
    """The last accounted interval with rows before ``start_s`` (id, start_s), or None: the
    standing an interval starts from."""
    return conn.execute(
        select(_intervals.c.id, _intervals.c.start_s)
        .where(
            _intervals.c.start_s < start_s,
            _intervals.c.state == IntervalState.accounted,
            _intervals.c.ledger_rows > 0,
        )
        .order_by(_intervals.c.start_s.desc())
        .limit(1)
    ).first()


def read_standing(
    conn: Connection,
    interval_id: int,
    start_s: int,
    levels: Mapping[int, LevelHeld] | None = None,
) -> LedgerStanding:
    """The standing the ledger rows of the interval starting at ``start_s`` carry
    (``levels``: those in force, if known)."""
    return LedgerStanding(
        start_s,
        customer_standings(conn, interval_id),
        organization_standings(conn, interval_id),
        {} if levels is None else levels,
    )


def customer_standings(conn: Connection, interval_id: int) -> dict[int, CustomerStanding]:
    """Per customer with a row in the interval, what the row carries."""
    c = _customer_ledger.c
    return {
        int(r.customer_id): CustomerStanding(
            r.balance, r.utility_work, r.utility_moment, r.priority
        )
        for r in conn.execute(
            select(c.customer_id, c.balance, c.utility_work, c.utility_moment, c.priority).where(
                c.interval_id == interval_id
            )
        )
    }


def organization_standings(conn: Connection, interval_id: int) -> dict[int, OrganizationStanding]:
    """Per organization with a row in the interval, its DirectContr contribution sums."""
    o = _organization_ledger.c
    return {
        int(r.organization_id): OrganizationStanding(r.contribution_work, r.contribution_moment)
        for r in conn.execute(
            select(o.organization_id, o.contribution_work, o.contribution_moment).where(
                o.interval_id == interval_id
            )
        )
    }
