"""``gmd-admin explain CUSTOMER``: why a customer stands where it stands, in plain words.

The ledger keeps each customer's per-interval greediness, per-resource terms and balance, but
not the per-VM arithmetic behind them. To explain an interval, the interval is accounted again
here from its stored on-time samples with the fairness engine (the same inputs accounting
used), which gives every VM's use, endowment and offset and every host's over-use α, unused
share β and credit factor κ. The recomputed total is checked against the ledger's row: when the
configuration changed since the interval was accounted they can differ, and the explanation
says so rather than quietly explaining numbers the ledger does not hold.

Before the detail comes a summary of five lines in plain words (who, at which level since
when, why, what is done on which hosts — weights everywhere, hard caps only where the host is
contended — the quota, and what would lift it), which ``--summary`` prints alone. Whether the
caps apply on a host is measured as the daemon's plan measures it, over the accounted
intervals up to the one explained.

This module computes: the explanation, its summary lines and its JSON document, which the
read API serves as they are. gmd-admin renders them for a terminal
(:mod:`gmd.admin.explain_text`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Connection, and_, func, or_, select

from gmd import GmdError
from gmd.common.timespec import iso
from gmd.common.units import DAY_S, HOUR_S
from gmd.daemon.config import Config
from gmd.daemon.enforce.plans import host_caps, host_knobs, others_use, recent_window
from gmd.daemon.ledger import capabilities, lookup, reset_window
from gmd.daemon.ledger.models import (
    ActionKind,
    BatchState,
    IntervalState,
)
from gmd.daemon.ledger.step_input import IntervalData, previous_standing, read_interval
from gmd.daemon.ledger.tables import (
    actions as _actions,
    batches as _batches,
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    customers as _customers,
    host_intervals as _host_intervals,
    hosts as _hosts,
    intervals as _intervals,
    organizations as _orgs,
    resource_ledger as _terms,
    samples as _samples,
    vms as _vms,
)
from gmd.daemon.reports.actions import actions as list_actions, knobs_words
from gmd.daemon.reports.enforcement import caps_words
from gmd.fairness.cloud import CloudGreediness
from gmd.fairness.decay import decay_factor
from gmd.fairness.policy import (
    CapDecision,
    CapResource,
    ThrottlePolicy,
    caps_wanted,
    for_customer,
)
from gmd.wire import Knob, PlanMode

AGREEMENT = 1e-9
"""recomputed and stored greediness closer than this are the same number"""


class NothingToExplain(GmdError, LookupError):
    """No accounted interval matches (with the reason as message)."""


@dataclass(frozen=True)
class ResourceUse:
    resource: str
    used: float
    endowment: float
    offset: float
    term: float
    """this VM's contribution to its customer's greediness from this resource"""


@dataclass(frozen=True)
class VmExplained:
    uuid: str
    greediness: float
    resources: list[ResourceUse]


@dataclass(frozen=True)
class HostResource:
    resource: str
    supply: float
    over: float
    """α: what all consumers on the host took above their endowments"""
    unused: float
    """β: what consumers left of their endowments"""
    credit: float
    """κ = min(1, α/β): the fraction of unused endowment others actually took"""


@dataclass(frozen=True)
class HostExplained:
    name: str
    organization: str
    consumers: int
    vms: list[VmExplained]
    resources: list[HostResource]

    @property
    def greediness(self) -> float:
        return sum(v.greediness for v in self.vms)


@dataclass(frozen=True)
class HostCaps:
    """Whether the hard caps of the customer's level apply on one of its hosts, and why."""

    host: str
    decisions: dict[CapResource, CapDecision]
    words: str
    """for the level in force: "applied: cpu 91 % ≥ 80 %", or "none at level 1"."""
    disk_weight: bool = True
    """whether the host has a disk weight (its agent's word: no BFQ on its disks, none)"""

    def document(self) -> dict[str, object]:
        return {
            "host": self.host,
            "caps": self.words,
            "disk_weight": self.disk_weight,
            "resources": [d.figures() for d in self.decisions.values()],
        }


@dataclass(frozen=True)
class Driver:
    """An interval whose greed makes up much of the balance after the interval explained."""

    start_s: int
    greediness: float
    """what the customer took beyond its share in it"""
    contribution: float
    """what of it is left in the balance explained, after decay"""
    resource: str | None
    """the resource of its largest term, where the ledger holds its terms"""

    def document(self) -> dict[str, object]:
        return {
            "interval": iso(self.start_s),
            "start_s": self.start_s,
            "greediness": self.greediness,
            "contribution": self.contribution,
            "resource": self.resource,
        }


DRIVERS = 3
"""Intervals the summary cites as what drove the level"""
DRIVER_SHARE = 0.1
"""An interval is cited when its contribution is at least this share of the largest one"""
DRIVER_SCAN = 10_000
"""Most of the customer's greedy intervals read back (a week of 60 s intervals)"""


@dataclass
class Explanation:
    customer: str
    """the project uuid, however the operator named it"""
    start_s: int
    length_s: int
    resources: tuple[str, ...]
    gamma: float
    share: dict[str, float]
    active_customers: int
    hosts: list[HostExplained]
    greediness: float
    ledger_greediness: float
    previous_balance: float
    previous_start_s: int | None
    decay: float
    half_life_s: float | None
    reset: bool
    balance: float
    priority: float
    utility: float
    score: float
    priority_weight: float
    enter: tuple[float, ...]
    leave: tuple[float, ...]
    level: int
    level_since_s: float | None
    mode: str
    level_reason: str | None
    """why the level in force was entered: its decision's words, with its score then"""
    actions: list[dict[str, object]]
    range_summary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    name: str | None = None
    """the project's name, where the ledger knows it"""
    policy: ThrottlePolicy = field(default_factory=ThrottlePolicy)
    caps: list[HostCaps] = field(default_factory=list)
    """per host the customer ran VMs on in the interval"""
    quota_cloud: str = ""
    """[enforcement.quota] cloud: empty when gmd changes no quota"""
    raw_kept: bool = True
    """the interval's samples are still in the ledger (not past raw retention)"""
    entered_after_s: int | None = None
    """start of the interval whose accounting decided the level in force"""
    entry_score: float | None = None
    """the score then, which the decision compared (``score`` is the one after this interval)"""
    drivers: list[Driver] = field(default_factory=list)
    """the intervals whose greed makes up most of the balance, oldest first (level > 0)"""

    @property
    def who(self) -> str:
        return self.customer if self.name is None else f"{self.customer} ({self.name})"

    def document(self) -> dict[str, object]:
        """Everything, as JSON-ready values."""
        return {
            "customer": self.customer,
            "name": self.name,
            "interval": {"start": iso(self.start_s), "start_s": self.start_s, "s": self.length_s},
            "gamma": self.gamma,
            "share": self.share,
            "active_customers": self.active_customers,
            "greediness": self.greediness,
            "ledger_greediness": self.ledger_greediness,
            "hosts": [
                {
                    "host": h.name,
                    "organization": h.organization,
                    "consumers": h.consumers,
                    "greediness": h.greediness,
                    "resources": [vars(r) for r in h.resources],
                    "vms": [
                        {
                            "uuid": v.uuid,
                            "greediness": v.greediness,
                            "resources": [vars(r) for r in v.resources],
                        }
                        for v in h.vms
                    ],
                }
                for h in self.hosts
            ],
            "balance": {
                "previous": self.previous_balance,
                "previous_interval_start_s": self.previous_start_s,
                "decay": self.decay,
                "half_life_s": self.half_life_s,
                "reset": self.reset,
                "greediness": self.ledger_greediness,
                "balance": self.balance,
            },
            "priority": self.priority,
            "utility": self.utility,
            "level": {
                "score": self.score,
                "priority_weight": self.priority_weight,
                "enter": list(self.enter),
                "leave": list(self.leave),
                "level": self.level,
                "since_s": self.level_since_s,
                "mode": self.mode,
                "reason": self.level_reason,
                "entered_after": None
                if self.entered_after_s is None
                else {
                    "interval": iso(self.entered_after_s),
                    "start_s": self.entered_after_s,
                    "score": self.entry_score,
                },
                "drivers": [d.document() for d in self.drivers],
            },
            "caps": [c.document() for c in self.caps],
            "actions": self.actions,
            "range": self.range_summary,
            "notes": self.notes,
            "summary": summary_lines(self),
        }


# --- finding the interval ------------------------------------------------------------------------


def _pick_interval(
    conn: Connection,
    customer_id: int,
    at_s: float | None,
    from_s: float | None,
    to_s: float | None,
) -> tuple[int, int, int]:
    """(interval id, start, length): the interval holding ``at_s``; else the customer's
    greediest interval of the range; else its latest interval with VMs."""
    accounted = _intervals.c.state == IntervalState.accounted
    if at_s is not None:
        row = conn.execute(
            select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s)
            .where(_intervals.c.start_s <= at_s)
            .order_by(_intervals.c.start_s.desc())
            .limit(1)
        ).first()
        if row is None or at_s >= row.start_s + row.length_s:
            raise NothingToExplain(f"no interval of the ledger holds {iso(at_s)}")
        state = conn.execute(select(_intervals.c.state).where(_intervals.c.id == row.id)).scalar()
        if state != IntervalState.accounted:
            raise NothingToExplain(
                f"the interval of {iso(row.start_s)} is not accounted yet ({state})"
            )
        return int(row.id), int(row.start_s), int(row.length_s)
    query = (
        select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s)
        .join(_ledger, _ledger.c.interval_id == _intervals.c.id)
        .where(accounted, _ledger.c.customer_id == customer_id, _ledger.c.vms > 0)
    )
    if from_s is not None:
        query = query.where(_intervals.c.start_s >= from_s)
    if to_s is not None:
        query = query.where(_intervals.c.start_s < to_s)
    if from_s is not None or to_s is not None:
        query = query.order_by(_ledger.c.greediness.desc(), _intervals.c.start_s.desc())
    else:
        query = query.order_by(_intervals.c.start_s.desc())
    row = conn.execute(query.limit(1)).first()
    if row is None:
        where = "in that range" if from_s is not None or to_s is not None else "in the ledger"
        raise NothingToExplain(f"the customer ran no VM in an accounted interval {where}")
    return int(row.id), int(row.start_s), int(row.length_s)


# --- what retention has left --------------------------------------------------------------------


def _raw_kept(conn: Connection, interval_id: int) -> bool:
    """Whether the interval's raw data is still there: its host capacities are, for every
    interval with samples, until retention drops its day."""
    found = conn.execute(
        select(_host_intervals.c.host_id).where(_host_intervals.c.interval_id == interval_id)
    ).first()
    return found is not None


def _past_retention(
    conn: Connection, config: Config, interval_id: int, customer_id: int, no_ledger_row: bool
) -> list[str]:
    """What explain can still say of an interval whose samples retention dropped."""
    kept = config.retention
    notes = [
        f"This interval's samples are past raw retention ([retention] raw_days ="
        f" {kept.raw_days:g}): its VMs and hosts cannot be shown or recomputed; the greediness,"
        " balance and level below are the ledger's."
    ]
    if not no_ledger_row:
        return notes
    hour = interval_id - interval_id % HOUR_S
    c = _customer_rollups.c
    rolled = conn.execute(
        select(c.period_s, c.gm_sum, c.balance_end, c.intervals)
        .where(
            c.customer_id == customer_id,
            or_(
                and_(c.period_s == HOUR_S, c.start_s == hour),
                and_(c.period_s == DAY_S, c.start_s == interval_id - interval_id % DAY_S),
            ),
        )
        .order_by(c.period_s)
    ).first()
    if rolled is None:
        notes.append(
            f"Its ledger rows are past ledger retention ([retention] ledger_days ="
            f" {kept.ledger_days:g}) and no rollup holds the customer there: nothing is left"
            " to show but the level in force."
        )
    else:
        period = "hour" if rolled.period_s == HOUR_S else "UTC day"
        notes.append(
            f"Its ledger rows are past ledger retention ([retention] ledger_days ="
            f" {kept.ledger_days:g}); its {period}'s rollup holds the customer's GM sum over"
            f" {rolled.intervals} interval(s), {rolled.gm_sum:.6g}, and its balance after the"
            f" {period}, {rolled.balance_end:.6g}."
        )
    return notes


# --- the interval again, VM by VM ----------------------------------------------------------------


def _recompute(
    conn: Connection, config: Config, interval_id: int, length_s: int, customer_id: int
) -> tuple[list[HostExplained], float, dict[str, float], int]:
    """The customer's hosts and VMs in the interval, its recomputed G, the share s_i and N:
    the interval read and stepped exactly as accounting does (:func:`read_interval`, then the
    pure step :func:`gmd.fairness.ledger_step.step_interval`), with the current
    configuration."""
    acc = config.accounting
    with np.errstate(over="ignore", invalid="ignore"):
        data = read_interval(conn, interval_id, acc)
        if data is None:
            return [], 0.0, {}, 0
        step = data.step(acc.interval_settings())
    result = step.result.greediness
    resources = acc.resources
    share = {r: float(result.share[k]) for k, r in enumerate(resources)}
    mine = step.accounts.account_of_customer.get(customer_id)
    if mine is None:
        return [], 0.0, share, result.active_customers
    names = _names(conn, interval_id, data)
    consumers_on = np.bincount(result.consumer_host, minlength=len(names.hosts))
    explained: list[HostExplained] = []
    for h in sorted(
        {int(result.consumer_host[j]) for j in np.flatnonzero(result.consumer_customer == mine)}
    ):
        ids = np.flatnonzero((result.consumer_customer == mine) & (result.consumer_host == h))
        host = names.hosts[h]
        explained.append(
            HostExplained(
                host.name,
                host.organization,
                int(consumers_on[h]),
                [_vm_explained(result, int(j), names.vm_uuids, resources) for j in ids],
                [
                    HostResource(
                        r,
                        float(data.sampled.supply[h, k]),
                        float(result.over[h, k]),
                        float(result.ceded[h, k]),
                        float(result.credit[h, k]),
                    )
                    for k, r in enumerate(resources)
                ],
            )
        )
    return explained, float(result.customer_greediness[mine]), share, result.active_customers


@dataclass(frozen=True)
class _Names:
    hosts: list[Any]
    """per host row: its ``name`` and its owner ``organization``'s name"""
    vm_uuids: list[str]
    """per VM row: its uuid"""


def _names(conn: Connection, interval_id: int, data: IntervalData) -> _Names:
    """The names behind the interval's host and VM rows."""
    uuids = dict(
        conn.execute(
            select(_vms.c.id, _vms.c.uuid).where(_vms.c.id.in_(np.unique(data.vm_ids).tolist()))
        ).all()
    )
    named = {
        int(h.id): h
        for h in conn.execute(
            select(_hosts.c.id, _hosts.c.name, _orgs.c.name.label("organization"))
            .join(_host_intervals, _host_intervals.c.host_id == _hosts.c.id)
            .join(_orgs, _orgs.c.id == _host_intervals.c.organization_id)
            .where(
                _host_intervals.c.interval_id == interval_id,
                _hosts.c.id.in_(data.host_ids.tolist()),
            )
        )
    }
    return _Names([named[int(h)] for h in data.host_ids], [str(uuids[int(v)]) for v in data.vm_ids])


def _vm_explained(
    result: CloudGreediness, consumer: int, vm_uuid: list[str], resources: Sequence[str]
) -> VmExplained:
    """One consumer (a VM, or the VMs the consumer mode makes one) term by term."""
    members = np.flatnonzero(result.consumer_of_vm == consumer)
    return VmExplained(
        ", ".join(vm_uuid[int(v)] for v in members),
        float(result.greediness[consumer]),
        [
            ResourceUse(
                r,
                float(result.use[consumer, k]),
                float(result.endowment[consumer, k]),
                float(result.offsets[consumer, k]),
                float(result.terms[consumer, k]),
            )
            for k, r in enumerate(resources)
        ],
    )


# --- the standing and the level ------------------------------------------------------------------


def _previous(conn: Connection, customer_id: int, start_s: int) -> tuple[float, int | None, bool]:
    """The balance accounting started this interval from: the previous interval with rows."""
    prev = previous_standing(conn, start_s)
    if prev is None:
        return 0.0, None, False
    balance = conn.execute(
        select(_ledger.c.balance).where(
            _ledger.c.interval_id == prev.id, _ledger.c.customer_id == customer_id
        )
    ).scalar()
    reset = customer_id in reset_window.reset_customers(conn, prev.start_s, start_s)
    return (0.0 if balance is None else float(balance)), int(prev.start_s), reset


@dataclass(frozen=True)
class LevelInForce:
    level: int
    reason: str | None
    decided_for_s: int | None
    """start of the interval whose accounting decided it"""
    recorded: object | None
    """when that decision was recorded (datetime)"""
    since_s: float | None = None
    """when the level took effect: the end of the interval that decided it"""


def _level_at(conn: Connection, customer_id: int, start_s: int) -> LevelInForce:
    """The level in force after the interval: the latest level change decided for it or for
    an interval before it."""
    change = conn.execute(
        select(
            _actions.c.after,
            _actions.c.reason,
            _actions.c.at,
            _intervals.c.start_s,
            _intervals.c.length_s,
        )
        .join(_intervals, _intervals.c.id == _actions.c.interval_id)
        .where(
            _actions.c.customer_id == customer_id,
            _actions.c.kind == ActionKind.level.value,
            _intervals.c.start_s <= start_s,
        )
        .order_by(_intervals.c.start_s.desc(), _actions.c.id.desc())
        .limit(1)
    ).first()
    if change is None:
        return LevelInForce(0, None, None, None)
    level = int(json.loads(change.after)["level"])
    since = float(change.start_s + change.length_s)
    return LevelInForce(level, change.reason, int(change.start_s), change.at, since)


def _entry_score(
    conn: Connection, customer_id: int, decided_for_s: int, priority_weight: float
) -> float | None:
    """The score the level decision compared: the standing after the interval it was decided
    for (None when retention dropped that row)."""
    row = conn.execute(
        select(_ledger.c.balance, _ledger.c.priority)
        .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
        .where(_intervals.c.start_s == decided_for_s, _ledger.c.customer_id == customer_id)
    ).first()
    return None if row is None else float(row.balance) - priority_weight * float(row.priority)


def _drivers(
    conn: Connection, customer_id: int, start_s: int, length_s: int, half_life_s: float | None
) -> list[Driver]:
    """The intervals whose greed is the most of the balance after the interval of
    ``start_s``: each greedy interval since the last reset weighs its greediness decayed to
    that interval's end (what is left of it in the balance); the :data:`DRIVERS` largest, of at
    least :data:`DRIVER_SHARE` of the largest, oldest first. The latest interval is cited only
    when it weighs: a negligible +0.0003 does not explain a level that +0.27 brought."""
    reset = reset_window.last_reset(conn, customer_id, start_s)
    where = [
        _ledger.c.customer_id == customer_id,
        _ledger.c.greediness > 0,
        _intervals.c.start_s <= start_s,
    ]
    if reset is not None:
        where.append(_intervals.c.start_s >= reset)
    rows = conn.execute(
        select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s, _ledger.c.greediness)
        .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
        .where(*where)
        .order_by(_intervals.c.start_s.desc())
        .limit(DRIVER_SCAN)
    ).all()
    end = start_s + length_s
    weighed = sorted(
        (
            (
                float(r.greediness)
                * decay_factor(max(0.0, float(end - r.start_s - r.length_s)), half_life_s),
                r,
            )
            for r in rows
        ),
        key=lambda pair: (-pair[0], -pair[1].start_s),
    )
    if not weighed:
        return []
    top = [(c, r) for c, r in weighed[:DRIVERS] if c >= DRIVER_SHARE * weighed[0][0]]
    largest: dict[int, tuple[str, float]] = {}
    for interval_id, resource, term in conn.execute(
        select(_terms.c.interval_id, _terms.c.resource, _terms.c.term).where(
            _terms.c.customer_id == customer_id,
            _terms.c.interval_id.in_([int(r.id) for _, r in top]),
        )
    ):
        if term > 0 and term > largest.get(int(interval_id), ("", 0.0))[1]:
            largest[int(interval_id)] = (str(resource), float(term))
    drivers = [
        Driver(int(r.start_s), float(r.greediness), c, largest.get(int(r.id), (None, 0.0))[0])
        for c, r in top
    ]
    return sorted(drivers, key=lambda d: d.start_s)


def _enforced(
    conn: Connection, customer: str, level: LevelInForce, start_s: int, limit: int
) -> list[dict[str, object]]:
    """What was done for the level in force: its decision and what followed up to the
    interval (quota writes tied to intervals; host reports, which carry no interval, recorded
    since the decision)."""
    if level.decided_for_s is None:
        return []
    in_range = [
        r
        for r in list_actions(conn, customer=customer, raw=True)
        if (r["interval_s"] is not None and level.decided_for_s <= r["interval_s"] <= start_s)
        or (r["interval_s"] is None and r["at_dt"] >= level.recorded)
    ]
    for r in in_range:
        r.pop("interval_s")
        r.pop("at_dt")
    return in_range[-limit:]


def explain(
    conn: Connection,
    config: Config,
    customer: str,
    *,
    at_s: float | None = None,
    from_s: float | None = None,
    to_s: float | None = None,
    max_actions: int = 20,
) -> Explanation:
    """Explain one interval of ``customer`` (see :func:`_pick_interval` for which)."""
    customer_id = lookup.customer_id(conn, customer)
    customer, name = conn.execute(
        select(_customers.c.name, _customers.c.display_name).where(_customers.c.id == customer_id)
    ).one()
    interval_id, start_s, length_s = _pick_interval(conn, customer_id, at_s, from_s, to_s)
    acc = config.accounting
    row = conn.execute(
        select(
            _ledger.c.greediness, _ledger.c.balance, _ledger.c.priority, _ledger.c.utility
        ).where(_ledger.c.interval_id == interval_id, _ledger.c.customer_id == customer_id)
    ).first()
    stored = (0.0, 0.0, 0.0, 0.0) if row is None else tuple(float(v) for v in row)
    notes: list[str] = []
    raw_kept = _raw_kept(conn, interval_id)
    if raw_kept:
        hosts, greediness, share, active = _recompute(
            conn, config, interval_id, length_s, customer_id
        )
    else:
        hosts, greediness, share, active = [], stored[0], {}, 0
        notes.extend(_past_retention(conn, config, interval_id, customer_id, row is None))
    previous, previous_start, reset = _previous(conn, customer_id, start_s)
    decay = decay_factor(
        0.0 if previous_start is None else float(start_s - previous_start), acc.half_life_s
    )
    policy = config.enforcement.policy
    score = stored[1] - policy.priority_weight * stored[2]
    in_force = _level_at(conn, customer_id, start_s)
    done = _enforced(conn, customer, in_force, start_s, max_actions)
    entry_score = None
    if in_force.decided_for_s is not None:
        entry_score = _entry_score(
            conn, customer_id, in_force.decided_for_s, policy.priority_weight
        )
    drivers = []
    if in_force.level > 0:
        drivers = _drivers(conn, customer_id, start_s, length_s, acc.half_life_s)
    if abs(greediness - stored[0]) > AGREEMENT * max(1.0, abs(stored[0])):
        notes.append(
            f"Recomputed from the stored samples with the current configuration, this interval's"
            f" greediness is {greediness:.6g}, but the ledger holds {stored[0]:.6g}: the"
            " accounting configuration (gamma, endowment, weights…) has changed since. The"
            " ledger's numbers are the ones that count."
        )
    late = conn.execute(
        select(_samples.c.vm_id)
        .join(_vms, _vms.c.id == _samples.c.vm_id)
        .where(
            _samples.c.interval_id == interval_id,
            _samples.c.late.is_(True),
            _samples.c.customer_id == customer_id,
        )
        .limit(1)
    ).first()
    if late is not None:
        notes.append(
            "Some of this customer's samples for this interval arrived after it was accounted"
            " (late): they are stored but not counted."
        )
    set_aside = conn.execute(
        select(func.count())
        .select_from(_batches)
        .where(
            _batches.c.interval_id == interval_id,
            _batches.c.late.is_(False),
            _batches.c.state != BatchState.accepted,
        )
    ).scalar_one()
    if set_aside:
        notes.append(
            f"{set_aside} batch(es) of this interval could not be accounted and were quarantined:"
            " the interval was accounted without them (gmd-admin batches --quarantined)."
        )
    summary = None
    if from_s is not None or to_s is not None:
        summary = _range_summary(conn, customer_id, from_s, to_s)
    caps = _caps(conn, config, [h.name for h in hosts], interval_id, in_force.level, customer_id)
    return Explanation(
        customer=customer,
        name=name,
        start_s=start_s,
        length_s=length_s,
        resources=acc.resources,
        gamma=acc.gamma,
        share=share,
        active_customers=active,
        hosts=hosts,
        greediness=greediness,
        ledger_greediness=stored[0],
        previous_balance=previous,
        previous_start_s=previous_start,
        decay=decay,
        half_life_s=acc.half_life_s,
        reset=reset,
        balance=stored[1],
        priority=stored[2],
        utility=stored[3],
        score=score,
        priority_weight=policy.priority_weight,
        enter=tuple(policy.enter),
        leave=tuple(policy.leave),
        level=in_force.level,
        level_since_s=None if in_force.level == 0 else in_force.since_s,
        mode=config.enforcement.mode,
        level_reason=in_force.reason,
        actions=done,
        range_summary=summary,
        notes=notes,
        policy=policy,
        caps=caps,
        quota_cloud=config.enforcement.quota.cloud,
        raw_kept=raw_kept,
        entered_after_s=in_force.decided_for_s,
        entry_score=entry_score,
        drivers=drivers,
    )


def _caps(
    conn: Connection,
    config: Config,
    hosts: list[str],
    interval_id: int,
    level: int,
    customer_id: int,
) -> list[HostCaps]:
    """Whether the level's caps apply to the customer on each host, measured as the plan
    served after the interval measured it: over the accounted intervals up to it (withheld
    where the customer contends the host alone: :func:`gmd.fairness.policy.for_customer`)."""
    if not hosts:
        return []
    contention = config.enforcement.contention
    window = recent_window(conn, contention.intervals, upto_id=interval_id)
    query = select(_hosts.c.name, _hosts.c.id).where(_hosts.c.name.in_(hosts))
    ids = {str(name): int(host_id) for name, host_id in conn.execute(query)}
    effect = config.enforcement.policy.effect(level)
    out = []
    for host in sorted(hosts):
        said = capabilities.of_host(conn, host)
        knobs = said.capabilities if said is not None else None
        host_id = ids.get(host)
        others = others_use(conn, host_id, window).get(customer_id, {})
        decisions = for_customer(
            host_knobs(host_caps(conn, host_id, window, contention), knobs), others, contention
        )
        weight = knobs is None or Knob.disk_weight not in knobs.unsupported()
        out.append(HostCaps(host, decisions, caps_words(effect, decisions), weight))
    return out


def reported_knobs(actions: list[dict[str, object]]) -> dict[str, str]:
    """Per host, what its latest report on the customer's VMs said of each knob (in words),
    for the hosts whose report says it (agents older than knobs say nothing)."""
    out: dict[str, str] = {}
    for a in actions:
        knobs = a.get("knobs")
        if a.get("kind") == "host_apply" and isinstance(knobs, dict) and knobs and a.get("host"):
            out[str(a["host"])] = knobs_words(knobs)
    return out


def _range_summary(
    conn: Connection, customer_id: int, from_s: float | None, to_s: float | None
) -> dict[str, object]:
    """Greediness and per-resource terms summed over the range, and the balance at its ends."""
    where = [_ledger.c.customer_id == customer_id]
    if from_s is not None:
        where.append(_intervals.c.start_s >= from_s)
    if to_s is not None:
        where.append(_intervals.c.start_s < to_s)
    total = conn.execute(
        select(func.count(), func.sum(_ledger.c.greediness))
        .select_from(_ledger.join(_intervals, _intervals.c.id == _ledger.c.interval_id))
        .where(*where)
    ).one()
    terms = dict(
        conn.execute(
            select(_terms.c.resource, func.sum(_terms.c.term))
            .select_from(_terms.join(_intervals, _intervals.c.id == _terms.c.interval_id))
            .where(_terms.c.customer_id == customer_id, *where[1:])
            .group_by(_terms.c.resource)
        ).all()
    )
    ends = conn.execute(
        select(_intervals.c.start_s, _ledger.c.balance)
        .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
        .where(*where)
        .order_by(_intervals.c.start_s)
    ).all()
    return {
        "intervals_with_a_standing": int(total[0]),
        "greediness_sum": float(total[1] or 0.0),
        "terms": {str(k): float(v) for k, v in terms.items()},
        "first_balance": float(ends[0].balance) if ends else 0.0,
        "last_balance": float(ends[-1].balance) if ends else 0.0,
    }


# --- in words ------------------------------------------------------------------------------------


def signed(x: float) -> str:
    """+0.125, −0.0625, 0 (never "-0")."""
    return "0" if x == 0 else f"{x:+.4g}".replace("-", "−")


def _duration(seconds: float) -> str:
    """A duration as a person reads it: 30 s, 90 s, 15 min, 1.5 h, 2.0 days (never "0 min":
    short half-lives and dwells are real settings, a test cloud's or a demo's)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


def _hosts_where(caps: list[HostCaps], resource: CapResource) -> str:
    """ "on cmp-01 (cpu 91 % ≥ 80 %); not on cmp-02 (cpu 22 % < 80 %), …"."""
    on: list[str] = []
    off: list[str] = []
    for c in caps:
        d = c.decisions[resource]
        (on if d.applied else off).append(f"{c.host} ({d.why()})")
    parts = []
    if on:
        parts.append(f"on {', '.join(on)}")
    if off:
        parts.append(f"not on {', '.join(off)}, where nobody needs protecting from it")
    return "; ".join(parts)


def drivers_words(drivers: list[Driver]) -> str:
    """ "the interval of 2026-… (+0.27, mostly cpu), the interval of 2026-… (+0.05)"."""
    return ", ".join(
        f"the interval of {iso(d.start_s)} ({signed(d.greediness)}"
        + (f", mostly {d.resource})" if d.resource else ")")
        for d in drivers
    )


def summary_lines(e: Explanation) -> list[str]:
    """Five lines in plain words: who and at which level since when; why (the balance
    against the thresholds); what is done on which hosts (weights everywhere, hard caps only
    where the host is contended); the quota; what would lift it."""
    p = e.policy
    level, n = e.level, len(e.enter)
    effect = p.effect(level)
    quantity = "balance" if e.priority_weight == 0 else "score (balance less weighted priority)"
    mode = f"enforcement is {PlanMode(e.mode).words}"
    if level == 0:
        first = f"Customer {e.who} is not throttled (level 0 of {n}); {mode}."
        why = f"Why: its {quantity}, {e.score:.4g}, is below {e.enter[0]:g}, where level 1 begins."
        done = "On its hosts: nothing; its VMs keep their own weights and no cap."
        quota = "Quota: unchanged."
        lift = f"Nothing to lift; a {quantity} of {e.enter[0]:g} would bring level 1."
        return [first, why, done, quota, lift]
    since = "" if e.level_since_s is None else f" since {iso(int(e.level_since_s))}"
    first = f"Customer {e.who} is at throttle level {level} of {n}{since}; {mode}."
    enter, leave = e.enter[level - 1], e.leave[level - 1]
    now = f"{e.score:.4g} now (after the interval of {iso(e.start_s)})"
    if e.score >= enter:
        why = f"Why: its {quantity} is {now}, at or above {enter:g}, where level {level} begins"
    else:
        why = (
            f"Why: its {quantity} is {now}, still at or above {leave:g}, below which"
            f" level {level} (entered at {enter:g}) is left"
        )
    if e.entry_score is not None and e.entered_after_s not in (None, e.start_s):
        why += (
            f"; it was {e.entry_score:.4g} when the level was decided, after the interval of"
            f" {iso(e.entered_after_s)}"
        )
    if e.drivers:
        why += f"; the greed that made its balance: {drivers_words(e.drivers)}"
    why += "."
    hosts = ", ".join(c.host for c in e.caps)
    if not e.raw_kept:
        done = (
            f"On its hosts: weights × {effect.weight_factor:g}; which hosts ran its VMs in this"
            " interval, and whether caps applied there, is past raw retention."
        )
    elif not hosts:
        done = "On its hosts: it ran no VM in this interval, so no host holds it back now."
    else:
        weighed = ", ".join(c.host for c in e.caps if c.disk_weight)
        unweighed = ", ".join(c.host for c in e.caps if not c.disk_weight)
        if not unweighed:
            done = (
                f"On its hosts: CPU and I/O weights × {effect.weight_factor:g} on {hosts} (they"
                " only take effect where a host is busy)"
            )
        else:
            done = (
                f"On its hosts: CPU weights × {effect.weight_factor:g} on {hosts}"
                + (f", I/O weights on {weighed}" if weighed else "")
                + " (they only take effect where a host is busy); no disk weight on"
                f" {unweighed}, whose disks no proportional I/O scheduler runs (a disk limit of"
                " the weight's share stands in where the disk is contended, unless"
                " disk_weight_fallback = none)"
            )
        wanted = caps_wanted(effect)
        if CapResource.cpu in wanted:
            done += (
                f"; a CPU cap of {100 * (effect.cpu_cap_fraction or 0):g} % of its vCPUs"
                f" {_hosts_where(e.caps, CapResource.cpu)}"
            )
        if CapResource.disk in wanted:
            done += (
                f"; disk caps of {(effect.disk_bytes_per_s or 0) / 1e6:g} MB/s per VM"
                f" {_hosts_where(e.caps, CapResource.disk)}"
            )
        if not wanted:
            done += f"; no hard caps below level {p.cap_level}"
        reported = reported_knobs(e.actions)
        if reported:
            done += "; as its hosts last reported: " + "; ".join(
                f"{host}: {words}" for host, words in sorted(reported.items())
            )
        done += "."
    if effect.quota_steps == 0:
        quota = "Quota: unchanged" + (
            f" (lowered from level {p.quota_level} on)." if p.quota_level <= n else "."
        )
    elif e.quota_cloud:
        quota = (
            f"Quota: its OpenStack compute quota is lowered by {effect.quota_steps} step(s)"
            f" (from level {p.quota_level} on), and restored when it falls below."
        )
    else:
        quota = (
            f"Quota: level {level} lowers it by {effect.quota_steps} step(s), but no cloud is"
            " configured ([enforcement.quota] cloud), so gmd changes none."
        )
    lift = f"What would lift it: a {quantity} below {leave:g} brings level {level - 1}"
    if p.dwell_s:
        lift += f" (one level per {_duration(p.dwell_s)} at most)"
    if e.priority_weight == 0 and e.half_life_s is not None and e.balance > 0:
        if leave > 0:
            wait = e.half_life_s * math.log2(e.balance / leave) if e.balance > leave else 0.0
            lift += (
                f"; with no more greed its balance halves every {_duration(e.half_life_s)},"
                f" below {leave:g} in about {_duration(wait)}"
            )
        else:
            lift += "; decay alone never takes it below 0: leaving its share to others does"
    lift += "."
    return [first, why, done, quota, lift]
