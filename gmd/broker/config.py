"""The ``[broker]`` section of ``gmd.toml``: what gmd-broker needs, validated like the rest
(errors name the file and the key). gmd-broker reads only this section; every key is declared
once, as a field of :class:`BrokerConfig` or :class:`OpenStackSettings`
(:mod:`gmd.common.settings`), and shown in docs/configuration.md and etc/gmd.toml."""

from __future__ import annotations

import enum
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gmd.broker.coordination import ROOT
from gmd.common.config import ConfigError, Reader, default_database_url, read_document
from gmd.common.options import Kind, Location, Number, Pattern, StateFile, Text, Words
from gmd.common.settings import Table, read_table, setting, subtable, table, table_of
from gmd.common.units import DAY_S

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_HOSTS = re.compile(r"^[A-Za-z0-9.:\[\]_-]+(,[A-Za-z0-9.:\[\]_-]+)*(/[A-Za-z0-9/._-]*)?$")
_UUID = r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$"
_NAME_PROBLEM = "{value}: 1–255 letters, digits, '.', '_' or '-'"


class HandlerKind(enum.StrEnum):
    """What a site runs the federation's requests on (``broker.handler``)."""

    local = "local"
    """a process per request on the broker's machine (tests, sites without OpenStack)"""
    openstack = "openstack"
    """a server per request, booted by Nova in the federation's project (``[broker.openstack]``)"""


@table("broker.openstack")
@dataclass(frozen=True)
class OpenStackSettings:
    """The OpenStack handler's (``broker.handler = "openstack"``): a server per request, booted
    by Nova in the federation's project and deleted once it has run; the site offers
    ``broker.cores``, never more than Placement's spare VCPU (docs/federation.md)."""

    cloud: str = setting(
        Text(
            "",
            "the clouds.yaml entry that boots and deletes the federation's servers (required"
            ' with ``handler = "openstack"``)',
        )
    )
    project: str = setting(
        Text(
            "",
            "the federation's project, by name in the entry's project domain, that the servers"
            " are booted in; empty: the project the ``cloud`` entry is scoped to",
        )
    )
    placement_cloud: str = setting(
        Text(
            "",
            "the clouds.yaml entry that reads Placement's allocation candidates (an admin or"
            " service account); empty: ``cloud``",
        )
    )
    image: str = setting(
        Text("", "the image the servers boot, by name or id (required with the handler)")
    )
    network: str = setting(
        Pattern(
            "none",
            '``"none"``: servers without a network, ``"auto"``: one Nova allocates, else a'
            " network's uuid",
            pattern=rf"(none|auto)\Z|{_UUID}",
            problem='{value}: "none", "auto" or a network\'s uuid',
        )
    )
    flavors: tuple[str, ...] = setting(
        Words(
            (),
            "the flavors a request may be booted with, by name or id; a request gets the"
            " smallest with at least its cores (fewest vCPUs, then least RAM, then disk);"
            " empty: any flavor the project sees",
            pattern="(?s).",
            problem="{value}: each a flavor's name or id",
        )
    )
    poll_s: float = setting(
        Number(5.0, "how often Nova is asked how the servers are doing", 0.1, 3600)
    )
    spare_s: float = setting(
        Number(
            10.0,
            "how long Placement's answer on the spare VCPU is used before it is asked again",
            0,
            3600,
        )
    )
    timeout_s: float = setting(
        Number(10.0, "each Nova, Glance or Placement request's timeout", 0.1, 600)
    )
    boot_timeout_s: float = setting(
        Number(
            600.0,
            "a server not ACTIVE this long after its boot was asked for is deleted and its"
            " request fails here",
            1,
            DAY_S,
        )
    )
    pause_s: float = setting(
        Number(
            60.0,
            "after a boot failed (refused, ERROR, too slow), the site offers nothing for this"
            " long, so that the request goes to another site rather than fail here again",
            0,
            DAY_S,
        )
    )


@table("broker")
@dataclass(frozen=True)
class BrokerConfig:
    """Read by gmd-broker, each cloud's broker in a federation (docs/federation.md)."""

    site: str = setting(
        Pattern(
            None,
            "this cloud's name in the federation (letters, digits, ``.``, ``_``, ``-``)",
            shown="this machine's host name",
            pattern=_NAME.pattern,
            problem=_NAME_PROBLEM,
            fallback=lambda: socket.gethostname().split(".")[0],
        )
    )
    org: str = setting(
        Pattern(
            None,
            "the organisation this cloud belongs to (its priority is the organisation's)",
            shown="the site's name",
            pattern=_NAME.pattern,
            problem=_NAME_PROBLEM,
        )
    )
    zookeeper: str = setting(
        Pattern(
            "127.0.0.1:2181",
            "the ZooKeeper ensemble, as kazoo takes it: ``HOST:PORT,HOST:PORT,…`` (``/chroot``)",
            pattern=_HOSTS.pattern,
            problem="{value}: HOST:PORT[,HOST:PORT…][/chroot]",
        )
    )
    root: str = setting(
        Pattern(
            ROOT,
            "the federation's path in ZooKeeper",
            pattern=r"(/[^/]+)+\Z",
            problem="{value}: an absolute ZooKeeper path, no trailing '/'",
        )
    )
    session_timeout_s: float = setting(
        Number(
            10.0,
            "the ZooKeeper session's timeout: a broker cut off this long is a lost site (the"
            " ensemble clamps it to 2 to 20 of its ticks)",
            1.0,
            600.0,
        )
    )
    threshold: float = setting(
        Number(
            1.0,
            "take the federation's requests while less than this share of the site's"
            " federation capacity is in use",
            0.0,
            1.0,
        )
    )
    handler: HandlerKind = setting(Kind(HandlerKind.local, "what requests run on"))
    cores: float = setting(
        Number(
            0.0,
            "the site's capacity for federation work, in cores (the OpenStack handler's never"
            " more than Placement's spare VCPU)",
            0.0,
            1e6,
        )
    )
    speed: float = setting(
        Number(
            1.0, "the local handler runs a request for its run time over this (tests)", 1e-3, 1e6
        )
    )
    journal: Path | None = setting(
        Location(
            None,
            "the local handler's file of ``SITE REQUEST start|end`` lines (none: no journal)",
            shown="none",
            blank_is_none=True,
        )
    )
    inbox: Path = setting(
        StateFile(
            None,
            "the directory ``gmd-broker submit`` leaves local requests in",
            shown="the state directory's broker-inbox/",
            name="broker-inbox",
        )
    )
    tick_s: float = setting(
        Number(0.5, "how often the broker looks for finished work and its inbox", 0.05, 60)
    )
    database_url: str = field(default_factory=default_database_url)
    """the cloud's ledger, where the federation's history is filed: ``[database] url``"""
    openstack: OpenStackSettings = subtable(OpenStackSettings)
    """the OpenStack handler's settings (``[broker.openstack]``)"""


def parse_broker(
    document: dict[str, Any], source: str = "<config>", path: Path | None = None
) -> BrokerConfig:
    """Validate the ``[broker]`` table of a parsed TOML document (other tables are ignored)."""
    table = document.get("broker", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: broker: expected a table, got {table!r}")
    r = Reader(source, "broker.", table, path)
    # The organisation is the site's unless it is named: read before the site is known.
    org = r.get("org", str, None)
    config = read_table(BrokerConfig, r, org="", database_url=_database_url(document, source))
    org_option = table_of(BrokerConfig).option("org")
    assert isinstance(org_option, Pattern)
    config = replace(config, org=org_option.checked(r, org or config.site))
    if config.handler == HandlerKind.openstack:
        for key in ("cloud", "image"):
            if not getattr(config.openstack, key):
                raise r.fail(f"openstack.{key}", 'is required with handler = "openstack"')
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


TABLES: tuple[Table, ...] = (table_of(BrokerConfig), table_of(OpenStackSettings))
