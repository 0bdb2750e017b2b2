"""The ledger's tables (SQLAlchemy 2). Alembic migrations in ``migrations/`` create them.

Amounts are per interval in the resources' own units (core-seconds, byte-seconds, bytes), as
the agents measured them, so that re-accounting an interval from its samples gives the same
rows. Host capacity is kept per interval for the same reason: a host that grew does not
rewrite the past. Ledger rows hold the engine's results and the DirectContr sums they came
from, so that a balance can be explained from the rows alone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gmd.common.units import DAY_S
from gmd.ledger_schema.kinds import BatchState, IntervalState
from gmd.wire import FLAVOR_FIELDS, USAGE_FIELDS

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


ID64 = BigInteger().with_variant(Integer, "sqlite")
"""Ids that grow with time, batches or samples: 64-bit on PostgreSQL (a 100,000-VM cloud posts
7.2 M batches a day, past 2^31 in ten months). SQLite's INTEGER is 64-bit already, and only
INTEGER makes a primary key the rowid that numbers rows by itself."""


class UtcDateTime(TypeDecorator[datetime]):
    """A moment, always read back as an aware UTC datetime.

    PostgreSQL's ``timestamptz`` comes back aware, SQLite's text without a zone: comparing the
    two (a host report's time with a level decision's) raised ``TypeError``. The zone is
    settled here, where every such column is read, once for all readers; a moment written
    with another zone is stored as UTC (SQLite would drop its offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


PARTITIONED = ("samples", "batches", "host_intervals")
"""On PostgreSQL these raw tables are partitioned by ``RANGE (interval_id)``, one partition a
UTC day in the schema :data:`PARTITION_SCHEMA` (so that neither reflection nor autogenerate
sees them), dropped whole past retention. Their primary keys lead with ``interval_id``, as
PostgreSQL requires of a partitioned table; the models keep the logical key. Created by the
migrations (0007), kept by :mod:`gmd.daemon.ledger.partitions`."""
PARTITION_SCHEMA = "gmd_partitions"
PARTITION_PARENT = {"samples": "sample_batches"}
"""The table that holds a partition, where it is not the one the partition is named after:
the samples of a day are ``gmd_partitions.samples_<day>``, a partition of ``sample_batches``
(migration 0013)."""


class Organization(Base):
    """Whoever contributed hosts; may also be a customer (then ``customer_id`` is set)."""

    __tablename__ = "organizations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    customer_id: Mapped[int | None] = mapped_column(ForeignKey("customers.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now())


class Customer(Base):
    """Whoever the flat rate is sold to: an OpenStack project, named by its uuid."""

    __tablename__ = "customers"
    # SQLite would reuse the largest id once its row is purged; a cached id must never come
    # to name another customer (migration 0010).
    __table_args__ = ({"sqlite_autoincrement": True},)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now())
    display_name: Mapped[str | None] = mapped_column(String(255))
    """The project's name, for people (Keystone's, else the Nova metadata's); None: unknown"""
    display_source: Mapped[str | None] = mapped_column(String(16))
    """Where display_name was read: a :class:`NameSource`"""
    last_seen_s: Mapped[int | None] = mapped_column(BigInteger, index=True)
    """The start of an interval in which a sample named it, less than :data:`SEEN_PERIOD_S`
    before its last (None: named only by configuration): retention purges a customer unseen
    past raw retention that nothing else names"""


class Host(Base):
    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    organization_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    last_seen_s: Mapped[int | None] = mapped_column(BigInteger)


SEEN_PERIOD_S = DAY_S
"""How stale ``vms.last_seen_s`` and ``customers.last_seen_s`` may be: ingest marks a host's VMs
and customers seen once in each period of this length (gmd.daemon.ingest.ids), so a row's
last sample came less than this after its ``last_seen_s``, and retention waits this much longer
before it deletes an unseen row (gmd.daemon.ledger.retention)."""


class Vm(Base):
    """A libvirt domain; its flavor is kept per sample (it can be resized)."""

    __tablename__ = "vms"
    __table_args__ = ({"sqlite_autoincrement": True},)  # as customers'
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    created_s: Mapped[int | None] = mapped_column(BigInteger)
    last_seen_s: Mapped[int | None] = mapped_column(BigInteger, index=True)
    """The start of an interval in which it had a sample, less than :data:`SEEN_PERIOD_S`
    before its last: retention purges a VM once no sample of it can be left"""


class Interval(Base):
    """An accounting period ``[start_s, start_s + length_s)``, open → closed → accounted."""

    __tablename__ = "intervals"
    id: Mapped[int] = mapped_column(ID64, primary_key=True)
    """The interval's start in Unix seconds (``start_s``): ids order as time does, a range
    of time is a range of ids, and the raw tables partition by it."""
    start_s: Mapped[int] = mapped_column(BigInteger, unique=True)
    length_s: Mapped[int] = mapped_column(Integer)
    state: Mapped[IntervalState] = mapped_column(
        Enum(IntervalState, name="interval_state", native_enum=False, length=16),
        default=IntervalState.open,
    )
    accounted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    ledger_rows: Mapped[int | None] = mapped_column(Integer)


class Batch(Base):
    """One agent POST; its key makes a retried batch count once, its digest catches key reuse."""

    __tablename__ = "batches"
    # The few batches an operator must look at (gmd-admin batches --quarantined), found without
    # reading the millions that were simply accepted.
    __table_args__ = (
        Index(
            "ix_batches_unsettled",
            "state",
            postgresql_where=text("state <> 'accepted'"),
            sqlite_where=text("state <> 'accepted'"),
        ),
        # A key is unique per interval (a partitioned table's unique keys must hold its
        # partition key); ingest looks a key up in every interval before it stores a batch.
        UniqueConstraint("key", "interval_id"),
        # The batches Placement has yet to vouch for ([placement] verify = "on"): few, found
        # by the daemon's job and by accounting without reading the rest.
        Index(
            "ix_batches_unverified",
            "unverified",
            postgresql_where=text("unverified"),
            sqlite_where=text("unverified"),
        ),
    )
    id: Mapped[int] = mapped_column(ID64, primary_key=True)
    key: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(64))
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id"), index=True)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now())
    samples: Mapped[int] = mapped_column(Integer)
    late: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    state: Mapped[BatchState] = mapped_column(
        Enum(BatchState, name="batch_state", native_enum=False, length=16),
        default=BatchState.accepted,
        server_default=BatchState.accepted.value,
    )
    error: Mapped[str | None] = mapped_column(Text)
    host_cpu_s: Mapped[float | None] = mapped_column(Double)
    """the host's busy CPU seconds in the interval as this batch gave them (NULL: not
    reported); a host's batches for one interval add up, as their samples do"""
    unverified: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """stored while Placement could not be reached: not yet vouched for (its VMs' rows were
    left as they were); the daemon's job verifies it, or quarantines it"""


class HostInterval(Base):
    """A host's capacity during one interval (its supply is capacity × length), as its first
    accepted batch gave it: a later batch with another capacity is refused, never applied.
    Accounting reads the rows of hosts with an on-time batch it accounts, so a row that a late
    batch created changes no accounted interval."""

    __tablename__ = "host_intervals"
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id"), primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    organization_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    cpu_cores: Mapped[float] = mapped_column(Double)
    memory_bytes: Mapped[float] = mapped_column(Double)
    disk_bytes_per_s: Mapped[float] = mapped_column(Double)
    network_bytes_per_s: Mapped[float] = mapped_column(Double)


class _SampleColumns:
    """What one VM used on one host in one interval, per batch, with its owner and flavor then.

    One row per batch and VM: an agent restarted mid-interval sends the rest under a new key,
    and accounting adds the rows up (owner and flavor from the latest batch). Keeping batches
    apart lets accounting leave out exactly one batch that it cannot account (quarantine).
    Samples that arrive after their interval closed have ``late`` set, so that accounting, and
    re-accounting, read exactly the on-time rows. Flavor amounts are NULL where the flavor sets
    none.

    This is the ledger's one high-volume table, so it has no foreign key: the references are
    written by the one ingest path in the same transaction that creates, finds or (once a day)
    marks seen what they point to, and retention deletes a VM only once no sample of it is
    left. Each per-row foreign-key check cost ~4 ms per 500-VM batch on PostgreSQL, 60 % of
    the insert with all five; and a key on ``vm_id`` made every VM deleted scan every raw
    partition (migration 0010).
    """

    id: Mapped[int] = mapped_column(ID64, primary_key=True)
    interval_id: Mapped[int] = mapped_column(ID64)
    vm_id: Mapped[int] = mapped_column(Integer)
    host_id: Mapped[int] = mapped_column(Integer)
    customer_id: Mapped[int] = mapped_column(Integer)
    batch_id: Mapped[int] = mapped_column(ID64, index=True)
    cpu_s: Mapped[float] = mapped_column(Double)
    memory_byte_s: Mapped[float] = mapped_column(Double)
    disk_read_bytes: Mapped[float] = mapped_column(Double)
    disk_write_bytes: Mapped[float] = mapped_column(Double)
    network_rx_bytes: Mapped[float] = mapped_column(Double)
    network_tx_bytes: Mapped[float] = mapped_column(Double)
    flavor_vcpus: Mapped[float | None] = mapped_column(Double)
    flavor_memory_bytes: Mapped[float | None] = mapped_column(Double)
    flavor_disk_bytes_per_s: Mapped[float | None] = mapped_column(Double)
    flavor_network_bytes_per_s: Mapped[float | None] = mapped_column(Double)
    late: Mapped[bool] = mapped_column(Boolean, default=False)


class Sample(_SampleColumns, Base):
    __doc__ = _SampleColumns.__doc__
    # On PostgreSQL ``samples`` is a view of :data:`sample_batches` with these columns but
    # ``id``; SQLite stores this table.
    __tablename__ = "samples"
    __table_args__ = (
        Index("ix_samples_interval_host_vm", "interval_id", "host_id", "vm_id"),
        # Late samples are few; whether an interval has any is answered without reading the
        # others.
        Index(
            "ix_samples_late",
            "interval_id",
            postgresql_where=text("late"),
            sqlite_where=text("late"),
        ),
    )


SAMPLE_IDS = ("vm_id", "customer_id")
# The samples' figures are the wire's fields (flavors prefixed), in the order of RESOURCES.
USE_COLUMNS = USAGE_FIELDS
FLAVOR_COLUMNS = tuple(f"flavor_{f}" for f in FLAVOR_FIELDS)
SAMPLE_FIGURES = (*USE_COLUMNS, *FLAVOR_COLUMNS)
PER_VM = (*SAMPLE_IDS, *SAMPLE_FIGURES)
"""The columns of ``samples`` that differ from VM to VM in a batch: arrays in
``sample_batches``."""

PACKED = MetaData(naming_convention=NAMING)
"""PostgreSQL's storage of the samples (migration 0013), apart from :class:`Base`'s metadata:
on PostgreSQL ``samples`` is a view of it, on SQLite the table of :class:`Sample`."""

sample_batches = Table(
    "sample_batches",
    PACKED,
    Column("interval_id", BigInteger, primary_key=True),
    Column("batch_id", BigInteger, primary_key=True),
    Column("host_id", Integer, nullable=False),
    Column("late", Boolean, nullable=False),
    *(Column(c, ARRAY(Integer), nullable=False) for c in SAMPLE_IDS),
    *(Column(c, ARRAY(Double), nullable=False) for c in SAMPLE_FIGURES),
    Index("ix_sample_batches_interval_host", "interval_id", "host_id"),
    Index("ix_sample_batches_batch_id", "batch_id"),
    Index("ix_sample_batches_late", "interval_id", postgresql_where=text("late")),
)
"""One row per batch, element ``k`` of each :data:`PER_VM` array being its ``k``-th VM's.

A sample row cost 239 bytes for ~110 bytes of figures (a tuple header, a line pointer and
three index entries per VM); one header and one index entry per batch leave the figures
nearly bare. Partitioned by day like the other raw tables (:data:`PARTITIONED`)."""


class QuarantinedSample(_SampleColumns, Base):
    """The samples of quarantined batches, moved out of ``samples`` so that neither accounting
    nor any report reads them until the operator releases or drops their batch."""

    __tablename__ = "quarantined_samples"


class CustomerLedger(Base):
    """A customer's standing after one interval."""

    __tablename__ = "customer_ledger"
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id"), primary_key=True)
    customer_id: Mapped[int] = mapped_column(
        ForeignKey("customers.id"), primary_key=True, index=True
    )
    greediness: Mapped[float] = mapped_column(Double)
    balance: Mapped[float] = mapped_column(Double)
    utility_work: Mapped[float] = mapped_column(Double)
    utility_moment: Mapped[float] = mapped_column(Double)
    utility: Mapped[float] = mapped_column(Double)
    priority: Mapped[float] = mapped_column(Double)
    vms: Mapped[int] = mapped_column(Integer)


class CustomerResourceLedger(Base):
    """One resource's term of a customer's interval greediness (they sum to it).

    ``customer_id`` has no foreign key: accounting writes these rows beside the customer's
    ``customer_ledger`` row, whose indexed key vouches for it, and a key here would make every
    customer retention deletes scan this table, which no index leads with ``customer_id``."""

    __tablename__ = "customer_resource_ledger"
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id"), primary_key=True)
    customer_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    resource: Mapped[str] = mapped_column(String(16), primary_key=True)
    term: Mapped[float] = mapped_column(Double)


class OrganizationLedger(Base):
    """An organization's DirectContr standing after one interval."""

    __tablename__ = "organization_ledger"
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id"), primary_key=True)
    organization_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    contribution_work: Mapped[float] = mapped_column(Double)
    contribution_moment: Mapped[float] = mapped_column(Double)
    contribution: Mapped[float] = mapped_column(Double)
    utility: Mapped[float] = mapped_column(Double)
    priority: Mapped[float] = mapped_column(Double)


class CustomerLevel(Base):
    """A customer's throttle level now and since when: the state hysteresis and dwell need."""

    __tablename__ = "customer_levels"
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), primary_key=True)
    level: Mapped[int] = mapped_column(Integer)
    since_s: Mapped[float] = mapped_column(Double)
    score: Mapped[float] = mapped_column(Double)
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id"))


class QuotaOriginal(Base):
    """A customer's compute quota before gmd first lowered it, to restore it exactly, and how
    many steps below it gmd holds it (``applied`` False: only decided, in dry-run)."""

    __tablename__ = "quota_originals"
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), primary_key=True)
    cloud: Mapped[str] = mapped_column(String(255), primary_key=True)
    cores: Mapped[int] = mapped_column(Integer)
    ram_mb: Mapped[int] = mapped_column(Integer)
    instances: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    applied: Mapped[bool] = mapped_column(Boolean)
    unset: Mapped[str] = mapped_column(String(64), server_default="")
    """Comma-separated resources that had no limit of the project's own (Keystone limits:
    restoring deletes the project limit gmd created)"""
    backend: Mapped[str | None] = mapped_column(String(32))
    """Where the lowered quota was written (``nova``, ``keystone-limits``); None until then"""
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now())


class EnforcementAction(Base):
    """Something gmd did or would do (dry-run) to a customer's VMs or quotas, and why."""

    __tablename__ = "enforcement_actions"
    id: Mapped[int] = mapped_column(ID64, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now())
    interval_id: Mapped[int | None] = mapped_column(ForeignKey("intervals.id"), index=True)
    customer_id: Mapped[int | None] = mapped_column(ForeignKey("customers.id"), index=True)
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"))
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    dry_run: Mapped[bool] = mapped_column(Boolean)
    before: Mapped[str | None] = mapped_column(Text)
    after: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    knobs: Mapped[str | None] = mapped_column(Text)
    """A host's report: per knob asked of (or put back on) the VM, ``{"cpu_cap": ["applied",
    ""], "disk_weight": ["unsupported", "why"]}``; NULL for other actions and older agents"""


class HostCapability(Base):
    """What a host's agent last said it can set (``PUT /v1/hosts/{host}/capabilities``): one row
    per host name, replaced whole. Keyed by name, not ``hosts.id``: an agent says it at start,
    before its first batch makes the host's row."""

    __tablename__ = "host_capabilities"
    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    reported_at: Mapped[datetime] = mapped_column(UtcDateTime())
    probed_s: Mapped[int] = mapped_column(BigInteger)
    document: Mapped[str] = mapped_column(Text)
    """the :class:`gmd.wire.HostCapabilities` as JSON"""


class BalanceReset(Base):
    """An operator's reset of a customer's balance to zero (``gmd-admin reset``).

    Ledger rows are never rewritten: the reset takes effect in the accounting of the first
    interval not yet accounted when it was made (``effective_start_s``), which starts the
    customer from a zero balance instead of its previous standing. The balance it threw away
    and the reason are kept for the audit."""

    __tablename__ = "balance_resets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=func.now())
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), index=True)
    effective_start_s: Mapped[int] = mapped_column(BigInteger, index=True)
    previous_balance: Mapped[float] = mapped_column(Double)
    requested_by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)


class RollupPeriod(Base):
    """A period (an hour or a UTC day) whose rollups are written: reports read the rollups of
    the periods listed here and the ledger's own rows elsewhere. An hour is rolled up in the
    transaction that accounts its last interval, a day with its last hour."""

    __tablename__ = "rollup_periods"
    period_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    """3600 (an hour) or 86400 (a UTC day)"""
    start_s: Mapped[int] = mapped_column(ID64, primary_key=True)
    intervals: Mapped[int] = mapped_column(Integer)
    """accounted intervals starting in the period"""
    with_rows: Mapped[int] = mapped_column(Integer)
    """of which with ledger rows (the others had no samples at all)"""
    seconds: Mapped[int] = mapped_column(BigInteger)
    """their total length"""
    end_interval_id: Mapped[int | None] = mapped_column(ID64)
    """the last interval with ledger rows: where the ``*_end`` standings were read"""


class CustomerRollup(Base):
    """A customer over a period: sums of its interval greediness, the most VMs it ran in one
    interval, what its VMs used (on-time samples), and its standing after the period."""

    __tablename__ = "customer_rollups"
    __table_args__ = (Index("ix_customer_rollups_customer", "customer_id", "period_s", "start_s"),)
    period_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_s: Mapped[int] = mapped_column(ID64, primary_key=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), primary_key=True)
    intervals: Mapped[int] = mapped_column(Integer)
    """intervals of the period in which it had a ledger row"""
    gm_sum: Mapped[float] = mapped_column(Double)
    gm_positive: Mapped[float] = mapped_column(Double)
    vms_max: Mapped[int] = mapped_column(Integer)
    balance_end: Mapped[float] = mapped_column(Double)
    utility_end: Mapped[float] = mapped_column(Double)
    priority_end: Mapped[float] = mapped_column(Double)
    cpu_s: Mapped[float] = mapped_column(Double)
    memory_byte_s: Mapped[float] = mapped_column(Double)
    disk_bytes: Mapped[float] = mapped_column(Double)
    network_bytes: Mapped[float] = mapped_column(Double)


class CustomerResourceRollup(Base):
    """One resource's terms of a customer's greediness over a period.

    ``customer_id`` has no foreign key, for the reason ``customer_resource_ledger`` has none:
    the customer's ``customer_rollups`` row beside it keeps the indexed one."""

    __tablename__ = "customer_resource_rollups"
    period_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_s: Mapped[int] = mapped_column(ID64, primary_key=True)
    customer_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    resource: Mapped[str] = mapped_column(String(16), primary_key=True)
    term_sum: Mapped[float] = mapped_column(Double)
    term_over: Mapped[float] = mapped_column(Double)
    """the sum of its positive terms"""
    term_under: Mapped[float] = mapped_column(Double)
    """the sum of its negative terms"""
    term_max: Mapped[float] = mapped_column(Double)


class HostRollup(Base):
    """A host over a period: its on-time samples, the most VMs and customers it ran in one
    interval, what they used and what it supplied."""

    __tablename__ = "host_rollups"
    period_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_s: Mapped[int] = mapped_column(ID64, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    organization_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    """its owner during the period's last interval"""
    samples: Mapped[int] = mapped_column(BigInteger)
    vms_max: Mapped[int] = mapped_column(Integer)
    customers_max: Mapped[int] = mapped_column(Integer)
    cpu_s: Mapped[float] = mapped_column(Double)
    memory_byte_s: Mapped[float] = mapped_column(Double)
    disk_bytes: Mapped[float] = mapped_column(Double)
    network_bytes: Mapped[float] = mapped_column(Double)
    cpu_supplied_core_s: Mapped[float] = mapped_column(Double)


class OrganizationRollup(Base):
    """An organization over a period: its DirectContr standing after it, and the CPU its
    hosts supplied and its customers' VMs used there."""

    __tablename__ = "organization_rollups"
    period_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_s: Mapped[int] = mapped_column(ID64, primary_key=True)
    organization_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    contribution_end: Mapped[float] = mapped_column(Double)
    utility_end: Mapped[float] = mapped_column(Double)
    priority_end: Mapped[float] = mapped_column(Double)
    cpu_supplied_core_s: Mapped[float] = mapped_column(Double)
    cpu_used_core_s: Mapped[float] = mapped_column(Double)
    customers_max: Mapped[int] = mapped_column(Integer)
    """the most customers its hosts served in one interval"""


class FederationEvent(Base):
    """A decision of this cloud's gmd-broker in a federation (docs/federation.md): the
    authoritative history of what the cloud lent and borrowed, which ZooKeeper only sums.

    A completion is written *before* it is made in ZooKeeper, with ``seq`` (this site's
    completion count in ZooKeeper after it) and ``counted`` unknown; once ZooKeeper answers it
    is settled true (counted: ``core_seconds`` went into the summaries) or false (refused: the
    request was no longer this site's). A broker that stopped in between settles it when it
    comes back, from the last completion ZooKeeper records for the site
    (:mod:`gmd.broker.history`)."""

    __tablename__ = "federation_events"
    __table_args__ = (UniqueConstraint("site", "seq"),)
    id: Mapped[int] = mapped_column(ID64, primary_key=True)
    at_s: Mapped[float] = mapped_column(Double, index=True)
    site: Mapped[str] = mapped_column(String(255))
    """the site whose broker decided (this cloud's)"""
    choice: Mapped[str] = mapped_column(String(16))
    request: Mapped[str] = mapped_column(String(255))
    """the request's id at the site that published it"""
    org: Mapped[str] = mapped_column(String(255))
    """the request's organisation"""
    request_site: Mapped[str] = mapped_column(String(255))
    """the site that published it"""
    node: Mapped[str | None] = mapped_column(String(64))
    """its node in ZooKeeper's queue (``req-<seq>``), where it had one"""
    cores: Mapped[float] = mapped_column(Double)
    core_seconds: Mapped[float] = mapped_column(Double)
    """a counted completion's amount: lent by this site's organisation to the request's"""
    seq: Mapped[int | None] = mapped_column(Integer)
    counted: Mapped[bool | None] = mapped_column(Boolean)


class FederationStanding(Base):
    """An organisation's standing in the federation as this cloud's broker last read it from
    ZooKeeper: what its sites lent and its requests borrowed (core-seconds), its priority, and
    its requests queued, running, lent and borrowed now. Replaced whole at every reading."""

    __tablename__ = "federation_standings"
    org: Mapped[str] = mapped_column(String(255), primary_key=True)
    contributed: Mapped[float] = mapped_column(Double)
    used: Mapped[float] = mapped_column(Double)
    priority: Mapped[float] = mapped_column(Double)
    queued: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)
    lent: Mapped[int] = mapped_column(Integer)
    """requests of other organisations its sites run now"""
    borrowed: Mapped[int] = mapped_column(Integer)
    """its requests other organisations' sites run now"""
    sites: Mapped[int] = mapped_column(Integer)
    """its sites that are members now"""
    as_of_s: Mapped[float] = mapped_column(Double)
    observer: Mapped[str] = mapped_column(String(255))
    """the site whose broker read it"""


def stored_metadata(dialect: str) -> MetaData:
    """The tables a ledger on ``dialect`` stores (what its migrations create): on PostgreSQL
    :data:`sample_batches` in place of ``samples``, which is a view there."""
    if dialect != "postgresql":
        return Base.metadata
    stored = MetaData(naming_convention=NAMING)
    for table in (*Base.metadata.tables.values(), sample_batches):
        if table.name != "samples":
            table.to_metadata(stored)
    return stored
