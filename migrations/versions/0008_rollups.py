"""Rollups: hourly and daily summaries that reports read instead of every interval's rows.

- ``rollup_periods``: which hours and UTC days are rolled up, and from what.
- ``customer_rollups``, ``customer_resource_rollups``, ``host_rollups``,
  ``organization_rollups``: per period, what the per-interval rows and the on-time samples
  add up to (see gmd.daemon.ledger.rollups).

Ledgers from before this revision get their rollups written by the daemon, oldest first, a
bounded number of periods per run (gmd.daemon.ledger.rollups.backfill).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ID64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_USED = ("cpu_s", "memory_byte_s", "disk_bytes", "network_bytes")


def _period(table: str) -> list[sa.Column]:
    return [
        sa.Column("period_s", sa.Integer(), nullable=False),
        sa.Column("start_s", ID64, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "rollup_periods",
        *_period("rollup_periods"),
        sa.Column("intervals", sa.Integer(), nullable=False),
        sa.Column("with_rows", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.BigInteger(), nullable=False),
        sa.Column("end_interval_id", ID64, nullable=True),
        sa.PrimaryKeyConstraint("period_s", "start_s", name="pk_rollup_periods"),
    )
    op.create_table(
        "customer_rollups",
        *_period("customer_rollups"),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("intervals", sa.Integer(), nullable=False),
        sa.Column("gm_sum", sa.Double(), nullable=False),
        sa.Column("gm_positive", sa.Double(), nullable=False),
        sa.Column("vms_max", sa.Integer(), nullable=False),
        sa.Column("balance_end", sa.Double(), nullable=False),
        sa.Column("utility_end", sa.Double(), nullable=False),
        sa.Column("priority_end", sa.Double(), nullable=False),
        *(sa.Column(c, sa.Double(), nullable=False) for c in _USED),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name="fk_customer_rollups_customer_id_customers"
        ),
        sa.PrimaryKeyConstraint("period_s", "start_s", "customer_id", name="pk_customer_rollups"),
    )
    op.create_index(
        "ix_customer_rollups_customer", "customer_rollups", ["customer_id", "period_s", "start_s"]
    )
    op.create_table(
        "customer_resource_rollups",
        *_period("customer_resource_rollups"),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("resource", sa.String(length=16), nullable=False),
        sa.Column("term_sum", sa.Double(), nullable=False),
        sa.Column("term_over", sa.Double(), nullable=False),
        sa.Column("term_under", sa.Double(), nullable=False),
        sa.Column("term_max", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name="fk_customer_resource_rollups_customer_id_customers",
        ),
        sa.PrimaryKeyConstraint(
            "period_s", "start_s", "customer_id", "resource", name="pk_customer_resource_rollups"
        ),
    )
    op.create_table(
        "host_rollups",
        *_period("host_rollups"),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("organization_id", sa.Integer(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("vms_max", sa.Integer(), nullable=False),
        sa.Column("customers_max", sa.Integer(), nullable=False),
        *(sa.Column(c, sa.Double(), nullable=False) for c in _USED),
        sa.Column("cpu_supplied_core_s", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name="fk_host_rollups_host_id_hosts"),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name="fk_host_rollups_organization_id_organizations",
        ),
        sa.PrimaryKeyConstraint("period_s", "start_s", "host_id", name="pk_host_rollups"),
    )
    op.create_table(
        "organization_rollups",
        *_period("organization_rollups"),
        sa.Column("organization_id", sa.Integer(), nullable=False),
        sa.Column("contribution_end", sa.Double(), nullable=False),
        sa.Column("utility_end", sa.Double(), nullable=False),
        sa.Column("priority_end", sa.Double(), nullable=False),
        sa.Column("cpu_supplied_core_s", sa.Double(), nullable=False),
        sa.Column("cpu_used_core_s", sa.Double(), nullable=False),
        sa.Column("customers_max", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name="fk_organization_rollups_organization_id_organizations",
        ),
        sa.PrimaryKeyConstraint(
            "period_s", "start_s", "organization_id", name="pk_organization_rollups"
        ),
    )


def downgrade() -> None:
    for table in (
        "organization_rollups",
        "host_rollups",
        "customer_resource_rollups",
        "customer_rollups",
        "rollup_periods",
    ):
        op.drop_table(table)
