"""The daemon's and gmd-admin's configuration: one validated object, loaded once at start.

Read from ``/etc/gmd/gmd.toml``, or the path in ``--config`` / ``GMD_CONFIG``
(:func:`gmd.common.config.read_document`); every table but ``[agent]`` and ``[broker]`` is
validated here, with errors that name the file and the key.

Every key is declared once, as a field of its table's configuration class
(:mod:`gmd.common.settings`; the enforcement tables in :mod:`gmd.daemon.enforce.settings`,
``[placement]`` in :mod:`gmd.daemon.placement.settings`): its
default, its bounds and what it means. :func:`parse` reads each table through those
declarations and writes by hand only the rules that span several keys; docs/configuration.md
shows the declarations as tables, and ``etc/gmd.toml`` shows each key with its default
(``tests/unit/common/test_config_defaults.py`` checks both).
"""

from __future__ import annotations

import copy
import itertools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gmd.common.config import Reader, default_database_url, read_document
from gmd.common.options import (
    Choice,
    Count,
    ExistingFile,
    Flag,
    FreeTable,
    Kind,
    Number,
    NumberOr,
    Option,
    Pattern,
    Text,
)
from gmd.common.settings import Table, read_table, setting, subtable, table, table_of
from gmd.common.units import DAY_S, WEEK_S
from gmd.daemon.enforce.settings import EnforcementConfig, QuotaConfig
from gmd.daemon.placement.settings import PlacementConfig
from gmd.fairness.cloud import ConsumerMode, EndowmentMode
from gmd.fairness.decay import DEFAULT_HALF_LIFE_S
from gmd.fairness.directcontr import Utility
from gmd.fairness.interval import IntervalSettings
from gmd.wire import RESOURCES_COMBINED, RESOURCES_SPLIT, canonical_customer, resource_names

DATABASE = Table(
    "database",
    "The ledger: SQLite by default, PostgreSQL in production.",
    (
        Option(
            None,
            "the ledger: ``sqlite:///PATH`` or ``postgresql+psycopg://USER:PASSWORD@HOST/DB``",
            key="url",
            shown="``ledger.db`` in the state directory (``/var/lib/gmd`` as root, else ``./var``)",
        ),
        Option(
            None,
            "a streaming replica (hot standby) of ``url`` for gmd-admin's read-only commands,"
            " so that heavy reports never load the primary; the same kind of database as"
            " ``url``",
            key="read_url",
            shown="none: everything reads ``url``",
        ),
    ),
)
"""``[database]``: its keys are :class:`Config`'s ``database_url`` and ``read_url``, read by
:func:`parse` (each is checked against the other)."""

WEIGHTS = Table(
    "accounting.weights",
    "Each resource's weight in the greediness, by its name as accounted (``split_io`` decides"
    " which are read); at least one must not be 0.",
    tuple(
        Number(
            1.0,
            f"the weight of {resource} (1: counts as much as the others; at most 1e6, beyond"
            " which a greediness overflows)",
            0.0,
            1e6,
            key=resource,
        )
        for resource in dict.fromkeys(RESOURCES_COMBINED + RESOURCES_SPLIT)
    ),
)


@table("accounting")
@dataclass(frozen=True)
class AccountingConfig:
    """How usage becomes balances: the interval, γ, endowments, consumers and decay."""

    interval_s: int = setting(
        Count(60, "length of one accounting interval", 1, DAY_S, whole=True, unit="seconds")
    )
    grace_s: int = setting(
        Count(
            45,
            "how long after an interval ends its samples may still arrive before it is closed:"
            " more than the agents' ``post_jitter_s`` (20) plus the 25 s a post may take to be"
            " stored; what arrives later is kept as late and changes nothing",
            0,
            DAY_S,
        )
    )
    gamma: float = setting(
        Number(0.5, "γ: how much of the resources a VM cedes is credited (the GM paper: 0.5)", 0, 1)
    )
    endowment: EndowmentMode = setting(
        Kind(
            EndowmentMode.flavor,
            "endowments: ``flavor`` (what each VM was configured with, scaled down on"
            " overcommitted hosts) or ``equal`` (each VM on a host gets the same share)",
        )
    )
    consumer: ConsumerMode = setting(
        Kind(
            ConsumerMode.vm,
            "consumers on a host: ``vm`` (each VM) or ``customer`` (a customer's VMs on a host"
            " together)",
        )
    )
    half_life_s: float | None = setting(
        NumberOr(
            DEFAULT_HALF_LIFE_S,
            "balances halve every this many seconds (> 0; 7 days, like Slurm's"
            ' PriorityDecayHalfLife), or ``"none"``: kept for ever',
            word="none",
            noun="seconds",
            infinite=True,
        )
    )
    utility: Utility = setting(
        Kind(
            Utility.psi_double_prime,
            "DirectContr utility: ``psi_double_prime`` (ψ″, work done), ``psi`` (ψ) or"
            " ``psi_prime`` (ψ′)",
        )
    )
    split_io: bool = setting(
        Flag(False, "six resources (disk and network split into read/write, rx/tx) instead of four")
    )
    weights: dict[str, float] = field(
        default_factory=lambda: {r: WEIGHTS.option(r).default for r in resource_names(False)}
    )
    """each resource's weight (1: counts as much as the others), by its name as accounted
    (:data:`WEIGHTS`)"""

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


def _per_interval(default: int, help: str, high: int) -> Count:
    return Count(default, help, 1, high, whole=True)


@table("daemon.limits")
@dataclass(frozen=True)
class LimitsConfig:
    """What one host (one token) may claim of the ledger, per host (see
    :mod:`gmd.daemon.ingest.limits`), so that a stolen or broken token cannot fill it. The defaults
    leave a host of a 100,000-VM cloud, which runs hundreds of VMs and builds at most a few at
    once (Nova's ``max_concurrent_builds`` is 10), several times what it needs, and bound what
    a stolen or buggy token can write to a few hundred rows a minute. "An interval" is
    ``accounting.interval_s`` of the daemon's clock; the counts are each daemon's own."""

    batches_per_interval: int = setting(
        _per_interval(
            4,
            "distinct batches a host may store for one interval (422 beyond): one, or a few"
            " after an agent's restart mid-interval (retries of a stored batch are duplicates"
            " and do not count)",
            10_000,
        )
    )
    new_customers_per_interval: int = setting(
        _per_interval(
            100,
            "customers the ledger does not know that a host may introduce per interval (429"
            " with Retry-After beyond; a host's first batch after the daemon starts is exempt)",
            10_000_000,
        )
    )
    new_vms_per_interval: int = setting(
        _per_interval(
            200,
            "VMs the ledger does not know that a host may introduce per interval (as"
            " ``new_customers_per_interval``)",
            10_000_000,
        )
    )
    report_rows_per_interval: int = setting(
        _per_interval(
            1000,
            "enforcement-log rows (VM results of plan reports) a host may write per interval",
            10_000_000,
        )
    )
    max_error_chars: int = setting(
        Count(
            500,
            "a host's error text in a plan report is cut to this many characters, marked as cut",
            20,
            2000,
            whole=True,
        )
    )


@table("daemon")
@dataclass(frozen=True)
class DaemonConfig:
    """gmd-daemon's HTTP service for the agents (``POST /v1/samples``, ``GET /v1/plan/HOST``),
    ``/healthz`` and ``/metrics``, what it takes from them, and its accountant."""

    bind: str = setting(Text("0.0.0.0", "the address gmd-daemon listens on"))
    port: int = setting(Count(8470, "its port", 0, 65535))
    auth: str = setting(
        Choice(
            "token",
            "``token``: every host is listed under ``[hosts]`` with its token's SHA-256 and"
            " sends ``Authorization: Bearer TOKEN``; ``none``: anyone who reaches the port may"
            " post (test beds only)",
            ("token", "none"),
        )
    )
    tls_cert: Path | None = setting(
        ExistingFile(
            None,
            "HTTPS certificate (PEM; relative to this file), given with ``tls_key``",
            shown="none: HTTP",
        )
    )
    tls_key: Path | None = setting(
        ExistingFile(
            None,
            "its private key (PEM; relative to this file), given with ``tls_cert``",
            shown="none: HTTP",
        )
    )
    clock_skew_s: int = setting(
        Count(
            300,
            "batches for intervals that end more than this far in the future are refused (425:"
            " the agent keeps them and sends them again)",
            0,
            DAY_S,
        )
    )
    max_batch_vms: int = setting(
        Count(2000, "VMs in one batch (413 beyond): a compute host runs hundreds at most", 1, 10**6)
    )
    max_body_bytes: int = setting(
        Count(
            16 * 1024 * 1024,
            "bytes in one request body (413 beyond)",
            1024,
            2**31,
            shown="``16777216`` (16 MiB)",
        )
    )
    ingest_threads: int = setting(
        Count(
            2,
            "threads that parse and store batches: parsing holds Python's global interpreter"
            " lock, so more only contend for it; to ingest more, run more daemons on one ledger",
            1,
            64,
        )
    )
    share_port: bool = setting(
        Flag(
            False,
            "let several gmd-daemon processes on this machine listen on the same port"
            " (``SO_REUSEPORT``): the kernel spreads the agents' connections over them, so"
            " ingest can use more than the one core a process's interpreter lock allows; each"
            " must say true. PostgreSQL only",
        )
    )
    accounting: bool = setting(
        Flag(
            True,
            "run the accountant in this daemon (several daemons on one PostgreSQL may all: an"
            " advisory lock lets one account at a time)",
        )
    )
    account_every_s: float = setting(
        Number(10.0, "how often the accountant looks for intervals past their grace", 0.01, 3600)
    )
    max_late_s: int = setting(
        Count(
            WEEK_S,
            "batches for intervals that ended longer ago than this are refused (422)",
            60,
            366 * DAY_S,
            shown="``604800`` (7 days)",
        )
    )
    plausibility_margin: float = setting(
        Number(
            0.1,
            "slack, as a fraction, on the plausibility bounds: no VM may use more of a"
            " resource than its host offers in the interval, nor all the host's VMs together",
            0.0,
            10.0,
        )
    )
    max_host_cores: float = setting(
        Number(
            4096.0, "the largest sane host: a capacity or flavor beyond is refused (422)", 1, 1e7
        )
    )
    max_host_memory_bytes: float = setting(
        Number(
            float(64 * 2**40),
            "as ``max_host_cores``, for memory",
            2**20,
            2**70,
            shown="``70368744177664`` (64 TiB)",
        )
    )
    max_host_disk_bytes_per_s: float = setting(
        Number(
            1e11,
            "as ``max_host_cores``, for disk bandwidth (100 GB/s: more than a dozen NVMe"
            " drives); no other check bounds what a host claims of disk, Placement holds no"
            " bandwidth",
            1,
            1e15,
        )
    )
    max_host_network_bytes_per_s: float = setting(
        Number(
            1e11,
            "as ``max_host_cores``, for network bandwidth (100 GB/s: two 400 Gbit/s links); no"
            " other check bounds what a host claims of network",
            1,
            1e15,
        )
    )
    limits: LimitsConfig = subtable(LimitsConfig)

    def max_capacity(self) -> tuple[float, ...]:
        """The sane bounds of a host's capacity, one per :data:`~gmd.wire.CAPACITY_FIELDS`."""
        return (
            self.max_host_cores,
            self.max_host_memory_bytes,
            self.max_host_disk_bytes_per_s,
            self.max_host_network_bytes_per_s,
        )


@table("retention")
@dataclass(frozen=True)
class RetentionConfig:
    """How long the ledger keeps each kind of row, in days (0: for ever); ``gmd-admin db
    usage`` shows what each table holds and when its oldest rows go."""

    raw_days: float = setting(
        Number(
            31.0,
            "samples, batches and hosts' capacities (on PostgreSQL whole daily partitions are"
            " dropped; on SQLite rows are deleted in chunks); must outlast"
            " ``daemon.max_late_s`` by a day",
            0,
            100 * 366,
        )
    )
    ledger_days: float = setting(
        Number(
            400.0,
            "the per-interval customer, resource and organization rows; at least ``raw_days``",
            0,
            100 * 366,
        )
    )
    rollup_days: float = setting(
        Number(
            0.0,
            "the hourly and daily rollups that reports read for long ranges; at least"
            " ``ledger_days``",
            0,
            1000 * 366,
        )
    )
    every_s: float = setting(Number(3600.0, "how often the daemon purges", 1, WEEK_S))
    delete_chunk: int = setting(
        Count(10_000, "rows deleted per transaction (SQLite)", 1, 10_000_000)
    )
    max_run_s: float = setting(
        Number(
            60.0, "one purge stops after this long; the next goes on where it stopped", 0.1, DAY_S
        )
    )

    def cutoff_s(self, days: float, now_s: float) -> int | None:
        """The time before which rows kept ``days`` days are due; None: kept for ever."""
        return None if days == 0 else int(now_s - days * DAY_S)


ORGANIZATIONS = Table(
    "organizations",
    "Who owns the hosts, and which organizations are also customers (DirectContr).",
    (
        Text(
            "operator",
            "the organization that owns hosts not listed under ``[hosts]``",
            key="default_owner",
        ),
        # Stored as the ledger stores customers (one spelling per project id).
        FreeTable(
            {},
            "a table organization = OpenStack project uuid: organizations that are also customers",
            key="customers",
            shown="none",
            convert=canonical_customer,
        ),
    ),
)
"""``[organizations]``: its keys are :class:`Config`'s ``default_owner`` and
``organization_customers`` (a host's owner defaults to the first)."""


@table("hosts.NAME")
@dataclass(frozen=True)
class HostConfig:
    """One table per compute host, ``[hosts.NAME]``: the agent authenticates with a bearer
    token of which only the SHA-256 is kept here (``printf %s "$TOKEN" | sha256sum``)."""

    name: str
    owner: str = setting(
        Option[Any](
            None,
            "the organization that owns this host",
            shown="``organizations.default_owner``",
        )
    )
    token_sha256: str | None = setting(
        Pattern(
            None,
            "the SHA-256 of the host's token: 64 lowercase hex digits",
            shown='none (only with ``daemon.auth = "none"``)',
            pattern=r"[0-9a-f]{64}\Z",
            problem="must be 64 lowercase hex digits (sha256sum of the token)",
        )
    )


READ_AUTH = ("off", "local", "keystone")
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@table("read_api")
@dataclass(frozen=True)
class ReadApiConfig:
    """Standings, reports, explanations, plots and the enforcement log over HTTP
    (docs/api.md), and who may read them (the rules: :mod:`gmd.daemon.api.access`)."""

    auth: str = setting(
        Choice(
            "off",
            "``off`` (no read route), ``local`` (every request is the operator's: only with"
            ' ``daemon.bind = "127.0.0.1"``) or ``keystone`` (an ``X-Auth-Token`` checked by'
            " keystonemiddleware, rights by oslo.policy)",
            READ_AUTH,
        )
    )
    keystone: dict[str, str] = setting(
        FreeTable(
            {},
            "keystonemiddleware's auth_token options, as any OpenStack service's"
            " ``[keystone_authtoken]``; ``www_authenticate_uri``, ``auth_url`` and"
            ' ``auth_type`` are required with ``auth = "keystone"``',
            shown="none",
            kinds=(str, int, float, bool),
        )
    )
    policy_file: Path | None = setting(
        ExistingFile(
            None,
            "oslo.policy rules over the defaults (``fairness:read_everyone``,"
            " ``fairness:read_project``), YAML; relative to this file",
            shown="none: the defaults",
        )
    )
    admin_project_id: str = setting(
        Text(
            "",
            "the project whose admins and readers read every customer (besides system-scoped"
            " tokens); empty: none",
        )
    )
    concurrent: int = setting(
        Count(
            2,
            "read requests (standings, reports, explanations, plots, what-ifs, pages) served at"
            " once; the agents' routes, /healthz and /metrics never wait behind them",
            1,
            64,
        )
    )
    queue_s: float = setting(
        Number(
            10.0,
            "how long a read request waits for its turn before it is answered 503 with Retry-After",
            0,
            600,
        )
    )
    whatif_max_s: float = setting(
        Number(
            120.0,
            "how long one what-if over the API may replay before it is stopped (503); one whose"
            " client has gone stops at its next interval",
            1,
            3600,
        )
    )
    whatif_max_intervals: int = setting(
        Count(
            100_000,
            "the most intervals one what-if replays (gmd-admin whatif too; more: refused, 400)",
            1,
            1_000_000,
        )
    )


TABLES: tuple[Table, ...] = (
    DATABASE,
    table_of(AccountingConfig),
    WEIGHTS,
    table_of(DaemonConfig),
    table_of(LimitsConfig),
    table_of(ReadApiConfig),
    table_of(EnforcementConfig),
    table_of(QuotaConfig),
    table_of(PlacementConfig),
    table_of(RetentionConfig),
    ORGANIZATIONS,
    table_of(HostConfig),
)
"""The tables the daemon reads, in etc/gmd.toml's order (the agent's:
:data:`gmd.agent.config.TABLES`)."""


@dataclass(frozen=True)
class Config:
    path: Path | None
    database_url: str
    accounting: AccountingConfig
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    default_owner: str = ORGANIZATIONS.option("default_owner").default
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
    root = Reader(source, "", document, path)
    url, read_url = _database(root.sub("database"))
    accounting = _accounting(root.sub("accounting"))
    daemon_reader = root.sub("daemon")
    daemon = read_table(DaemonConfig, daemon_reader)
    if (daemon.tls_cert is None) != (daemon.tls_key is None):
        key = "tls_cert" if daemon.tls_cert is None else "tls_key"
        raise daemon_reader.fail(key, "give tls_cert and tls_key together")
    if daemon.share_port and url.startswith("sqlite:"):
        raise daemon_reader.fail(
            "share_port", "needs a PostgreSQL ledger: one process at a time writes SQLite"
        )
    read_api = _read_api(root.sub("read_api"), daemon)
    enforcement = read_table(EnforcementConfig, root.sub("enforcement"))
    retention = _retention(root.sub("retention"), daemon)
    placement = _placement(root.sub("placement"), enforcement.quota.cloud)

    orgs = root.sub("organizations")
    default_owner = ORGANIZATIONS.option("default_owner").read(orgs)
    org_customers = ORGANIZATIONS.option("customers").read(orgs)
    orgs.done()
    hosts = _hosts(root.sub("hosts"), default_owner)
    # [agent] belongs to gmd-agent, which validates it (gmd.agent.config), and [broker] to
    # gmd-broker (gmd.broker.config); one file can serve a host that runs several of them.
    root.get("agent", dict, {})
    root.get("broker", dict, {})
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


def _hosts(r: Reader, default_owner: str) -> dict[str, HostConfig]:
    """``[hosts.NAME]`` each; a host's owner is the default owner unless it names one."""
    hosts = {}
    for name in r.table:
        h = r.sub(name)
        hosts[name] = read_table(HostConfig, h, name=name, owner=h.get("owner", str, default_owner))
    r.done()
    return hosts


def _database(db: Reader) -> tuple[str, str | None]:
    """``[database]``: the ledger's URL and its read replica's. The replica's is checked as the
    primary's is, so that a typo in either is caught when the file is read, not at the first
    report; and a replica is a copy of the ledger: a SQLite file cannot stream from PostgreSQL,
    nor the reverse, so a mixed pair is a mistake in the file, not a set-up to run with."""
    url, read_url = (_database_url(db, option) for option in DATABASE.options)
    url = url or default_database_url()
    if read_url is not None and read_url.startswith("sqlite:") != url.startswith("sqlite:"):
        raise db.fail(
            "read_url",
            f"{read_url!r} is not the same kind of database as url {url.split(':')[0]!r}",
        )
    db.done()
    return url, read_url


def _database_url(db: Reader, option: Option[str | None]) -> str | None:
    """A database URL, None when absent or empty."""
    url = option.read(db)
    if not url:
        return None
    if not url.startswith(("sqlite:", "postgresql")):
        raise db.fail(option.key, f"{url!r}: use sqlite:///PATH or postgresql+psycopg://...")
    return url


def _accounting(acc: Reader) -> AccountingConfig:
    """``[accounting]``, whose ``weights`` table holds a weight for each resource that
    ``split_io`` says is accounted."""
    weights_reader = acc.sub("weights")
    config = read_table(AccountingConfig, acc)
    weights = {r: WEIGHTS.option(r).read(weights_reader) for r in config.resources}
    weights_reader.done()
    if not any(weights.values()):
        raise acc.fail("weights", "are all zero: at least one resource must count")
    return replace(config, weights=weights)


def _placement(r: Reader, quota_cloud: str) -> PlacementConfig:
    """``[placement]``, whose cloud is the quotas' unless it names its own."""
    cloud = table_of(PlacementConfig).option("cloud").read(r) or quota_cloud
    config = read_table(PlacementConfig, r, cloud=cloud)
    if config.on and not config.cloud:
        raise r.fail(
            "cloud",
            'is required with verify = "on" (a clouds.yaml entry; [enforcement.quota] cloud'
            " serves when set)",
        )
    return config


def _retention(r: Reader, daemon: DaemonConfig) -> RetentionConfig:
    config = read_table(RetentionConfig, r)
    # A batch may arrive max_late_s after its interval: its day must still be kept, or the
    # late batch would land in a day already purged.
    if config.raw_days and config.raw_days * DAY_S <= daemon.max_late_s + DAY_S:
        raise r.fail(
            "raw_days",
            f"{config.raw_days:g} days do not outlast [daemon] max_late_s"
            f" ({daemon.max_late_s / DAY_S:g} days) by a day: raw data must be kept longer"
            " than a batch may arrive late",
        )
    # A summary kept for less than what it sums would leave a span summed nowhere. Raw data
    # kept for ever (raw_days = 0) is the exception: what it sums can be summed again from it
    # (gmd-admin whatif replays it), so the defaults of the others stand beside it.
    longest = [(k, getattr(config, k)) for k in ("raw_days", "ledger_days", "rollup_days")]
    for (shorter, a), (longer, b) in itertools.pairwise(longest):
        if b and (a > b or (a == 0 and shorter != "raw_days")):
            raise r.fail(
                longer,
                f"{b:g} days is shorter than {shorter} ({'for ever' if a == 0 else f'{a:g}'}):"
                " each summary must be kept at least as long as what it sums",
            )
    return config


def _read_api(r: Reader, daemon: DaemonConfig) -> ReadApiConfig:
    config = read_table(ReadApiConfig, r)
    if config.auth == "local" and daemon.bind not in LOOPBACK:
        raise r.fail(
            "auth",
            f'"local" serves the ledger to anyone who can connect: bind the daemon to'
            f' 127.0.0.1 (daemon.bind is {daemon.bind!r}), or use "keystone"',
        )
    if config.auth == "keystone":
        for key in ("www_authenticate_uri", "auth_url", "auth_type"):
            if key not in config.keystone:
                raise r.fail(f"keystone.{key}", 'is required with auth = "keystone"')
    return config


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The daemon's and gmd-admin's configuration (see :func:`read_document` for where)."""
    return parse(*read_document(path))
