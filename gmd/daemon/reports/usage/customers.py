"""The usage report grouped by customer, kept apart from the other groupings as Slurm's sreport
keeps its report families: per customer its GM sum and mean, balance, utility, priority and
contribution at the end, its per-resource terms, time throttled, quota changes and late samples.

The columns are defined in :mod:`gmd.daemon.reports.usage`. The per-resource terms are the
ledger's biggest table, so :func:`by_customer` sums them last, and with ``top`` only for the
customers kept.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import Connection, and_, func, or_, select

from gmd.columns import PROJECT, Column
from gmd.daemon.ledger import lookup, reset_window
from gmd.daemon.reports.usage.common import (
    THROTTLE_NOTE,
    Range,
    Steps,
    customer_names,
    end_note,
    late_by,
    only_customer,
    range_note,
    raw_and_rolled,
    resource_key,
    sort_rows,
    sql_float,
    throttle_spans,
    throttled_in,
    utc_datetime,
)
from gmd.ledger_schema.kinds import ActionKind, ActionStatus
from gmd.ledger_schema.tables import (
    actions as _actions,
    customer_ledger as _ledger,
    customer_rollups as _customer_rollups,
    organization_ledger as _org_ledger,
    organizations as _organizations,
    resource_ledger as _terms,
    resource_rollups as _resource_rollups,
    samples as _samples,
)

QUOTA_KINDS: tuple[str, ...] = (ActionKind.quota_lower.value, ActionKind.quota_restore.value)

_CUSTOMER_HEAD = (
    Column("customer", "Customer", None, "left"),
    PROJECT,
    Column("gm_sum", "GM sum", 4),
    Column("gm_mean", "GM mean", 6),
    Column("balance", "Balance (end)", 4),
)
_CUSTOMER_TAIL = (
    Column("utility", "Utility (end)", 4),
    Column("priority", "Priority (end)", 4),
    Column("contribution", "Contribution (end)", 4),
    Column("throttled_s", "Throttled s", None),
    Column("throttle_mode", "Mode", None, "left"),
    Column("quota_changes", "Quota changes", None),
    Column("late_samples", "Late samples", None),
)


def by_customer(
    conn: Connection,
    rng: Range,
    step: Steps,
    customer_id: int | None,
    sort: str | None,
    top: int | None,
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    """Customer rows. The per-resource terms are the ledger's biggest table (one row per
    customer, interval and resource), so they are summed last, and with ``top`` only for
    the customers kept — unless the rows are sorted by one of them."""
    step("GM sums")
    gm = _gm_sums(conn, rng, customer_id)
    step("standings at the end")
    end, contribution = _end_standings(conn, rng, customer_id)
    step("late samples")
    late = late_by(conn, rng, _samples.c.customer_id, customer_id)
    step("quota changes")
    quota = _quota_changes(conn, rng, customer_id)
    step("throttling")
    spans = throttle_spans(conn, rng, customer_id)
    throttled = {cid: throttled_in(s, rng, 0, rng.accounted) for cid, s in spans.items()}
    step("resets and names")
    # A reset after the range's last standing, for an interval the range holds, is pending.
    reset = (
        reset_window.reset_customers(conn, rng.end_start, rng.hi - 1)
        if rng.end_start is not None
        else set()
    )
    names = customer_names(conn)
    shown = lookup.display_names(conn)

    # Standings at the end come from before the range when it has only intervals without
    # samples; a range without any accounted interval lists nobody for them.
    ids = set(gm) | (set(end) if rng.accounted else set()) | set(late) | set(quota)
    ids |= {cid for cid, (seconds, _) in throttled.items() if seconds > 0}
    if customer_id is not None:
        ids &= {customer_id}
    rows: dict[int, dict[str, object]] = {}
    for cid in ids:
        balance, utility, priority = end.get(cid, (0.0, 0.0, 0.0))
        total = gm.get(cid, 0.0)
        seconds, mode = throttled.get(cid, (0, ""))
        rows[cid] = {
            "customer": names.get(cid, str(cid)),
            "name": shown.get(cid),
            "gm_sum": total,
            "gm_mean": total / rng.accounted if rng.accounted else 0.0,
            "balance": 0.0 if cid in reset else balance,
            "utility": utility,
            "priority": priority,
            "contribution": contribution.get(cid, 0.0),
            "throttled_s": seconds,
            "throttle_mode": mode,
            "quota_changes": quota.get(cid, 0),
            "late_samples": late.get(cid, 0),
        }

    step("per-resource terms")
    rows, wanted = _top(rows, customer_id, sort, top)
    ordered = _add_terms(conn, rng, rows, wanted)
    columns = (
        *_CUSTOMER_HEAD,
        *(Column(f"gm_{r}", f"GM {r}", 4) for r in ordered),
        *_CUSTOMER_TAIL,
    )
    shown_reset = sorted(names.get(c, str(c)) for c in reset & set(rows))
    return columns, list(rows.values()), _customer_notes(rng, columns, shown_reset)


def _gm_sums(conn: Connection, rng: Range, customer_id: int | None) -> dict[int, float]:
    """Per customer, its GM summed over the range (raw rows and rollups)."""
    only = [] if customer_id is None else [_ledger.c.customer_id == customer_id]
    cr = _customer_rollups.c
    raw = select(_ledger.c.customer_id.label("cid"), _ledger.c.greediness.label("gm")).where(
        rng.cover.raw_where(_ledger.c.interval_id), *only
    )
    rolled = select(cr.customer_id, cr.gm_sum).where(
        rng.cover.rolled_where(_customer_rollups), *only_customer(cr.customer_id, customer_id)
    )
    return {
        int(r.cid): sql_float(r.gm)
        for r in raw_and_rolled(conn, (raw, rolled), ("cid",), gm=func.sum)
    }


def _end_standings(
    conn: Connection, rng: Range, customer_id: int | None
) -> tuple[dict[int, tuple[float, float, float]], dict[int, float]]:
    """Per customer its balance, utility and priority after the range's last interval with
    rows, and the contribution of the organizations that are customers."""
    if rng.end_id is None:
        return {}, {}
    only = [] if customer_id is None else [_ledger.c.customer_id == customer_id]
    end = {
        int(r.customer_id): (float(r.balance), float(r.utility), float(r.priority))
        for r in conn.execute(
            select(
                _ledger.c.customer_id, _ledger.c.balance, _ledger.c.utility, _ledger.c.priority
            ).where(_ledger.c.interval_id == rng.end_id, *only)
        )
    }
    contribution = {
        int(cid): float(c)
        for cid, c in conn.execute(
            select(_organizations.c.customer_id, _org_ledger.c.contribution)
            .join(_organizations, _organizations.c.id == _org_ledger.c.organization_id)
            .where(
                _org_ledger.c.interval_id == rng.end_id,
                _organizations.c.customer_id.is_not(None),
            )
        )
    }
    return end, contribution


def _quota_changes(conn: Connection, rng: Range, customer_id: int | None) -> dict[int, int]:
    """Per customer, its quota lowerings and restorations in the range (failed ones not)."""
    quota_query = (
        select(_actions.c.customer_id, func.count())
        .where(
            _actions.c.kind.in_(QUOTA_KINDS),
            _actions.c.status != ActionStatus.failed.value,
            _actions.c.customer_id.is_not(None),
            # Tied to an interval: by its start, as every report column; else by when recorded.
            or_(
                and_(*rng.ids(_actions.c.interval_id)),
                and_(
                    _actions.c.interval_id.is_(None),
                    _actions.c.at >= utc_datetime(rng.lo),
                    _actions.c.at < utc_datetime(rng.hi),
                ),
            ),
        )
        .group_by(_actions.c.customer_id)
    )
    if customer_id is not None:
        quota_query = quota_query.where(_actions.c.customer_id == customer_id)
    return {int(cid): int(n) for cid, n in conn.execute(quota_query)}


def _top(
    rows: dict[int, dict[str, object]], customer_id: int | None, sort: str | None, top: int | None
) -> tuple[dict[int, dict[str, object]], set[int] | None]:
    """The rows ``top`` keeps, and the customers whose terms to sum (None: all). Sorted by a
    resource's terms, every customer's are needed first."""
    wanted: set[int] | None = None if customer_id is None else {customer_id}
    by_resource = sort is not None and sort.startswith("gm_") and sort not in ("gm_sum", "gm_mean")
    if top is not None and not by_resource and len(rows) > top:
        order = list(rows.values())
        sort_rows(order, (*_CUSTOMER_HEAD, *_CUSTOMER_TAIL), sort or "gm_sum")
        kept = {id(r) for r in order[:top]}
        wanted = {cid for cid, r in rows.items() if id(r) in kept}
        rows = {cid: r for cid, r in rows.items() if cid in wanted}
    return rows, wanted


def _add_terms(
    conn: Connection, rng: Range, rows: dict[int, dict[str, object]], wanted: set[int] | None
) -> list[str]:
    """Add each row's per-resource terms (``gm_<resource>``) for the ``wanted`` customers
    (None: all); returns the resources in column order."""
    terms: dict[int, dict[str, float]] = defaultdict(dict)
    resources: set[str] = set()
    if rng.end_id is not None and rng.accounted:
        # The resources of the last interval, so that the columns do not depend on --top.
        resources |= set(
            conn.execute(
                select(_terms.c.resource).distinct().where(_terms.c.interval_id == rng.end_id)
            ).scalars()
        )
    kept_t = [] if wanted is None else [_terms.c.customer_id.in_(sorted(wanted))]
    rr = _resource_rollups.c
    kept_r = [] if wanted is None else [rr.customer_id.in_(sorted(wanted))]
    raw = select(
        _terms.c.customer_id.label("cid"), _terms.c.resource, _terms.c.term.label("term")
    ).where(rng.cover.raw_where(_terms.c.interval_id), *kept_t)
    rolled = select(rr.customer_id, rr.resource, rr.term_sum).where(
        rng.cover.rolled_where(_resource_rollups), *kept_r
    )
    if wanted != set():
        for r in raw_and_rolled(conn, (raw, rolled), ("cid", "resource"), term=func.sum):
            terms[int(r.cid)][str(r.resource)] = sql_float(r.term)
            resources.add(str(r.resource))
    ordered = sorted(resources, key=resource_key)
    for cid, row in rows.items():
        row.update({f"gm_{r}": terms.get(cid, {}).get(r, 0.0) for r in ordered})
    return ordered


def _customer_notes(rng: Range, columns: tuple[Column, ...], shown_reset: list[str]) -> list[str]:
    notes = [
        range_note(rng, columns),
        end_note(rng, "balance, utility, priority and contribution (organizations only)"),
        THROTTLE_NOTE,
        "quota_changes: quota lowerings and restorations applied or decided in dry-run"
        " (failed ones excluded), by the interval they were written for (by the time they"
        " were recorded if none)",
        "gm_<resource>: that resource's terms of the GM sum (they add up to it)",
    ]
    if shown_reset:
        notes.append(f"balance reset after that interval (shown as 0): {', '.join(shown_reset)}")
    return notes
