"""The usage report grouped by resource, kept apart from the other groupings as Slurm's sreport
keeps its report families: per resource the sum of its GM terms, the positive (over the
endowment) and negative (ceded and credited) parts, and how many customers went over.

Resources are listed in the configuration's order (``RESOURCE_ORDER``, in :mod:`.common`).
The columns are defined in :mod:`gmd.daemon.reports.usage`.
"""

from __future__ import annotations

from sqlalchemy import Connection, case, func, select, union_all

from gmd.columns import Column
from gmd.daemon.reports.usage.common import (
    Range,
    Steps,
    only_customer,
    range_note,
    resource_key,
    sql_float,
    sql_int,
)
from gmd.ledger_schema.tables import (
    resource_ledger as _terms,
    resource_rollups as _resource_rollups,
)

RESOURCE_COLUMNS = (
    Column("resource", "Resource", None, "left"),
    Column("gm_sum", "Σ terms", 4),
    Column("over", "Σ positive (over endowment)", 4),
    Column("under", "Σ negative (ceded, credited)", 4),
    Column("customers_over", "Customers over", None),
)


def by_resource(
    conn: Connection, rng: Range, step: Steps, customer_id: int | None
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    step("terms per resource")
    t = _terms.c
    # Per customer first, then per resource: "customers over" needs each customer's terms,
    # and COUNT(DISTINCT …) over every term row would sort them all on PostgreSQL.
    rr = _resource_rollups.c
    terms = union_all(
        select(
            t.customer_id.label("cid"),
            t.resource,
            t.term.label("total"),
            case((t.term > 0, t.term), else_=0.0).label("over"),
            case((t.term < 0, t.term), else_=0.0).label("under"),
            t.term.label("top"),
        ).where(rng.cover.raw_where(t.interval_id), *only_customer(t.customer_id, customer_id)),
        select(
            rr.customer_id, rr.resource, rr.term_sum, rr.term_over, rr.term_under, rr.term_max
        ).where(
            rng.cover.rolled_where(_resource_rollups), *only_customer(rr.customer_id, customer_id)
        ),
    ).subquery()
    inner = (
        select(
            terms.c.resource,
            func.sum(terms.c.total).label("total"),
            func.sum(terms.c.over).label("over"),
            func.sum(terms.c.under).label("under"),
            func.max(terms.c.top).label("top"),
        )
        .group_by(terms.c.resource, terms.c.cid)
        .subquery()
    )
    query = select(
        inner.c.resource,
        func.sum(inner.c.total).label("total"),
        func.sum(inner.c.over).label("over"),
        func.sum(inner.c.under).label("under"),
        func.sum(case((inner.c.top > 0, 1), else_=0)).label("customers"),
    ).group_by(inner.c.resource)
    rows = [
        {
            "resource": str(r.resource),
            "gm_sum": sql_float(r.total),
            "over": sql_float(r.over),
            "under": sql_float(r.under),
            "customers_over": sql_int(r.customers),
        }
        for r in conn.execute(query)
    ]
    rows.sort(key=lambda r: resource_key(str(r["resource"])))
    notes = [
        range_note(rng, RESOURCE_COLUMNS),
        "terms are per customer and interval: positive where it took more than its endowment,"
        " negative where it ceded what others used (credited γ·κ); they add up to the GM sums;"
        " customers_over: customers with a positive term in some interval",
    ]
    return RESOURCE_COLUMNS, rows, notes
