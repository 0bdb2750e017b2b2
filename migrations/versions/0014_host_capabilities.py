"""What each host can set (``host_capabilities``) and what became of each knob of a host's
report (``enforcement_actions.knobs``).

An agent probes which knobs its host has (CPU weight and cap, disk weight, disk limit, network
limit: a disk weight needs BFQ, which most NVMe and virtio hosts do not run) and says so at
start and whenever it changes; the daemon plans with it. A host's report on a VM now says per
knob whether it was applied, is not supported there, or failed. Both are new: existing rows
have no knobs (NULL), which reads as before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 16:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_capabilities",
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("probed_s", sa.BigInteger(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("host"),
    )
    op.add_column("enforcement_actions", sa.Column("knobs", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("enforcement_actions", schema=None) as batch_op:
        batch_op.drop_column("knobs")
    op.drop_table("host_capabilities")
