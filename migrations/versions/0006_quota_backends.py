"""Quota originals that say where they were written and which values were defaults; names.

- ``quota_originals.unset``: the resources that had no limit of the project's own (Keystone's
  unified limits tell; Nova's legacy quotas do not), so that restoring deletes the project
  limit gmd created instead of pinning the default of the day.
- ``quota_originals.backend``: ``nova`` or ``keystone-limits``, once a lowered quota is written.

- ``customers.display_name`` / ``display_source``: the project's name for people, from
  Keystone (or the Nova metadata), shown beside the uuid.

Rows written before this revision were written to Nova, with no defaults told apart.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 00:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_originals", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("unset", sa.String(length=64), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("backend", sa.String(length=32), nullable=True))
    op.execute("UPDATE quota_originals SET backend = 'nova' WHERE applied")
    with op.batch_alter_table("customers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("display_name", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("display_source", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("customers", schema=None) as batch_op:
        batch_op.drop_column("display_source")
        batch_op.drop_column("display_name")
    with op.batch_alter_table("quota_originals", schema=None) as batch_op:
        batch_op.drop_column("backend")
        batch_op.drop_column("unset")
