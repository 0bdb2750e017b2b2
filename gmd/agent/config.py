"""The ``[agent]`` section of ``gmd.toml``: what gmd-agent needs, validated like the rest.

Read with :class:`gmd.common.config.Reader`, so errors name the file and the key
(``gmd.toml: agent.tick_s: 0 is not in [0.05, 3600]``). gmd-agent reads only this section of
the file; the other sections belong to the daemon and are validated by :mod:`gmd.daemon.config`.

Every key is declared once, in :class:`Agent`: its default, its bounds and what it means.
docs/configuration.md shows them as a table made from these declarations, and
``etc/gmd.toml`` shows each with its default (``tests/unit/common/test_config_defaults.py``
checks both).
"""

from __future__ import annotations

import enum
import math
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gmd.agent.apply.cgroupfs import CgroupError, VmIdentity, render_template
from gmd.agent.apply.state import EnforceBackend
from gmd.agent.collect.ownership import EVERY_DOMAIN, DomainFilter
from gmd.common.config import (
    ConfigError,
    Count,
    Flag,
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


class Agent(Table):
    """Read by gmd-agent on each compute host; the daemon ignores it."""

    name = "agent"

    daemon_url = Option(
        None,
        "base URL of gmd-daemon, e.g. ``https://gmd.example.org:8470``",
        shown="none (required to send)",
    )
    token = Option(
        None,
        "this host's bearer token (give this or ``token_file``; without either, only for"
        " ``auth = none``)",
        shown="none",
    )
    token_file = Option(
        None,
        "file holding the token (relative to this file); keeps it out of the config",
        shown="none",
    )
    host = Option(
        None,
        "this host's name in the ledger; must match ``[hosts.NAME]``",
        shown="the FQDN (``socket.getfqdn()``)",
    )
    libvirt_uri = Text("qemu:///system", "libvirt connection (read-only)")
    tick_s = Number(10.0, "seconds between readings (≤ ``interval_s``)", 0.05, 3600)
    interval_s = Count(
        60,
        "accounting interval: must equal the daemon's ``accounting.interval_s``",
        1,
        DAY_S,
        whole=True,
        unit="seconds",
    )
    spool_path = Option(
        None,
        "SQLite spool: unsent batches and the counters' baselines",
        shown="``agent-spool.db`` in the state directory (``/var/lib/gmd`` as root, else"
        " ``./var``)",
    )
    spool_max_bytes = Count(
        2**30,
        "spool bound; past it the oldest batches are dropped (logged, counted)",
        4096,
        2**50,
        shown="``1073741824`` (1 GiB)",
    )
    spool_max_batches = Count(
        10080, "spool bound, in batches", 1, 10**9, shown="``10080`` (a week of minutes)"
    )
    disk_bytes_per_s = Number(500e6, "host disk bandwidth (capacity the daemon divides)", 1)
    network_bytes_per_s = Option(
        None,
        "host network bandwidth, > 0; 1 Gbit/s when no link reports a speed",
        shown="fastest physical link's speed (``/sys/class/net/*/speed``)",
    )
    default_customer = Option(
        None,
        "customer of VMs with neither Nova nor gmd metadata",
        shown='none (→ ``"unknown"``)',
    )
    domain_prefixes = Option(
        EVERY_DOMAIN.prefixes,
        "measure and throttle only the domains whose name starts with one of these"
        ' (``["instance-"]``: Nova\'s names); empty: every domain',
    )
    only_nova = Flag(
        EVERY_DOMAIN.only_nova,
        "measure and throttle only the domains with Nova's metadata (an owner project); the"
        " others on a shared hypervisor are left alone",
    )
    metrics_bind = Text("127.0.0.1", "where ``/metrics`` and ``/healthz`` listen")
    metrics_port = Count(8471, "its port; ``0`` turns it off", 0, 65535)
    timeout_s = Number(10.0, "HTTP timeout per request to the daemon", 0.1, 600)
    post_jitter_s = Number(
        DEFAULT_POST_JITTER_S,
        "a closed interval's batch is spooled at once, but first posted a random time in"
        " [0, this) after the interval's end, so that hosts do not all post at once"
        " (< ``interval_s``; ``0``, and replays: at once). The daemon's"
        " ``accounting.grace_s`` must exceed it",
        0,
        DAY_S,
        shown="``20``, or ``interval_s / 3`` when that is shorter",
    )
    describe_every_s = Number(
        300.0, "re-read each domain's XML (owner, flavor, devices) this often", 1, DAY_S
    )
    reconnect_max_s = Number(
        60.0, "longest wait between libvirt reconnection attempts (1 s, doubling)", 1, 3600
    )
    enforce_backend = Kind(
        EnforceBackend.libvirt,
        "how the daemon's throttling plan is applied: ``libvirt`` (LIVE tuning), ``cgroup``"
        " (cgroup files) or ``none`` (never fetch a plan)",
    )
    plan_every_s = Number(
        30.0,
        "fetch and apply the plan this often (at most once per tick; ``0``: every tick)",
        0,
        DAY_S,
    )
    enforcement_state_path = Option(
        None,
        "the VMs' original settings (JSON), kept to restore them exactly after a restart",
        shown="``agent-enforcement.json`` in the state directory",
    )
    cgroup_root = Text(
        "/sys/fs/cgroup", "cgroup mount under which ``cgroup_template`` is rendered (only with it)"
    )
    cgroup_template = Option(
        None,
        "``cgroup`` backend: a VM's cgroup below ``cgroup_root``, for agents that cannot see"
        " QEMU's processes (fields ``{name}``, ``{uuid}``, ``{id}``, ``{machine}``,"
        " ``{machine_unit}``; its version detected at the root)",
        shown="none: where the VM's QEMU process sits (``/proc/PID/cgroup``), the groups the"
        " kernel collector reads (see :mod:`gmd.agent.cgroups`)",
    )
    collector = Kind(
        CollectorKind.auto,
        "where readings come from: ``kernel`` (cgroup and /proc files, libvirt only to list"
        " and describe, see :mod:`gmd.agent.collect.kernel`), ``libvirt`` (bulk stats: remote"
        " or other drivers), ``auto`` (kernel for this machine's ``qemu:///system``, else"
        " libvirt) or ``replay`` (recorded traces, see :mod:`gmd.agent.collect.replay`)",
    )
    replay_dir = Option(
        None,
        "directory of Bitbrains traces ``N.csv`` or ``N.csv.gz`` (relative to this file)",
        shown="none (required for ``replay``)",
    )
    replay_vms = Option(
        (),
        'which traces: a list (``[1, 2, "7"]``) or ranges (``"1-10,15"``)',
        shown="``[]``: every ``N.csv`` in the directory",
    )
    replay_customers = Option(
        None,
        "a list, dealt round-robin over ``replay_vms`` in order, or a table trace → customer",
        shown="``default_customer``",
    )
    replay_start = Option(
        None,
        "simulated start (ISO, ``now-3d``, Unix seconds); the traces' first row falls on it",
        shown='``"now-7d"``',
    )
    replay_end = Option(
        None,
        "simulated end (never past the traces' end, nor past the present unless the replay"
        " is live: ``replay_speed = 1`` from a start no later than the present)",
        shown="the present",
    )
    replay_speed = Option(
        "max",
        'simulated seconds per wall second, or ``"max"``: as fast as the agent goes',
    )
    replay_offset_s = Number(0.0, "start this far into the traces", 0)
    replay_host_cores = Option(
        None, "the simulated host's cores", shown="the VMs' provisioned cores, summed"
    )
    replay_host_memory_bytes = Option(
        None, "the simulated host's RAM", shown="their provisioned memory, summed"
    )


TABLES: tuple[type[Table], ...] = (Agent,)
"""The tables this module declares (the daemon's: :data:`gmd.daemon.config.TABLES`)."""


@dataclass(frozen=True)
class AgentConfig:
    path: Path | None
    host: str
    spool_path: Path
    daemon_url: str | None = Agent.daemon_url.default
    token: str | None = Agent.token.default
    libvirt_uri: str = Agent.libvirt_uri.default
    tick_s: float = Agent.tick_s.default
    interval_s: int = Agent.interval_s.default
    spool_max_bytes: int = Agent.spool_max_bytes.default
    spool_max_batches: int = Agent.spool_max_batches.default
    disk_bytes_per_s: float = Agent.disk_bytes_per_s.default
    network_bytes_per_s: float | None = Agent.network_bytes_per_s.default
    default_customer: str | None = Agent.default_customer.default
    domains: DomainFilter = EVERY_DOMAIN
    """which domains are measured and throttled (``domain_prefixes``, ``only_nova``)"""
    metrics_bind: str = Agent.metrics_bind.default
    metrics_port: int = Agent.metrics_port.default
    timeout_s: float = Agent.timeout_s.default
    post_jitter_s: float = Agent.post_jitter_s.default
    """see :func:`default_post_jitter_s`; 0: every batch is posted as soon as it is made"""
    describe_every_s: float = Agent.describe_every_s.default
    reconnect_max_s: float = Agent.reconnect_max_s.default
    enforce_backend: EnforceBackend = Agent.enforce_backend.default
    plan_every_s: float = Agent.plan_every_s.default
    enforcement_state_path: Path = field(
        default_factory=lambda: default_state_dir() / "agent-enforcement.json"
    )
    cgroup_root: Path = Path(Agent.cgroup_root.default)
    cgroup_template: str | None = Agent.cgroup_template.default
    collector: CollectorKind = Agent.collector.default
    replay_dir: Path | None = Agent.replay_dir.default
    replay_vms: tuple[str, ...] = Agent.replay_vms.default
    """trace names (``N`` of ``N.csv``); empty: every trace in ``replay_dir``"""
    replay_customers: tuple[str, ...] | Mapping[str, str] = ()
    """empty: every VM is ``default_customer``'s"""
    replay_start_s: float | None = Agent.replay_start.default
    """``None``: a week before the replay starts"""
    replay_end_s: float | None = Agent.replay_end.default
    """``None``: the present"""
    replay_speed: float | None = None
    """``None``: as fast as possible (``replay_speed = "max"``)"""
    replay_offset_s: float = Agent.replay_offset_s.default
    replay_host_cores: float | None = Agent.replay_host_cores.default
    replay_host_memory_bytes: float | None = Agent.replay_host_memory_bytes.default


def parse_agent(
    document: dict[str, Any], source: str = "<config>", path: Path | None = None
) -> AgentConfig:
    """Validate the ``[agent]`` table of a parsed TOML document (other tables are ignored)."""
    table = document.get("agent", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: agent: expected a table, got {table!r}")
    a = Reader(source, "agent.", table)

    url = a.get("daemon_url", str, None)
    if url is not None and not re.match(r"^https?://[^/\s]+", url):
        raise a.fail("daemon_url", f"{url!r}: use http://HOST:PORT or https://HOST:PORT")

    token = a.get("token", str, None)
    token_file = a.get("token_file", str, None)
    if token is not None and token_file is not None:
        raise a.fail("token_file", "give token or token_file, not both")
    key = "token"
    if token_file is not None:
        key = "token_file"
        p = relative_to_file(path, token_file)
        try:
            token = p.read_text().strip()
        except OSError as exc:
            raise a.fail("token_file", f"{str(p)!r}: cannot read: {exc.strerror}") from None
    if token is not None and not _PRINTABLE.match(token):
        raise a.fail(key, "the token must be printable ASCII without spaces, and not empty")

    host = a.get("host", str, None) or socket.getfqdn()
    if not _NAME.match(host):
        raise a.fail("host", f"{host!r}: 1–255 characters, no control characters")
    default_customer = a.get("default_customer", str, None)
    if default_customer is not None and not _NAME.match(default_customer):
        raise a.fail("default_customer", f"{default_customer!r}: 1–255 characters, no controls")

    interval = a.option(Agent.interval_s)
    tick = a.option(Agent.tick_s)
    if tick > interval:
        raise a.fail("tick_s", f"{tick:g} is longer than interval_s = {interval:g}")
    jitter = a.option(replace(Agent.post_jitter_s, default=default_post_jitter_s(interval)))
    if jitter >= interval:
        # Batches leave in order: one held for an interval or longer would still wait when
        # the next is made, and the daemon would need a grace period longer than an interval.
        raise a.fail("post_jitter_s", f"{jitter:g} is not shorter than interval_s = {interval:g}")

    spool = a.get("spool_path", str, None)
    network = a.get("network_bytes_per_s", (int, float), None)
    if network is not None and not (0 < network < float("inf")):
        raise a.fail("network_bytes_per_s", f"{network!r} must be > 0")
    state_path = a.get("enforcement_state_path", str, None)
    template = a.get("cgroup_template", str, None)
    if template is not None:
        try:
            render_template(template, VmIdentity(name="instance-00000001", uuid="u", id=1))
        except CgroupError as exc:
            raise a.fail("cgroup_template", str(exc)) from None
    config = AgentConfig(
        path=path,
        host=host,
        spool_path=(
            relative_to_file(path, spool) if spool else default_state_dir() / "agent-spool.db"
        ),
        daemon_url=url.rstrip("/") if url else None,
        token=token,
        libvirt_uri=a.option(Agent.libvirt_uri),
        tick_s=tick,
        interval_s=interval,
        spool_max_bytes=a.option(Agent.spool_max_bytes),
        spool_max_batches=a.option(Agent.spool_max_batches),
        disk_bytes_per_s=a.option(Agent.disk_bytes_per_s),
        network_bytes_per_s=None if network is None else float(network),
        default_customer=default_customer,
        domains=_domains(a),
        metrics_bind=a.option(Agent.metrics_bind),
        metrics_port=a.option(Agent.metrics_port),
        timeout_s=a.option(Agent.timeout_s),
        post_jitter_s=jitter,
        describe_every_s=a.option(Agent.describe_every_s),
        reconnect_max_s=a.option(Agent.reconnect_max_s),
        enforce_backend=a.option(Agent.enforce_backend),
        plan_every_s=a.option(Agent.plan_every_s),
        enforcement_state_path=(
            relative_to_file(path, state_path)
            if state_path
            else default_state_dir() / "agent-enforcement.json"
        ),
        cgroup_root=relative_to_file(path, a.option(Agent.cgroup_root)),
        cgroup_template=template,
        **_replay_keys(a, path),
    )
    a.done()
    if config.collector == CollectorKind.replay:
        # A replay's hosts tick in lock step through simulated time, far faster than a live
        # cloud's intervals end, and its last batches must be delivered when it ends: no spread.
        config = replace(config, post_jitter_s=0.0)
    return config


def _domains(a: Reader) -> DomainFilter:
    """``domain_prefixes`` and ``only_nova``: the domains this agent may measure and throttle."""
    prefixes = a.get("domain_prefixes", list, list(Agent.domain_prefixes.default))
    for p in prefixes:
        if not isinstance(p, str) or not _NAME.match(p):
            raise a.fail("domain_prefixes", f"{p!r}: each prefix is 1–255 characters of a name")
    return DomainFilter(tuple(prefixes), a.option(Agent.only_nova))


def _replay_keys(a: Reader, path: Path | None) -> dict[str, Any]:
    """The ``collector`` and ``replay_*`` keys. The traces' directory and files must exist
    when the collector is ``"replay"``; the files themselves are read when the replay starts."""
    collector = a.option(Agent.collector)
    directory = a.get("replay_dir", str, None)
    replay_dir = None if directory is None else relative_to_file(path, directory)
    if collector == CollectorKind.replay:
        if replay_dir is None:
            raise a.fail("replay_dir", 'required with collector = "replay"')
        if not replay_dir.is_dir():
            raise a.fail("replay_dir", f"{str(replay_dir)!r} is not a directory")
    vms = _trace_names(a, a.get("replay_vms", (list, str), None))
    if collector == CollectorKind.replay and replay_dir is not None:
        for name in vms:
            try:
                trace_file(replay_dir, name)
            except TraceError as exc:
                raise a.fail("replay_vms", str(exc)) from None
    now = time.time()
    speed = a.get("replay_speed", (int, float, str), Agent.replay_speed.default)
    if speed == "max":
        speed = None
    elif isinstance(speed, str) or not (0 < speed < math.inf):
        raise a.fail("replay_speed", f'{speed!r}: give a number > 0, or "max"')
    cores = a.get("replay_host_cores", (int, float), None)
    memory = a.get("replay_host_memory_bytes", (int, float), None)
    for key, value in (("replay_host_cores", cores), ("replay_host_memory_bytes", memory)):
        if value is not None and not (0 < value < math.inf):
            raise a.fail(key, f"{value!r} must be > 0")
    start, end = _moment(a, "replay_start", now), _moment(a, "replay_end", now)
    if start is not None and end is not None and end <= start:
        raise a.fail("replay_end", f"{end:.0f} is not after replay_start ({start:.0f})")
    return {
        "collector": collector,
        "replay_dir": replay_dir,
        "replay_vms": vms,
        "replay_customers": _customers(a, vms),
        "replay_start_s": start,
        "replay_end_s": end,
        "replay_speed": None if speed is None else float(speed),
        "replay_offset_s": a.option(Agent.replay_offset_s),
        "replay_host_cores": None if cores is None else float(cores),
        "replay_host_memory_bytes": None if memory is None else float(memory),
    }


def _trace_names(a: Reader, value: list[Any] | str | None) -> tuple[str, ...]:
    """The ``replay_vms`` key read by :func:`gmd.traces.trace_ranges`."""
    if value is None:
        return ()
    try:
        return trace_ranges(value)
    except ValueError as exc:
        raise a.fail("replay_vms", str(exc)) from None


def _customers(a: Reader, vms: tuple[str, ...]) -> tuple[str, ...] | dict[str, str]:
    """A list of customers (dealt round-robin) or a table trace → customer, names checked."""
    value = a.get("replay_customers", (list, dict), None)
    if value is None:
        return ()
    names = list(value.values()) if isinstance(value, dict) else value
    for name in names:
        if not (isinstance(name, str) and _NAME.match(name)):
            raise a.fail("replay_customers", f"{name!r}: 1–255 characters, no controls")
    if isinstance(value, list):
        if not value:
            raise a.fail("replay_customers", "an empty list: give at least one customer")
        return tuple(value)
    missing = [n for n in vms if n not in value]
    if missing:
        raise a.fail("replay_customers", f"no customer for trace {missing[0]} (replay_vms)")
    return {str(k): v for k, v in value.items()}


def _moment(a: Reader, key: str, now_s: float) -> float | None:
    """An instant as :func:`gmd.common.timespec.parse_time` reads it, Unix seconds, or a TOML
    date-time (UTC unless it says otherwise)."""
    value = a.get(key, (str, int, float, datetime), None)
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, str):
        try:
            return parse_time(value, now_s)
        except ValueError as exc:
            raise a.fail(key, str(exc)) from None
    if not (0 <= value < math.inf):
        raise a.fail(key, f"{value!r} is not a time")
    return float(value)


def load_agent(path: str | os.PathLike[str] | None = None) -> AgentConfig:
    """The agent's configuration, from the file :func:`gmd.common.config.read_document` finds."""
    return parse_agent(*read_document(path))
