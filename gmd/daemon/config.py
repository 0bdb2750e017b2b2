"""The daemon's and gmd-admin's configuration: one validated object, loaded once at start.

Read from ``/etc/gmd/gmd.toml``, or the path in ``--config`` / ``GMD_CONFIG``
(:func:`gmd.common.config.read_document`); every table but ``[agent]`` is validated here, with
errors that name the file and the key.

Every key is declared once, in the :class:`~gmd.common.config.Table` of its section
(:data:`TABLES`): its default, its bounds and what it means. The configuration classes take
their defaults from there, docs/configuration.md shows the declarations as tables, and
``etc/gmd.toml`` shows each key with its default
(``tests/unit/common/test_config_defaults.py`` checks both).
"""

from __future__ import annotations

import copy
import enum
import itertools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gmd.common.config import (
    Choice,
    ConfigError,
    Count,
    Flag,
    Kind,
    Number,
    Option,
    Reader,
    Table,
    Text,
    default_database_url,
    read_document,
)
from gmd.common.units import DAY_S, WEEK_S
from gmd.fairness.cloud import ConsumerMode, EndowmentMode
from gmd.fairness.decay import DEFAULT_HALF_LIFE_S
from gmd.fairness.directcontr import Utility
from gmd.fairness.interval import IntervalSettings
from gmd.fairness.policy import CapResource, ContentionPolicy, DiskWeightFallback, ThrottlePolicy
from gmd.wire import (
    RESOURCES_COMBINED,
    RESOURCES_SPLIT,
    PlanMode,
    canonical_customer,
    resource_names,
)


class Database(Table):
    """The ledger: SQLite by default, PostgreSQL in production."""

    name = "database"

    url = Option(
        None,
        "the ledger: ``sqlite:///PATH`` or ``postgresql+psycopg://USER:PASSWORD@HOST/DB``",
        shown="``ledger.db`` in the state directory (``/var/lib/gmd`` as root, else ``./var``)",
    )
    read_url = Option(
        None,
        "a streaming replica (hot standby) of ``url`` for gmd-admin's read-only commands, so"
        " that heavy reports never load the primary; the same kind of database as ``url``",
        shown="none: everything reads ``url``",
    )


class Accounting(Table):
    """How usage becomes balances: the interval, γ, endowments, consumers and decay."""

    name = "accounting"

    interval_s = Count(
        60, "length of one accounting interval", 1, DAY_S, whole=True, unit="seconds"
    )
    grace_s = Count(
        45,
        "how long after an interval ends its samples may still arrive before it is closed:"
        " more than the agents' ``post_jitter_s`` (20) plus the 25 s a post may take to be"
        " stored; what arrives later is kept as late and changes nothing",
        0,
        DAY_S,
    )
    gamma = Number(
        0.5, "γ: how much of the resources a VM cedes is credited (the GM paper: 0.5)", 0.0, 1.0
    )
    endowment = Kind(
        EndowmentMode.flavor,
        "endowments: ``flavor`` (what each VM was configured with, scaled down on"
        " overcommitted hosts) or ``equal`` (each VM on a host gets the same share)",
    )
    consumer = Kind(
        ConsumerMode.vm,
        "consumers on a host: ``vm`` (each VM) or ``customer`` (a customer's VMs on a host"
        " together)",
    )
    half_life_s = Option(
        DEFAULT_HALF_LIFE_S,
        "balances halve every this many seconds (> 0; 7 days, like Slurm's"
        ' PriorityDecayHalfLife), or ``"none"``: kept for ever',
    )
    utility = Kind(
        Utility.psi_double_prime,
        "DirectContr utility: ``psi_double_prime`` (ψ″, work done), ``psi`` (ψ) or"
        " ``psi_prime`` (ψ′)",
    )
    split_io = Flag(
        False,
        "six resources (disk and network split into read/write, rx/tx) instead of four",
    )


class Weights(Table):
    """Each resource's weight in the greediness, by its name as accounted (``split_io``
    decides which are read); at least one must not be 0."""

    name = "accounting.weights"
    options = tuple(
        Number(
            1.0,
            f"the weight of {resource} (1: counts as much as the others; at most 1e6, beyond"
            " which a greediness overflows)",
            0.0,
            1e6,
            key=resource,
        )
        for resource in dict.fromkeys(RESOURCES_COMBINED + RESOURCES_SPLIT)
    )


@dataclass(frozen=True)
class AccountingConfig:
    interval_s: int = Accounting.interval_s.default
    grace_s: int = Accounting.grace_s.default
    gamma: float = Accounting.gamma.default
    endowment: EndowmentMode = Accounting.endowment.default
    consumer: ConsumerMode = Accounting.consumer.default
    half_life_s: float | None = Accounting.half_life_s.default
    utility: Utility = Accounting.utility.default
    split_io: bool = Accounting.split_io.default
    weights: dict[str, float] = field(
        default_factory=lambda: {
            r: Weights.option(r).default for r in resource_names(Accounting.split_io.default)
        }
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


class Limits(Table):
    """What one host (one token) may claim of the ledger, per host (see
    :mod:`gmd.daemon.api.limits`), so that a stolen or broken token cannot fill it. The defaults
    leave a host of a 100,000-VM cloud, which runs hundreds of VMs and builds at most a few at
    once (Nova's ``max_concurrent_builds`` is 10), several times what it needs, and bound what
    a stolen or buggy token can write to a few hundred rows a minute. "An interval" is
    ``accounting.interval_s`` of the daemon's clock; the counts are each daemon's own."""

    name = "daemon.limits"

    batches_per_interval = Count(
        4,
        "distinct batches a host may store for one interval (422 beyond): one, or a few after"
        " an agent's restart mid-interval (retries of a stored batch are duplicates and do not"
        " count)",
        1,
        10_000,
        whole=True,
    )
    new_customers_per_interval = Count(
        100,
        "customers the ledger does not know that a host may introduce per interval (429 with"
        " Retry-After beyond; a host's first batch after the daemon starts is exempt)",
        1,
        10_000_000,
        whole=True,
    )
    new_vms_per_interval = Count(
        200,
        "VMs the ledger does not know that a host may introduce per interval (as"
        " ``new_customers_per_interval``)",
        1,
        10_000_000,
        whole=True,
    )
    report_rows_per_interval = Count(
        1000,
        "enforcement-log rows (VM results of plan reports) a host may write per interval",
        1,
        10_000_000,
        whole=True,
    )
    max_error_chars = Count(
        500,
        "a host's error text in a plan report is cut to this many characters, marked as cut",
        20,
        2000,
        whole=True,
    )


@dataclass(frozen=True)
class LimitsConfig:
    """``[daemon.limits]``: what one host may claim of the ledger (:class:`Limits`)."""

    batches_per_interval: int = Limits.batches_per_interval.default
    new_customers_per_interval: int = Limits.new_customers_per_interval.default
    new_vms_per_interval: int = Limits.new_vms_per_interval.default
    report_rows_per_interval: int = Limits.report_rows_per_interval.default
    max_error_chars: int = Limits.max_error_chars.default


class Daemon(Table):
    """gmd-daemon's HTTP service for the agents (``POST /v1/samples``, ``GET /v1/plan/HOST``),
    ``/healthz`` and ``/metrics``, what it takes from them, and its accountant."""

    name = "daemon"

    bind = Text("0.0.0.0", "the address gmd-daemon listens on")
    port = Count(8470, "its port", 0, 65535)
    auth = Choice(
        "token",
        "``token``: every host is listed under ``[hosts]`` with its token's SHA-256 and sends"
        " ``Authorization: Bearer TOKEN``; ``none``: anyone who reaches the port may post"
        " (test beds only)",
        ("token", "none"),
    )
    tls_cert = Option(
        None,
        "HTTPS certificate (PEM; relative to this file), given with ``tls_key``",
        shown="none: HTTP",
    )
    tls_key = Option(
        None,
        "its private key (PEM; relative to this file), given with ``tls_cert``",
        shown="none: HTTP",
    )
    clock_skew_s = Count(
        300,
        "batches for intervals that end more than this far in the future are refused (425: the"
        " agent keeps them and sends them again)",
        0,
        DAY_S,
    )
    max_batch_vms = Count(
        2000,
        "VMs in one batch (413 beyond): a compute host runs hundreds at most",
        1,
        1_000_000,
    )
    max_body_bytes = Count(
        16 * 1024 * 1024,
        "bytes in one request body (413 beyond)",
        1024,
        2**31,
        shown="``16777216`` (16 MiB)",
    )
    ingest_threads = Count(
        2,
        "threads that parse and store batches: parsing holds Python's global interpreter"
        " lock, so more only contend for it; to ingest more, run more daemons on one ledger",
        1,
        64,
    )
    share_port = Flag(
        False,
        "let several gmd-daemon processes on this machine listen on the same port"
        " (``SO_REUSEPORT``): the kernel spreads the agents' connections over them, so ingest"
        " can use more than the one core a process's interpreter lock allows; each must say"
        " true. PostgreSQL only",
    )
    accounting = Flag(
        True,
        "run the accountant in this daemon (several daemons on one PostgreSQL may all: an"
        " advisory lock lets one account at a time)",
    )
    account_every_s = Number(
        10.0, "how often the accountant looks for intervals past their grace", 0.01, 3600
    )
    max_late_s = Count(
        WEEK_S,
        "batches for intervals that ended longer ago than this are refused (422)",
        60,
        366 * DAY_S,
        shown="``604800`` (7 days)",
    )
    plausibility_margin = Number(
        0.1,
        "slack, as a fraction, on the plausibility bounds: no VM may use more of a resource"
        " than its host offers in the interval, nor all the host's VMs together",
        0.0,
        10.0,
    )
    max_host_cores = Number(
        4096.0, "the largest sane host: a capacity or flavor beyond is refused (422)", 1, 1e7
    )
    max_host_memory_bytes = Number(
        float(64 * 2**40),
        "as ``max_host_cores``, for memory",
        2**20,
        2**70,
        shown="``70368744177664`` (64 TiB)",
    )
    max_host_disk_bytes_per_s = Number(
        1e11,
        "as ``max_host_cores``, for disk bandwidth (100 GB/s: more than a dozen NVMe drives);"
        " no other check bounds what a host claims of disk, Placement holds no bandwidth",
        1,
        1e15,
    )
    max_host_network_bytes_per_s = Number(
        1e11,
        "as ``max_host_cores``, for network bandwidth (100 GB/s: two 400 Gbit/s links); no"
        " other check bounds what a host claims of network",
        1,
        1e15,
    )


@dataclass(frozen=True)
class DaemonConfig:
    bind: str = Daemon.bind.default
    port: int = Daemon.port.default
    auth: str = Daemon.auth.default
    tls_cert: Path | None = Daemon.tls_cert.default
    tls_key: Path | None = Daemon.tls_key.default
    clock_skew_s: int = Daemon.clock_skew_s.default
    max_batch_vms: int = Daemon.max_batch_vms.default
    max_body_bytes: int = Daemon.max_body_bytes.default
    ingest_threads: int = Daemon.ingest_threads.default
    share_port: bool = Daemon.share_port.default
    accounting: bool = Daemon.accounting.default
    account_every_s: float = Daemon.account_every_s.default
    max_late_s: int = Daemon.max_late_s.default
    plausibility_margin: float = Daemon.plausibility_margin.default
    max_host_cores: float = Daemon.max_host_cores.default
    max_host_memory_bytes: float = Daemon.max_host_memory_bytes.default
    max_host_disk_bytes_per_s: float = Daemon.max_host_disk_bytes_per_s.default
    max_host_network_bytes_per_s: float = Daemon.max_host_network_bytes_per_s.default
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


class Enforcement(Table):
    """What the daemon decides and does about greedy customers: levels with hysteresis, what
    each level does, and on which hosts its hard caps apply. The defaults are
    :class:`~gmd.fairness.policy.ThrottlePolicy`'s and
    :class:`~gmd.fairness.policy.ContentionPolicy`'s; the lists hold one value per level."""

    name = "enforcement"

    mode = Kind(
        PlanMode.dry_run,
        "``off``: decide nothing; ``dry-run``: decide levels, plans and quota changes and record"
        " them as what gmd would do, applying nothing; ``on``: also apply them",
    )
    enter = Option(
        ThrottlePolicy.enter,
        "level k is entered when a customer's score (its balance, less ``priority_weight`` ×"
        " its DirectContr priority) reaches ``enter[k-1]``; increasing",
    )
    leave = Option(
        ThrottlePolicy.leave,
        "and left only when the score falls below ``leave[k-1]`` (< ``enter[k-1]``: hysteresis)",
    )
    dwell_s = Number(
        ThrottlePolicy.dwell_s, "seconds a level is held before it may change", 0, 30 * DAY_S
    )
    max_step = Count(ThrottlePolicy.max_step, "at most this many levels per decision", 1, 100)
    priority_weight = Number(
        ThrottlePolicy.priority_weight,
        "how much a customer's DirectContr priority (contribution − utility) lowers its score;"
        " 0: the balance alone decides",
        0,
    )
    weight_factors = Option(
        ThrottlePolicy.weight_factors,
        "per level, the factor on a VM's CPU and I/O scheduling weights (work conserving: they"
        " only bite on contended hosts); in (0, 1], not growing with the level",
    )
    weight_floor = Number(ThrottlePolicy.weight_floor, "no weight factor below this", 0, 1)
    cap_level = Count(
        ThrottlePolicy.cap_level,
        "from this level on, hard caps: CPU and disk (levels + 1: never)",
        1,
        100,
    )
    cpu_cap_fractions = Option(
        ThrottlePolicy.cpu_cap_fractions,
        "per level, a VM's CPU cap as a fraction of its vCPUs; in (0, 1]",
    )
    cap_floor = Number(ThrottlePolicy.cap_floor, "no CPU cap fraction below this", 0, 1)
    disk_caps_bytes_per_s = Option(
        tuple(c or 0.0 for c in ThrottlePolicy.disk_caps_bytes_per_s),
        "per level, a VM's disk cap in bytes/s (0: none)",
    )
    quota_level = Count(
        ThrottlePolicy.quota_level,
        "from this level on, the customer's OpenStack quota is lowered by one step per level"
        " (levels + 1: never)",
        1,
        100,
    )
    contended_above = Number(
        ContentionPolicy.cpu_above,
        "a level's caps apply only on a host whose VMs together used at least this fraction"
        " of its capacity over its last ``contention_intervals``; one fraction for both, or"
        " one per resource: ``{ cpu = 0.8, disk = 0.6 }``; 0: on every host",
        0,
        1,
    )
    contention_intervals = Count(
        ContentionPolicy.intervals,
        "how many of a host's last accounted intervals ``contended_above`` looks at",
        1,
        1440,
        whole=True,
        unit="intervals",
    )
    others_above = Number(
        ContentionPolicy.others_above,
        "a customer's caps apply on a contended host only where the other customers' VMs used"
        " at least this fraction of it (per resource, over the same intervals): caps protect"
        " others, and a customer alone on a host it keeps busy loses to a cap only what nobody"
        " else wanted; 0: wherever the host is contended",
        0,
        1,
    )
    disk_weight_fallback = Kind(
        DiskWeightFallback.limit,
        "on a host whose agent says it has no disk weight (no BFQ on its disks: most NVMe and"
        " virtio hosts), ``limit``: a throttled VM's disk is held instead to a bytes/s limit of"
        " the share its weight would give it, where the host's disk is contended"
        " (``contended_above``); ``none``: weights only, and the host's plan says disk"
        " throttling is unavailable there",
    )


class Quota(Table):
    """OpenStack compute quotas: each step removes ``step_*`` of the original quota (a
    fraction), never below ``floor_*``; the original is kept in the ledger and written back
    exactly when the customer's level drops below ``enforcement.quota_level``."""

    name = "enforcement.quota"

    cloud = Text(
        "",
        "the clouds.yaml entry gmd-daemon changes quotas with (an admin of the projects);"
        " empty: no quota changes",
    )
    backend = Kind(
        QuotaBackendKind.auto,
        "where the cloud keeps compute quotas: ``nova`` (Nova's quota API), ``keystone-limits``"
        " (unified limits: Keystone project limits) or ``auto`` (found out from the cloud)",
    )
    limits_cloud = Text(
        "",
        "the clouds.yaml entry that writes Keystone limits, where that is another account"
        " than ``cloud``'s; empty: ``cloud``",
    )
    step_cores = Number(0.25, "each step removes this fraction of the original cores", 0, 1)
    step_ram = Number(0.25, "each step removes this fraction of the original RAM", 0, 1)
    step_instances = Number(0.25, "each step removes this fraction of the original instances", 0, 1)
    floor_cores = Count(1, "never fewer cores than this (-1: never lower them)", -1, 10**9)
    floor_ram_mb = Count(2048, "never less RAM than this (-1: never lower it)", -1, 10**12)
    floor_instances = Count(1, "never fewer instances than this (-1: never lower them)", -1, 10**9)
    every_s = Number(60.0, "how often quotas are brought in line with the levels", 1, DAY_S)
    timeout_s = Number(10.0, "each API request's timeout", 0.1, 600)
    retries = Count(2, "retries of a request (timeouts and 5xx only)", 0, 20)
    names_every_s = Number(
        3600.0,
        "how often customers' project names are read from Keystone (0: never; names then come"
        " from the Nova metadata)",
        0,
        WEEK_S,
    )


@dataclass(frozen=True)
class QuotaConfig:
    """``[enforcement.quota]``: OpenStack compute quotas (:class:`Quota`); ``cloud`` names the
    clouds.yaml entry ("" = no quotas)."""

    cloud: str = Quota.cloud.default
    backend: QuotaBackendKind = Quota.backend.default
    limits_cloud: str = Quota.limits_cloud.default
    step_cores: float = Quota.step_cores.default
    step_ram: float = Quota.step_ram.default
    step_instances: float = Quota.step_instances.default
    floor_cores: int = Quota.floor_cores.default
    floor_ram_mb: int = Quota.floor_ram_mb.default
    floor_instances: int = Quota.floor_instances.default
    every_s: float = Quota.every_s.default
    timeout_s: float = Quota.timeout_s.default
    retries: int = Quota.retries.default
    names_every_s: float = Quota.names_every_s.default


@dataclass(frozen=True)
class EnforcementConfig:
    """``mode``: "off" decides nothing; "dry-run" decides and records what it would do;
    "on" also applies it. ``policy`` holds the thresholds and what each level does;
    ``contention`` on which hosts a level's hard caps apply."""

    mode: PlanMode = Enforcement.mode.default
    policy: ThrottlePolicy = field(default_factory=ThrottlePolicy)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    contention: ContentionPolicy = field(default_factory=ContentionPolicy)
    disk_weight_fallback: DiskWeightFallback = Enforcement.disk_weight_fallback.default


class Retention(Table):
    """How long the ledger keeps each kind of row, in days (0: for ever); ``gmd-admin db
    usage`` shows what each table holds and when its oldest rows go."""

    name = "retention"

    raw_days = Number(
        31.0,
        "samples, batches and hosts' capacities (on PostgreSQL whole daily partitions are"
        " dropped; on SQLite rows are deleted in chunks); must outlast ``daemon.max_late_s``"
        " by a day",
        0,
        100 * 366,
    )
    ledger_days = Number(
        400.0,
        "the per-interval customer, resource and organization rows; at least ``raw_days``",
        0,
        100 * 366,
    )
    rollup_days = Number(
        0.0,
        "the hourly and daily rollups that reports read for long ranges; at least ``ledger_days``",
        0,
        1000 * 366,
    )
    every_s = Number(3600.0, "how often the daemon purges", 1, WEEK_S)
    delete_chunk = Count(10_000, "rows deleted per transaction (SQLite)", 1, 10_000_000)
    max_run_s = Number(
        60.0, "one purge stops after this long; the next goes on where it stopped", 0.1, DAY_S
    )


@dataclass(frozen=True)
class RetentionConfig:
    """``[retention]``: how long the ledger keeps each kind of row (:class:`Retention`)."""

    raw_days: float = Retention.raw_days.default
    ledger_days: float = Retention.ledger_days.default
    rollup_days: float = Retention.rollup_days.default
    every_s: float = Retention.every_s.default
    delete_chunk: int = Retention.delete_chunk.default
    max_run_s: float = Retention.max_run_s.default

    def cutoff_s(self, days: float, now_s: float) -> int | None:
        """The time before which rows kept ``days`` days are due; None: kept for ever."""
        return None if days == 0 else int(now_s - days * DAY_S)


PLACEMENT_VERIFY = ("auto", "on", "off")


class Placement(Table):
    """Whether Placement vouches for what hosts claim (see :mod:`gmd.daemon.placement`)."""

    name = "placement"

    verify = Choice(
        "auto",
        "``on``: every batch is checked against Placement before it is stored (a VM Placement"
        " contradicts is set aside, its samples quarantined; Placement unreachable: stored"
        " unverified, verified later); ``auto``: on wherever a cloud is configured (``cloud``"
        " here or ``[enforcement.quota] cloud``), off in clouds without OpenStack; ``off``:"
        " hosts' tokens are trusted (a warning at every start where a cloud is configured)",
        PLACEMENT_VERIFY,
    )
    cloud = Text(
        "",
        "the clouds.yaml entry (an account that may read resource providers and allocations);"
        " empty: ``[enforcement.quota] cloud``'s",
    )
    refresh_s = Number(
        300.0, "how old a host's snapshot may grow before it is read again", 1, DAY_S
    )
    timeout_s = Number(
        5.0,
        "each request's timeout; never retried: a batch that cannot be verified is verified later",
        0.1,
        600,
    )
    miss_s = Number(
        30.0,
        "at most one read per host this often for a VM or capacity its snapshot does not vouch for",
        0,
        DAY_S,
    )
    wait_s = Number(
        900.0,
        "how long accounting waits, past an interval's grace, for its batches stored unverified",
        0,
        WEEK_S,
    )
    providers: Option[dict[str, str]] = Option(
        {},
        "a table host = its resource provider's name, where that is not the host's own name"
        " (Nova's)",
        shown="none: each host's own name",
    )


@dataclass(frozen=True)
class PlacementConfig:
    """``[placement]``: whether Placement vouches for what hosts claim (:class:`Placement`)."""

    verify: str = Placement.verify.default
    cloud: str = Placement.cloud.default
    """the clouds.yaml entry Placement is read with: this table's, else the quotas'"""
    refresh_s: float = Placement.refresh_s.default
    timeout_s: float = Placement.timeout_s.default
    miss_s: float = Placement.miss_s.default
    wait_s: float = Placement.wait_s.default
    providers: dict[str, str] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        """Whether batches are checked: ``on``, or ``auto`` where a cloud is configured."""
        return self.verify == "on" or (self.verify == "auto" and bool(self.cloud))

    @property
    def trusting_a_cloud(self) -> bool:
        """Turned off explicitly although a cloud is configured: said at every start."""
        return self.verify == "off" and bool(self.cloud)

    def provider_name(self, host: str) -> str:
        """The name of the host's resource provider in Placement."""
        return self.providers.get(host, host)


class Organizations(Table):
    """Who owns the hosts, and which organizations are also customers (DirectContr)."""

    name = "organizations"

    default_owner = Text(
        "operator", "the organization that owns hosts not listed under ``[hosts]``"
    )
    customers: Option[dict[str, str]] = Option(
        {},
        "a table organization = OpenStack project uuid: organizations that are also customers",
        shown="none",
    )


class Host(Table):
    """One table per compute host, ``[hosts.NAME]``: the agent authenticates with a bearer
    token of which only the SHA-256 is kept here (``printf %s "$TOKEN" | sha256sum``)."""

    name = "hosts.NAME"

    owner = Option(
        None,
        "the organization that owns this host",
        shown="``organizations.default_owner``",
    )
    token_sha256 = Option(
        None,
        "the SHA-256 of the host's token: 64 lowercase hex digits",
        shown='none (only with ``daemon.auth = "none"``)',
    )


@dataclass(frozen=True)
class HostConfig:
    name: str
    owner: str
    token_sha256: str | None = Host.token_sha256.default


READ_AUTH = ("off", "local", "keystone")
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


class ReadApi(Table):
    """Standings, reports, explanations, plots and the enforcement log over HTTP
    (docs/api.md), and who may read them."""

    name = "read_api"

    auth = Choice(
        "off",
        "``off`` (no read route), ``local`` (every request is the operator's: only with"
        ' ``daemon.bind = "127.0.0.1"``) or ``keystone`` (an ``X-Auth-Token`` checked by'
        " keystonemiddleware, rights by oslo.policy)",
        READ_AUTH,
    )
    keystone: Option[dict[str, str]] = Option(
        {},
        "keystonemiddleware's auth_token options, as any OpenStack service's"
        " ``[keystone_authtoken]``; ``www_authenticate_uri``, ``auth_url`` and ``auth_type``"
        ' are required with ``auth = "keystone"``',
        shown="none",
    )
    policy_file = Option(
        None,
        "oslo.policy rules over the defaults (``fairness:read_everyone``,"
        " ``fairness:read_project``), YAML; relative to this file",
        shown="none: the defaults",
    )
    admin_project_id = Text(
        "",
        "the project whose admins and readers read every customer (besides system-scoped"
        " tokens); empty: none",
    )
    concurrent = Count(
        2,
        "read requests (standings, reports, explanations, plots, what-ifs, pages) served at"
        " once; the agents' routes, /healthz and /metrics never wait behind them",
        1,
        64,
    )
    queue_s = Number(
        10.0,
        "how long a read request waits for its turn before it is answered 503 with Retry-After",
        0,
        600,
    )
    whatif_max_s = Number(
        120.0,
        "how long one what-if over the API may replay before it is stopped (503); one whose"
        " client has gone stops at its next interval",
        1,
        3600,
    )
    whatif_max_intervals = Count(
        100_000,
        "the most intervals one what-if replays (gmd-admin whatif too; more: refused, 400)",
        1,
        1_000_000,
    )


@dataclass(frozen=True)
class ReadApiConfig:
    """``[read_api]``: who may read standings, reports, explanations and plots over HTTP
    (:class:`ReadApi`; the rules: :mod:`gmd.daemon.api.access`)."""

    auth: str = ReadApi.auth.default
    keystone: dict[str, str] = field(default_factory=dict)
    admin_project_id: str = ReadApi.admin_project_id.default
    policy_file: Path | None = ReadApi.policy_file.default
    concurrent: int = ReadApi.concurrent.default
    queue_s: float = ReadApi.queue_s.default
    whatif_max_s: float = ReadApi.whatif_max_s.default
    whatif_max_intervals: int = ReadApi.whatif_max_intervals.default


TABLES: tuple[type[Table], ...] = (
    Database,
    Accounting,
    Weights,
    Daemon,
    Limits,
    ReadApi,
    Enforcement,
    Quota,
    Placement,
    Retention,
    Organizations,
    Host,
)
"""The tables the daemon reads, in etc/gmd.toml's order (the agent's:
:data:`gmd.agent.config.TABLES`)."""


@dataclass(frozen=True)
class Config:
    path: Path | None
    database_url: str
    accounting: AccountingConfig
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    default_owner: str = Organizations.default_owner.default
    hosts: dict[str, HostConfig] = field(default_factory=dict)
    organization_customers: dict[str, str] = field(default_factory=dict)
    enforcement: EnforcementConfig = field(default_factory=EnforcementConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    # A streaming replica of database_url for gmd-admin's reads, so that heavy reports do not
    # load the primary that ingests and accounts; None reads from database_url.
    read_url: str | None = Database.read_url.default
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
    interval = acc.option(Accounting.interval_s)
    half_life = acc.get("half_life_s", (int, float, str), Accounting.half_life_s.default)
    if half_life == "none":
        half_life = None
    elif isinstance(half_life, str) or not half_life > 0:
        raise acc.fail("half_life_s", f'{half_life!r}: give seconds > 0, or "none"')
    utility = acc.option(Accounting.utility)
    split = acc.option(Accounting.split_io)
    resources = resource_names(split)
    weights_reader = acc.sub("weights")
    weights = {r: weights_reader.option(Weights.option(r)) for r in resources}
    weights_reader.done()
    accounting = AccountingConfig(
        interval_s=interval,
        grace_s=acc.option(Accounting.grace_s),
        gamma=acc.option(Accounting.gamma),
        endowment=acc.option(Accounting.endowment),
        consumer=acc.option(Accounting.consumer),
        half_life_s=None if half_life is None else float(half_life),
        utility=utility,
        split_io=split,
        weights=weights,
    )
    if not any(weights.values()):
        raise acc.fail("weights", "are all zero: at least one resource must count")
    acc.done()

    daemon_reader = root.sub("daemon")
    daemon = _daemon(daemon_reader, path)
    if daemon.share_port and url.startswith("sqlite:"):
        raise daemon_reader.fail(
            "share_port", "needs a PostgreSQL ledger: one process at a time writes SQLite"
        )
    read_api = _read_api(root.sub("read_api"), daemon, path)
    enforcement = _enforcement(root.sub("enforcement"))
    retention = _retention(root.sub("retention"), daemon)
    placement = _placement(root.sub("placement"), enforcement.quota.cloud)

    orgs = root.sub("organizations")
    default_owner = orgs.option(Organizations.default_owner)
    customers_reader = orgs.sub("customers")
    # Stored as the ledger stores customers (one spelling per project id).
    org_customers = {
        name: canonical_customer(customers_reader.get(name, str, None))
        for name in customers_reader.table
    }
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


def _numbers(r: Reader, option: Option[tuple[float, ...]]) -> tuple[float, ...]:
    """A list of numbers, one per level (the levels' count is the policy's to check)."""
    key = option.key
    values = r.get(key, list, list(option.default))
    if not values or any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise r.fail(key, f"{values!r}: give a list of numbers, one per level")
    return tuple(float(v) for v in values)


def _enforcement(e: Reader) -> EnforcementConfig:
    disk = _numbers(e, Enforcement.disk_caps_bytes_per_s)
    try:
        policy = ThrottlePolicy(
            enter=_numbers(e, Enforcement.enter),
            leave=_numbers(e, Enforcement.leave),
            dwell_s=e.option(Enforcement.dwell_s),
            max_step=e.option(Enforcement.max_step),
            priority_weight=e.option(Enforcement.priority_weight),
            weight_factors=_numbers(e, Enforcement.weight_factors),
            weight_floor=e.option(Enforcement.weight_floor),
            cap_level=e.option(Enforcement.cap_level),
            cpu_cap_fractions=_numbers(e, Enforcement.cpu_cap_fractions),
            cap_floor=e.option(Enforcement.cap_floor),
            disk_caps_bytes_per_s=tuple(None if c == 0 else c for c in disk),
            quota_level=e.option(Enforcement.quota_level),
        )
    except ConfigError:
        raise
    except ValueError as exc:
        raise e.fail("", str(exc)) from None
    mode = e.option(Enforcement.mode)
    contention = _contention(e)
    q = e.sub("quota")
    quota = QuotaConfig(
        cloud=q.option(Quota.cloud),
        backend=q.option(Quota.backend),
        limits_cloud=q.option(Quota.limits_cloud),
        step_cores=q.option(Quota.step_cores),
        step_ram=q.option(Quota.step_ram),
        step_instances=q.option(Quota.step_instances),
        floor_cores=q.option(Quota.floor_cores),
        floor_ram_mb=q.option(Quota.floor_ram_mb),
        floor_instances=q.option(Quota.floor_instances),
        every_s=q.option(Quota.every_s),
        timeout_s=q.option(Quota.timeout_s),
        retries=q.option(Quota.retries),
        names_every_s=q.option(Quota.names_every_s),
    )
    q.done()
    fallback = e.option(Enforcement.disk_weight_fallback)
    e.done()
    return EnforcementConfig(mode, policy, quota, contention, fallback)


def _contention(e: Reader) -> ContentionPolicy:
    """``contended_above``: one fraction for every capped resource, or a table per resource
    (``{ cpu = 0.8, disk = 0.6 }``: a disk's configured bandwidth is often a rougher figure
    than its cores); ``contention_intervals``: how many of the host's last intervals count."""
    d = ContentionPolicy()
    declared = Enforcement.contended_above
    given = e.get(declared.key, (int, float, dict), None)
    if isinstance(given, dict):
        table = e.sub(declared.key)
        above = {
            r: table.option(replace(declared, key=r.value, default=d.threshold(r)))
            for r in CapResource
        }
        for key in table.table:
            if key not in above:
                raise table.fail(
                    key, f"caps exist for {' and '.join(CapResource)} only: no threshold for {key}"
                )
    else:
        both = e.option(declared)
        above = dict.fromkeys(CapResource, both)
    intervals = e.option(Enforcement.contention_intervals)
    others = e.option(Enforcement.others_above)
    return ContentionPolicy(above[CapResource.cpu], above[CapResource.disk], intervals, others)


def _placement(r: Reader, quota_cloud: str) -> PlacementConfig:
    names = r.sub("providers")
    providers = {host: names.get(host, str, host) for host in names.table}
    names.done()
    config = PlacementConfig(
        verify=r.option(Placement.verify),
        cloud=r.option(Placement.cloud) or quota_cloud,
        refresh_s=r.option(Placement.refresh_s),
        timeout_s=r.option(Placement.timeout_s),
        miss_s=r.option(Placement.miss_s),
        wait_s=r.option(Placement.wait_s),
        providers=providers,
    )
    if config.on and not config.cloud:
        raise r.fail(
            "cloud",
            'is required with verify = "on" (a clouds.yaml entry; [enforcement.quota] cloud'
            " serves when set)",
        )
    r.done()
    return config


def _retention(r: Reader, daemon: DaemonConfig) -> RetentionConfig:
    config = RetentionConfig(
        raw_days=r.option(Retention.raw_days),
        ledger_days=r.option(Retention.ledger_days),
        rollup_days=r.option(Retention.rollup_days),
        every_s=r.option(Retention.every_s),
        delete_chunk=r.option(Retention.delete_chunk),
        max_run_s=r.option(Retention.max_run_s),
    )
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
    r.done()
    return config


def _read_api(r: Reader, daemon: DaemonConfig, path: Path | None) -> ReadApiConfig:
    auth = r.option(ReadApi.auth)
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
    config = ReadApiConfig(
        auth,
        options,
        r.option(ReadApi.admin_project_id),
        policy_file,
        concurrent=r.option(ReadApi.concurrent),
        queue_s=r.option(ReadApi.queue_s),
        whatif_max_s=r.option(ReadApi.whatif_max_s),
        whatif_max_intervals=r.option(ReadApi.whatif_max_intervals),
    )
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
        bind=d.option(Daemon.bind),
        port=d.option(Daemon.port),
        auth=d.option(Daemon.auth),
        tls_cert=cert,
        tls_key=key,
        clock_skew_s=d.option(Daemon.clock_skew_s),
        max_batch_vms=d.option(Daemon.max_batch_vms),
        max_body_bytes=d.option(Daemon.max_body_bytes),
        ingest_threads=d.option(Daemon.ingest_threads),
        share_port=d.option(Daemon.share_port),
        accounting=d.option(Daemon.accounting),
        account_every_s=d.option(Daemon.account_every_s),
        max_late_s=d.option(Daemon.max_late_s),
        plausibility_margin=d.option(Daemon.plausibility_margin),
        max_host_cores=d.option(Daemon.max_host_cores),
        max_host_memory_bytes=d.option(Daemon.max_host_memory_bytes),
        max_host_disk_bytes_per_s=d.option(Daemon.max_host_disk_bytes_per_s),
        max_host_network_bytes_per_s=d.option(Daemon.max_host_network_bytes_per_s),
        limits=_limits(d.sub("limits")),
    )
    d.done()
    return config


def _limits(r: Reader) -> LimitsConfig:
    config = LimitsConfig(
        batches_per_interval=r.option(Limits.batches_per_interval),
        new_customers_per_interval=r.option(Limits.new_customers_per_interval),
        new_vms_per_interval=r.option(Limits.new_vms_per_interval),
        report_rows_per_interval=r.option(Limits.report_rows_per_interval),
        max_error_chars=r.option(Limits.max_error_chars),
    )
    r.done()
    return config


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The daemon's and gmd-admin's configuration (see :func:`read_document` for where)."""
    return parse(*read_document(path))
