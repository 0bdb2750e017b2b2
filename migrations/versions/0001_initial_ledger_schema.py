"""The initial ledger schema: accounts, hosts, VMs, samples, intervals, ledger, actions.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 03:33:23.736600
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "customers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_customers")),
        sa.UniqueConstraint("name", name=op.f("uq_customers_name")),
    )
    op.create_table(
        "intervals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("start_s", sa.BigInteger(), nullable=False),
        sa.Column("length_s", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "open", "closed", "accounted", name="interval_state", native_enum=False, length=16
            ),
            nullable=False,
        ),
        sa.Column("accounted_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_intervals")),
        sa.UniqueConstraint("start_s", name=op.f("uq_intervals_start_s")),
    )
    op.create_table(
        "customer_ledger",
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("greediness", sa.Double(), nullable=False),
        sa.Column("balance", sa.Double(), nullable=False),
        sa.Column("utility_work", sa.Double(), nullable=False),
        sa.Column("utility_moment", sa.Double(), nullable=False),
        sa.Column("utility", sa.Double(), nullable=False),
        sa.Column("vms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_customer_ledger_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name=op.f("fk_customer_ledger_interval_id_intervals")
        ),
        sa.PrimaryKeyConstraint("interval_id", "customer_id", name=op.f("pk_customer_ledger")),
    )
    op.create_table(
        "customer_resource_ledger",
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("resource", sa.String(length=16), nullable=False),
        sa.Column("term", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_customer_resource_ledger_customer_id_customers"),
        ),
        sa.ForeignKeyConstraint(
            ["interval_id"],
            ["intervals.id"],
            name=op.f("fk_customer_resource_ledger_interval_id_intervals"),
        ),
        sa.PrimaryKeyConstraint(
            "interval_id", "customer_id", "resource", name=op.f("pk_customer_resource_ledger")
        ),
    )
    op.create_table(
        "organizations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_organizations_customer_id_customers")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_organizations")),
        sa.UniqueConstraint("name", name=op.f("uq_organizations_name")),
    )
    op.create_table(
        "hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("organization_id", sa.Integer(), nullable=False),
        sa.Column("last_seen_s", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_hosts_organization_id_organizations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hosts")),
        sa.UniqueConstraint("name", name=op.f("uq_hosts_name")),
    )
    op.create_table(
        "organization_ledger",
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column("organization_id", sa.Integer(), nullable=False),
        sa.Column("contribution_work", sa.Double(), nullable=False),
        sa.Column("contribution_moment", sa.Double(), nullable=False),
        sa.Column("contribution", sa.Double(), nullable=False),
        sa.Column("utility", sa.Double(), nullable=False),
        sa.Column("priority", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["interval_id"],
            ["intervals.id"],
            name=op.f("fk_organization_ledger_interval_id_intervals"),
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_organization_ledger_organization_id_organizations"),
        ),
        sa.PrimaryKeyConstraint(
            "interval_id", "organization_id", name=op.f("pk_organization_ledger")
        ),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_batches_host_id_hosts")),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name=op.f("fk_batches_interval_id_intervals")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("key", name=op.f("uq_batches_key")),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_batches_interval_id"), ["interval_id"], unique=False)

    op.create_table(
        "enforcement_actions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("customer_id", sa.Integer(), nullable=True),
        sa.Column("host_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_enforcement_actions_customer_id_customers"),
        ),
        sa.ForeignKeyConstraint(
            ["host_id"], ["hosts.id"], name=op.f("fk_enforcement_actions_host_id_hosts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enforcement_actions")),
    )
    with op.batch_alter_table("enforcement_actions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_enforcement_actions_customer_id"), ["customer_id"], unique=False
        )

    op.create_table(
        "host_intervals",
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("organization_id", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Double(), nullable=False),
        sa.Column("memory_bytes", sa.Double(), nullable=False),
        sa.Column("disk_bytes_per_s", sa.Double(), nullable=False),
        sa.Column("network_bytes_per_s", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"], ["hosts.id"], name=op.f("fk_host_intervals_host_id_hosts")
        ),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name=op.f("fk_host_intervals_interval_id_intervals")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_host_intervals_organization_id_organizations"),
        ),
        sa.PrimaryKeyConstraint("interval_id", "host_id", name=op.f("pk_host_intervals")),
    )
    op.create_table(
        "vms",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("created_s", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_vms_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_vms_host_id_hosts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_vms")),
        sa.UniqueConstraint("uuid", name=op.f("uq_vms_uuid")),
    )
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_vms_customer_id"), ["customer_id"], unique=False)

    op.create_table(
        "samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column("vm_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("cpu_s", sa.Double(), nullable=False),
        sa.Column("memory_byte_s", sa.Double(), nullable=False),
        sa.Column("disk_read_bytes", sa.Double(), nullable=False),
        sa.Column("disk_write_bytes", sa.Double(), nullable=False),
        sa.Column("network_rx_bytes", sa.Double(), nullable=False),
        sa.Column("network_tx_bytes", sa.Double(), nullable=False),
        sa.Column("flavor_vcpus", sa.Double(), nullable=True),
        sa.Column("flavor_memory_bytes", sa.Double(), nullable=True),
        sa.Column("flavor_disk_bytes_per_s", sa.Double(), nullable=True),
        sa.Column("flavor_network_bytes_per_s", sa.Double(), nullable=True),
        sa.Column("late", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_samples_batch_id_batches")
        ),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_samples_host_id_hosts")),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name=op.f("fk_samples_interval_id_intervals")
        ),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"], name=op.f("fk_samples_vm_id_vms")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sa.UniqueConstraint("interval_id", "vm_id", name=op.f("uq_samples_interval_id")),
    )
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_samples_batch_id"), ["batch_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_samples_batch_id"))

    op.drop_table("samples")
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_vms_customer_id"))

    op.drop_table("vms")
    op.drop_table("host_intervals")
    with op.batch_alter_table("enforcement_actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_enforcement_actions_customer_id"))

    op.drop_table("enforcement_actions")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_batches_interval_id"))

    op.drop_table("batches")
    op.drop_table("organization_ledger")
    op.drop_table("hosts")
    op.drop_table("organizations")
    op.drop_table("customer_resource_ledger")
    op.drop_table("customer_ledger")
    op.drop_table("intervals")
    op.drop_table("customers")
