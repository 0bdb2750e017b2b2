"""gmd-broker: this cloud's broker in a federation of clouds that lend each other capacity.

Wiring only: the loop is :class:`gmd.broker.broker.Broker`, the shared state
:mod:`gmd.broker.coordination`, what requests run on :mod:`gmd.broker.handlers`.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gmd.broker import inbox
from gmd.broker.config import BrokerConfig, HandlerKind, load_broker
from gmd.broker.coordination import FederationError, Request
from gmd.common import logs
from gmd.common.cli import ExitCode, LogLevelOption, fail, run, version_option
from gmd.common.config import ConfigError

if TYPE_CHECKING:
    from kazoo.client import KazooClient
    from sqlalchemy import Engine

    from gmd.broker.broker import Broker
    from gmd.broker.handlers import ResourceHandler

log = logging.getLogger("gmd.broker")

app = typer.Typer(add_completion=False, rich_markup_mode=None, no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="GMD_CONFIG",
        metavar="FILE",
        help="Configuration file (default /etc/gmd/gmd.toml); the [broker] section.",
    ),
]


@app.callback()
def main_options(_version: Annotated[bool, version_option("gmd-broker")] = False) -> None:
    """This cloud's broker in a federation of clouds lending each other capacity (CloudShare),
    coordinated over ZooKeeper. Exit codes: 0 stopped cleanly, 1 ZooKeeper or the handler
    cannot be used, 2 bad configuration or option."""


def _config(path: Path | None) -> BrokerConfig:
    try:
        return load_broker(path)
    except ConfigError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None


def _ledger(config: BrokerConfig) -> Engine:
    """The cloud's ledger, at this gmd's schema (an empty database gets it, as gmd-daemon
    does); else exit 1 in one line."""
    from sqlalchemy.exc import SQLAlchemyError

    from gmd.ledger_schema import migrate

    try:
        engine = migrate.engine_for(config.database_url)
    except (SQLAlchemyError, OSError) as exc:
        raise fail(f"database url: {exc}", ExitCode.USAGE) from None
    shown = engine.url.render_as_string(hide_password=True)
    try:
        migrate.prepare(engine)
    except migrate.SchemaMismatch as exc:
        raise fail(f"{shown}: {exc}", ExitCode.UNAVAILABLE) from None
    except SQLAlchemyError as exc:
        message = f"cannot use the ledger {shown}: {type(exc).__name__}: {exc.args[0]}"
        raise fail(message.splitlines()[0], ExitCode.UNAVAILABLE) from None
    return engine


@app.command("run")
def run_command(
    config_path: ConfigOption = None, log_level: LogLevelOption = logs.LogLevel.info
) -> None:
    """Join the federation and broker until stopped (SIGTERM or SIGINT).

    Local requests (gmd-broker submit) run here when they fit, else go to the federation's
    queue; this site takes queued requests by their organisation's priority while its
    reservation is below broker.threshold; a site that leaves has its foreign work requeued.
    """
    logs.setup(log_level.value, quiet=("kazoo.client",))
    config = _config(config_path)
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError
    from sqlalchemy.exc import SQLAlchemyError

    from gmd.broker.broker import Broker, BrokerSettings
    from gmd.broker.history import History

    handler = _handler(config)
    ledger = _ledger(config)
    zk = _zookeeper(config)
    settings = BrokerSettings(
        config.site, config.org, config.threshold, root=config.root, tick_s=config.tick_s
    )
    broker = Broker(
        zk,
        settings,
        handler,
        history=History(ledger, config.site),
        handed=functools.partial(_handed, config.inbox),
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _start(broker, config)
        while not stop.is_set():
            for request in inbox.take(config.inbox, config.site, config.org):
                broker.submit(request)
            stop.wait(config.tick_s)
    except FederationError as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    except (KazooException, KazooTimeoutError) as exc:
        # starting while ZooKeeper has no quorum, or expired the session meanwhile: one line,
        # exit 1, and systemd starts the broker again (the loop itself waits ZooKeeper out)
        message = f"ZooKeeper at {config.zookeeper}: {type(exc).__name__} while starting"
        raise fail(message, ExitCode.UNAVAILABLE) from None
    except SQLAlchemyError as exc:
        message = f"the ledger: {type(exc).__name__}: {exc.args[0] if exc.args else ''}"
        raise fail(message.splitlines()[0], ExitCode.UNAVAILABLE) from None
    finally:
        broker.stop()
        handler.close()
        zk.stop()
        zk.close()
    log.info("%s stopped", config.site)


def _handed(box: Path, request: Request) -> None:
    """The broker handed ``request`` on: its inbox file goes (a file left is only submitted
    again by the next start, and its marker refuses it then)."""
    try:
        inbox.handed(box, request.id)
    except OSError as exc:
        log.warning("%s: %s", box, exc)


@app.command("submit")
def submit_command(
    request_id: Annotated[str, typer.Option("--id", help="The request's id, unique at this site.")],
    cores: Annotated[float, typer.Option(min=0, help="Cores it needs.")] = 1.0,
    run_s: Annotated[float, typer.Option(min=0, help="Seconds it runs.")] = 60.0,
    org: Annotated[str | None, typer.Option(help="Its organisation (default: broker.org).")] = None,
    config_path: ConfigOption = None,
) -> None:
    """Submit a local request to this site's running broker (through its inbox)."""
    config = _config(config_path)
    try:
        request = Request(request_id, org or config.org, config.site, cores, run_s, time.time())
        path = inbox.write(config.inbox, request)
    except FederationError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{config.inbox}: {exc.strerror}", ExitCode.UNAVAILABLE) from None
    typer.echo(str(path))


def main() -> None:
    run(app, "gmd-broker")


if __name__ == "__main__":
    main()


def _handler(config: BrokerConfig) -> ResourceHandler:
    """What runs this site's requests: the OpenStack cloud (checked now: exit 1 when it
    cannot be used) or local processes."""
    from gmd.broker.handlers import LocalProcesses

    if config.handler != HandlerKind.openstack:
        return LocalProcesses(config.site, config.cores, config.journal, config.speed)
    from gmd.broker.handlers import HandlerUnavailable
    from gmd.broker.openstack import OpenStackHandler

    cloud = OpenStackHandler(config.site, config.cores, config.openstack)
    try:
        cloud.check()
    except HandlerUnavailable as exc:
        cloud.close(delete=False)
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    return cloud


def _zookeeper(config: BrokerConfig) -> KazooClient:
    """A started ZooKeeper session that retries its connection for ever; exit 1 when the
    ensemble does not answer in 30 s."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    zk = KazooClient(
        hosts=config.zookeeper,
        timeout=config.session_timeout_s,
        connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
    )
    try:
        zk.start(timeout=30)
    except KazooTimeoutError:
        message = f"ZooKeeper at {config.zookeeper} did not answer in 30 s"
        raise fail(message, ExitCode.UNAVAILABLE) from None
    return zk


def _start(broker: Broker, config: BrokerConfig) -> None:
    """Start brokering with the requests an earlier process took from the inbox and did not
    hand on, and say so."""
    config.inbox.mkdir(parents=True, exist_ok=True)
    held = inbox.held(config.inbox, config.site, config.org)
    broker.start(held)
    log.info(
        "%s (%s) brokering: %g cores, threshold %g, ZooKeeper %s%s",
        config.site,
        config.org,
        config.cores,
        config.threshold,
        config.zookeeper,
        config.root,
    )
    if held:
        log.info(
            "%s: %d request(s) an earlier process took from the inbox and did not hand on:"
            " published again unless ZooKeeper has them",
            config.site,
            len(held),
        )
