"""Hourly and daily rollups: what reports over long ranges read instead of every interval.

A 100,000-VM cloud writes ~2,000 customer rows, ~8,000 resource terms and 100,000 samples
every minute; a month's report over them reads billions of rows. Slurm keeps hourly, daily
and monthly usage rollups for the same reason. Here an hour is rolled up in the transaction
that accounts its last interval (the first whose end reaches the hour's end), from the hour's
ledger rows and on-time samples, and a UTC day in the one that rolls up its last hour, from
its hours: both land with the interval or neither does. Rolling a period up again replaces
its rows, so it is idempotent; :func:`backfill` rolls up the complete periods a ledger from
before rollups (or a crash between schema upgrade and start) lacks.

What a period holds (``start_s`` is its start; intervals belong to the period they start in):

- ``rollup_periods``: accounted intervals, how many had ledger rows, their seconds, and the
  last one with rows (where the standings "at the end" are read);
- ``customer_rollups``: per customer, intervals with a row, Σ greediness, Σ positive
  greediness, the most VMs in one interval, its balance, utility and priority after the
  period (0 when it had no row in the period's last interval with rows: negligible), and what
  its VMs used (on-time samples; disk = read + written, network = received + sent);
- ``customer_resource_rollups``: per customer and resource, Σ, Σ positive, Σ negative and
  the largest of its terms;
- ``host_rollups``: per host, on-time samples, the most VMs and customers in one interval,
  what they used, the CPU it supplied (core-seconds, intervals it was accounted in), its
  owner in the period's last interval;
- ``organization_rollups``: per organization, its standing after the period, the CPU its
  hosts supplied and what was used on them.

Late samples are not rolled up: they can still arrive after the hour is rolled up, and they
are few (a partial index finds them by range).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    case,
    delete,
    distinct,
    exists,
    func,
    insert,
    select,
)

from gmd.common.units import DAY_S, HOUR_S
from gmd.ledger_schema.kinds import BatchState, IntervalState
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import (
    batches as _batches,
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    host_intervals as _host_intervals,
    host_rollups as _host_rollups,
    intervals as _intervals,
    organization_ledger as _org_ledger,
    organization_rollups as _org_rollups,
    resource_ledger as _terms,
    resource_rollups as _resource_rollups,
    rollup_periods as _periods,
    samples as _samples,
)

log = logging.getLogger(__name__)

PERIODS = (HOUR_S, DAY_S)
ROLLUP_TABLES = (_periods, _customer_rollups, _resource_rollups, _host_rollups, _org_rollups)
USED = ("cpu_s", "memory_byte_s", "disk_bytes", "network_bytes")


def after_interval(conn: Connection, start_s: int, length_s: int) -> None:
    """Roll up the hour, and the day, that the interval just accounted completes."""
    end = start_s + length_s
    hour = start_s - start_s % HOUR_S
    if end >= hour + HOUR_S:
        roll_hour(conn, hour)
        day = start_s - start_s % DAY_S
        if end >= day + DAY_S:
            roll_day(conn, day)


def _host_row(base: dict[str, int], host_id: int) -> dict[str, Any]:
    """A host's rollup row before anything is added to it (its owner is set by the caller)."""
    return {
        **base,
        "host_id": host_id,
        "samples": 0,
        "vms_max": 0,
        "customers_max": 0,
        **dict.fromkeys(USED, 0.0),
        "cpu_supplied_core_s": 0.0,
    }


def _org_row(base: dict[str, int], organization_id: int) -> dict[str, Any]:
    """An organization's rollup row before anything is added to it."""
    return {
        **base,
        "organization_id": organization_id,
        "contribution_end": 0.0,
        "utility_end": 0.0,
        "priority_end": 0.0,
        "cpu_supplied_core_s": 0.0,
        "cpu_used_core_s": 0.0,
        "customers_max": 0,
    }


def _clear(conn: Connection, period_s: int, start_s: int) -> None:
    for table in ROLLUP_TABLES:
        conn.execute(delete(table).where(table.c.period_s == period_s, table.c.start_s == start_s))


def _insert(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(insert(table), rows)


def roll_hour(conn: Connection, hour_s: int) -> None:
    """Write the rollups of the hour starting at ``hour_s`` from its intervals' rows: the
    period's row, then customers' and hosts' (with what their samples used), resources' and
    organizations'."""
    lo, hi = hour_s, hour_s + HOUR_S
    _clear(conn, HOUR_S, hour_s)
    hour = _hour_period(conn, hour_s)
    if hour is None:
        return
    end_id, base = hour
    customers = _hour_customers(conn, lo, hi, end_id, base)
    hosts = _host_rows(conn, lo, hi, base)
    _add_samples(conn, lo, hi, customers, hosts)
    _insert(conn, _customer_rollups, list(customers.values()))
    _insert(conn, _host_rollups, list(hosts.values()))
    _insert(conn, _resource_rollups, _resource_rows(conn, lo, hi, base))
    _insert(conn, _org_rollups, _organization_rows(conn, lo, hi, end_id, hosts.values(), base))


def _hour_period(conn: Connection, hour_s: int) -> tuple[int | None, dict[str, int]] | None:
    """Write the hour's period row from its accounted intervals: the last of them with rows
    (None: none had) and the rows' period columns; None when no interval of it is accounted."""
    ivs = conn.execute(
        select(_intervals.c.id, _intervals.c.length_s, _intervals.c.ledger_rows).where(
            _intervals.c.id >= hour_s,
            _intervals.c.id < hour_s + HOUR_S,
            _intervals.c.state == IntervalState.accounted,
        )
    ).all()
    if not ivs:
        return None
    with_rows = [int(r.id) for r in ivs if (r.ledger_rows or 0) > 0]
    end_id = max(with_rows) if with_rows else None
    base = {"period_s": HOUR_S, "start_s": hour_s}
    _insert(
        conn,
        _periods,
        [
            {
                **base,
                "intervals": len(ivs),
                "with_rows": len(with_rows),
                "seconds": sum(int(r.length_s) for r in ivs),
                "end_interval_id": end_id,
            }
        ],
    )
    return end_id, base


def _hour_customers(
    conn: Connection, lo: int, hi: int, end_id: int | None, base: dict[str, int]
) -> dict[int, dict[str, Any]]:
    """Each customer's row of the hour [lo, hi) from its ledger rows, with its standing after
    the interval ``end_id``; what its samples used is added by :func:`_add_samples`."""
    in_hour = and_(_ledger.c.interval_id >= lo, _ledger.c.interval_id < hi)
    customers: dict[int, dict[str, Any]] = {}
    for r in conn.execute(
        select(
            _ledger.c.customer_id,
            func.count().label("n"),
            func.sum(_ledger.c.greediness).label("gm"),
            func.sum(case((_ledger.c.greediness > 0, _ledger.c.greediness), else_=0.0)).label(
                "pos"
            ),
            func.max(_ledger.c.vms).label("vms"),
        )
        .where(in_hour)
        .group_by(_ledger.c.customer_id)
    ):
        customers[int(r.customer_id)] = {
            **base,
            "customer_id": int(r.customer_id),
            "intervals": int(r.n),
            "gm_sum": float(r.gm),
            "gm_positive": float(r.pos),
            "vms_max": int(r.vms or 0),
            "balance_end": 0.0,
            "utility_end": 0.0,
            "priority_end": 0.0,
            **dict.fromkeys(USED, 0.0),
        }
    if end_id is not None:
        for r in conn.execute(
            select(
                _ledger.c.customer_id, _ledger.c.balance, _ledger.c.utility, _ledger.c.priority
            ).where(_ledger.c.interval_id == end_id)
        ):
            row = customers.get(int(r.customer_id))
            if row is not None:
                row.update(
                    balance_end=float(r.balance),
                    utility_end=float(r.utility),
                    priority_end=float(r.priority),
                )
    return customers


def _add_samples(
    conn: Connection,
    lo: int,
    hi: int,
    customers: dict[int, dict[str, Any]],
    hosts: dict[int, dict[str, Any]],
) -> None:
    """Add what the on-time samples of [lo, hi) used to their customers' and hosts' rows."""
    s = _samples.c
    for r in conn.execute(
        select(
            s.host_id,
            s.customer_id,
            func.count().label("n"),
            func.sum(s.cpu_s).label("cpu"),
            func.sum(s.memory_byte_s).label("memory"),
            func.sum(s.disk_read_bytes + s.disk_write_bytes).label("disk"),
            func.sum(s.network_rx_bytes + s.network_tx_bytes).label("network"),
        )
        .where(s.interval_id >= lo, s.interval_id < hi, s.late.is_(False))
        .group_by(s.host_id, s.customer_id)
    ):
        used = dict(
            zip(USED, (float(r.cpu), float(r.memory), float(r.disk), float(r.network)), strict=True)
        )
        customer = customers.get(int(r.customer_id))
        if customer is not None:
            for k, v in used.items():
                customer[k] += v
        host = hosts.get(int(r.host_id))
        if host is not None:
            host["samples"] += int(r.n)
            for k, v in used.items():
                host[k] += v


def _host_rows(
    conn: Connection, lo: int, hi: int, base: dict[str, int]
) -> dict[int, dict[str, Any]]:
    """The hour's hosts that were accounted (an on-time, accepted batch in an interval), with
    the CPU they supplied, their peaks and their owner in their last interval."""
    hi_c = _host_intervals.c
    accounted = exists().where(
        _batches.c.interval_id == hi_c.interval_id,
        _batches.c.host_id == hi_c.host_id,
        _batches.c.late.is_(False),
        _batches.c.state == BatchState.accepted,
    )
    hosts: dict[int, dict[str, Any]] = {}
    for r in conn.execute(
        select(hi_c.host_id, hi_c.organization_id, hi_c.cpu_cores, _intervals.c.length_s)
        .join(_intervals, _intervals.c.id == hi_c.interval_id)
        .where(hi_c.interval_id >= lo, hi_c.interval_id < hi, accounted)
        .order_by(hi_c.interval_id)
    ):
        host = hosts.setdefault(int(r.host_id), _host_row(base, int(r.host_id)))
        host["organization_id"] = int(r.organization_id)
        host["cpu_supplied_core_s"] += float(r.cpu_cores) * int(r.length_s)
    s = _samples.c
    per_interval = (
        select(
            s.host_id,
            func.count(distinct(s.vm_id)).label("vms"),
            func.count(distinct(s.customer_id)).label("customers"),
        )
        .where(s.interval_id >= lo, s.interval_id < hi, s.late.is_(False))
        .group_by(s.interval_id, s.host_id)
        .subquery()
    )
    for peak in conn.execute(
        select(
            per_interval.c.host_id,
            func.max(per_interval.c.vms).label("vms"),
            func.max(per_interval.c.customers).label("customers"),
        ).group_by(per_interval.c.host_id)
    ):
        found = hosts.get(int(peak.host_id))
        if found is not None:
            found["vms_max"], found["customers_max"] = int(peak.vms), int(peak.customers)
    return hosts


def _resource_rows(
    conn: Connection, lo: int, hi: int, base: dict[str, int]
) -> list[dict[str, Any]]:
    t = _terms.c
    return [
        {
            **base,
            "customer_id": int(r.customer_id),
            "resource": str(r.resource),
            "term_sum": float(r.total),
            "term_over": float(r.over),
            "term_under": float(r.under),
            "term_max": float(r.top),
        }
        for r in conn.execute(
            select(
                t.customer_id,
                t.resource,
                func.sum(t.term).label("total"),
                func.sum(case((t.term > 0, t.term), else_=0.0)).label("over"),
                func.sum(case((t.term < 0, t.term), else_=0.0)).label("under"),
                func.max(t.term).label("top"),
            )
            .where(t.interval_id >= lo, t.interval_id < hi)
            .group_by(t.customer_id, t.resource)
        )
    ]


def _organization_rows(
    conn: Connection,
    lo: int,
    hi: int,
    end_id: int | None,
    hosts: Iterable[dict[str, Any]],
    base: dict[str, int],
) -> list[dict[str, Any]]:
    orgs: dict[int, dict[str, Any]] = {}

    def org(oid: int) -> dict[str, Any]:
        return orgs.setdefault(oid, _org_row(base, oid))

    for oid, customers in served_peaks(conn, lo, hi):
        org(oid)["customers_max"] = customers
    for host in hosts:
        row = org(host["organization_id"])
        row["cpu_supplied_core_s"] += host["cpu_supplied_core_s"]
        row["cpu_used_core_s"] += host["cpu_s"]
    if end_id is not None:
        for r in conn.execute(select(_org_ledger).where(_org_ledger.c.interval_id == end_id)):
            org(int(r.organization_id)).update(
                contribution_end=float(r.contribution),
                utility_end=float(r.utility),
                priority_end=float(r.priority),
            )
    return list(orgs.values())


def served_peaks(conn: Connection, lo: int, hi: int) -> list[tuple[int, int]]:
    """(organization, the most customers its hosts served in one interval starting in
    [lo, hi)) from the on-time samples; shared with reports over stretches not rolled up."""
    s, h = _samples.c, _host_intervals.c
    per_interval = (
        select(h.organization_id, func.count(distinct(s.customer_id)).label("n"))
        .select_from(
            _samples.join(
                _host_intervals,
                and_(h.interval_id == s.interval_id, h.host_id == s.host_id),
            )
        )
        .where(s.interval_id >= lo, s.interval_id < hi, s.late.is_(False))
        .group_by(s.interval_id, h.organization_id)
        .subquery()
    )
    return [
        (int(oid), int(n))
        for oid, n in conn.execute(
            select(per_interval.c.organization_id, func.max(per_interval.c.n)).group_by(
                per_interval.c.organization_id
            )
        )
    ]


def roll_day(conn: Connection, day_s: int) -> None:
    """Write the rollups of the UTC day starting at ``day_s`` from its hours' rollups: the
    period's row, then each table's (customers, their resources, hosts, organizations)."""
    _clear(conn, DAY_S, day_s)
    day = _day_period(conn, day_s)
    if day is None:
        return
    _day_customers(conn, day)
    _day_resources(conn, day)
    _day_hosts(conn, day)
    _day_organizations(conn, day)


@dataclass(frozen=True)
class _Day:
    """A UTC day being rolled up from its hours."""

    start_s: int
    last_hour: int | None
    """the start of the hour of the day's last interval with rows (None: no interval had)"""

    @property
    def base(self) -> dict[str, int]:
        return {"period_s": DAY_S, "start_s": self.start_s}

    def hours_of(self, table: Any) -> Any:
        """The day's hourly rows of ``table``."""
        lo, hi = self.start_s, self.start_s + DAY_S
        return and_(table.c.period_s == HOUR_S, table.c.start_s >= lo, table.c.start_s < hi)


def _day_period(conn: Connection, day_s: int) -> _Day | None:
    """Write the day's period row from its hours'; None when no hour of it was rolled up."""
    p = _periods.c
    period = conn.execute(
        select(
            func.count().label("hours"),
            func.sum(p.intervals).label("intervals"),
            func.sum(p.with_rows).label("with_rows"),
            func.sum(p.seconds).label("seconds"),
            func.max(p.end_interval_id).label("end_id"),
        ).where(p.period_s == HOUR_S, p.start_s >= day_s, p.start_s < day_s + DAY_S)
    ).one()
    if not period.hours:
        return None
    end_id = None if period.end_id is None else int(period.end_id)
    day = _Day(day_s, None if end_id is None else end_id - end_id % HOUR_S)
    _insert(
        conn,
        _periods,
        [
            {
                **day.base,
                "intervals": int(period.intervals),
                "with_rows": int(period.with_rows),
                "seconds": int(period.seconds),
                "end_interval_id": end_id,
            }
        ],
    )
    return day


def _day_customers(conn: Connection, day: _Day) -> None:
    base, hours_of, last_hour = day.base, day.hours_of, day.last_hour
    c = _customer_rollups.c
    customers = {
        int(r.customer_id): {
            **base,
            "customer_id": int(r.customer_id),
            "intervals": int(r.intervals),
            "gm_sum": float(r.gm_sum),
            "gm_positive": float(r.gm_positive),
            "vms_max": int(r.vms_max),
            "balance_end": 0.0,
            "utility_end": 0.0,
            "priority_end": 0.0,
            **{k: float(getattr(r, k)) for k in USED},
        }
        for r in conn.execute(
            select(
                c.customer_id,
                func.sum(c.intervals).label("intervals"),
                func.sum(c.gm_sum).label("gm_sum"),
                func.sum(c.gm_positive).label("gm_positive"),
                func.max(c.vms_max).label("vms_max"),
                *(func.sum(c[k]).label(k) for k in USED),
            )
            .where(hours_of(_customer_rollups))
            .group_by(c.customer_id)
        )
    }
    _end_of_day(conn, _customer_rollups, "customer_id", CUSTOMER_ENDS, last_hour, customers)
    _insert(conn, _customer_rollups, list(customers.values()))


def _day_resources(conn: Connection, day: _Day) -> None:
    base, hours_of = day.base, day.hours_of
    t = _resource_rollups.c
    _insert(
        conn,
        _resource_rollups,
        [
            {**base, **dict(r._mapping)}
            for r in conn.execute(
                select(
                    t.customer_id,
                    t.resource,
                    func.sum(t.term_sum).label("term_sum"),
                    func.sum(t.term_over).label("term_over"),
                    func.sum(t.term_under).label("term_under"),
                    func.max(t.term_max).label("term_max"),
                )
                .where(hours_of(_resource_rollups))
                .group_by(t.customer_id, t.resource)
            )
        ],
    )


def _day_hosts(conn: Connection, day: _Day) -> None:
    base, hours_of = day.base, day.hours_of
    h = _host_rollups.c
    hosts: dict[int, dict[str, Any]] = {}
    for r in conn.execute(select(_host_rollups).where(hours_of(_host_rollups)).order_by(h.start_s)):
        host = hosts.setdefault(int(r.host_id), _host_row(base, int(r.host_id)))
        host["organization_id"] = int(r.organization_id)  # the latest hour's owner
        host["samples"] += int(r.samples)
        host["vms_max"] = max(host["vms_max"], int(r.vms_max))
        host["customers_max"] = max(host["customers_max"], int(r.customers_max))
        host["cpu_supplied_core_s"] += float(r.cpu_supplied_core_s)
        for k in USED:
            host[k] += float(getattr(r, k))
    _insert(conn, _host_rollups, list(hosts.values()))


def _day_organizations(conn: Connection, day: _Day) -> None:
    base, hours_of, last_hour = day.base, day.hours_of, day.last_hour
    o = _org_rollups.c
    orgs = {
        int(r.organization_id): {
            **_org_row(base, int(r.organization_id)),
            "cpu_supplied_core_s": float(r.supplied),
            "cpu_used_core_s": float(r.used),
            "customers_max": int(r.customers),
        }
        for r in conn.execute(
            select(
                o.organization_id,
                func.sum(o.cpu_supplied_core_s).label("supplied"),
                func.sum(o.cpu_used_core_s).label("used"),
                func.max(o.customers_max).label("customers"),
            )
            .where(hours_of(_org_rollups))
            .group_by(o.organization_id)
        )
    }
    _end_of_day(conn, _org_rollups, "organization_id", ORGANIZATION_ENDS, last_hour, orgs)
    _insert(conn, _org_rollups, list(orgs.values()))


CUSTOMER_ENDS = ("balance_end", "utility_end", "priority_end")
ORGANIZATION_ENDS = ("contribution_end", "utility_end", "priority_end")


def _end_of_day(
    conn: Connection,
    table: Table,
    key: str,
    ends: tuple[str, ...],
    last_hour: int | None,
    rows: dict[int, dict[str, Any]],
) -> None:
    """Give each day row of ``rows`` (by ``key``) the ``ends`` of its last hour: a standing at
    the end of a day is the one at the end of that day's last rolled-up hour."""
    if last_hour is None:
        return
    t = table.c
    for r in conn.execute(
        select(t[key], *(t[e] for e in ends)).where(t.period_s == HOUR_S, t.start_s == last_hour)
    ):
        rows[int(r[0])].update({e: float(r._mapping[e]) for e in ends})


def complete_until(conn: Connection) -> int | None:
    """The end of the last accounted interval: every period ending by then is complete."""
    row = conn.execute(
        select(_intervals.c.start_s, _intervals.c.length_s)
        .where(_intervals.c.state == IntervalState.accounted)
        .order_by(_intervals.c.start_s.desc())
        .limit(1)
    ).first()
    return None if row is None else int(row.start_s) + int(row.length_s)


def missing(conn: Connection, period_s: int, limit: int) -> list[int]:
    """Starts of complete periods with accounted intervals and raw data still kept, but no
    rollup, oldest first."""
    until = complete_until(conn)
    oldest_raw = conn.execute(select(func.min(_samples.c.interval_id))).scalar()
    if until is None or oldest_raw is None:
        return []
    start = _intervals.c.id - _intervals.c.id % period_s
    done = select(_periods.c.start_s).where(_periods.c.period_s == period_s)
    return [
        int(s)
        for (s,) in conn.execute(
            select(start)
            .distinct()
            .where(
                _intervals.c.state == IntervalState.accounted,
                _intervals.c.id >= int(oldest_raw) - int(oldest_raw) % period_s,
                start + period_s <= until,
                start.not_in(done),
            )
            .order_by(start)
            .limit(limit)
        )
    ]


def backfill(engine: Engine, limit: int = 48) -> int:
    """Roll up up to ``limit`` complete hours that have no rollup yet, then the complete days
    that lack one or hold one of those hours (a day rolled up before all its hours were is
    rolled up again), each in a transaction of its own; returns how many periods."""
    with engine.connect() as conn:
        hours = missing(conn, HOUR_S, limit)
    for start in hours:
        with writer(engine).begin() as conn:
            roll_hour(conn, start)
    with engine.connect() as conn:
        until = complete_until(conn)
        days = set(missing(conn, DAY_S, limit))
    days |= {h - h % DAY_S for h in hours if until is not None and h - h % DAY_S + DAY_S <= until}
    for start in sorted(days):
        with writer(engine).begin() as conn:
            roll_day(conn, start)
    done = len(hours) + len(days)
    if done:
        log.info("rollups: %d period(s) rolled up after the fact", done)
    return done
