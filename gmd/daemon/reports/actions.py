"""The enforcement log: every action gmd took or would take (dry-run), and why."""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, CursorResult, and_, or_, select

from gmd.columns import Column
from gmd.ledger_schema.kinds import ActionKind
from gmd.ledger_schema.tables import (
    actions as _actions,
    customers as _customers,
    hosts as _hosts,
    intervals as _intervals,
)
from gmd.wire import knob_words

COLUMNS = (
    Column("at", "At", None, "left"),
    Column("interval", "Interval", None, "left"),
    Column("customer", "Customer", None, "left"),
    Column("host", "Host", None, "left"),
    Column("kind", "Kind", None, "left"),
    Column("status", "Status", None, "left"),
    Column("dry_run", "Dry-run", None, "left"),
    Column("before", "Before", None, "left"),
    Column("after", "After", None, "left"),
    Column("knobs", "Knobs", None, "left"),
    Column("reason", "Reason", None, "left"),
)


def actions(
    conn: Connection,
    *,
    from_s: float | None = None,
    to_s: float | None = None,
    customer: str | None = None,
    limit: int | None = None,
    raw: bool = False,
) -> list[dict[str, Any]]:
    """Actions about ``[from_s, to_s)``, oldest first; with ``limit``, the newest ``limit`` of
    them. An action tied to an interval (a level decided, a quota written for it) is in the
    range when its interval starts in it, as reports count it; one tied to none (a reset, a
    host's report) when it was recorded in it. ``customer`` is a project uuid. ``raw`` adds
    ``interval_s`` (the interval's start) and ``at_dt`` (an aware datetime) for filtering."""
    query = select(
        _actions.c.at,
        _intervals.c.start_s,
        _customers.c.name.label("customer"),
        _hosts.c.name.label("host"),
        _actions.c.kind,
        _actions.c.status,
        _actions.c.dry_run,
        _actions.c.before,
        _actions.c.after,
        _actions.c.knobs,
        _actions.c.reason,
    ).select_from(
        _actions.outerjoin(_customers, _customers.c.id == _actions.c.customer_id)
        .outerjoin(_hosts, _hosts.c.id == _actions.c.host_id)
        .outerjoin(_intervals, _intervals.c.id == _actions.c.interval_id)
    )
    query = query.where(*_about(from_s, to_s))
    if customer is not None:
        query = query.where(_customers.c.name == customer)
    newest_first = query.order_by(_actions.c.at.desc(), _actions.c.id.desc())
    if limit is not None:
        newest_first = newest_first.limit(limit)
    return [_action_row(r, raw) for r in reversed(conn.execute(newest_first).all())]


def _about(from_s: float | None, to_s: float | None) -> list[ColumnElement[bool]]:
    """The conditions for actions about ``[from_s, to_s)``: tied to an interval starting in
    it (an interval's id is its start, Unix seconds: the range is a range of ids), or to none
    and recorded in it."""
    where: list[ColumnElement[bool]] = []
    if from_s is not None:
        where.append(
            or_(
                _actions.c.interval_id >= math.ceil(from_s),
                and_(
                    _actions.c.interval_id.is_(None),
                    _actions.c.at >= datetime.fromtimestamp(from_s, UTC),
                ),
            )
        )
    if to_s is not None:
        where.append(
            or_(
                _actions.c.interval_id < math.ceil(to_s),
                and_(
                    _actions.c.interval_id.is_(None),
                    _actions.c.at < datetime.fromtimestamp(to_s, UTC),
                ),
            )
        )
    return where


def _action_row(r: Any, raw: bool) -> dict[str, Any]:
    """One action as reports show it (``raw``: with ``interval_s`` and ``at_dt``)."""
    at = r.at  # aware UTC (UtcDateTime)
    row = {
        "at": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "interval": None
        if r.start_s is None
        else datetime.fromtimestamp(r.start_s, UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "customer": r.customer,
        "host": r.host,
        "kind": r.kind,
        "status": r.status,
        "dry_run": bool(r.dry_run),
        "before": _compact(r.before),
        "after": _compact(r.after),
        "knobs": knob_outcomes(r.knobs),
        "reason": r.reason,
    }
    if raw:
        row["interval_s"] = r.start_s
        row["at_dt"] = at
    return row


def level_changes(
    conn: Connection,
    *,
    customer_ids: Collection[int] | None = None,
    before_s: float | None = None,
) -> CursorResult:
    """The ``level`` rows of the log, decided for intervals starting before ``before_s``, in
    the order they were decided (by interval, then as recorded). Each row: ``customer_id``,
    ``start_s`` and ``length_s`` of the interval whose accounting decided it (it took effect
    at that interval's end), ``after`` (the JSON with the new level) and ``dry_run``."""
    query = (
        select(
            _actions.c.customer_id,
            _intervals.c.start_s,
            _intervals.c.length_s,
            _actions.c.after,
            _actions.c.dry_run,
        )
        .join(_intervals, _intervals.c.id == _actions.c.interval_id)
        .where(_actions.c.kind == ActionKind.level.value, _actions.c.customer_id.is_not(None))
        .order_by(_intervals.c.start_s, _actions.c.id)
    )
    if customer_ids is not None:
        query = query.where(_actions.c.customer_id.in_(list(customer_ids)))
    if before_s is not None:
        query = query.where(_intervals.c.start_s < before_s)
    return conn.execute(query)


def knob_outcomes(text: str | None) -> dict[str, dict[str, str]] | None:
    """A host report's knobs (``enforcement_actions.knobs``) as reports show them:
    ``{"cpu_cap": {"outcome": "applied", "detail": ""}, …}``; None for other actions and
    reports of agents older than knobs."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    out = {}
    for knob, value in doc.items():
        if isinstance(value, list) and len(value) == 2:
            out[str(knob)] = {"outcome": str(value[0]), "detail": str(value[1])}
    return out


def knobs_words(knobs: dict[str, dict[str, str]] | None) -> str:
    """ "CPU cap applied, disk weight unsupported (no BFQ …)"."""
    if not knobs:
        return ""
    parts = []
    for knob, o in knobs.items():
        detail = f" ({o['detail']})" if o["detail"] and o["outcome"] != "applied" else ""
        parts.append(f"{knob_words(knob)} {o['outcome']}{detail}")
    return ", ".join(parts)


def _compact(text: str | None) -> object:
    """JSON documents stay documents (for --format json); tables show them compactly."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
