"""Batches that accounting cannot account: found, set aside, and left to the operator.

Intervals are accounted in order (balances carry over), so one batch that makes the engine or
the write fail would stop accounting for good. When an interval fails with its data, the
batches that cause it are found by halving (a set of batches that accounts on its own holds
no culprit; a failing set is split until single batches remain), their samples moved to
``quarantined_samples`` and the batches marked, in the accounting transaction, which then
accounts the interval without them. Nothing else reads quarantined samples.

The operator decides later (``gmd-admin batches release|drop KEY --reason``): released, the
samples come back as *late* ones, seen by reports but by no accounted interval (accounted
intervals never change); dropped, they are deleted. The batch row stays either way, so an
agent's retry of the same key is still acknowledged as a duplicate, never stored again.
Every decision is in the enforcement log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import DataError, IntegrityError

from gmd import GmdError
from gmd.daemon.ledger import sample_store
from gmd.daemon.ledger.sample_store import SAMPLE_COLUMNS
from gmd.ledger_schema.kinds import ActionKind, ActionStatus, BatchState
from gmd.ledger_schema.tables import (
    actions as _actions,
    batches as _batches,
    hosts as _hosts,
    intervals as _intervals,
    quarantined_samples as _quarantined,
    samples as _samples,
)

log = logging.getLogger(__name__)

# At most this many trials (accounting a subset of the batches) per failing interval: halving
# finds k culprits among n batches in about 2·k·log2(n); past it the interval is a bug to report.
MAX_TRIES = 512


@dataclass(frozen=True)
class Quarantined:
    """A batch accounting left out, and why."""

    batch_id: int
    key: str
    host: str
    interval_start_s: int
    error: str


def bad_data(exc: BaseException) -> bool:
    """Whether ``exc`` may come from what a batch holds (a number the engine refuses, a value
    the database cannot store), as opposed to a lost connection or a lock: only then is it
    worth looking for a batch to blame."""
    return isinstance(exc, ValueError | ArithmeticError | LookupError | DataError | IntegrityError)


def isolate(
    conn: Connection,
    interval_id: int,
    trial: Callable[[Sequence[int]], None],
    failure: BaseException,
) -> list[Quarantined]:
    """Find the on-time batches of the interval without which it accounts, quarantine them,
    and return them; an empty list when no batch explains ``failure``.

    ``trial(batch_ids)`` accounts the interval restricted to those batches and undoes it,
    raising what accounting would raise. Another kind of error than bad data in a trial (the
    database went away) is raised, not blamed on a batch.
    """
    ids = list(
        conn.execute(
            select(_batches.c.id)
            .where(
                _batches.c.interval_id == interval_id,
                _batches.c.late.is_(False),
                _batches.c.state == BatchState.accepted,
            )
            .order_by(_batches.c.id)
        ).scalars()
    )
    errors: dict[int, str] = {}
    tries = 0

    def fails(subset: Sequence[int]) -> str | None:
        nonlocal tries
        tries += 1
        try:
            trial(subset)
        except Exception as exc:
            if not bad_data(exc):
                raise
            return str(exc) or type(exc).__name__
        return None

    def culprits(subset: list[int], known: str | None) -> None:
        error = known if known is not None else fails(subset)
        if error is None or tries > MAX_TRIES:
            return
        if len(subset) == 1:
            errors[subset[0]] = error
            return
        half = len(subset) // 2
        culprits(subset[:half], None)
        culprits(subset[half:], None)

    culprits(ids, str(failure) or type(failure).__name__)
    # Every batch guilty on its own, when there are several, says that what fails is not in
    # the batches (the standing the interval starts from, say): no batch is to blame.
    if not errors or tries > MAX_TRIES or (len(ids) > 1 and len(errors) == len(ids)):
        return []
    return quarantine(conn, errors)


def quarantine(
    conn: Connection,
    errors: dict[int, str],
    cause: str = "accounting failed with this batch",
    by: str = "accounting",
) -> list[Quarantined]:
    """Move the samples of the batches in ``errors`` (id → why) out of accounting's way, mark
    the batches and log each in the enforcement log (``cause: why``, by ``by``)."""
    ids = sorted(errors)
    found = describe(conn, ids)
    conn.execute(
        insert(_quarantined).from_select(
            list(SAMPLE_COLUMNS),
            select(*(_samples.c[c] for c in SAMPLE_COLUMNS)).where(_samples.c.batch_id.in_(ids)),
        )
    )
    sample_store.delete_batches(conn, ids)
    out = []
    for batch_id in ids:
        row = found[batch_id]
        error = errors[batch_id][:2000]
        conn.execute(
            update(_batches)
            .where(_batches.c.id == batch_id)
            .values(state=BatchState.quarantined, error=error)
        )
        _log_action(
            conn,
            row,
            ActionKind.batch_quarantine,
            BatchState.accepted,
            BatchState.quarantined,
            f"{cause}: {error}",
            by,
        )
        out.append(Quarantined(batch_id, row.key, row.host, int(row.start_s), error))
    return out


@dataclass(frozen=True)
class BatchRow:
    id: int
    key: str
    host: str
    host_id: int
    interval_id: int
    start_s: int
    state: BatchState
    late: bool
    samples: int
    error: str | None


def describe(conn: Connection, ids: Sequence[int]) -> dict[int, BatchRow]:
    """The batches ``ids`` with their host's name and interval's start, for messages and the
    enforcement log."""
    rows = conn.execute(
        select(
            _batches.c.id,
            _batches.c.key,
            _hosts.c.name.label("host"),
            _batches.c.host_id,
            _batches.c.interval_id,
            _intervals.c.start_s,
            _batches.c.state,
            _batches.c.late,
            _batches.c.samples,
            _batches.c.error,
        )
        .join(_hosts, _hosts.c.id == _batches.c.host_id)
        .join(_intervals, _intervals.c.id == _batches.c.interval_id)
        .where(_batches.c.id.in_(list(ids)))
    ).all()
    return {int(r.id): BatchRow(*tuple(r)) for r in rows}


class BatchDecisionError(GmdError, ValueError):
    """The batch cannot be released or dropped: unknown key, or not quarantined."""


def find(conn: Connection, key: str) -> BatchRow:
    batch_id = conn.execute(select(_batches.c.id).where(_batches.c.key == key)).scalar()
    if batch_id is None:
        raise BatchDecisionError(f"no batch with key {key!r}")
    return describe(conn, [batch_id])[batch_id]


def release(conn: Connection, key: str, reason: str, by: str) -> BatchRow:
    """Put a quarantined batch's samples back as late ones: reports count them, no accounted
    interval is recomputed from them."""
    row = _quarantined_batch(conn, key)
    sample_store.restore_quarantined(conn, row.id)
    conn.execute(delete(_quarantined).where(_quarantined.c.batch_id == row.id))
    conn.execute(
        update(_batches).where(_batches.c.id == row.id).values(state=BatchState.released, late=True)
    )
    _log_action(conn, row, ActionKind.batch_release, row.state, BatchState.released, reason, by)
    return row


def drop(conn: Connection, key: str, reason: str, by: str) -> BatchRow:
    """Delete a quarantined batch's samples; the batch row stays, marked, so that a retry of
    its key is a duplicate and the audit keeps what was dropped."""
    row = _quarantined_batch(conn, key)
    conn.execute(delete(_quarantined).where(_quarantined.c.batch_id == row.id))
    conn.execute(update(_batches).where(_batches.c.id == row.id).values(state=BatchState.dropped))
    _log_action(conn, row, ActionKind.batch_drop, row.state, BatchState.dropped, reason, by)
    return row


def _quarantined_batch(conn: Connection, key: str) -> BatchRow:
    row = find(conn, key)
    if row.state != BatchState.quarantined:
        raise BatchDecisionError(
            f"batch {key!r} is {row.state}, not quarantined: only quarantined batches can be"
            " released or dropped"
        )
    return row


def _log_action(
    conn: Connection,
    row: BatchRow,
    kind: ActionKind,
    before: BatchState,
    after: BatchState,
    reason: str,
    by: str = "accounting",
) -> None:
    conn.execute(
        insert(_actions).values(
            interval_id=row.interval_id,
            host_id=row.host_id,
            kind=kind,
            status=ActionStatus.ok,
            dry_run=False,
            before=json.dumps({"batch": row.key, "state": str(before)}),
            after=json.dumps({"batch": row.key, "state": str(after), "by": by}),
            reason=reason,
        )
    )
