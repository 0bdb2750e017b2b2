"""The ``[agent]`` section of ``gmd.toml``: what gmd-agent needs, validated like the rest.

Errors name the file and the key (``gmd.toml: agent.tick_s: 0 is not in [0.05, 3600]``).
gmd-agent reads only this section of the file; the other sections belong to the daemon and are
validated by :mod:`gmd.daemon.config`.

Every key is declared once, as a field of :class:`AgentConfig` (:mod:`gmd.common.settings`):
its default, its bounds and what it means; :func:`parse_agent` writes by hand only the rules
that span several keys. docs/configuration.md shows them as a table made from these
declarations, and ``etc/gmd.toml`` shows each with its default
(``tests/unit/common/test_config_defaults.py`` checks both).
"""

from __future__ import annotations

import enum
import math
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gmd.agent.apply.cgroupfs import CgroupError, VmIdentity, render_template
from gmd.agent.apply.state import EnforceBackend
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter
from gmd.common.config import ConfigError, Reader, read_document
from gmd.common.options import (
    Count,
    Flag,
    Kind,
    Location,
    Number,
    NumberOr,
    Option,
    Pattern,
    Place,
    Positive,
    StateFile,
    Text,
    Words,
)
from gmd.common.settings import RuleRefusal, Table, composed, read_table, setting, table, table_of
from gmd.common.timespec import parse_time
from gmd.common.units import DAY_S
from gmd.traces import TraceError, trace_file, trace_ranges


class CollectorKind(enum.StrEnum):
    """What the agent reads its VMs' counters from (``agent.collector``)."""

    auto = "auto"
    """the kernel's cgroup files where they can be read, else libvirt"""
    kernel = "kernel"
    libvirt = "libvirt"
    replay = "replay"
    """recorded traces: a simulated host (the demo, what-if runs)"""


_PRINTABLE = re.compile(r"^[!-~]+$")
_NAME = re.compile(r"^[^\x00-\x1f]{1,255}$")

DEFAULT_POST_JITTER_S = 20.0
"""The agents' default spread of posts after an interval's end: it turns the interval-end
burst (every host at once) into ~1/20 of the hosts per second. The daemon's default
``accounting.grace_s`` (45) is this plus the 25 s that a post may take to be stored."""


def default_post_jitter_s(interval_s: float) -> float:
    """``DEFAULT_POST_JITTER_S``, or a third of a shorter interval (tests, demos): the spread
    then ends well before the next interval's batches are made."""
    return min(DEFAULT_POST_JITTER_S, interval_s / 3)


@dataclass(frozen=True)
class BaseUrl(Pattern):
    """A base URL, kept without its trailing ``/``."""

    def checked(self, r: Reader, value: str) -> str:
        return super().checked(r, value).rstrip("/")


@dataclass(frozen=True)
class CgroupTemplate(Option[Any]):
    """A cgroup path template, checked by rendering it for a sample VM."""

    def read(self, r: Reader) -> str | None:
        template: str | None = r.get(self.key, str, None)
        if template is not None:
            try:
                render_template(template, VmIdentity(name="instance-00000001", uuid="u", id=1))
            except CgroupError as exc:
                raise r.fail(self.key, str(exc)) from None
        return template


@dataclass(frozen=True)
class TraceNames(Option[tuple[str, ...]]):
    """Trace names (``N`` of ``N.csv``), as :func:`gmd.traces.trace_ranges` reads a list or
    ranges."""

    def read(self, r: Reader) -> tuple[str, ...]:
        value = r.get(self.key, (list, str), None)
        if value is None:
            return ()
        try:
            return trace_ranges(value)
        except ValueError as exc:
            raise r.fail(self.key, str(exc)) from None


@dataclass(frozen=True)
class TraceCustomers(Option[Any]):
    """A list of customers (dealt round-robin) or a table trace → customer, names checked."""

    def initial(self) -> tuple[str, ...]:
        return ()

    def read(self, r: Reader) -> tuple[str, ...] | dict[str, str]:
        value = r.get(self.key, (list, dict), None)
        if value is None:
            return ()
        names = list(value.values()) if isinstance(value, dict) else value
        for name in names:
            if not (isinstance(name, str) and _NAME.match(name)):
                raise r.fail(self.key, f"{name!r}: 1–255 characters, no controls")
        if isinstance(value, list):
            if not value:
                raise r.fail(self.key, "an empty list: give at least one customer")
            return tuple(value)
        return {str(k): v for k, v in value.items()}


@dataclass(frozen=True)
class Moment(Option[Any]):
    """An instant as :func:`gmd.common.timespec.parse_time` reads it, Unix seconds, or a TOML
    date-time (UTC unless it says otherwise); :meth:`at` reads it against a given present."""

    def read(self, r: Reader) -> float | None:
        return self.at(r, time.time())

    def at(self, r: Reader, now_s: float) -> float | None:
        value = r.get(self.key, (str, int, float, datetime), None)
        if value is None:
            return None
        if isinstance(value, datetime):
            return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
        if isinstance(value, str):
            try:
                return parse_time(value, now_s)
            except ValueError as exc:
                raise r.fail(self.key, str(exc)) from None
        if not (0 <= value < math.inf):
            raise r.fail(self.key, f"{value!r} is not a time")
        return float(value)


def _token(token: str | None, token_file: Path | None) -> str | None:
    """``token``, or what ``token_file`` holds; printable either way."""
    if token is not None and token_file is not None:
        raise RuleRefusal("token_file", "give token or token_file, not both")
    key = "token"
    if token_file is not None:
        key = "token_file"
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise RuleRefusal(
                "token_file", f"{str(token_file)!r}: cannot read: {exc.strerror}"
            ) from None
    if token is not None and not _PRINTABLE.match(token):
        raise RuleRefusal(key, "the token must be printable ASCII without spaces, and not empty")
    return token


def _domains(domain_prefixes: tuple[str, ...], only_nova: bool) -> DomainFilter:
    return DomainFilter(domain_prefixes, only_nova)


@table("agent")
@dataclass(frozen=True)
class AgentConfig:
    """Read by gmd-agent on each compute host; the daemon ignores it."""

    daemon_url: str | None = setting(
        BaseUrl(
            None,
            "base URL of gmd-daemon, e.g. ``https://gmd.example.org:8470``",
            shown="none (required to send)",
            pattern=r"^https?://[^/\s]+",
            problem="{value}: use http://HOST:PORT or https://HOST:PORT",
        )
    )
    token: str | None = composed(
        _token,
        token=Option(
            None,
            "this host's bearer token (give this or ``token_file``; without either, only for"
            " ``auth = none``)",
            shown="none",
        ),
        token_file=Location(
            None,
            "file holding the token (relative to this file); keeps it out of the config",
            shown="none",
        ),
    )
    host: str = setting(
        Pattern(
            None,
            "this host's name in the ledger; must match ``[hosts.NAME]``",
            shown="the FQDN (``socket.getfqdn()``)",
            pattern=_NAME.pattern,
            problem="{value}: 1–255 characters, no control characters",
            fallback=socket.getfqdn,
        )
    )
    libvirt_uri: str = setting(Text("qemu:///system", "libvirt connection (read-only)"))
    tick_s: float = setting(Number(10.0, "seconds between readings (≤ ``interval_s``)", 0.05, 3600))
    interval_s: int = setting(
        Count(
            60,
            "accounting interval: must equal the daemon's ``accounting.interval_s``",
            1,
            DAY_S,
            whole=True,
            unit="seconds",
        )
    )
    spool_path: Path = setting(
        StateFile(
            None,
            "SQLite spool: unsent batches and the counters' baselines",
            shown="``agent-spool.db`` in the state directory (``/var/lib/gmd`` as root, else"
            " ``./var``)",
            name="agent-spool.db",
        )
    )
    spool_max_bytes: int = setting(
        Count(
            2**30,
            "spool bound; past it the oldest batches are dropped (logged, counted)",
            4096,
            2**50,
            shown="``1073741824`` (1 GiB)",
        )
    )
    spool_max_batches: int = setting(
        Count(10080, "spool bound, in batches", 1, 10**9, shown="``10080`` (a week of minutes)")
    )
    disk_bytes_per_s: float = setting(
        Number(500e6, "host disk bandwidth (capacity the daemon divides)", 1)
    )
    network_bytes_per_s: float | None = setting(
        Positive(
            None,
            "host network bandwidth, > 0; 1 Gbit/s when no link reports a speed",
            shown="fastest physical link's speed (``/sys/class/net/*/speed``)",
        )
    )
    default_customer: str | None = setting(
        Pattern(
            None,
            "customer of VMs with neither Nova nor gmd metadata",
            shown='none (→ ``"unknown"``)',
            pattern=_NAME.pattern,
            problem="{value}: 1–255 characters, no controls",
        )
    )
    domains: DomainFilter = composed(
        _domains,
        domain_prefixes=Words(
            EVERY_DOMAIN.prefixes,
            "measure and throttle only the domains whose name starts with one of these"
            ' (``["instance-"]``: Nova\'s names); empty: every domain',
            pattern=_NAME.pattern,
            problem="{value}: each prefix is 1–255 characters of a name",
        ),
        only_nova=Flag(
            EVERY_DOMAIN.only_nova,
            "measure and throttle only the domains with Nova's metadata (an owner project); the"
            " others on a shared hypervisor are left alone",
        ),
    )
    """which domains are measured and throttled (``domain_prefixes``, ``only_nova``)"""
    metrics_bind: str = setting(Text("127.0.0.1", "where ``/metrics`` and ``/healthz`` listen"))
    metrics_port: int = setting(Count(8471, "its port; ``0`` turns it off", 0, 65535))
    timeout_s: float = setting(Number(10.0, "HTTP timeout per request to the daemon", 0.1, 600))
    post_jitter_s: float = setting(
        Number(
            DEFAULT_POST_JITTER_S,
            "a closed interval's batch is spooled at once, but first posted a random time in"
            " [0, this) after the interval's end, so that hosts do not all post at once"
            " (< ``interval_s``; ``0``, and replays: at once). The daemon's"
            " ``accounting.grace_s`` must exceed it",
            0,
            DAY_S,
            shown="``20``, or ``interval_s / 3`` when that is shorter",
        )
    )
    """see :func:`default_post_jitter_s`; 0: every batch is posted as soon as it is made"""
    describe_every_s: float = setting(
        Number(300.0, "re-read each domain's XML (owner, flavor, devices) this often", 1, DAY_S)
    )
    reconnect_max_s: float = setting(
        Number(60.0, "longest wait between libvirt reconnection attempts (1 s, doubling)", 1, 3600)
    )
    enforce_backend: EnforceBackend = setting(
        Kind(
            EnforceBackend.libvirt,
            "how the daemon's throttling plan is applied: ``libvirt`` (LIVE tuning), ``cgroup``"
            " (cgroup files) or ``none`` (never fetch a plan)",
        )
    )
    plan_every_s: float = setting(
        Number(
            30.0,
            "fetch and apply the plan this often (at most once per tick; ``0``: every tick)",
            0,
            DAY_S,
        )
    )
    enforcement_state_path: Path = setting(
        StateFile(
            None,
            "the VMs' original settings (JSON), kept to restore them exactly after a restart",
            shown="``agent-enforcement.json`` in the state directory",
            name="agent-enforcement.json",
        )
    )
    cgroup_root: Path = setting(
        Place(
            Path("/sys/fs/cgroup"),
            "cgroup mount under which ``cgroup_template`` is rendered (only with it)",
            shown='``"/sys/fs/cgroup"``',
        )
    )
    cgroup_template: str | None = setting(
        CgroupTemplate(
            None,
            "``cgroup`` backend: a VM's cgroup below ``cgroup_root``, for agents that cannot see"
            " QEMU's processes (fields ``{name}``, ``{uuid}``, ``{id}``, ``{machine}``,"
            " ``{machine_unit}``; its version detected at the root)",
            shown="none: where the VM's QEMU process sits (``/proc/PID/cgroup``), the groups"
            " the kernel collector reads (see :mod:`gmd.agent.cgroups`)",
        )
    )
    collector: CollectorKind = setting(
        Kind(
            CollectorKind.auto,
            "where readings come from: ``kernel`` (cgroup and /proc files, libvirt only to list"
            " and describe, see :mod:`gmd.agent.collect.kernel`), ``libvirt`` (bulk stats:"
            " remote or other drivers), ``auto`` (kernel for this machine's ``qemu:///system``,"
            " else libvirt) or ``replay`` (recorded traces, see :mod:`gmd.agent.collect.replay`)",
        )
    )
    replay_dir: Path | None = setting(
        Location(
            None,
            "directory of Bitbrains traces ``N.csv`` or ``N.csv.gz`` (relative to this file)",
            shown="none (required for ``replay``)",
        )
    )
    replay_vms: tuple[str, ...] = setting(
        TraceNames(
            (),
            'which traces: a list (``[1, 2, "7"]``) or ranges (``"1-10,15"``)',
            shown="``[]``: every ``N.csv`` in the directory",
        )
    )
    """trace names (``N`` of ``N.csv``); empty: every trace in ``replay_dir``"""
    replay_customers: tuple[str, ...] | Mapping[str, str] = setting(
        TraceCustomers(
            None,
            "a list, dealt round-robin over ``replay_vms`` in order, or a table trace → customer",
            shown="``default_customer``",
        )
    )
    """empty: every VM is ``default_customer``'s"""
    replay_start_s: float | None = setting(
        Moment(
            None,
            "simulated start (ISO, ``now-3d``, Unix seconds); the traces' first row falls on it",
            key="replay_start",
            shown='``"now-7d"``',
        )
    )
    """``None``: a week before the replay starts"""
    replay_end_s: float | None = setting(
        Moment(
            None,
            "simulated end (never past the traces' end, nor past the present unless the replay"
            " is live: ``replay_speed = 1`` from a start no later than the present)",
            key="replay_end",
            shown="the present",
        )
    )
    """``None``: the present"""
    replay_speed: float | None = setting(
        NumberOr(
            "max",
            'simulated seconds per wall second, or ``"max"``: as fast as the agent goes',
            word="max",
            noun="a number",
        )
    )
    """``None``: as fast as possible (``replay_speed = "max"``)"""
    replay_offset_s: float = setting(Number(0.0, "start this far into the traces", 0))
    replay_host_cores: float | None = setting(
        Positive(None, "the simulated host's cores", shown="the VMs' provisioned cores, summed")
    )
    replay_host_memory_bytes: float | None = setting(
        Positive(None, "the simulated host's RAM", shown="their provisioned memory, summed")
    )
    path: Path | None = None
    """the file this was read from (None: the default file is absent)"""


TABLES: tuple[Table, ...] = (table_of(AgentConfig),)
"""The tables this module declares (the daemon's: :data:`gmd.daemon.config.TABLES`)."""


def parse_agent(
    document: dict[str, Any], source: str = "<config>", path: Path | None = None
) -> AgentConfig:
    """Validate the ``[agent]`` table of a parsed TOML document (other tables are ignored)."""
    table = document.get("agent", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: agent: expected a table, got {table!r}")
    a = Reader(source, "agent.", table, path)
    # One present for both ends of a replay, so that "now" is not after "now".
    now = time.time()
    start, end = (_moment(k).at(a, now) for k in ("replay_start", "replay_end"))
    config = read_table(AgentConfig, a, path=path, replay_start_s=start, replay_end_s=end)
    if config.tick_s > config.interval_s:
        raise a.fail(
            "tick_s", f"{config.tick_s:g} is longer than interval_s = {config.interval_s:g}"
        )
    if "post_jitter_s" not in table:
        config = replace(config, post_jitter_s=default_post_jitter_s(config.interval_s))
    if config.post_jitter_s >= config.interval_s:
        # Batches leave in order: one held for an interval or longer would still wait when
        # the next is made, and the daemon would need a grace period longer than an interval.
        raise a.fail(
            "post_jitter_s",
            f"{config.post_jitter_s:g} is not shorter than interval_s = {config.interval_s:g}",
        )
    _check_replay(a, config)
    if config.collector == CollectorKind.replay:
        # A replay's hosts tick in lock step through simulated time, far faster than a live
        # cloud's intervals end, and its last batches must be delivered when it ends: no spread.
        config = replace(config, post_jitter_s=0.0)
    return config


def _moment(key: str) -> Moment:
    option = table_of(AgentConfig).option(key)
    assert isinstance(option, Moment)
    return option


def _check_replay(a: Reader, config: AgentConfig) -> None:
    """The ``replay_*`` keys together. The traces' directory and files must exist when the
    collector is ``"replay"``; the files themselves are read when the replay starts."""
    if config.collector == CollectorKind.replay:
        if config.replay_dir is None:
            raise a.fail("replay_dir", 'required with collector = "replay"')
        if not config.replay_dir.is_dir():
            raise a.fail("replay_dir", f"{str(config.replay_dir)!r} is not a directory")
        for name in config.replay_vms:
            try:
                trace_file(config.replay_dir, name)
            except TraceError as exc:
                raise a.fail("replay_vms", str(exc)) from None
    customers = config.replay_customers
    if isinstance(customers, Mapping):
        missing = [n for n in config.replay_vms if n not in customers]
        if missing:
            raise a.fail("replay_customers", f"no customer for trace {missing[0]} (replay_vms)")
    start, end = config.replay_start_s, config.replay_end_s
    if start is not None and end is not None and end <= start:
        raise a.fail("replay_end", f"{end:.0f} is not after replay_start ({start:.0f})")


def load_agent(path: str | os.PathLike[str] | None = None) -> AgentConfig:
    """The agent's configuration, from the file :func:`gmd.common.config.read_document` finds."""
    return parse_agent(*read_document(path))
