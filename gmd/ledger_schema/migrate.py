"""Schema upgrades through Alembic, for ``gmd-admin db`` and the start-up check of gmd-daemon
and gmd-broker; and the engine that opens the ledger, with the writer transactions SQLite needs.

Alembic is imported only by what migrates or reads the migration scripts: a command that only
reads the ledger checks its schema (:func:`current` against :data:`SCHEMA`) without it, which
saves about 0.1 s of every such process (gmd-admin's commands, the daemon's health check).
"""

from __future__ import annotations

import logging
import os
import site
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, create_engine, event, inspect, text
from sqlalchemy.engine import Engine, make_url

from gmd import GmdError

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

_WRITER = "gmd_writer"

SCHEMA = "0015"
"""The ledger schema this gmd reads and writes: the revision its newest migration makes (a
new migration moves it, and tests/unit/ledger_schema/test_migrate.py fails until it does).
Written here rather than read from the scripts, which loads Alembic and every migration."""

VERSION_TABLE = "alembic_version"
"""Where Alembic keeps a database's revision (its default, which migrations/env.py keeps)."""


# Where a wheel install puts the migrations (pyproject.toml's [tool.setuptools.data-files]),
# below an installation prefix; and where they are in the source tree (an editable install or
# a checkout).
INSTALLED_MIGRATIONS = Path("share", "gmd", "migrations")
SOURCE_MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def install_prefixes() -> list[Path]:
    """The prefixes a wheel's data files may have gone to, most specific first.

    ``sys.prefix`` (a virtualenv such as /opt/gmd), the default scheme's data path (Debian's
    pip installs into /usr/local while ``sys.prefix`` is /usr) and the user base
    (``pip install --user``).
    """
    found: list[Path] = []
    for raw in (sys.prefix, sysconfig.get_path("data"), site.getuserbase()):
        if raw and Path(raw) not in found:
            found.append(Path(raw))
    return found


def migrations_candidates() -> list[Path]:
    """Where :func:`migrations_dir` looks, in order.

    ``$GMD_MIGRATIONS`` alone when it is set (an explicit choice is never second-guessed);
    else the source tree, then ``PREFIX/share/gmd/migrations`` for each installation prefix.
    """
    env = os.environ.get("GMD_MIGRATIONS")
    if env:
        return [Path(env)]
    return [SOURCE_MIGRATIONS, *(prefix / INSTALLED_MIGRATIONS for prefix in install_prefixes())]


def migrations_dir() -> Path:
    """The Alembic migrations directory (the first candidate with an ``env.py``).

    Raises FileNotFoundError naming every place searched.
    """
    candidates = migrations_candidates()
    for path in candidates:
        if (path / "env.py").is_file():
            return path
    searched = ", ".join(str(p) for p in candidates)
    raise FileNotFoundError(
        f"no Alembic migrations (env.py) found; searched: {searched} "
        "(reinstall gmd, or set GMD_MIGRATIONS to the migrations directory)"
    )


def _sqlite_pragma(conn: Connection, pragma: str) -> None:
    """Run a PRAGMA on the driver's own connection: outside SQLAlchemy's transaction, where
    SQLite honours ``foreign_keys``."""
    raw = conn.connection.driver_connection
    assert raw is not None, "a connection in use has a driver connection"
    raw.execute(f"PRAGMA {pragma}")


MIGRATION_LOCK = int.from_bytes(b"gmd-migr", "big", signed=True)


def _config() -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


def _migrate(engine: Engine, step: Callable[[AlembicConfig], None]) -> None:
    """Run one Alembic command in a transaction of its own.

    SQLite rebuilds a table to alter it, which foreign keys forbid while they are enforced;
    they are switched off for the migration (outside any transaction, where SQLite honours the
    pragma) and the result is checked with ``foreign_key_check`` before it is committed.
    """
    cfg = _config()
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _sqlite_pragma(conn, "foreign_keys=OFF")
        try:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    # Daemons started together on an empty database would otherwise all create
                    # the schema, and all but one fail; after the lock, the others find it made.
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
                cfg.attributes["connection"] = conn
                step(cfg)
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise RuntimeError(f"migration left dangling references: {broken[:5]}")
        finally:
            if sqlite:
                _sqlite_pragma(conn, "foreign_keys=ON")


def upgrade(engine: Engine, revision: str = SCHEMA) -> None:
    from alembic import command

    _migrate(engine, lambda cfg: command.upgrade(cfg, revision))


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    _migrate(engine, lambda cfg: command.downgrade(cfg, revision))


def current(engine: Engine) -> str | None:
    """The schema revision the database is at; None for an empty database. Read from
    Alembic's version table with a plain query, as Alembic itself reads it, not through
    Alembic (see the module's notes)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        found = [str(v) for v in conn.scalars(text(f"SELECT version_num FROM {VERSION_TABLE}"))]
    if len(found) > 1:
        raise SchemaMismatch(
            f"the ledger database is at several schema revisions ({', '.join(sorted(found))}):"
            " not a schema gmd made"
        )
    return found[0] if found else None


class SchemaMismatch(GmdError):
    """The ledger is at another schema revision than this gmd's."""


def prepare(engine: Engine) -> None:
    """The ledger at this gmd's schema, for a long-running process (gmd-daemon, gmd-broker):
    an empty database gets it; one at another revision is refused (:class:`SchemaMismatch`:
    only ``gmd-admin db upgrade`` migrates a ledger that holds data)."""
    revision = current(engine)
    if revision is None:
        logging.getLogger(__name__).info("empty ledger database: creating the schema (%s)", SCHEMA)
        upgrade(engine)
    elif revision != SCHEMA:
        raise SchemaMismatch(
            f"the ledger database is at schema {revision}, this gmd needs {SCHEMA}:"
            " run `gmd-admin db upgrade`"
        )


def head() -> str:
    """The revision the migration scripts end at (found where :func:`migrations_dir` finds
    them): :data:`SCHEMA`, unless the scripts installed are another gmd's."""
    from alembic.script import ScriptDirectory

    head_rev = ScriptDirectory.from_config(_config()).get_current_head()
    assert head_rev is not None
    return head_rev


_PREPARED_ONLY_WHEN_ASKED = 2**62
"""psycopg's ``prepare_threshold`` that no statement reaches: only ``prepare=True`` prepares
(``None`` would refuse that too)."""


def engine_for(url: str) -> Engine:
    """An engine for the ledger.

    SQLite files get their directory made, foreign keys on, WAL (readers such as
    ``gmd-admin standings`` never block the daemon) and a busy timeout. Transactions are begun
    by us rather than by the driver, so that writers can ask for ``BEGIN IMMEDIATE`` through
    :func:`writer`: a deferred transaction that reads and then writes can fail at once with
    "database is locked" instead of waiting its turn.

    Server databases' connections are not pinged when taken from the pool: the ping is one
    more round trip per batch, and at the end of an interval every host posts at once. A
    connection is replaced instead once it is 4 minutes old, before the idle timeouts of common
    firewalls and load balancers (Azure's: 4 minutes). One that died anyway fails its first
    statement, which makes SQLAlchemy discard it and the pool's older ones; ingest retries the
    batch (:func:`gmd.daemon.ingest.store.retryable`), other jobs run again at their next time.

    psycopg's statements are not prepared on the server by themselves (it would after five
    runs): a prepared statement soon runs a generic plan, chosen for the tables as they were
    then and kept for the connection's life. A new cloud's first interval grows ``vms`` from
    nothing, and a look-up of a batch's VMs planned on the empty table scanned the whole
    table for every batch after (9.1 ms a batch at 20,000 VMs, 0.6 ms planned each time). The
    one statement a known host's batch takes asks to be prepared
    (:mod:`~gmd.daemon.ingest.one_statement`): planning it each time cost more than running it.
    """
    memory = url in ("sqlite://", "sqlite:///:memory:")
    if url.startswith("sqlite:///") and not memory:
        parsed = make_url(url)
        # With uri=true the database is SQLite's own URI (file:…?mode=ro), not a path to make.
        if parsed.database and parsed.query.get("uri") not in ("true", "1"):
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    if not url.startswith("sqlite"):
        return create_engine(
            url,
            pool_size=10,
            max_overflow=20,
            pool_recycle=240,
            connect_args={"prepare_threshold": _PREPARED_ONLY_WHEN_ASKED},
        )
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA busy_timeout=60000")
        if not memory:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_WRITER, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def writer(engine: Engine) -> Engine:
    """The same engine, beginning SQLite transactions as writers (no-op elsewhere)."""
    return engine.execution_options(**{_WRITER: True})
