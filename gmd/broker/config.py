"""The ``[broker]`` section of ``gmd.toml``: what gmd-broker needs, validated like the rest
(errors name the file and the key). gmd-broker reads only this section; every key is declared
once, in :class:`Broker`, and shown in docs/configuration.md and etc/gmd.toml."""

from __future__ import annotations

import enum
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmd.broker.coordination import ROOT
from gmd.common.config import (
    ConfigError,
    Kind,
    Number,
    Option,
    Reader,
    Table,
    Text,
    default_state_dir,
    read_document,
    relative_to_file,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_HOSTS = re.compile(r"^[A-Za-z0-9.:\[\]_-]+(,[A-Za-z0-9.:\[\]_-]+)*(/[A-Za-z0-9/._-]*)?$")


class HandlerKind(enum.StrEnum):
    """What a site runs the federation's requests on (``broker.handler``)."""

    local = "local"
    """a process per request on the broker's machine (tests, sites without OpenStack)"""


class Broker(Table):
    """Read by gmd-broker, each cloud's broker in a federation (docs/federation.md)."""

    name = "broker"

    site: Option[str | None] = Option(
        None,
        "this cloud's name in the federation (letters, digits, ``.``, ``_``, ``-``)",
        shown="this machine's host name",
    )
    org: Option[str | None] = Option(
        None,
        "the organisation this cloud belongs to (its priority is the organisation's)",
        shown="the site's name",
    )
    zookeeper = Text(
        "127.0.0.1:2181",
        "the ZooKeeper ensemble, as kazoo takes it: ``HOST:PORT,HOST:PORT,…`` (``/chroot``)",
    )
    root = Text(ROOT, "the federation's path in ZooKeeper")
    session_timeout_s = Number(
        10.0,
        "the ZooKeeper session's timeout: a broker cut off this long is a lost site (the"
        " ensemble clamps it to 2 to 20 of its ticks)",
        1.0,
        600.0,
    )
    threshold = Number(
        1.0,
        "take the federation's requests while less than this share of the site's federation"
        " capacity is in use",
        0.0,
        1.0,
    )
    handler: Option[HandlerKind] = Kind(HandlerKind.local, "what requests run on")
    cores = Number(0.0, "the local handler's capacity for federation work, in cores", 0.0, 1e6)
    speed = Number(
        1.0, "the local handler runs a request for its run time over this (tests)", 1e-3, 1e6
    )
    journal = Option(
        None,
        "the local handler's file of ``SITE REQUEST start|end`` lines (none: no journal)",
        shown="none",
    )
    inbox = Option(
        None,
        "the directory ``gmd-broker submit`` leaves local requests in",
        shown="the state directory's broker-inbox/",
    )
    tick_s = Number(0.5, "how often the broker looks for finished work and its inbox", 0.05, 60)


@dataclass(frozen=True)
class BrokerConfig:
    site: str
    org: str
    zookeeper: str
    root: str
    session_timeout_s: float
    threshold: float
    handler: HandlerKind
    cores: float
    speed: float
    journal: Path | None
    inbox: Path
    tick_s: float


def parse_broker(
    document: dict[str, Any], source: str = "<config>", path: Path | None = None
) -> BrokerConfig:
    """Validate the ``[broker]`` table of a parsed TOML document (other tables are ignored)."""
    table = document.get("broker", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: broker: expected a table, got {table!r}")
    r = Reader(source, "broker.", table)
    site = r.get("site", str, None) or socket.gethostname().split(".")[0]
    org = r.get("org", str, None) or site
    for key, value in (("site", site), ("org", org)):
        if not _NAME.match(value):
            raise r.fail(key, f"{value!r}: 1–255 letters, digits, '.', '_' or '-'")
    zookeeper = r.option(Broker.zookeeper)
    if not _HOSTS.match(zookeeper):
        raise r.fail("zookeeper", f"{zookeeper!r}: HOST:PORT[,HOST:PORT…][/chroot]")
    root = r.option(Broker.root)
    if not root.startswith("/") or root.endswith("/") or "//" in root:
        raise r.fail("root", f"{root!r}: an absolute ZooKeeper path, no trailing '/'")
    journal = r.get("journal", str, None)
    inbox = r.get("inbox", str, None)
    config = BrokerConfig(
        site=site,
        org=org,
        zookeeper=zookeeper,
        root=root,
        session_timeout_s=r.option(Broker.session_timeout_s),
        threshold=r.option(Broker.threshold),
        handler=r.option(Broker.handler),
        cores=r.option(Broker.cores),
        speed=r.option(Broker.speed),
        journal=relative_to_file(path, journal) if journal else None,
        inbox=relative_to_file(path, inbox) if inbox else default_state_dir() / "broker-inbox",
        tick_s=r.option(Broker.tick_s),
    )
    r.done()
    return config


def load_broker(path: str | Path | None = None) -> BrokerConfig:
    document, source, found = read_document(path)
    return parse_broker(document, source, found)


TABLES: tuple[type[Table], ...] = (Broker,)
