"""The federation's history in this cloud's ledger, and its reconciliation with ZooKeeper.

The ledger (the cloud's PostgreSQL or SQLite, ``[database] url``) is the authoritative record
of what the cloud lent and borrowed; ZooKeeper keeps only each organisation's sums and each
site's completion count with its last completion (:class:`~gmd.broker.coordination.SiteRecord`).

**A completion is filed before it is made.** :meth:`History.begin` writes the completion's row
with its number (the site's count after it) and ``counted`` unknown; ZooKeeper's transaction
then counts it and moves the count; :meth:`History.settle` marks the row. A broker that stopped
in between finds the row unsettled when it comes back, and :meth:`History.reconcile` settles
it from ZooKeeper's count: counted if the count reached its number, else refused (the request
is then requeued by the broker's own reconciliation, and counted when it completes again).

**The two are reconciled whenever the broker (re)joins**:

- ZooKeeper has no record of this site but the ledger has counted completions: ZooKeeper lost
  its data (or the federation was started anew). The ledger's sums are put back into the
  summaries, once (:meth:`~gmd.broker.coordination.Federation.reseed`).
- ZooKeeper's count is past the ledger's last counted completion: the ledger lost rows (it was
  restored from an older backup). This cannot be rebuilt from ZooKeeper's sums; it is logged
  and filed as a ``behind`` event with the missing count, so that an audit sees the gap.
- ZooKeeper's count is behind the ledger's: ZooKeeper lost completions it had counted (writes
  it had acknowledged: the federation's soak met this on an ensemble run with forceSync=no,
  under leader kills; or it was restored from an older copy).
  The completions numbered past its count are put back into the summaries, with the count, in
  one transaction fenced by the site record's version, so once. Until then every completion
  of the site would take a number the ledger holds counted already, and be refused for good.

Other decisions (published, took, requeued …) are written in batches by the broker's tick; a
ledger that cannot be reached keeps them in memory (at most :data:`MAX_UNWRITTEN`, the oldest
dropped with a warning) and never stops the broker, but a completion waits for the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from sqlalchemy import Engine, and_, delete, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from gmd.broker.coordination import Completion, OrgStanding, SiteRecord
from gmd.ledger_schema.migrate import writer
from gmd.ledger_schema.tables import (
    federation_events as _events,
    federation_standings as _standings,
)

LOG = logging.getLogger(__name__)
MAX_UNWRITTEN = 100_000
"""Decisions kept in memory while the ledger cannot be reached."""
BEHIND = "behind"
"""The choice of the event that records a gap: ZooKeeper counted completions the ledger lacks."""

_REFUSED: dict[str, object] = {"counted": False, "core_seconds": 0.0, "seq": None}


@dataclass(frozen=True)
class Entry:
    """One decision as the ledger files it."""

    at_s: float
    choice: str
    request: str
    org: str
    request_site: str
    node: str | None = None
    cores: float = 0.0


class Reseed(Protocol):
    """:meth:`gmd.broker.coordination.Federation.reseed`'s shape."""

    def __call__(
        self, seq: int, lent: dict[str, float], contributed: float, version: int | None = None
    ) -> bool: ...


@dataclass(frozen=True)
class Reconciled:
    """What :meth:`History.reconcile` found and did."""

    settled_counted: int = 0
    settled_refused: int = 0
    reseeded: bool = False
    missing: int = 0
    """completions ZooKeeper counted that the ledger has no row of"""
    caught_up: int = 0
    """completions the ledger counted that ZooKeeper had lost, put back"""


@dataclass
class History:
    engine: Engine
    site: str
    _unwritten: list[Entry] = field(default_factory=list)

    def record(self, entry: Entry) -> None:
        """File a decision at the next :meth:`flush`."""
        self._unwritten.append(entry)
        if len(self._unwritten) > MAX_UNWRITTEN:
            del self._unwritten[0]
            LOG.warning(
                "%s: the ledger is unreachable: the oldest unwritten decision dropped", self.site
            )

    def flush(self) -> bool:
        """Write the decisions recorded so far; False (and kept) when the ledger cannot be
        reached."""
        if not self._unwritten:
            return True
        rows = [self._row(e) for e in self._unwritten]
        try:
            with writer(self.engine).begin() as conn:
                conn.execute(insert(_events), rows)
        except SQLAlchemyError as exc:
            LOG.warning(
                "%s: the ledger: %s: %d decision(s) kept", self.site, type(exc).__name__, len(rows)
            )
            return False
        self._unwritten.clear()
        return True

    def _row(self, e: Entry, **extra: object) -> dict[str, object]:
        row: dict[str, object] = {
            "at_s": e.at_s,
            "site": self.site,
            "choice": e.choice,
            "request": e.request,
            "org": e.org,
            "request_site": e.request_site,
            "node": e.node,
            "cores": e.cores,
            "core_seconds": 0.0,
            "seq": None,
            "counted": None,
        }
        row.update(extra)
        return row

    # -- completions --------------------------------------------------------------------------

    def begin(self, completion: Completion, at_s: float) -> None:
        """File ``completion`` as about to be made (unsettled); raises SQLAlchemyError when the
        ledger cannot be reached (the completion then waits). Filing the same number again
        (ZooKeeper's transaction was retried) replaces the unsettled row."""
        r = completion.request
        entry = Entry(at_s, "completed", r.id, r.org, r.site, completion.name, r.cores)
        with writer(self.engine).begin() as conn:
            conn.execute(
                delete(_events).where(
                    and_(
                        _events.c.site == self.site,
                        _events.c.seq == completion.seq,
                        _events.c.counted.is_(None),
                    )
                )
            )
            conn.execute(
                insert(_events),
                [self._row(entry, seq=completion.seq, core_seconds=completion.core_seconds)],
            )

    def settle(self, seq: int, counted: bool) -> None:
        """Mark completion ``seq`` counted, or refused (no longer this site's: ZooKeeper's
        count did not move, so the number goes back to the next completion: the refused row
        keeps none)."""
        where = and_(_events.c.site == self.site, _events.c.seq == seq)
        values = {"counted": True} if counted else _REFUSED
        with writer(self.engine).begin() as conn:
            conn.execute(update(_events).where(where).values(**values))

    # -- reconciliation -----------------------------------------------------------------------

    def counted(self, after: int = 0) -> tuple[int, float, dict[str, float]]:
        """The ledger's counted completions of this site (those numbered past ``after``): the
        highest number, and the core-seconds lent in all and to each organisation."""
        with self.engine.connect() as conn:
            mine = and_(
                _events.c.site == self.site, _events.c.counted.is_(True), _events.c.seq > after
            )
            last = conn.execute(select(func.max(_events.c.seq)).where(mine)).scalar()
            lent = {
                str(org): float(amount)
                for org, amount in conn.execute(
                    select(_events.c.org, func.sum(_events.c.core_seconds))
                    .where(mine)
                    .group_by(_events.c.org)
                )
            }
        return int(last or 0), sum(lent.values()), {o: a for o, a in lent.items() if a > 0}

    def reconcile(self, record: SiteRecord, reseed: Reseed, now_s: float) -> Reconciled:
        """Settle the unsettled completions from ZooKeeper's count, and put back into
        ZooKeeper what it lost (see the module's notes)."""
        with writer(self.engine).begin() as conn:
            pending = (
                conn.execute(
                    select(_events.c.seq).where(
                        and_(
                            _events.c.site == self.site,
                            _events.c.seq.is_not(None),
                            _events.c.counted.is_(None),
                        )
                    )
                )
                .scalars()
                .all()
            )
            counted = [s for s in pending if s is not None and s <= record.seq]
            refused = [s for s in pending if s is not None and s > record.seq]
            if counted:
                conn.execute(
                    update(_events)
                    .where(and_(_events.c.site == self.site, _events.c.seq.in_(counted)))
                    .values(counted=True)
                )
            if refused:
                conn.execute(
                    update(_events)
                    .where(and_(_events.c.site == self.site, _events.c.seq.in_(refused)))
                    .values(**_REFUSED)
                )
        last, contributed, lent = self.counted()
        reseeded = False
        missing = caught_up = 0
        if record.version is None and last > 0:
            reseeded = reseed(last, lent, contributed)
            if reseeded:
                LOG.warning(
                    "%s: ZooKeeper had no record of this site: the ledger's %d completion(s)"
                    " (%.0f core-seconds lent) put back into the summaries",
                    self.site,
                    last,
                    contributed,
                )
        elif record.seq < last:
            _, ahead, lent_ahead = self.counted(after=record.seq)
            if reseed(last, lent_ahead, ahead, version=record.version):
                caught_up = last - record.seq
                LOG.warning(
                    "%s: ZooKeeper's count of this site's completions (%d) is behind the"
                    " ledger's (%d): ZooKeeper lost writes it had acknowledged; the %d"
                    " completion(s) (%.0f core-seconds lent) put back into the summaries",
                    self.site,
                    record.seq,
                    last,
                    caught_up,
                    ahead,
                )
        elif record.seq > last:
            missing = record.seq - last
            LOG.warning(
                "%s: ZooKeeper counted %d completion(s) of this site the ledger has no row of"
                " (numbers %d to %d): the ledger was restored from an older copy?",
                self.site,
                missing,
                last + 1,
                record.seq,
            )
            self._file_gap(last, record.seq, now_s)
        return Reconciled(len(counted), len(refused), reseeded, missing, caught_up)

    def _file_gap(self, last: int, zk_seq: int, now_s: float) -> None:
        entry = Entry(now_s, BEHIND, f"completions {last + 1}-{zk_seq}", "", self.site)
        with writer(self.engine).begin() as conn:
            already = conn.execute(
                select(func.count()).where(
                    and_(
                        _events.c.site == self.site,
                        _events.c.choice == BEHIND,
                        _events.c.request == entry.request,
                    )
                )
            ).scalar()
            if not already:
                conn.execute(insert(_events), [self._row(entry)])

    # -- standings ----------------------------------------------------------------------------

    def write_standings(self, rows: Sequence[OrgStanding], as_of_s: float) -> bool:
        """Replace the standings with ``rows``; False when the ledger cannot be reached."""
        values = [{**asdict(r), "as_of_s": as_of_s, "observer": self.site} for r in rows]
        try:
            with writer(self.engine).begin() as conn:
                conn.execute(delete(_standings))
                if values:
                    conn.execute(insert(_standings), values)
        except SQLAlchemyError as exc:
            LOG.warning("%s: the ledger: %s: standings not written", self.site, type(exc).__name__)
            return False
        return True
