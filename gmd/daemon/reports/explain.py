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

This module reads the ledger for the explanation (:mod:`.explanation` holds it, its summary
lines and its JSON document, which the read API serves as they are; :mod:`.explain_recompute`
accounts the interval again). gmd-admin renders them for a terminal
(:mod:`gmd.admin.explain_text`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, and_, func, or_, select

from gmd import GmdError
from gmd.common.timespec import iso
from gmd.common.units import DAY_S, HOUR_S
from gmd.daemon.config import Config
from gmd.daemon.enforce.plans import host_caps, host_knobs, others_use, recent_window
from gmd.daemon.ledger import capabilities, lookup, reset_window
from gmd.daemon.ledger.step_input import previous_standing
from gmd.daemon.reports.actions import actions as list_actions
from gmd.daemon.reports.enforcement import caps_words
from gmd.daemon.reports.explain_recompute import recompute
from gmd.daemon.reports.explanation import CapsOnHost, Driver, Explanation
from gmd.fairness.decay import decay_factor
from gmd.fairness.policy import (
    for_customer,
)
from gmd.ledger_schema.kinds import ActionKind, BatchState, IntervalState
from gmd.ledger_schema.tables import (
    actions as _actions,
    batches as _batches,
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    customers as _customers,
    host_intervals as _host_intervals,
    hosts as _hosts,
    intervals as _intervals,
    resource_ledger as _terms,
    samples as _samples,
    vms as _vms,
)
from gmd.wire import Knob

AGREEMENT = 1e-9
"""recomputed and stored greediness closer than this are the same number"""


class NothingToExplain(GmdError, LookupError):
    """No accounted interval matches (with the reason as message)."""


DRIVERS = 3
"""Intervals the summary cites as what drove the level"""
DRIVER_SHARE = 0.1
"""An interval is cited when its contribution is at least this share of the largest one"""
DRIVER_SCAN = 10_000
"""Most of the customer's greedy intervals read back (a week of 60 s intervals)"""


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
    conn: Connection, customer_id: int, decided_for_s: int | None, priority_weight: float
) -> float | None:
    """The score the level decision compared: the standing after the interval it was decided
    for (None when no decision made the level, or retention dropped that row)."""
    if decided_for_s is None:
        return None
    row = conn.execute(
        select(_ledger.c.balance, _ledger.c.priority)
        .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
        .where(_intervals.c.start_s == decided_for_s, _ledger.c.customer_id == customer_id)
    ).first()
    return None if row is None else float(row.balance) - priority_weight * float(row.priority)


def _drivers(
    conn: Connection,
    customer_id: int,
    start_s: int,
    length_s: int,
    half_life_s: float | None,
    level: int,
) -> list[Driver]:
    """At a ``level`` above 0, the intervals whose greed is the most of the balance after the
    interval of ``start_s`` (none at level 0: nothing to explain): each greedy interval since
    the last reset weighs its greediness decayed to that interval's end (what is left of it in
    the balance); the :data:`DRIVERS` largest, of at least :data:`DRIVER_SHARE` of the
    largest, oldest first. The latest interval is cited only when it weighs: a negligible
    +0.0003 does not explain a level that +0.27 brought."""
    if level <= 0:
        return []
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
    row = _ledger_row(conn, interval_id, customer_id)
    stored = (0.0, 0.0, 0.0, 0.0) if row is None else row
    notes: list[str] = []
    raw_kept = _raw_kept(conn, interval_id)
    if raw_kept:
        hosts, greediness, share, active = recompute(conn, config, interval_id, customer_id)
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
    entry_score = _entry_score(conn, customer_id, in_force.decided_for_s, policy.priority_weight)
    drivers = _drivers(conn, customer_id, start_s, length_s, acc.half_life_s, in_force.level)
    notes.extend(_interval_notes(conn, interval_id, customer_id, greediness, stored[0]))
    ranged = from_s is not None or to_s is not None
    summary = _range_summary(conn, customer_id, from_s, to_s) if ranged else None
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


def _ledger_row(
    conn: Connection, interval_id: int, customer_id: int
) -> tuple[float, float, float, float] | None:
    """The customer's greediness, balance, priority and utility in the interval, as the ledger
    holds them (None: no row, or retention dropped it)."""
    row = conn.execute(
        select(
            _ledger.c.greediness, _ledger.c.balance, _ledger.c.priority, _ledger.c.utility
        ).where(_ledger.c.interval_id == interval_id, _ledger.c.customer_id == customer_id)
    ).first()
    if row is None:
        return None
    greediness, balance, priority, utility = (float(v) for v in row)
    return greediness, balance, priority, utility


def _interval_notes(
    conn: Connection,
    interval_id: int,
    customer_id: int,
    greediness: float,
    ledger_greediness: float,
) -> list[str]:
    """What the reader must know of the interval's figures: a recomputed greediness the ledger
    does not hold (the configuration changed since), late samples, quarantined batches."""
    notes: list[str] = []
    if abs(greediness - ledger_greediness) > AGREEMENT * max(1.0, abs(ledger_greediness)):
        notes.append(
            f"Recomputed from the stored samples with the current configuration, this interval's"
            f" greediness is {greediness:.6g}, but the ledger holds {ledger_greediness:.6g}: the"
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
    return notes


def _caps(
    conn: Connection,
    config: Config,
    hosts: list[str],
    interval_id: int,
    level: int,
    customer_id: int,
) -> list[CapsOnHost]:
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
        out.append(CapsOnHost(host, decisions, caps_words(effect, decisions), weight))
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
