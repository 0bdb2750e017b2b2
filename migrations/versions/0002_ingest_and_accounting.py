"""Ingest and accounting: batch digests, samples per host with their owner, customer priority.

- ``batches.digest``: the content hash that tells a retried batch from a reused key.
- ``samples.customer_id``: who owned the VM when it was sampled (ownership can change later);
  one row per (interval, host, VM, late) so that a VM that migrated mid-interval keeps its use
  on both hosts and late samples never merge into on-time ones. Only ``vm_id`` stays a foreign
  key: per-row checks of the others cost more than the insert itself (see ``Sample``).
- ``intervals.ledger_rows``: how many customer rows accounting wrote (NULL until accounted).
- ``customer_ledger.priority``: the customer account's DirectContr priority.

Rows written before this revision get the values they would have had: the owner from ``vms``,
an empty digest (no retry can match it), and priority = −utility (no customer was an
organization's account before).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 03:48:04.880207
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


_UNCHECKED = (("interval_id", "intervals"), ("host_id", "hosts"), ("batch_id", "batches"))


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("digest", sa.String(length=64), nullable=False, server_default="")
        )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.alter_column("digest", server_default=None)

    with op.batch_alter_table("customer_ledger", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Double(), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_customer_ledger_customer_id"), ["customer_id"], unique=False
        )
    op.execute("UPDATE customer_ledger SET priority = -utility")
    with op.batch_alter_table("customer_ledger", schema=None) as batch_op:
        batch_op.alter_column("priority", existing_type=sa.Double(), nullable=False)

    with op.batch_alter_table("intervals", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ledger_rows", sa.Integer(), nullable=True))

    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("customer_id", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE samples SET customer_id = (SELECT vms.customer_id FROM vms WHERE vms.id = vm_id)"
    )
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.alter_column("customer_id", existing_type=sa.Integer(), nullable=False)
        batch_op.drop_constraint(batch_op.f("uq_samples_interval_id"), type_="unique")
        batch_op.create_unique_constraint(
            "uq_samples_interval_host_vm_late", ["interval_id", "host_id", "vm_id", "late"]
        )
        for column, table in _UNCHECKED:
            batch_op.drop_constraint(f"fk_samples_{column}_{table}", type_="foreignkey")


def downgrade() -> None:
    # Merging a migrated VM's rows back into one per (interval, VM) would lose which host they
    # came from; the old unique constraint simply cannot hold such rows, and says so.
    with op.batch_alter_table("samples", schema=None) as batch_op:
        for column, table in _UNCHECKED:
            batch_op.create_foreign_key(f"fk_samples_{column}_{table}", table, [column], ["id"])
        batch_op.drop_constraint("uq_samples_interval_host_vm_late", type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_samples_interval_id"), ["interval_id", "vm_id"]
        )
        batch_op.drop_column("customer_id")

    with op.batch_alter_table("intervals", schema=None) as batch_op:
        batch_op.drop_column("ledger_rows")

    with op.batch_alter_table("customer_ledger", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_customer_ledger_customer_id"))
        batch_op.drop_column("priority")

    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("digest")
