"""The ledger at cloud scale: interval ids are start times, 64-bit ids, partitioned raw data.

- ``intervals.id`` becomes the interval's start in Unix seconds, and every ``interval_id``
  with it (rows written before are renumbered): a range of time is a range of ids, so the raw
  tables partition by it and every query by time is a query by id.
- 64-bit: ``intervals.id`` and every ``interval_id``, ``batches.id``, ``samples.batch_id``,
  ``quarantined_samples.batch_id``, ``enforcement_actions.id`` (and their sequences).
- ``batches``: a key is unique per interval (``uq_batches_key`` on key and interval_id).
- ``ix_samples_late``: a partial index on the few late samples.
- PostgreSQL: ``samples``, ``batches`` and ``host_intervals`` become partitioned by
  ``RANGE (interval_id)``, one partition a UTC day in the schema ``gmd_partitions``, with
  primary keys that lead with ``interval_id``; their rows are copied over. Partitions are
  made for every day that has an interval and for the next few; the daemon keeps making them
  ahead (gmd.daemon.ledger.partitions).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 11:00:00.000000
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SCHEMA = "gmd_partitions"
DAY_S = 86400
AHEAD_DAYS = 3
PARTITIONED = ("samples", "batches", "host_intervals")
# Tables whose interval_id refers to intervals.id with a foreign key, and the one without.
REFERENCING = (
    "batches",
    "host_intervals",
    "customer_ledger",
    "customer_resource_ledger",
    "organization_ledger",
    "customer_levels",
    "enforcement_actions",
)
UNREFERENCED = ("samples", "quarantined_samples")
_LATE = sa.text("late")
_UNSETTLED = sa.text("state <> 'accepted'")
_USE = (
    "cpu_s",
    "memory_byte_s",
    "disk_read_bytes",
    "disk_write_bytes",
    "network_rx_bytes",
    "network_tx_bytes",
)
_FLAVOR = (
    "flavor_vcpus",
    "flavor_memory_bytes",
    "flavor_disk_bytes_per_s",
    "flavor_network_bytes_per_s",
)
_CAPACITY = ("cpu_cores", "memory_bytes", "disk_bytes_per_s", "network_bytes_per_s")


def _renumber(table: str, column: str) -> None:
    """``column`` from old interval ids to start times, through the map in ``gmd_ids``.
    Twice, through negative values, so that no row ever takes an id another row still has."""
    op.execute(f"UPDATE {table} SET {column} = -1 - {column} WHERE {column} IS NOT NULL")
    op.execute(
        f"UPDATE {table} SET {column} = (SELECT m.new_id FROM gmd_ids m"
        f" WHERE m.old_id = -1 - {table}.{column}) WHERE {column} < 0"
    )


def upgrade() -> None:
    bind = op.get_bind()
    op.execute("CREATE TEMPORARY TABLE gmd_ids (old_id BIGINT PRIMARY KEY, new_id BIGINT)")
    op.execute("INSERT INTO gmd_ids SELECT id, start_s FROM intervals")
    if bind.dialect.name == "postgresql":
        _upgrade_postgresql()
    else:
        _upgrade_sqlite()
    op.execute("DROP TABLE gmd_ids")


def _upgrade_sqlite() -> None:
    # INTEGER is 64-bit in SQLite already: only the numbers and the constraints change.
    for table in (*REFERENCING, *UNREFERENCED):
        _renumber(table, "interval_id")
    _renumber("intervals", "id")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_constraint("uq_batches_key", type_="unique")
        batch_op.create_unique_constraint("uq_batches_key", ["key", "interval_id"])
    op.create_index("ix_samples_late", "samples", ["interval_id"], unique=False, sqlite_where=_LATE)


def _foreign_keys_to_intervals(table: str) -> list[str]:
    inspector = sa.inspect(op.get_bind())
    return [
        fk["name"]
        for fk in inspector.get_foreign_keys(table)
        if fk["referred_table"] == "intervals" and fk["name"]
    ]


def _upgrade_postgresql() -> None:
    for table in REFERENCING:
        for name in _foreign_keys_to_intervals(table):
            op.drop_constraint(name, table, type_="foreignkey")
    op.alter_column("intervals", "id", type_=sa.BigInteger(), existing_nullable=False)
    op.execute("ALTER SEQUENCE IF EXISTS intervals_id_seq AS BIGINT")
    kept = [t for t in (*REFERENCING, "quarantined_samples") if t not in PARTITIONED]
    for table in kept:
        op.alter_column(table, "interval_id", type_=sa.BigInteger())
        _renumber(table, "interval_id")
    _renumber("intervals", "id")
    op.alter_column("quarantined_samples", "batch_id", type_=sa.BigInteger())
    op.alter_column("enforcement_actions", "id", type_=sa.BigInteger(), existing_nullable=False)
    op.execute("ALTER SEQUENCE enforcement_actions_id_seq AS BIGINT")

    op.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    for table in PARTITIONED:
        _set_aside(table)
    _create_partitioned()
    now_day = int(time.time()) // DAY_S
    days = {
        int(d)
        for (d,) in op.get_bind().execute(
            sa.text(f"SELECT DISTINCT start_s / {DAY_S} FROM intervals")
        )
    }
    for day in sorted(days | set(range(now_day - 1, now_day + AHEAD_DAYS + 1))):
        for table in PARTITIONED:
            _partition(table, day)
    _copy_partitioned()
    for table in PARTITIONED:
        op.execute(f"DROP TABLE {table}_0006")
    op.execute("ALTER SEQUENCE samples_id_seq OWNED BY samples.id")
    op.execute("ALTER SEQUENCE batches_id_seq AS BIGINT OWNED BY batches.id")
    for table in ("samples", "batches"):  # go on after the copied rows, whatever made them
        op.execute(
            f"SELECT setval('{table}_id_seq', (SELECT max(id) FROM {table}))"
            f" WHERE EXISTS (SELECT 1 FROM {table})"
        )
    for table in REFERENCING:
        if table not in PARTITIONED:
            op.create_foreign_key(
                f"fk_{table}_interval_id_intervals", table, "intervals", ["interval_id"], ["id"]
            )


def _set_aside(table: str) -> None:
    """Rename the old table out of the way, with the names of its keys and indexes."""
    bind = op.get_bind()
    for (index,) in bind.execute(
        sa.text("SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND tablename = :t"),
        {"t": table},
    ):
        constraint = bind.execute(
            sa.text(
                "SELECT 1 FROM pg_constraint WHERE conname = :n AND conrelid = CAST(:t AS regclass)"
            ),
            {"n": index, "t": table},
        ).first()
        if constraint:
            op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT "{index}" TO "{index}_0006"')
        else:
            op.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_0006"')
    if table in ("samples", "batches"):
        op.execute(f"ALTER SEQUENCE {table}_id_seq OWNED BY NONE")
    op.execute(f"ALTER TABLE {table} RENAME TO {table}_0006")


def _create_partitioned() -> None:
    by_interval = {"postgresql_partition_by": "RANGE (interval_id)"}
    op.create_table(
        "samples",
        sa.Column(
            "id",
            sa.BigInteger(),
            server_default=sa.text("nextval('samples_id_seq')"),
            nullable=False,
        ),
        sa.Column("interval_id", sa.BigInteger(), nullable=False),
        sa.Column("vm_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        *(sa.Column(c, sa.Double(), nullable=False) for c in _USE),
        *(sa.Column(c, sa.Double(), nullable=True) for c in _FLAVOR),
        sa.Column("late", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"], name="fk_samples_vm_id_vms"),
        sa.PrimaryKeyConstraint("interval_id", "id", name="pk_samples"),
        **by_interval,
    )
    op.create_index("ix_samples_interval_host_vm", "samples", ["interval_id", "host_id", "vm_id"])
    op.create_index("ix_samples_batch_id", "samples", ["batch_id"])
    op.create_index("ix_samples_late", "samples", ["interval_id"], postgresql_where=_LATE)

    op.create_table(
        "batches",
        sa.Column(
            "id",
            sa.BigInteger(),
            server_default=sa.text("nextval('batches_id_seq')"),
            nullable=False,
        ),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("interval_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("late", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("state", sa.String(length=16), server_default="accepted", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name="fk_batches_host_id_hosts"),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name="fk_batches_interval_id_intervals"
        ),
        sa.PrimaryKeyConstraint("interval_id", "id", name="pk_batches"),
        sa.UniqueConstraint("key", "interval_id", name="uq_batches_key"),
        **by_interval,
    )
    op.create_index("ix_batches_interval_id", "batches", ["interval_id"])
    op.create_index("ix_batches_unsettled", "batches", ["state"], postgresql_where=_UNSETTLED)

    op.create_table(
        "host_intervals",
        sa.Column("interval_id", sa.BigInteger(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("organization_id", sa.Integer(), nullable=False),
        *(sa.Column(c, sa.Double(), nullable=False) for c in _CAPACITY),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name="fk_host_intervals_interval_id_intervals"
        ),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name="fk_host_intervals_host_id_hosts"),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name="fk_host_intervals_organization_id_organizations",
        ),
        sa.PrimaryKeyConstraint("interval_id", "host_id", name="pk_host_intervals"),
        **by_interval,
    )


def _partition(table: str, day: int) -> None:
    name = time.strftime("%Y%m%d", time.gmtime(day * DAY_S))
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA}.{table}_{name} PARTITION OF public.{table}"
        f" FOR VALUES FROM ({day * DAY_S}) TO ({(day + 1) * DAY_S})"
    )


def _copy_partitioned() -> None:
    use = ", ".join((*_USE, *_FLAVOR))
    op.execute(
        f"INSERT INTO samples (id, interval_id, vm_id, host_id, customer_id, batch_id, {use},"
        f" late) SELECT s.id, m.new_id, s.vm_id, s.host_id, s.customer_id, s.batch_id, {use},"
        " s.late FROM samples_0006 s JOIN gmd_ids m ON m.old_id = s.interval_id"
    )
    op.execute(
        "INSERT INTO batches (id, key, digest, host_id, interval_id, received_at, samples, late,"
        " state, error) SELECT b.id, b.key, b.digest, b.host_id, m.new_id, b.received_at,"
        " b.samples, b.late, b.state, b.error"
        " FROM batches_0006 b JOIN gmd_ids m ON m.old_id = b.interval_id"
    )
    capacity = ", ".join(_CAPACITY)
    op.execute(
        f"INSERT INTO host_intervals (interval_id, host_id, organization_id, {capacity})"
        f" SELECT m.new_id, h.host_id, h.organization_id, {capacity}"
        " FROM host_intervals_0006 h JOIN gmd_ids m ON m.old_id = h.interval_id"
    )


def downgrade() -> None:
    """Back to 0006's schema. Interval ids stay start times: they fit 0006's 32-bit columns
    until 2038, and the ledger means the same with them."""
    if op.get_bind().dialect.name == "postgresql":
        _downgrade_postgresql()
        return
    op.drop_index("ix_samples_late", table_name="samples", sqlite_where=_LATE)
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_constraint("uq_batches_key", type_="unique")
        batch_op.create_unique_constraint("uq_batches_key", ["key"])


def _downgrade_postgresql() -> None:
    for table in PARTITIONED:
        op.execute(f"ALTER TABLE {table} RENAME TO {table}_0007")
        for index in (
            ("pk_samples", "ix_samples_interval_host_vm", "ix_samples_batch_id", "ix_samples_late")
            if table == "samples"
            else ("pk_batches", "uq_batches_key", "ix_batches_interval_id", "ix_batches_unsettled")
            if table == "batches"
            else ("pk_host_intervals",)
        ):
            op.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_0007"')
    op.execute("ALTER SEQUENCE samples_id_seq OWNED BY NONE")
    op.execute("ALTER SEQUENCE batches_id_seq OWNED BY NONE")
    op.execute(
        "CREATE TABLE samples (LIKE samples_0007 INCLUDING DEFAULTS,"
        " CONSTRAINT pk_samples PRIMARY KEY (id),"
        " CONSTRAINT fk_samples_vm_id_vms FOREIGN KEY (vm_id) REFERENCES vms (id))"
    )
    op.execute("INSERT INTO samples SELECT * FROM samples_0007")
    op.create_index("ix_samples_interval_host_vm", "samples", ["interval_id", "host_id", "vm_id"])
    op.create_index("ix_samples_batch_id", "samples", ["batch_id"])
    op.execute(
        "CREATE TABLE batches (LIKE batches_0007 INCLUDING DEFAULTS,"
        " CONSTRAINT pk_batches PRIMARY KEY (id), CONSTRAINT uq_batches_key UNIQUE (key),"
        " CONSTRAINT fk_batches_host_id_hosts FOREIGN KEY (host_id) REFERENCES hosts (id),"
        " CONSTRAINT fk_batches_interval_id_intervals FOREIGN KEY (interval_id)"
        " REFERENCES intervals (id))"
    )
    op.execute("INSERT INTO batches SELECT * FROM batches_0007")
    op.create_index("ix_batches_interval_id", "batches", ["interval_id"])
    op.create_index("ix_batches_unsettled", "batches", ["state"], postgresql_where=_UNSETTLED)
    op.execute(
        "CREATE TABLE host_intervals (LIKE host_intervals_0007,"
        " CONSTRAINT pk_host_intervals PRIMARY KEY (interval_id, host_id),"
        " CONSTRAINT fk_host_intervals_interval_id_intervals FOREIGN KEY (interval_id)"
        " REFERENCES intervals (id),"
        " CONSTRAINT fk_host_intervals_host_id_hosts FOREIGN KEY (host_id) REFERENCES hosts (id),"
        " CONSTRAINT fk_host_intervals_organization_id_organizations FOREIGN KEY"
        " (organization_id) REFERENCES organizations (id))"
    )
    op.execute("INSERT INTO host_intervals SELECT * FROM host_intervals_0007")
    for table in PARTITIONED:
        op.execute(f"DROP TABLE {table}_0007")
    op.execute("ALTER SEQUENCE samples_id_seq OWNED BY samples.id")
    op.execute("ALTER SEQUENCE batches_id_seq OWNED BY batches.id")
    op.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
