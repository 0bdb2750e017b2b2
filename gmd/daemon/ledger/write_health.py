"""Whether the ledger can write, as the daemon's writes found out: what holds the accountant.

A ledger that cannot write (a full disk under SQLite, a read-only or unreachable PostgreSQL)
answers every batch 503 and the agents spool. Their batches arrive when it writes again, late
for every interval that closed meanwhile, and late samples never count. So while writes fail
no interval is closed, and after the first write that succeeds again the accountant waits one
grace period more, for the agents to replay their spools, before it closes the outage's
intervals. ``/healthz`` reports the same state.

The daemon's writes are its batches' and its accountant's: a daemon that received no batch in
the outage (another daemon on the same port took them all) learns of it from its accountant's
own failures, and of the end of it from a write that succeeds (:func:`probe_write`), so it does
not close the outage's intervals the moment the database answers again, before the agents'
spooled batches are back.

The state lives in the daemon's memory: a daemon restarted during an outage knows of no failure
until its first write fails.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from gmd.common.timespec import iso


@dataclass
class WriteHealth:
    """The outcome of the daemon's ledger writes; ``grace_s`` is accounting's grace period,
    the time agents have to deliver what they spooled."""

    grace_s: float
    failing_since_s: float | None = None
    """the first failure of the current (or latest) outage; None: no write has failed"""
    failure: str = ""
    """what the latest failure said"""
    recovered_s: float | None = None
    """the first success after the latest failure; None while writes still fail"""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def failed(self, now_s: float, error: BaseException) -> bool:
        """A write failed at ``now_s`` with ``error`` (a database error); whether this failure
        begins an outage (the log says so once, not at every request)."""
        with self._lock:
            begins = self.failing_since_s is None or self.recovered_s is not None
            if begins:
                self.failing_since_s = now_s
            self.recovered_s = None
            self.failure = f"{type(error).__name__}: {first_line(error)}"
            return begins

    def succeeded(self, now_s: float) -> None:
        """A write committed at ``now_s``."""
        with self._lock:
            if self.failing_since_s is not None and self.recovered_s is None:
                self.recovered_s = now_s

    def failing(self) -> str | None:
        """Why the ledger cannot write now (for ``/healthz``), or None when it can (as far as
        the daemon's writes tell)."""
        with self._lock:
            if self.failing_since_s is None or self.recovered_s is not None:
                return None
            return f"ledger cannot write since {iso(self.failing_since_s)}: {self.failure}"

    def hold_closing(self, now_s: float) -> str | None:
        """Why no interval may be closed at ``now_s``, or None when intervals may close: writes
        fail, or they recovered less than a grace period ago (spools are being replayed)."""
        reason = self.failing()
        if reason is not None:
            return reason
        with self._lock:
            recovered = self.recovered_s
        if recovered is not None and now_s < recovered + self.grace_s:
            return (
                f"ledger writes recovered at {iso(recovered)}; agents replay their spools"
                f" until {iso(recovered + self.grace_s)} (accounting.grace_s)"
            )
        return None


PROBE = text("UPDATE intervals SET length_s = length_s WHERE 1 = 0")
"""A write that changes nothing: PostgreSQL refuses it while read-only or unreachable."""


def probe_write(engine: Engine) -> None:
    """Whether the ledger takes a write now: raises the database's error when it does not.
    (SQLite with a full disk takes it, writing nothing; a daemon on SQLite is the only one,
    and its batches tell.)"""
    with engine.begin() as conn:
        conn.execute(PROBE)


def first_line(error: BaseException) -> str:
    """The database's own message: SQLAlchemy's text after the driver's first line is the
    statement and its parameters, which say nothing about the cause."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error)
    return text.splitlines()[0][:200] if text else ""
