"""Batches that accounting can leave out: per-batch samples, batch state, quarantine.

- ``samples``: one row per batch and VM (no longer merged per interval, host, VM and late), so
  that accounting can leave out exactly the batch it cannot account; accounting adds a VM's
  rows up. The unique constraint becomes a plain index on (interval, host, VM).
- ``batches.late``: the batch arrived after its interval closed; ``batches.state``: accepted,
  quarantined, released or dropped; ``batches.error``: why accounting quarantined it. A partial
  index finds the batches that are not simply accepted.
- ``quarantined_samples``: the samples of quarantined batches, out of every query's way.

Rows written before this revision: every batch accepted, late when its samples are.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_UNSETTLED = sa.text("state <> 'accepted'")
_USE = (
    "cpu_s",
    "memory_byte_s",
    "disk_read_bytes",
    "disk_write_bytes",
    "network_rx_bytes",
    "network_tx_bytes",
)


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("late", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(
            sa.Column("state", sa.String(length=16), server_default="accepted", nullable=False)
        )
        batch_op.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch_op.create_index(
            "ix_batches_unsettled",
            ["state"],
            unique=False,
            postgresql_where=_UNSETTLED,
            sqlite_where=_UNSETTLED,
        )
    op.execute(
        "UPDATE batches SET late = true WHERE id IN (SELECT batch_id FROM samples WHERE late)"
    )

    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_constraint("uq_samples_interval_host_vm_late", type_="unique")
        batch_op.create_index(
            "ix_samples_interval_host_vm", ["interval_id", "host_id", "vm_id"], unique=False
        )

    op.create_table(
        "quarantined_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("interval_id", sa.Integer(), nullable=False),
        sa.Column("vm_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
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
            ["vm_id"], ["vms.id"], name=op.f("fk_quarantined_samples_vm_id_vms")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantined_samples")),
    )
    with op.batch_alter_table("quarantined_samples", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_quarantined_samples_batch_id"), ["batch_id"], unique=False
        )


def downgrade() -> None:
    """Back to merged samples: quarantined samples are deleted (their batches were never
    accounted) and a VM's rows per interval, host and lateness are added up again."""
    with op.batch_alter_table("quarantined_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_quarantined_samples_batch_id"))
    op.drop_table("quarantined_samples")
    same_row = (
        "o.interval_id = samples.interval_id AND o.host_id = samples.host_id"
        " AND o.vm_id = samples.vm_id AND o.late = samples.late"
    )
    sums = ", ".join(f"{c} = (SELECT sum(o.{c}) FROM samples o WHERE {same_row})" for c in _USE)
    op.execute(f"UPDATE samples SET {sums}")
    op.execute(
        f"DELETE FROM samples WHERE id <> (SELECT min(o.id) FROM samples o WHERE {same_row})"
    )
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index("ix_samples_interval_host_vm")
        batch_op.create_unique_constraint(
            "uq_samples_interval_host_vm_late", ["interval_id", "host_id", "vm_id", "late"]
        )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index("ix_batches_unsettled")
        batch_op.drop_column("error")
        batch_op.drop_column("state")
        batch_op.drop_column("late")
