"""The host's own busy CPU time: ``batches.host_cpu_s``.

An agent reports the host's busy CPU seconds in the interval (``/proc/stat``: its VMs and
everything else it runs) beside its VMs' use, and the enforcer calls a host contended for CPU
when either reaches the threshold (gmd.daemon.enforce.plans.host_caps). Stored per batch, as
samples are, so that a host's batches for one interval add up. NULL: not reported (batches
written before this revision, agents that do not measure it).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 20:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # On PostgreSQL, batches is partitioned: a column added to the parent is added to every
    # partition, and a nullable one without a default rewrites nothing.
    op.add_column("batches", sa.Column("host_cpu_s", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("host_cpu_s")
