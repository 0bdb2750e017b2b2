"""Batches Placement has not vouched for yet: ``batches.unverified``.

With ``[placement] verify = "on"`` the daemon checks each batch against Placement before it
stores it; while Placement cannot be reached a batch is stored all the same, marked
unverified, and the daemon's job verifies it once Placement answers (and quarantines it if
Placement disagrees). Accounting waits for an interval's unverified batches (at most
``[placement] wait_s``). Indexed where true: the job finds the few waiting batches without
reading the many verified ones. Rows written before this revision are false (believed, as
they were).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 23:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_UNVERIFIED = sa.text("unverified")


def upgrade() -> None:
    # On PostgreSQL batches is partitioned: the column reaches every partition, and a constant
    # default rewrites none of them.
    op.add_column(
        "batches",
        sa.Column("unverified", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_index(
        "ix_batches_unverified",
        "batches",
        ["unverified"],
        postgresql_where=_UNVERIFIED,
        sqlite_where=_UNVERIFIED,
    )


def downgrade() -> None:
    op.drop_index("ix_batches_unverified", table_name="batches")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("unverified")
