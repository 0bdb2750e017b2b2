"""The usage report grouped by organization, kept apart from the other groupings as Slurm's
sreport keeps its report families: per organization its contribution, utility and priority at
the end, the hosts it supplied and their CPU supplied and used, and the customers they served.

Hosts count for the organization that owned them in each interval. The columns are defined in
:mod:`gmd.daemon.reports.usage`.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import Connection, and_, distinct, exists, func, literal, select

from gmd.columns import Column
from gmd.daemon.ledger.rollups import served_peaks
from gmd.daemon.reports.usage.common import (
    Range,
    Steps,
    customer_names,
    end_note,
    raw_and_rolled,
    sql_float,
)
from gmd.ledger_schema.kinds import BatchState
from gmd.ledger_schema.tables import (
    batches as _batches,
    host_intervals as _host_intervals,
    host_rollups as _host_rollups,
    intervals as _intervals,
    organization_ledger as _org_ledger,
    organization_rollups as _org_rollups,
    organizations as _organizations,
    samples as _samples,
)

ORGANIZATION_COLUMNS = (
    Column("organization", "Organization", None, "left"),
    Column("customer", "Is customer", None, "left"),
    Column("contribution", "Contribution (end)", 4),
    Column("utility", "Utility (end)", 4),
    Column("priority", "Priority (end)", 4),
    Column("hosts", "Hosts", None),
    Column("customers", "Customers served", None),
    Column("cpu_supplied_core_s", "CPU supplied core-s", 1),
    Column("cpu_used_core_s", "CPU used core-s", 1),
    Column("late_samples", "Late samples", None),
)


def by_organization(
    conn: Connection, rng: Range, step: Steps
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    step("standings at the end")
    end: dict[int, tuple[float, float, float]] = {}
    if rng.end_id is not None:
        end = {
            int(r.organization_id): (float(r.contribution), float(r.utility), float(r.priority))
            for r in conn.execute(
                select(
                    _org_ledger.c.organization_id,
                    _org_ledger.c.contribution,
                    _org_ledger.c.utility,
                    _org_ledger.c.priority,
                ).where(_org_ledger.c.interval_id == rng.end_id)
            )
        }
    step("hosts and supply")
    supply = _supply(conn, rng)
    step("customers served and late samples")
    served = _served(conn, rng)
    late = _late_by_organization(conn, rng)
    orgs = {
        int(r.id): (str(r.name), r.customer_id)
        for r in conn.execute(
            select(_organizations.c.id, _organizations.c.name, _organizations.c.customer_id)
        )
    }
    names = customer_names(conn)
    rows = []
    for oid in set(end) | set(supply) | set(served) | set(late):
        contribution, utility, priority = end.get(oid, (0.0, 0.0, 0.0))
        hosts, supplied, used = supply.get(oid, (0, 0.0, 0.0))
        customers = served.get(oid, 0)
        name, cid = orgs.get(oid, (str(oid), None))
        rows.append(
            {
                "organization": name,
                "customer": "" if cid is None else names.get(int(cid), str(cid)),
                "contribution": contribution,
                "utility": utility,
                "priority": priority,
                "hosts": hosts,
                "customers": customers,
                "cpu_supplied_core_s": supplied,
                "cpu_used_core_s": used,
                "late_samples": late.get(oid, 0),
            }
        )
    notes = [
        end_note(rng, "contribution, utility and priority"),
        "hosts, supply and use: the hosts accounted in the range's intervals (an on-time"
        " batch) and their on-time samples, by the organization that owned the host then;"
        " cpu_supplied_core_s = cores × interval length; customers: the most its hosts served"
        " in one interval",
    ]
    return ORGANIZATION_COLUMNS, rows, notes


def _supply(conn: Connection, rng: Range) -> dict[int, tuple[int, float, float]]:
    """Per organization: the hosts accounted in the range, the CPU they supplied (cores ×
    interval length) and the CPU their on-time samples used."""
    hc, hr = _host_intervals.c, _host_rollups.c
    accounted = exists().where(
        _batches.c.interval_id == hc.interval_id,
        _batches.c.host_id == hc.host_id,
        _batches.c.late.is_(False),
        _batches.c.state == BatchState.accepted,
    )
    raw_hosts = (
        select(
            hc.organization_id.label("oid"),
            hc.host_id.label("host"),
            (hc.cpu_cores * _intervals.c.length_s).label("supplied"),
            literal(0.0).label("used"),
        )
        .join(_intervals, _intervals.c.id == hc.interval_id)
        .where(rng.cover.raw_where(hc.interval_id), accounted)
    )
    s_ = _samples.c
    raw_use = (
        select(
            hc.organization_id.label("oid"),
            hc.host_id.label("host"),
            literal(0.0).label("supplied"),
            s_.cpu_s.label("used"),
        )
        .join(
            _host_intervals,
            and_(hc.interval_id == s_.interval_id, hc.host_id == s_.host_id),
        )
        .where(rng.cover.raw_where(s_.interval_id), s_.late.is_(False))
    )
    rolled = select(hr.organization_id, hr.host_id, hr.cpu_supplied_core_s, hr.cpu_s).where(
        rng.cover.rolled_where(_host_rollups)
    )
    return {
        int(r.oid): (int(r.host), sql_float(r.supplied), sql_float(r.used))
        for r in raw_and_rolled(
            conn,
            (raw_hosts, raw_use, rolled),
            ("oid",),
            host=lambda c: func.count(distinct(c)),
            supplied=func.sum,
            used=func.sum,
        )
    }


def _served(conn: Connection, rng: Range) -> dict[int, int]:
    """Per organization, the most customers its hosts served in one interval of the range."""
    served: dict[int, int] = defaultdict(int)
    for a, b in rng.cover.raw:
        for oid, n in served_peaks(conn, a, b):
            served[oid] = max(served[oid], n)
    orc = _org_rollups.c
    for oid, n in conn.execute(
        select(orc.organization_id, func.max(orc.customers_max))
        .where(rng.cover.rolled_where(_org_rollups))
        .group_by(orc.organization_id)
    ):
        served[int(oid)] = max(served[int(oid)], int(n))
    return served


def _late_by_organization(conn: Connection, rng: Range) -> dict[int, int]:
    """Per organization, the late samples of its hosts in the range."""
    hc, s_ = _host_intervals.c, _samples.c
    return {
        int(oid): int(n)
        for oid, n in conn.execute(
            select(hc.organization_id, func.count())
            .select_from(
                _samples.join(
                    _host_intervals,
                    and_(hc.interval_id == s_.interval_id, hc.host_id == s_.host_id),
                )
            )
            .where(*rng.ids(s_.interval_id), s_.late.is_(True))
            .group_by(hc.organization_id)
        )
    }
