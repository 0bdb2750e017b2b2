"""When a balance reset counts: the reset window, in one place.

``gmd-admin reset`` records a reset with the start ``E`` of the first interval not yet
accounted (``balance_resets.effective_start_s``). The interval starting at ``E`` starts the
customer from 0 instead of its standing before. So an interval starting at ``S``, accounted from
the standing after the interval that started at ``P``, sees the resets with ``P < E ≤ S``; after
the latest standing ``P`` a reset with ``E > P`` is *pending* (reports show the balance as 0
until a ledger row reflects it); and a customer's greed adds up only from its last reset on.
Accounting, explain, a what-if, the standings and the usage reports ask these questions here.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, Connection, func, select

from gmd.ledger_schema.tables import balance_resets as _resets


def counts(effective_s: int, after_s: float | None, upto_s: float | None) -> bool:
    """Whether a reset effective from the interval starting at ``effective_s`` falls in the
    window after the standing of ``after_s`` up to the interval starting at ``upto_s`` (either
    bound None: open)."""
    return (after_s is None or effective_s > after_s) and (upto_s is None or effective_s <= upto_s)


def _window(after_s: float | None, upto_s: float | None) -> list[ColumnElement[bool]]:
    """:func:`counts` as SQL conditions on ``balance_resets``."""
    where = []
    if after_s is not None:
        where.append(_resets.c.effective_start_s > after_s)
    if upto_s is not None:
        where.append(_resets.c.effective_start_s <= upto_s)
    return where


def resets(conn: Connection, after_s: float | None, upto_s: float | None) -> list[tuple[int, int]]:
    """(customer id, effective start) of every reset in the window, oldest first: read once for
    many intervals (a what-if, a report's periods) and asked with :func:`customers_within`."""
    return [
        (int(c), int(e))
        for c, e in conn.execute(
            select(_resets.c.customer_id, _resets.c.effective_start_s)
            .where(*_window(after_s, upto_s))
            .order_by(_resets.c.effective_start_s)
        )
    ]


def customers_within(
    read: Iterable[tuple[int, int]], after_s: float | None, upto_s: float | None
) -> set[int]:
    """The customers of ``read`` (:func:`resets`' pairs) whose reset is in the window."""
    return {c for c, effective in read if counts(effective, after_s, upto_s)}


def reset_customers(conn: Connection, after_s: float | None, upto_s: float | None) -> set[int]:
    """The customers whose balance an interval accounted from the standing after ``after_s``
    up to the interval starting at ``upto_s`` starts from 0."""
    return set(
        conn.execute(select(_resets.c.customer_id).where(*_window(after_s, upto_s))).scalars()
    )


def pending(conn: Connection, after_s: int) -> dict[int, int]:
    """Customers with a reset not yet reflected in a ledger row after the standing of
    ``after_s`` (the latest accounted interval): customer id → the interval it applies from."""
    return {
        int(c): int(e)
        for c, e in conn.execute(
            select(_resets.c.customer_id, func.max(_resets.c.effective_start_s))
            .where(*_window(after_s, None))
            .group_by(_resets.c.customer_id)
        )
    }


def last_reset(conn: Connection, customer_id: int, upto_s: int) -> int | None:
    """The start of the interval from which the customer's latest reset up to the interval
    starting at ``upto_s`` counts: its greed adds up from there (None: never reset)."""
    found = conn.execute(
        select(func.max(_resets.c.effective_start_s)).where(
            _resets.c.customer_id == customer_id, *_window(None, upto_s)
        )
    ).scalar()
    return None if found is None else int(found)
