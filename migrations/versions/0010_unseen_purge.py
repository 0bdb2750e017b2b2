"""Customers and VMs unseen past retention can be purged: ``last_seen_s``, and the foreign keys
whose check would scan a high-volume table dropped.

- ``vms.last_seen_s`` and ``customers.last_seen_s``: the start of an interval in which a
  sample named them, less than a day before their last (ingest marks a host's VMs and
  customers once a day), indexed so that retention finds the unseen ones without reading the
  others. Rows written before this
  revision count as seen now: they are kept at least one raw retention from the upgrade.
- Dropped: ``samples.vm_id`` → ``vms`` and ``quarantined_samples.vm_id`` → ``vms``;
  ``customer_resource_ledger.customer_id`` and ``customer_resource_rollups.customer_id`` →
  ``customers``. Deleting one VM or customer makes the database check every row that could
  point at it: no index leads with those columns (an index on ``samples.vm_id`` would cost
  every batch and ~30 % more raw storage), so each deletion would scan every raw partition or
  the whole per-resource ledger. Those rows are written by the one ingest path, or by
  accounting beside the ``customer_ledger`` and ``customer_rollups`` rows that keep their
  (indexed) foreign key; retention deletes a VM only once no sample of it is left, and a
  customer only once nothing names it (gmd.daemon.ledger.retention).
- SQLite: ``vms`` and ``customers`` number rows with ``AUTOINCREMENT``, so that the id of a
  purged row is never given to a new one (SQLite otherwise reuses the largest id once its row
  is deleted): a process that still has the old id cached finds it gone, not someone else's.
  PostgreSQL's sequences never go back.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 23:00:00.000000
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

DAY_S = 86400
# (table, column, referred table) of each dropped foreign key, named fk_<table>_<column>_<referred>.
DROPPED = (
    ("samples", "vm_id", "vms"),
    ("quarantined_samples", "vm_id", "vms"),
    ("customer_resource_ledger", "customer_id", "customers"),
    ("customer_resource_rollups", "customer_id", "customers"),
)
_LATE = sa.text("late")


def _name(table: str, column: str, referred: str) -> str:
    return f"fk_{table}_{column}_{referred}"


def upgrade() -> None:
    now_s = int(time.time()) // DAY_S * DAY_S
    for table in ("vms", "customers"):
        op.add_column(table, sa.Column("last_seen_s", sa.BigInteger(), nullable=True))
        op.execute(sa.text(f"UPDATE {table} SET last_seen_s = {now_s}"))
        op.create_index(f"ix_{table}_last_seen_s", table, ["last_seen_s"])
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for table in ("vms", "customers"):
            with op.batch_alter_table(
                table, recreate="always", table_kwargs={"sqlite_autoincrement": True}
            ):
                pass
    for table, column, referred in DROPPED:
        if not sqlite:
            # On the partitioned samples this drops the key of every partition with it.
            op.drop_constraint(_name(table, column, referred), table, type_="foreignkey")
            continue
        # SQLite rebuilds the table; its partial index is made again by hand, since
        # reflection does not carry the WHERE clause over.
        if table == "samples":
            op.drop_index("ix_samples_late", table_name="samples", sqlite_where=_LATE)
        with op.batch_alter_table(table, recreate="always") as batch_op:
            batch_op.drop_constraint(_name(table, column, referred), type_="foreignkey")
        if table == "samples":
            op.create_index("ix_samples_late", "samples", ["interval_id"], sqlite_where=_LATE)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, column, referred in DROPPED:
        if not sqlite:
            op.create_foreign_key(_name(table, column, referred), table, referred, [column], ["id"])
            continue
        if table == "samples":
            op.drop_index("ix_samples_late", table_name="samples", sqlite_where=_LATE)
        with op.batch_alter_table(table, recreate="always") as batch_op:
            batch_op.create_foreign_key(_name(table, column, referred), referred, [column], ["id"])
        if table == "samples":
            op.create_index("ix_samples_late", "samples", ["interval_id"], sqlite_where=_LATE)
    for table in ("customers", "vms"):
        op.drop_index(f"ix_{table}_last_seen_s", table_name=table)
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_column("last_seen_s")
