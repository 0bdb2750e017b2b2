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
    default_database_url,
    default_state_dir,
    read_document,
    relative_to_file,
)
from gmd.common.units import DAY_S

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_HOSTS = re.compile(r"^[A-Za-z0-9.:\[\]_-]+(,[A-Za-z0-9.:\[\]_-]+)*(/[A-Za-z0-9/._-]*)?$")


class HandlerKind(enum.StrEnum):
    """What a site runs the federation's requests on (``broker.handler``)."""

    local = "local"
    """a process per request on the broker's machine (tests, sites without OpenStack)"""
    openstack = "openstack"
    """a server per request, booted by Nova in the federation's project (``[broker.openstack]``)"""


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
    cores = Number(
        0.0,
        "the site's capacity for federation work, in cores (the OpenStack handler's never more"
        " than Placement's spare VCPU)",
        0.0,
        1e6,
    )
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


_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")


class BrokerOpenStack(Table):
    """The OpenStack handler's (``broker.handler = "openstack"``): a server per request, booted
    by Nova in the federation's project and deleted once it has run; the site offers
    ``broker.cores``, never more than Placement's spare VCPU (docs/federation.md)."""

    name = "broker.openstack"

    cloud = Text(
        "",
        "the clouds.yaml entry that boots and deletes the federation's servers (required with"
        ' ``handler = "openstack"``)',
    )
    project = Text(
        "",
        "the federation's project, by name in the entry's project domain, that the servers are"
        " booted in; empty: the project the ``cloud`` entry is scoped to",
    )
    placement_cloud = Text(
        "",
        "the clouds.yaml entry that reads Placement's allocation candidates (an admin or"
        " service account); empty: ``cloud``",
    )
    image = Text("", "the image the servers boot, by name or id (required with the handler)")
    network = Text(
        "none",
        '``"none"``: servers without a network, ``"auto"``: one Nova allocates, else a'
        " network's uuid",
    )
    flavors: Option[tuple[str, ...]] = Option(
        (),
        "the flavors a request may be booted with, by name or id; a request gets the smallest"
        " with at least its cores (fewest vCPUs, then least RAM, then disk); empty: any flavor"
        " the project sees",
    )
    poll_s = Number(5.0, "how often Nova is asked how the servers are doing", 0.1, 3600)
    spare_s = Number(
        10.0,
        "how long Placement's answer on the spare VCPU is used before it is asked again",
        0,
        3600,
    )
    timeout_s = Number(10.0, "each Nova, Glance or Placement request's timeout", 0.1, 600)
    boot_timeout_s = Number(
        600.0,
        "a server not ACTIVE this long after its boot was asked for is deleted and its request"
        " fails here",
        1,
        DAY_S,
    )
    pause_s = Number(
        60.0,
        "after a boot failed (refused, ERROR, too slow), the site offers nothing for this long,"
        " so that the request goes to another site rather than fail here again",
        0,
        DAY_S,
    )


@dataclass(frozen=True)
class OpenStackSettings:
    """``[broker.openstack]`` (:class:`BrokerOpenStack`)."""

    cloud: str = BrokerOpenStack.cloud.default
    project: str = BrokerOpenStack.project.default
    placement_cloud: str = BrokerOpenStack.placement_cloud.default
    image: str = BrokerOpenStack.image.default
    network: str = BrokerOpenStack.network.default
    flavors: tuple[str, ...] = BrokerOpenStack.flavors.default
    poll_s: float = BrokerOpenStack.poll_s.default
    spare_s: float = BrokerOpenStack.spare_s.default
    timeout_s: float = BrokerOpenStack.timeout_s.default
    boot_timeout_s: float = BrokerOpenStack.boot_timeout_s.default
    pause_s: float = BrokerOpenStack.pause_s.default


def _parse_openstack(r: Reader, handler: HandlerKind) -> OpenStackSettings:
    """``[broker.openstack]``, read whatever the handler (a misspelt key is refused all the
    same); ``cloud`` and ``image`` are required with the OpenStack handler."""
    o = r.sub("openstack")
    flavors = o.get("flavors", list, [])
    for flavor in flavors:
        if not isinstance(flavor, str) or not flavor:
            raise o.fail("flavors", f"{flavor!r}: each a flavor's name or id")
    network = o.option(BrokerOpenStack.network)
    if network not in ("none", "auto") and not _UUID.match(network):
        raise o.fail("network", f'{network!r}: "none", "auto" or a network\'s uuid')
    settings = OpenStackSettings(
        cloud=o.option(BrokerOpenStack.cloud),
        project=o.option(BrokerOpenStack.project),
        placement_cloud=o.option(BrokerOpenStack.placement_cloud),
        image=o.option(BrokerOpenStack.image),
        network=network,
        flavors=tuple(flavors),
        poll_s=o.option(BrokerOpenStack.poll_s),
        spare_s=o.option(BrokerOpenStack.spare_s),
        timeout_s=o.option(BrokerOpenStack.timeout_s),
        boot_timeout_s=o.option(BrokerOpenStack.boot_timeout_s),
        pause_s=o.option(BrokerOpenStack.pause_s),
    )
    o.done()
    if handler == HandlerKind.openstack:
        for key in ("cloud", "image"):
            if not getattr(settings, key):
                raise o.fail(key, 'is required with handler = "openstack"')
    return settings


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
    database_url: str
    """the cloud's ledger, where the federation's history is filed: ``[database] url``"""
    openstack: OpenStackSettings = OpenStackSettings()
    """the OpenStack handler's settings (``[broker.openstack]``)"""


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
    handler = r.option(Broker.handler)
    config = BrokerConfig(
        site=site,
        org=org,
        zookeeper=zookeeper,
        root=root,
        session_timeout_s=r.option(Broker.session_timeout_s),
        threshold=r.option(Broker.threshold),
        handler=handler,
        cores=r.option(Broker.cores),
        speed=r.option(Broker.speed),
        journal=relative_to_file(path, journal) if journal else None,
        inbox=relative_to_file(path, inbox) if inbox else default_state_dir() / "broker-inbox",
        tick_s=r.option(Broker.tick_s),
        database_url=_database_url(document, source),
        openstack=_parse_openstack(r, handler),
    )
    r.done()
    return config


def _database_url(document: dict[str, Any], source: str) -> str:
    """The cloud's ledger: gmd-daemon's ``[database] url`` (its default when unset). Only this
    key of that table is read here; the daemon validates the rest."""
    table = document.get("database", {})
    url = table.get("url") if isinstance(table, dict) else None
    if url is None:
        return default_database_url()
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{source}: database.url: expected a database URL, got {url!r}")
    return url


def load_broker(path: str | Path | None = None) -> BrokerConfig:
    document, source, found = read_document(path)
    return parse_broker(document, source, found)


TABLES: tuple[type[Table], ...] = (Broker, BrokerOpenStack)
