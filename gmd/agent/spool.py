"""The agent's on-disk spool (SQLite): batches not yet acknowledged, and the agent's state.

A tick writes, in one transaction, the batches it closed and the state (counter baselines,
open intervals) they were computed from. Whatever kills the agent, the file then holds either
both or neither: after a restart the agent measures from the baselines that match what is in
the outbox, so no delta is lost (it was not yet in a batch: it is measured again from the old
baseline) and none is counted twice (it is in a batch, which keeps its key until the daemon
acknowledges it). ``synchronous=FULL`` makes the commit durable before the batch is posted.

The outbox is bounded (``agent.spool_max_bytes``, ``agent.spool_max_batches``): past the bound
the oldest batches are dropped, each with an error log line, and reported to the caller to be
counted. A file lock keeps a second agent off the same spool, which would measure from the
same baselines and count everything twice.

A spool SQLite cannot use (corrupt, not a database, its disk failing or full) raises
:class:`SpoolError` from every method, with one line saying what is wrong and what to do;
gmd-agent logs it and exits 1. A corrupt file is found when it is opened (``PRAGMA
quick_check``, a read of every page: 0.4 s for a 264 MiB spool in the page cache) rather
than at some later tick.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gmd import GmdError

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    interval_start_s INTEGER NOT NULL,
    body BLOB NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    body BLOB NOT NULL
);
"""


class SpoolError(GmdError, RuntimeError):
    """The spool file cannot be used; the message names it and says what to do."""


def spool_problem(path: Path, exc: sqlite3.Error | str) -> SpoolError:
    """The one line for a spool SQLite cannot use: a corrupt file (``exc`` a string: what
    ``quick_check`` found) is moved aside, saying what that loses; anything else (a full or
    failing disk, permissions) is fixed where it is."""
    code = "SQLITE_CORRUPT" if isinstance(exc, str) else getattr(exc, "sqlite_errorname", "")
    if code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return SpoolError(
            f"spool {path} is corrupt ({exc}): move it aside, with any -wal and -shm file"
            f" beside it (mv {path} {path}.corrupt), and start gmd-agent again; the batches it"
            " held that the daemon had not acknowledged, and the VMs' use since, are lost"
        )
    return SpoolError(f"spool {path}: {exc} ({code or 'SQLite error'}): fix the file or its disk")


@dataclass(frozen=True, slots=True)
class Spooled:
    seq: int
    key: str
    interval_start_s: int
    body: bytes


class Spool:
    def __init__(self, path: Path, *, max_bytes: int, max_batches: int) -> None:
        self.path = Path(path)
        self.max_bytes, self.max_batches = max_bytes, max_batches
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = open(f"{self.path}.lock", "a")  # noqa: SIM115 (held while open)
        except OSError as exc:
            raise SpoolError(f"spool {self.path}: cannot create: {exc.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise SpoolError(
                f"spool {self.path} is in use by another gmd-agent (lock {self.path}.lock):"
                " two agents on one spool would count every VM twice"
            ) from None
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            problems = [r[0] for r in self._db.execute("PRAGMA quick_check(3)").fetchall()]
        except sqlite3.Error as exc:
            self._lock.close()
            raise spool_problem(self.path, exc) from None
        if problems != ["ok"]:
            self.close()
            raise spool_problem(self.path, "; ".join(problems))

    @contextlib.contextmanager
    def _sqlite(self) -> Iterator[sqlite3.Connection]:
        """The database, its failures as :class:`SpoolError` (a file can break while open)."""
        try:
            yield self._db
        except sqlite3.Error as exc:
            raise spool_problem(self.path, exc) from None

    def state(self) -> bytes | None:
        """The state stored with the last commit, or ``None`` for a new spool."""
        with self._sqlite() as db:
            row = db.execute("SELECT body FROM state WHERE id = 1").fetchone()
        return None if row is None else bytes(row[0])

    def commit(self, state: bytes | None, batches: list[tuple[str, int, bytes]]) -> list[Spooled]:
        """Store new batches ``(key, interval_start_s, body)`` and the state, atomically.

        Returns the batches dropped to stay within the bounds (oldest first).
        """
        with self._sqlite() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO outbox (key, interval_start_s, body, bytes) VALUES (?, ?, ?, ?)",
                    [(key, start, body, len(body)) for key, start, body in batches],
                )
                if state is not None:
                    db.execute(
                        "INSERT INTO state (id, body) VALUES (1, ?)"
                        " ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                        (state,),
                    )
                dropped = self._trim()
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        for d in dropped:
            log.error(
                "spool %s is full (%d batches / %d bytes at most): dropped the oldest batch %s"
                " (interval %d) — its usage is lost",
                self.path,
                self.max_batches,
                self.max_bytes,
                d.key,
                d.interval_start_s,
            )
        return dropped

    def _trim(self) -> list[Spooled]:
        count, size = self.size()
        dropped: list[Spooled] = []
        if count <= self.max_batches and size <= self.max_bytes:
            return dropped
        for seq, key, start, body, n in self._db.execute(
            "SELECT seq, key, interval_start_s, body, bytes FROM outbox ORDER BY seq"
        ).fetchall():
            if count <= self.max_batches and size <= self.max_bytes:
                break
            dropped.append(Spooled(seq, key, start, bytes(body)))
            count -= 1
            size -= n
        self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(d.seq,) for d in dropped])
        return dropped

    def oldest(self, limit: int, after: int = 0) -> list[Spooled]:
        """Up to ``limit`` batches, oldest first, of those spooled after sequence ``after``."""
        with self._sqlite() as db:
            rows = db.execute(
                "SELECT seq, key, interval_start_s, body FROM outbox WHERE seq > ?"
                " ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        return [Spooled(seq, key, start, bytes(body)) for seq, key, start, body in rows]

    def remove(self, seq: int) -> None:
        with self._sqlite() as db:
            db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    def size(self) -> tuple[int, int]:
        """Batches waiting, and their bytes."""
        with self._sqlite() as db:
            count, size = db.execute(
                "SELECT count(*), coalesce(sum(bytes), 0) FROM outbox"
            ).fetchone()
        return int(count), int(size)

    def close(self) -> None:
        self._db.close()
        self._lock.close()
