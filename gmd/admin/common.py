"""What every gmd-admin command shares: the global options on the root context, the
configuration, the ledger opened for reading (replica, read-only, schema checked) or for
writing, and the times operators type.

Kept apart from :mod:`gmd.admin.cli`, which registers the commands, so that the command
families (:mod:`gmd.admin.commands`) import it and nothing imports back.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gmd.common.cli import ExitCode, fail
from gmd.common.config import DEFAULT_PATH, ConfigError
from gmd.common.timespec import NotATime, parse_time

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from gmd.daemon.config import Config

# The daemon's configuration, SQLAlchemy and Alembic are imported by the functions that open
# the ledger, not here: every gmd-admin process imports this module to build its command line
# (a --help or a mistyped option, the calculator), and they are most of its 0.6 s start.

NAMED = "project uuid or project name"
"""How every command that takes a customer says it may be named: the ledger's lookup
(:mod:`gmd.daemon.ledger.lookup`) takes either, so every help says so in these words."""


@dataclass(frozen=True)
class Options:
    """The global options, kept on the root context for every command to find."""

    config: Path | None
    primary: bool


def options(ctx: typer.Context) -> Options:
    options = ctx.obj
    assert isinstance(options, Options), "the root callback sets ctx.obj"
    return options


def load_config(ctx: typer.Context) -> Config:
    from gmd.daemon.config import load as load_config_file

    try:
        return load_config_file(options(ctx).config)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def shown_url(url: str) -> str:
    """The database URL with its password masked, for messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _engine(ctx: typer.Context, *, replica: bool = False) -> Engine:
    """The ledger's engine: the primary's ([database] url), or with ``replica`` the read
    replica's (read_url); a bad URL names the key it came from."""
    from sqlalchemy.exc import SQLAlchemyError

    from gmd.ledger_schema import migrate

    config = load_config(ctx)
    key, url = ("read_url", config.read_url) if replica else ("url", config.database_url)
    assert url is not None, "replica only when read_url is set"
    try:
        return migrate.engine_for(url)
    except (SQLAlchemyError, OSError) as exc:
        raise fail(f"database {key} {shown_url(url)!r}: {exc}") from None


def _read_only(engine: Engine) -> Engine:
    """The engine with every transaction read-only, so that a read command that writes by
    mistake fails at once, on the primary too, instead of writing there or failing only
    where a replica is set.

    PostgreSQL begins READ ONLY transactions (a hot standby refuses writes anyway); SQLite
    gets ``PRAGMA query_only``, after engine_for's own pragmas, which must still write.
    """
    if engine.dialect.name == "postgresql":
        return engine.execution_options(postgresql_readonly=True)
    if engine.dialect.name == "sqlite":
        from sqlalchemy import event

        @event.listens_for(engine, "connect")
        def _query_only(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA query_only = ON")

    return engine


def _db_error(engine: Engine, exc: Exception, hint: str = "") -> typer.Exit:
    return fail(f"database {shown_url(str(engine.url))}: {exc}{hint}", ExitCode.UNAVAILABLE)


@contextmanager
def database(ctx: typer.Context, *, replica: bool = False) -> Iterator[Engine]:
    """The ledger for one command: a database that cannot be reached or read ends the command
    with exit 1 and its URL (password masked), and the engine is disposed whatever happens."""
    from sqlalchemy.exc import SQLAlchemyError

    engine = _engine(ctx, replica=replica)
    # The replica is a second thing that can be down: say how to go on without it.
    hint = " (the read replica, [database] read_url; --primary reads url)" if replica else ""
    try:
        yield engine
    except (SQLAlchemyError, OSError) as exc:
        raise _db_error(engine, exc, hint) from None
    finally:
        engine.dispose()


@contextmanager
def reading(ctx: typer.Context, *, schema: bool = True) -> Iterator[Engine]:
    """The ledger for a command that only reads: the replica in [database] read_url when one
    is set and --primary is not given, else the primary; read-only transactions either way.
    Commands that write use :func:`database`, which is always the primary.

    Reading creates nothing: a SQLite ledger that is not there, or a database without the
    ledger's schema (or with another version of it, unless ``schema`` is False), ends the
    command with exit 1 and what to do, instead of an empty file or an SQL error."""
    config = load_config(ctx)
    replica = config.read_url is not None and not options(ctx).primary
    url = config.read_url if replica and config.read_url else config.database_url
    file = sqlite_file(url)
    if file is not None and not file.exists():
        where = (
            f"[database] url in {config.path}"
            if config.path is not None
            else f"the default ledger: there is no configuration at {DEFAULT_PATH}; give"
            " --config FILE or set GMD_CONFIG"
        )
        raise fail(
            f"no ledger at {file} ({where}); gmd-daemon creates it when it starts, or run"
            " `gmd-admin db upgrade`",
            ExitCode.UNAVAILABLE,
        )
    with database(ctx, replica=replica) as engine:
        reading = _read_only(engine)
        if schema:
            _check_schema(reading)
        yield reading


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for other databases and for memory)."""
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return None
    return Path(url.removeprefix("sqlite:///").split("?", 1)[0])


def _check_schema(engine: Engine) -> None:
    from gmd.ledger_schema import migrate

    revision = migrate.current(engine)
    if revision == migrate.SCHEMA:
        return
    url = shown_url(str(engine.url))
    if revision is None:
        raise fail(f"no ledger schema in {url}: run `gmd-admin db upgrade`", ExitCode.UNAVAILABLE)
    raise fail(
        f"the ledger in {url} is at schema {revision}, this gmd reads {migrate.SCHEMA}: run"
        " `gmd-admin db upgrade` (or, if the ledger is newer, upgrade gmd)",
        ExitCode.UNAVAILABLE,
    )


def times(*given: str | None) -> tuple[float | None, ...]:
    """Each of the ``--at/--from/--to`` options given, as Unix seconds (None where absent);
    a time gmd cannot read ends the command with exit 2 and what it can read."""
    now = time.time()
    try:
        return tuple(None if t is None else parse_time(t, now) for t in given)
    except NotATime as exc:
        raise fail(str(exc)) from None
