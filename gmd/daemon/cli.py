"""gmd-daemon: ingests samples over HTTP and keeps the ledger, accounting every interval."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from uvicorn.config import STARTUP_FAILURE

from gmd.common import logs
from gmd.common.cli import ExitCode, LogLevelOption, fail, run, version_option
from gmd.common.config import ConfigError, read_document
from gmd.common.limits import raise_open_files
from gmd.daemon import reload
from gmd.daemon.api.app import create_app
from gmd.daemon.api.services import Services
from gmd.daemon.config import Config, load as load_config
from gmd.daemon.ingest.transport import with_body_limit
from gmd.ledger_schema import migrate
from gmd.openstack.client import entry_problem

log = logging.getLogger("gmd.daemon")

app = typer.Typer(add_completion=False, rich_markup_mode=None)


@app.command()
def serve(
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="GMD_CONFIG",
            metavar="FILE",
            help="Configuration file (default /etc/gmd/gmd.toml).",
        ),
    ] = None,
    bind: Annotated[
        str | None, typer.Option(help="Address to listen on (default: daemon.bind).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port (default: daemon.port, 8470).")
    ] = None,
    accounting: Annotated[
        bool | None,
        typer.Option(
            "--accounting/--no-accounting",
            help="Run the accountant here (default: daemon.accounting). Ingest-only daemons "
            "share one PostgreSQL with one that accounts.",
        ),
    ] = None,
    log_level: LogLevelOption = logs.LogLevel.info,
    _version: Annotated[bool, version_option("gmd-daemon")] = False,
) -> None:
    """Serve the gmd API: POST /v1/samples, GET /v1/plan/HOST, /healthz, /metrics.

    An empty database gets the current schema; an older one must be upgraded first with
    `gmd-admin db upgrade`. SIGTERM or SIGINT stops it: requests in flight are answered and an
    accounting catch-up ends after the interval it is on (within a few seconds). SIGHUP reads
    the configuration again: what can change live does, the log names what takes a restart.

    Exit codes: 0 stopped cleanly (also on SIGTERM/SIGINT), 1 database unusable (cannot be
    reached, read or written, or at another schema), 2 bad configuration or option (TLS
    certificate and key included), 4 cannot listen on the address (in use, or not permitted).
    Why it stopped is one line on stderr: gmd-daemon: error: WHAT.
    """
    # apscheduler and alembic's routine chatter (every scheduler tick, every schema probe)
    # would drown what matters.
    logs.setup(log_level.value, quiet=("apscheduler", "alembic.runtime.migration"))
    raise_open_files()
    config = _configured(config_path)
    engine, api = _ledger_app(config, accounting)
    server = _server(api, config, log_level, config_path)
    d = config.daemon
    where = (bind or d.bind, port if port is not None else d.port)
    _say_started(config, engine, where, accounting)
    try:
        sock = listen(*where, share=d.share_port)
    except OSError as exc:
        raise fail(
            f"cannot listen on {where[0]} port {where[1]}: {exc.strerror or exc}",
            ExitCode.CANNOT_LISTEN,
        ) from None
    with sock:
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:
            # uvicorn exits 3 when the app's start (its lifespan) fails; that start writes to
            # the ledger, which the check before just did, so what failed is the database
            # (gone since), and that is 1.
            if exc.code != STARTUP_FAILURE:
                raise
            raise fail(
                "could not start its services (the log above says why)", ExitCode.UNAVAILABLE
            ) from None


def _configured(config_path: Path | None) -> Config:
    """The configuration, or exit 2 saying what is wrong with it."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    placement = config.placement
    if placement.on and (why := entry_problem(placement.cloud)) is not None:
        raise fail(
            f"[placement] cannot verify hosts' claims with the clouds.yaml entry"
            f' {placement.cloud!r}: {why} (verify = "off" trusts hosts\' tokens instead)',
            ExitCode.USAGE,
        )
    return config


def _ledger_app(config: Config, accounting: bool | None) -> tuple[Engine, FastAPI]:
    """The ledger's engine, at the current schema and writable, and the app on it; exit 2 for
    a URL that cannot be used, 1 for a database that cannot be reached, read or written."""
    try:
        engine = migrate.engine_for(config.database_url)
    except (SQLAlchemyError, OSError) as exc:
        raise fail(f"database url: {exc}", ExitCode.USAGE) from None
    api = create_app(config, engine, accountant=accounting)
    try:
        migrate.prepare(engine)
        # The first write the app's start makes (the rest follows in its lifespan). A database
        # that can be read but not written (a read-only file, role or standby) then fails here,
        # as one line and exit 1, not as a lifespan traceback and uvicorn's exit 3.
        api.state.services.store.sync_organizations([config.default_owner])
    except migrate.SchemaMismatch as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    except SQLAlchemyError as exc:
        raise fail(
            f"cannot use the ledger database {engine.url.render_as_string(hide_password=True)}:"
            f" {getattr(exc, 'orig', None) or exc}",
            ExitCode.UNAVAILABLE,
        ) from None
    return engine, api


def _server(
    api: FastAPI, config: Config, log_level: logs.LogLevel, config_path: Path | None
) -> _Server:
    """uvicorn's server of ``api`` behind the body cap, its TLS loaded (exit 2 when the
    certificate or key cannot be used), SIGHUP reloading ``config_path``."""
    d = config.daemon
    server = _Server(
        uvicorn.Config(
            with_body_limit(api, d.max_body_bytes),
            ssl_certfile=str(d.tls_cert) if d.tls_cert else None,
            ssl_keyfile=str(d.tls_key) if d.tls_key else None,
            log_level=log_level.value,
            # uvicorn's loggers go through gmd's own format (logs.setup), not its own.
            log_config=None,
            access_log=log_level is logs.LogLevel.debug,
            timeout_graceful_shutdown=10,
        )
    )
    server.on_hangup = Reloader(api.state.services, config_path).start
    try:
        # Loaded here, not when serving, so that a certificate or key that cannot be read or
        # used is a configuration error (one line, exit 2), not a traceback.
        server.config.load()
    except OSError as exc:  # ssl.SSLError included
        raise fail(
            f"cannot use daemon.tls_cert {d.tls_cert} with daemon.tls_key {d.tls_key}: {exc}",
            ExitCode.USAGE,
        ) from None
    return server


def _say_started(
    config: Config, engine: Engine, where: tuple[str, int], accounting: bool | None
) -> None:
    """The log's first line: where the daemon serves, from which ledger, doing what."""
    d, placement = config.daemon, config.placement
    log.info(
        "gmd-daemon on %s://%s:%d, ledger %s, %d s intervals, accounting %s, enforcement %s,"
        " hosts' claims %s",
        "https" if d.tls_cert else "http",
        *where,
        engine.url.render_as_string(hide_password=True),
        config.accounting.interval_s,
        "on" if (d.accounting if accounting is None else accounting) else "off",
        config.enforcement.mode,
        f"verified against Placement ({placement.cloud})" if placement.on else "trusted",
    )
    if placement.trusting_a_cloud:
        log.warning(
            '[placement] verify = "off" although cloud %r is configured: hosts\' claims are'
            " not checked against Placement, and one host's token can frame any customer"
            " (docs/api.md)",
            placement.cloud,
        )


def listen(host: str, port: int, *, share: bool = False) -> socket.socket:
    """A listening socket on ``host``:``port``, bound here rather than by uvicorn so that an
    address in use is one error line and exit 4, not uvicorn's start-up failure.

    ``share`` (``daemon.share_port``) sets ``SO_REUSEPORT``: every process that sets it may
    bind the port, and the kernel hands each new connection to one of them. One process
    parses one batch at a time (the interpreter lock), so this is how ingest uses more
    cores; a process that did not set it still finds the port in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if share:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, minus its habit (0.29+) of re-raising the signal that stopped it once
    the graceful shutdown is done: the daemon stopped cleanly, so it exits 0, as systemd and
    the README expect, not -15. SIGHUP reloads the configuration (``on_hangup``)."""

    on_hangup: Callable[[], None] | None = None

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.on_hangup is not None:
            hangup = self.on_hangup
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda _n, _f: hangup())
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


class Reloader:
    """SIGHUP's work, on a thread of its own (a signal handler must not touch the ledger):
    read the file again and put its live settings in force (:mod:`gmd.daemon.reload`); one
    reload at a time, each said in the log."""

    def __init__(self, services: Services, path: Path | None) -> None:
        self.services, self.path = services, path
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self.run, name="reload", daemon=True).start()

    def run(self) -> None:
        with self._lock:
            running = self.services.config
            where = self.path or running.path
            try:
                document, source, _ = read_document(where)
                outcome = reload.plan(running, document, source)
            except ConfigError as exc:
                log.error("SIGHUP: not reloaded, the running configuration stays: %s", exc)
                return
            try:
                self.services.reload(outcome.config)
            except SQLAlchemyError as exc:
                log.error(
                    "SIGHUP: reloaded %s but could not record its organizations in the ledger"
                    " (%s); they are recorded at the next reload or start",
                    source,
                    getattr(exc, "orig", None) or exc,
                )
            log.info(
                "SIGHUP: reloaded %s: %s",
                source,
                ", ".join(outcome.applied) + " changed live" if outcome.applied else "no change",
            )
            if outcome.kept:
                log.warning(
                    "SIGHUP: %s changed in %s but take(s) a restart: the running value stays",
                    ", ".join(outcome.kept),
                    source,
                )


def main() -> None:
    run(app, "gmd-daemon")


if __name__ == "__main__":
    main()
