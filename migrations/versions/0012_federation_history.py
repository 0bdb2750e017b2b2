"""The federation's history in each cloud's ledger (gmd-broker, docs/federation.md).

- ``federation_events``: every decision of this cloud's broker (published, took, completed,
  requeued …), the authoritative record of what the cloud lent and borrowed. ZooKeeper keeps
  only each organisation's sums and each site's last completion; a completion row is written
  before ZooKeeper counts it and settled after (``counted``), so a broker that stopped in
  between settles it when it comes back. Unique per (site, completion number).
- ``federation_standings``: the organisations' standings as the broker last read them from
  ZooKeeper, for gmd-admin and the read API (which never talk to ZooKeeper).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 14:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ID64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "federation_events",
        sa.Column("id", ID64, nullable=False),
        sa.Column("at_s", sa.Double(), nullable=False),
        sa.Column("site", sa.String(255), nullable=False),
        sa.Column("choice", sa.String(16), nullable=False),
        sa.Column("request", sa.String(255), nullable=False),
        sa.Column("org", sa.String(255), nullable=False),
        sa.Column("request_site", sa.String(255), nullable=False),
        sa.Column("node", sa.String(64), nullable=True),
        sa.Column("cores", sa.Double(), nullable=False),
        sa.Column("core_seconds", sa.Double(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=True),
        sa.Column("counted", sa.Boolean(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_federation_events"),
        sa.UniqueConstraint("site", "seq", name="uq_federation_events_site"),
    )
    op.create_index("ix_federation_events_at_s", "federation_events", ["at_s"])
    op.create_table(
        "federation_standings",
        sa.Column("org", sa.String(255), nullable=False),
        sa.Column("contributed", sa.Double(), nullable=False),
        sa.Column("used", sa.Double(), nullable=False),
        sa.Column("priority", sa.Double(), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("lent", sa.Integer(), nullable=False),
        sa.Column("borrowed", sa.Integer(), nullable=False),
        sa.Column("sites", sa.Integer(), nullable=False),
        sa.Column("as_of_s", sa.Double(), nullable=False),
        sa.Column("observer", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("org", name="pk_federation_standings"),
    )


def downgrade() -> None:
    op.drop_table("federation_standings")
    op.drop_index("ix_federation_events_at_s", table_name="federation_events")
    op.drop_table("federation_events")
