"""Schema upgrades through Alembic, for ``gmd-admin db`` and the daemon's start-up check."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine


def migrations_dir() -> Path:
    """``$GMD_MIGRATIONS``, else ``migrations/`` beside the package (the source tree)."""
    env = os.environ.get("GMD_MIGRATIONS")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").is_file():
        raise FileNotFoundError(f"{path}: no Alembic migrations here (set GMD_MIGRATIONS)")
    return path


def _config() -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current(engine: Engine) -> str | None:
    """The schema revision the database is at; None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head() -> str:
    head_rev = ScriptDirectory.from_config(_config()).get_current_head()
    assert head_rev is not None
    return head_rev


def engine_for(url: str) -> Engine:
    """An engine for the ledger; SQLite files get their directory made and foreign keys on."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _fk_on(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.execute("PRAGMA foreign_keys=ON")

    return engine
