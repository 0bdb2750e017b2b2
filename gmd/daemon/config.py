"""The daemon's and gmd-admin's configuration: one validated object, loaded once at start.

Read from ``/etc/gmd/gmd.toml``, or the path in ``--config`` / ``GMD_CONFIG``
(:func:`gmd.common.config.read_document`); every table but ``[agent]`` is validated here, with
errors that name the file and the key.
"""

from __future__ import annotations

import copy
import enum
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmd.common.config import (
    ConfigError,
    Reader,
    default_state_dir,
    read_document,
)
from gmd.fairness.cloud import CONSUMER_MODES, ENDOWMENT_MODES, ConsumerMode, EndowmentMode
from gmd.fairness.decay import DEFAULT_HALF_LIFE_S
from gmd.fairness.directcontr import UTILITIES
from gmd.fairness.interval import IntervalSettings
from gmd.fairness.policy import CapResource, ContentionPolicy, ThrottlePolicy
from gmd.wire import PlanMode, resource_names


def default_database_url() -> str:
    return f"sqlite:///{default_state_dir() / 'ledger.db'}"


@dataclass(frozen=True)
class AccountingConfig:
    interval_s: int = 60
    grace_s: int = 45
    """the agents' default ``post_jitter_s`` (20) plus 25 s for the last post to be stored"""
    gamma: float = 0.5
    endowment: EndowmentMode = "flavor"
    consumer: ConsumerMode = "vm"
    half_life_s: float | None = DEFAULT_HALF_LIFE_S
    utility: str = "psi_double_prime"
    split_io: bool = False
    weights: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(resource_names(False), 1.0)
    )
    """each resource's weight (1: counts as much as the others), by its name as accounted"""

    @property
    def resources(self) -> tuple[str, ...]:
        return resource_names(self.split_io)

    def weight_vector(self) -> list[float]:
        return [self.weights.get(r, 1.0) for r in self.resources]

    def interval_settings(self) -> IntervalSettings:
        """What the pure interval step (:mod:`gmd.fairness.interval`) takes of these."""
        return IntervalSettings(
            resources=self.resources,
            gamma=self.gamma,
            endowment=self.endowment,
            consumer=self.consumer,
            weights=tuple(self.weight_vector()),
            half_life_s=self.half_life_s,
            utility=self.utility,
        )


@dataclass(frozen=True)
class LimitsConfig:
    """``[daemon.limits]``: what one host may claim of the ledger, per host (see
    :mod:`gmd.daemon.api.limits`). The defaults leave a host of a 100,000-VM cloud, which runs
    hundreds of VMs and builds at most a few at once (Nova's ``max_concurrent_builds`` is 10),
    several times what it needs, and bound what a stolen or buggy token can write to a few
    hundred rows a minute."""

    batches_per_interval: int = 4
    """distinct batches a host may store for one interval: one, or a few after an agent's
    restart mid-interval (retries of a stored batch are duplicates and do not count)"""
    new_customers_per_interval: int = 100
    """customers the ledger does not know that a host may introduce per interval"""
    new_vms_per_interval: int = 200
    """VMs the ledger does not know that a host may introduce per interval"""
    report_rows_per_interval: int = 1000
    """enforcement-log rows (VM results of plan reports) a host may write per interval"""
    max_error_chars: int = 500
    """a host's error text in a plan report is cut to this many characters"""


@dataclass(frozen=True)
class DaemonConfig:
    bind: str = "0.0.0.0"
    port: int = 8470
    auth: str = "token"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    clock_skew_s: int = 300
    max_batch_vms: int = 2000
    """VMs in one batch: a compute host runs hundreds at most"""
    max_body_bytes: int = 16 * 1024 * 1024
    ingest_threads: int = 2
    accounting: bool = True
    account_every_s: float = 10.0
    max_late_s: int = 7 * 86400
    plausibility_margin: float = 0.1
    max_host_cores: float = 4096
    max_host_memory_bytes: float = 64 * 2**40
    max_host_disk_bytes_per_s: float = 1e12
    max_host_network_bytes_per_s: float = 1e12
    limits: LimitsConfig = field(default_factory=LimitsConfig)

    def max_capacity(self) -> tuple[float, ...]:
        """The sane bounds of a host's capacity, one per :data:`~gmd.wire.CAPACITY_FIELDS`."""
        return (
            self.max_host_cores,
            self.max_host_memory_bytes,
            self.max_host_disk_bytes_per_s,
            self.max_host_network_bytes_per_s,
        )


class QuotaBackendKind(enum.StrEnum):
    """Where a cloud keeps its compute quotas."""

    nova = "nova"
    """Nova's legacy quota API (``os-quota-sets``, DbQuotaDriver)"""
    keystone_limits = "keystone-limits"
    """Unified limits: project limits in Keystone (Nova's UnifiedLimitsDriver)"""
    auto = "auto"
    """Find out from the cloud (registered limits, and whether a Nova write changes anything)"""


@dataclass(frozen=True)
class QuotaConfig:
    """OpenStack compute quotas: ``cloud`` names the clouds.yaml entry ("" = no quotas).

    Each step removes ``step_*`` of the original quota (a fraction), never below ``floor_*``.
    ``backend`` says where the quotas live (Nova's legacy quotas, Keystone's unified limits,
    or "auto": found out from the cloud); ``limits_cloud`` is the clouds.yaml entry that writes
    Keystone limits ("" = ``cloud``).
    """

    cloud: str = ""
    backend: QuotaBackendKind = QuotaBackendKind.auto
    limits_cloud: str = ""
    step_cores: float = 0.25
    step_ram: float = 0.25
    step_instances: float = 0.25
    floor_cores: int = 1
    floor_ram_mb: int = 2048
    floor_instances: int = 1
    every_s: float = 60.0
    timeout_s: float = 10.0
    retries: int = 2
    names_every_s: float = 3600.0
    """How often customers' project names are read from Keystone (0: never)"""


@dataclass(frozen=True)
class EnforcementConfig:
    """``mode``: "off" decides nothing; "dry-run" decides and records what it would do;
    "on" also applies it. ``policy`` holds the thresholds and what each level does;
    ``contention`` on which hosts a level's hard caps apply."""

    mode: PlanMode = PlanMode.dry_run
    policy: ThrottlePolicy = field(default_factory=ThrottlePolicy)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    contention: ContentionPolicy = field(default_factory=ContentionPolicy)


@dataclass(frozen=True)
class RetentionConfig:
    """How long the ledger keeps each kind of row, in days (0: for ever).

    ``raw_days``: samples, batches and host capacities (on PostgreSQL whole daily partitions
    are dropped; on SQLite rows are deleted ``delete_chunk`` at a time). ``ledger_days``: the
    per-interval customer, resource and organization rows; ``rollup_days``: the hourly and
    daily rollups that reports read for older ranges. ``every_s``: how often the daemon
    purges; one run stops after ``max_run_s`` and the next goes on.
    """

    raw_days: float = 31.0
    ledger_days: float = 400.0
    rollup_days: float = 0.0
    every_s: float = 3600.0
    delete_chunk: int = 10_000
    max_run_s: float = 60.0

    def cutoff_s(self, days: float, now_s: float) -> int | None:
        """The time before which rows kept ``days`` days are due; None: kept for ever."""
        return None if days == 0 else int(now_s - days * 86400)


PLACEMENT_VERIFY = ("off", "on")


@dataclass(frozen=True)
class PlacementConfig:
    """``[placement]``: whether Placement vouches for what hosts claim (see
    :mod:`gmd.daemon.placement`). ``cloud`` names the clouds.yaml entry (an account that may
    read providers and allocations); ``refresh_s`` is how old a host's snapshot may grow
    before the daemon's job reads it again; ``timeout_s`` bounds each request (never
    retried: a batch that cannot be verified is verified later); ``miss_s`` is how often at
    most a batch that Placement's snapshot does not vouch for makes the daemon ask again, per
    host; ``wait_s`` is how long accounting waits, past an interval's grace, for its batches
    accepted unverified; ``providers`` maps a host to its resource provider's name (default:
    the host's own name, which is Nova's)."""

    verify: str = "off"
    cloud: str = ""
    refresh_s: float = 300.0
    timeout_s: float = 5.0
    miss_s: float = 30.0
    wait_s: float = 900.0
    providers: dict[str, str] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.verify == "on"

    def provider_name(self, host: str) -> str:
        """The name of the host's resource provider in Placement."""
        return self.providers.get(host, host)


@dataclass(frozen=True)
class HostConfig:
    name: str
    owner: str
    token_sha256: str | None = None


READ_AUTH = ("off", "local", "keystone")
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True)
class ReadApiConfig:
    """``[read_api]``: who may read standings, reports, explanations and plots over HTTP.

    ``auth`` is "off" (no read route: the default, nothing of the ledger is served), "local"
    (every request is the operator's: only for a daemon bound to loopback) or "keystone"
    (an ``X-Auth-Token`` checked by keystonemiddleware with the options of
    ``[read_api.keystone]``, then oslo.policy's rules, see :mod:`gmd.daemon.api.access`)."""

    auth: str = "off"
    keystone: dict[str, str] = field(default_factory=dict)
    admin_project_id: str = ""
    """the project whose admins and readers read every customer (besides system scope)"""
    policy_file: Path | None = None


@dataclass(frozen=True)
class Config:
    path: Path | None
    database_url: str
    accounting: AccountingConfig
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    default_owner: str = "operator"
    hosts: dict[str, HostConfig] = field(default_factory=dict)
    organization_customers: dict[str, str] = field(default_factory=dict)
    enforcement: EnforcementConfig = field(default_factory=EnforcementConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    # A streaming replica of database_url for gmd-admin's reads, so that heavy reports do not
    # load the primary that ingests and accounts; None reads from database_url.
    read_url: str | None = None
    read_api: ReadApiConfig = field(default_factory=ReadApiConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    document: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The TOML document this was parsed from: a what-if re-parses it with its changes."""
    source: str = "<config>"

    def owner_of(self, host: str) -> str:
        """The organization that contributed ``host``: configured, else the default owner."""
        h = self.hosts.get(host)
        return h.owner if h is not None else self.default_owner


def parse(document: dict[str, Any], source: str = "<config>", path: Path | None = None) -> Config:
    """Validate a parsed TOML document into a :class:`Config`."""
    root = Reader(source, "", document)

    db = root.sub("database")
    url = _database_url(db, "url") or default_database_url()
    read_url = _database_url(db, "read_url")
    # A replica is a copy of the ledger: a SQLite file cannot stream from PostgreSQL, nor the
    # reverse, so a mixed pair is a mistake in the file, not a set-up to run with.
    if read_url is not None and read_url.startswith("sqlite:") != url.startswith("sqlite:"):
        raise db.fail(
            "read_url",
            f"{read_url!r} is not the same kind of database as url {url.split(':')[0]!r}",
        )
    db.done()

    acc = root.sub("accounting")
    interval = acc.number("interval_s", 60, 1, 86400)
    if interval != int(interval):
        raise acc.fail("interval_s", f"{interval!r} is not a whole number of seconds")
    half_life = acc.get("half_life_s", (int, float, str), DEFAULT_HALF_LIFE_S)
    if half_life == "none":
        half_life = None
    elif isinstance(half_life, str) or not half_life > 0:
        raise acc.fail("half_life_s", f'{half_life!r}: give seconds > 0, or "none"')
    utility = acc.choice("utility", "psi_double_prime", UTILITIES)
    split = acc.get("split_io", bool, False)
    resources = resource_names(split)
    weights_reader = acc.sub("weights")
    weights = {r: weights_reader.number(r, 1.0, 0.0) for r in resources}
    weights_reader.done()
    accounting = AccountingConfig(
        interval_s=int(interval),
        grace_s=int(acc.number("grace_s", AccountingConfig.grace_s, 0, 86400)),
        gamma=acc.number("gamma", 0.5, 0.0, 1.0),
        endowment=acc.choice("endowment", "flavor", ENDOWMENT_MODES),
        consumer=acc.choice("consumer", "vm", CONSUMER_MODES),
        half_life_s=None if half_life is None else float(half_life),
        utility=utility,
        split_io=split,
        weights=weights,
    )
    if not any(weights.values()):
        raise acc.fail("weights", "are all zero: at least one resource must count")
    acc.done()

    daemon = _daemon(root.sub("daemon"), path)
    read_api = _read_api(root.sub("read_api"), daemon, path)
    enforcement = _enforcement(root.sub("enforcement"))
    retention = _retention(root.sub("retention"), daemon)
    placement = _placement(root.sub("placement"))

    orgs = root.sub("organizations")
    default_owner = orgs.get("default_owner", str, "operator")
    customers_reader = orgs.sub("customers")
    org_customers = {name: customers_reader.get(name, str, None) for name in customers_reader.table}
    customers_reader.done()
    orgs.done()

    hosts_reader = root.sub("hosts")
    hosts = {}
    for name in hosts_reader.table:
        h = hosts_reader.sub(name)
        token = h.get("token_sha256", str, None)
        if token is not None and (
            len(token) != 64 or not all(c in "0123456789abcdef" for c in token)
        ):
            raise h.fail("token_sha256", "must be 64 lowercase hex digits (sha256sum of the token)")
        hosts[name] = HostConfig(name, h.get("owner", str, default_owner), token)
        h.done()
    hosts_reader.done()
    # [agent] belongs to gmd-agent, which validates it (gmd.agent.config); one file can serve
    # a host that runs both.
    root.get("agent", dict, {})
    root.done()
    return Config(
        path,
        url,
        accounting,
        daemon,
        default_owner,
        hosts,
        org_customers,
        enforcement,
        retention,
        read_url=read_url,
        read_api=read_api,
        placement=placement,
        document=copy.deepcopy(document),
        source=source,
    )


def _database_url(db: Reader, key: str) -> str | None:
    """``[database] key``, None when absent or empty; the read replica's URL is checked as the
    primary's is, so that a typo in either is caught when the file is read, not at the first
    report."""
    url = db.get(key, str, None)
    if not url:
        return None
    if not url.startswith(("sqlite:", "postgresql")):
        raise db.fail(key, f"{url!r}: use sqlite:///PATH or postgresql+psycopg://...")
    return url


def _numbers(r: Reader, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    values = r.get(key, list, list(default))
    if not values or any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise r.fail(key, f"{values!r}: give a list of numbers, one per level")
    return tuple(float(v) for v in values)


def _enforcement(e: Reader) -> EnforcementConfig:
    d = ThrottlePolicy()
    disk = _numbers(e, "disk_caps_bytes_per_s", tuple(c or 0.0 for c in d.disk_caps_bytes_per_s))
    try:
        policy = ThrottlePolicy(
            enter=_numbers(e, "enter", d.enter),
            leave=_numbers(e, "leave", d.leave),
            dwell_s=e.number("dwell_s", d.dwell_s, 0, 30 * 86400),
            max_step=int(e.number("max_step", d.max_step, 1, 100)),
            priority_weight=e.number("priority_weight", d.priority_weight, 0),
            weight_factors=_numbers(e, "weight_factors", d.weight_factors),
            weight_floor=e.number("weight_floor", d.weight_floor, 0, 1),
            cap_level=int(e.number("cap_level", d.cap_level, 1, 100)),
            cpu_cap_fractions=_numbers(e, "cpu_cap_fractions", d.cpu_cap_fractions),
            cap_floor=e.number("cap_floor", d.cap_floor, 0, 1),
            disk_caps_bytes_per_s=tuple(None if c == 0 else c for c in disk),
            quota_level=int(e.number("quota_level", d.quota_level, 1, 100)),
        )
    except ConfigError:
        raise
    except ValueError as exc:
        raise e.fail("", str(exc)) from None
    mode = e.kind("mode", PlanMode.dry_run)
    contention = _contention(e)
    q = e.sub("quota")
    d_q = QuotaConfig()
    quota = QuotaConfig(
        cloud=q.get("cloud", str, ""),
        backend=q.kind("backend", d_q.backend),
        limits_cloud=q.get("limits_cloud", str, ""),
        step_cores=q.number("step_cores", d_q.step_cores, 0, 1),
        step_ram=q.number("step_ram", d_q.step_ram, 0, 1),
        step_instances=q.number("step_instances", d_q.step_instances, 0, 1),
        floor_cores=int(q.number("floor_cores", d_q.floor_cores, -1, 10**9)),
        floor_ram_mb=int(q.number("floor_ram_mb", d_q.floor_ram_mb, -1, 10**12)),
        floor_instances=int(q.number("floor_instances", d_q.floor_instances, -1, 10**9)),
        every_s=q.number("every_s", d_q.every_s, 1, 86400),
        timeout_s=q.number("timeout_s", d_q.timeout_s, 0.1, 600),
        retries=int(q.number("retries", d_q.retries, 0, 20)),
        names_every_s=q.number("names_every_s", d_q.names_every_s, 0, 7 * 86400),
    )
    q.done()
    e.done()
    return EnforcementConfig(mode, policy, quota, contention)


def _contention(e: Reader) -> ContentionPolicy:
    """``contended_above``: one fraction for every capped resource, or a table per resource
    (``{ cpu = 0.8, disk = 0.6 }``: a disk's configured bandwidth is often a rougher figure
    than its cores); ``contention_intervals``: how many of the host's last intervals count."""
    d = ContentionPolicy()
    given = e.get("contended_above", (int, float, dict), None)
    if isinstance(given, dict):
        table = e.sub("contended_above")
        above = {r: table.number(r.value, d.threshold(r), 0, 1) for r in CapResource}
        for key in table.table:
            if key not in above:
                raise table.fail(
                    key, f"caps exist for {' and '.join(CapResource)} only: no threshold for {key}"
                )
    else:
        both = e.number("contended_above", d.cpu_above, 0, 1)
        above = dict.fromkeys(CapResource, both)
    intervals = e.number("contention_intervals", d.intervals, 1, 1440)
    if intervals != int(intervals):
        raise e.fail("contention_intervals", f"{intervals!r} is not a whole number of intervals")
    return ContentionPolicy(above[CapResource.cpu], above[CapResource.disk], int(intervals))


def _placement(r: Reader) -> PlacementConfig:
    d = PlacementConfig()
    names = r.sub("providers")
    providers = {host: names.get(host, str, host) for host in names.table}
    names.done()
    config = PlacementConfig(
        verify=r.choice("verify", d.verify, PLACEMENT_VERIFY),
        cloud=r.get("cloud", str, d.cloud),
        refresh_s=r.number("refresh_s", d.refresh_s, 1, 86400),
        timeout_s=r.number("timeout_s", d.timeout_s, 0.1, 600),
        miss_s=r.number("miss_s", d.miss_s, 0, 86400),
        wait_s=r.number("wait_s", d.wait_s, 0, 7 * 86400),
        providers=providers,
    )
    if config.on and not config.cloud:
        raise r.fail("cloud", 'is required with verify = "on" (a clouds.yaml entry)')
    r.done()
    return config


def _retention(r: Reader, daemon: DaemonConfig) -> RetentionConfig:
    config = RetentionConfig(
        raw_days=r.number("raw_days", RetentionConfig.raw_days, 0, 100 * 366),
        ledger_days=r.number("ledger_days", RetentionConfig.ledger_days, 0, 100 * 366),
        rollup_days=r.number("rollup_days", RetentionConfig.rollup_days, 0, 1000 * 366),
        every_s=r.number("every_s", RetentionConfig.every_s, 1, 7 * 86400),
        delete_chunk=int(r.number("delete_chunk", RetentionConfig.delete_chunk, 1, 10_000_000)),
        max_run_s=r.number("max_run_s", RetentionConfig.max_run_s, 0.1, 86400),
    )
    # A batch may arrive max_late_s after its interval: its day must still be kept, or the
    # late batch would land in a day already purged.
    if config.raw_days and config.raw_days * 86400 <= daemon.max_late_s + 86400:
        raise r.fail(
            "raw_days",
            f"{config.raw_days:g} days do not outlast [daemon] max_late_s"
            f" ({daemon.max_late_s / 86400:g} days) by a day: raw data must be kept longer"
            " than a batch may arrive late",
        )
    longest = [(k, getattr(config, k)) for k in ("raw_days", "ledger_days", "rollup_days")]
    for (shorter, a), (longer, b) in itertools.pairwise(longest):
        if b and (a == 0 or a > b):
            raise r.fail(
                longer,
                f"{b:g} days is shorter than {shorter} ({'for ever' if a == 0 else f'{a:g}'}):"
                " each summary must be kept at least as long as what it sums",
            )
    r.done()
    return config


def _read_api(r: Reader, daemon: DaemonConfig, path: Path | None) -> ReadApiConfig:
    auth = r.choice("auth", "off", READ_AUTH)
    if auth == "local" and daemon.bind not in LOOPBACK:
        raise r.fail(
            "auth",
            f'"local" serves the ledger to anyone who can connect: bind the daemon to'
            f' 127.0.0.1 (daemon.bind is {daemon.bind!r}), or use "keystone"',
        )
    ks = r.sub("keystone")
    options = {key: str(ks.get(key, (str, int, float, bool), None)) for key in ks.table}
    ks.done()
    if auth == "keystone":
        for key in ("www_authenticate_uri", "auth_url", "auth_type"):
            if key not in options:
                raise r.fail(f"keystone.{key}", 'is required with auth = "keystone"')
    policy = r.get("policy_file", str, None)
    policy_file = None
    if policy is not None:
        policy_file = Path(policy)
        if not policy_file.is_absolute() and path is not None:
            policy_file = path.parent / policy_file
        if not policy_file.is_file():
            raise r.fail("policy_file", f"{policy!r}: no such file")
    config = ReadApiConfig(auth, options, r.get("admin_project_id", str, ""), policy_file)
    r.done()
    return config


def _daemon(d: Reader, path: Path | None) -> DaemonConfig:
    def existing_file(key: str) -> Path | None:
        value = d.get(key, str, None)
        if value is None:
            return None
        p = Path(value)
        if not p.is_absolute() and path is not None:
            p = path.parent / p
        if not p.is_file():
            raise d.fail(key, f"{value!r}: no such file")
        return p

    cert, key = existing_file("tls_cert"), existing_file("tls_key")
    if (cert is None) != (key is None):
        raise d.fail(
            "tls_cert" if cert is None else "tls_key", "give tls_cert and tls_key together"
        )
    config = DaemonConfig(
        bind=d.get("bind", str, "0.0.0.0"),
        port=int(d.number("port", 8470, 0, 65535)),
        auth=d.choice("auth", "token", ("token", "none")),
        tls_cert=cert,
        tls_key=key,
        clock_skew_s=int(d.number("clock_skew_s", 300, 0, 86400)),
        max_batch_vms=int(d.number("max_batch_vms", DaemonConfig.max_batch_vms, 1, 1_000_000)),
        max_body_bytes=int(d.number("max_body_bytes", 16 * 1024 * 1024, 1024, 2**31)),
        ingest_threads=int(d.number("ingest_threads", 2, 1, 64)),
        accounting=d.get("accounting", bool, True),
        account_every_s=d.number("account_every_s", 10.0, 0.01, 3600),
        max_late_s=int(d.number("max_late_s", DaemonConfig.max_late_s, 60, 366 * 86400)),
        plausibility_margin=d.number("plausibility_margin", 0.1, 0.0, 10.0),
        max_host_cores=d.number("max_host_cores", DaemonConfig.max_host_cores, 1, 1e7),
        max_host_memory_bytes=d.number(
            "max_host_memory_bytes", DaemonConfig.max_host_memory_bytes, 2**20, 2**70
        ),
        max_host_disk_bytes_per_s=d.number(
            "max_host_disk_bytes_per_s", DaemonConfig.max_host_disk_bytes_per_s, 1, 1e15
        ),
        max_host_network_bytes_per_s=d.number(
            "max_host_network_bytes_per_s", DaemonConfig.max_host_network_bytes_per_s, 1, 1e15
        ),
        limits=_limits(d.sub("limits")),
    )
    d.done()
    return config


def _limits(r: Reader) -> LimitsConfig:
    d = LimitsConfig()

    def whole(key: str, low: int, high: int) -> int:
        value = r.number(key, getattr(d, key), low, high)
        if value != int(value):
            raise r.fail(key, f"{value!r} is not a whole number")
        return int(value)

    config = LimitsConfig(
        batches_per_interval=whole("batches_per_interval", 1, 10_000),
        new_customers_per_interval=whole("new_customers_per_interval", 1, 10_000_000),
        new_vms_per_interval=whole("new_vms_per_interval", 1, 10_000_000),
        report_rows_per_interval=whole("report_rows_per_interval", 1, 10_000_000),
        max_error_chars=whole("max_error_chars", 20, 2000),
    )
    r.done()
    return config


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The daemon's and gmd-admin's configuration (see :func:`read_document` for where)."""
    return parse(*read_document(path))
