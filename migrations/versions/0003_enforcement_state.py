"""Enforcement state: customers' throttle levels, original quotas, actions tied to intervals.

- ``customer_levels``: each customer's level and since when (what hysteresis and dwell need),
  and the score and interval that decided it.
- ``quota_originals``: a customer's compute quota before gmd first lowered it, per cloud, so
  that restoring writes back exactly what the operator had set, and the steps gmd holds.
- ``enforcement_actions.interval_id``: the interval whose accounting led to the action.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 04:34:17.749229
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "customer_levels",
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("since_s", sa.Double(), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_customer_levels_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["intervals.id"], name=op.f("fk_customer_levels_interval_id_intervals")
        ),
        sa.PrimaryKeyConstraint("customer_id", name=op.f("pk_customer_levels")),
    )
    op.create_table(
        "quota_originals",
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("cloud", sa.String(length=255), nullable=False),
        sa.Column("cores", sa.Integer(), nullable=False),
        sa.Column("ram_mb", sa.Integer(), nullable=False),
        sa.Column("instances", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_quota_originals_customer_id_customers")
        ),
        sa.PrimaryKeyConstraint("customer_id", "cloud", name=op.f("pk_quota_originals")),
    )
    with op.batch_alter_table("enforcement_actions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("interval_id", sa.Integer(), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_enforcement_actions_interval_id"), ["interval_id"], unique=False
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_enforcement_actions_interval_id_intervals"),
            "intervals",
            ["interval_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("enforcement_actions", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("fk_enforcement_actions_interval_id_intervals"), type_="foreignkey"
        )
        batch_op.drop_index(batch_op.f("ix_enforcement_actions_interval_id"))
        batch_op.drop_column("interval_id")

    op.drop_table("quota_originals")
    op.drop_table("customer_levels")
