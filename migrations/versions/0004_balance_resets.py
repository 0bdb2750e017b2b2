"""Balance resets: an operator's ``gmd-admin reset CUSTOMER``, applied by accounting.

- ``balance_resets``: who reset which customer's balance, when, why, the balance thrown away,
  and the first interval whose accounting starts that customer from zero.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 09:10:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "balance_resets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("effective_start_s", sa.BigInteger(), nullable=False),
        sa.Column("previous_balance", sa.Double(), nullable=False),
        sa.Column("requested_by", sa.String(length=255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_balance_resets_customer_id_customers")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_balance_resets")),
    )
    with op.batch_alter_table("balance_resets", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_balance_resets_customer_id"), ["customer_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_balance_resets_effective_start_s"), ["effective_start_s"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("balance_resets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_balance_resets_effective_start_s"))
        batch_op.drop_index(batch_op.f("ix_balance_resets_customer_id"))
    op.drop_table("balance_resets")
