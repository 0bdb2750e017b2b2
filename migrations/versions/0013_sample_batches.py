"""PostgreSQL: a batch's samples stored as one row of arrays (``sample_batches``), read through
the view ``samples``.

A sample row cost 239 bytes on disk for ~110 bytes of figures: a 24-byte tuple header and a
line pointer per VM, a primary key on a surrogate id, and three indexes with an entry per VM.
One row per batch, its VMs' figures as arrays, stores the figures nearly bare, with one
header and one index entry a batch.

- ``sample_batches``: partitioned by ``RANGE (interval_id)`` like every raw table, keyed by
  ``(interval_id, batch_id)``; ``host_id`` and ``late`` are the batch's, and each per-VM column
  of the old table is an array of the same name, element ``k`` of each being the batch's
  ``k``-th VM. A flavor figure not reported is NaN in its array (an array without NULLs has
  one binary form, which accounting reads in place) and NULL in the view, as before.
- ``samples`` is now a view with the old columns but ``id`` (readers keep their SQL; nothing
  used the id but to pick the newest of a VM's rows, which ``batch_id`` orders as well).
  Rows inserted into or deleted from the view are put into or taken out of their batch's
  arrays by ``INSTEAD OF`` triggers, so that an operator's SQL still works; gmd itself writes
  and deletes whole batches in ``sample_batches``.
- Existing samples are packed one partition (one UTC day) at a time, each VM's element in the
  order of the old ids.

SQLite keeps its row table: a single-file ledger is the small deployment, and it has no arrays.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 21:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

SCHEMA = "gmd_partitions"
IDS = ("vm_id", "customer_id")
FIGURES = (
    "cpu_s",
    "memory_byte_s",
    "disk_read_bytes",
    "disk_write_bytes",
    "network_rx_bytes",
    "network_tx_bytes",
    "flavor_vcpus",
    "flavor_memory_bytes",
    "flavor_disk_bytes_per_s",
    "flavor_network_bytes_per_s",
)
PER_VM = (*IDS, *FIGURES)
NULLABLE = tuple(c for c in FIGURES if c.startswith("flavor_"))
VIEW_COLUMNS = (
    "interval_id",
    "vm_id",
    "host_id",
    "customer_id",
    "batch_id",
    *FIGURES,
    "late",
)


def _partition_days(table: str) -> list[str]:
    """The ``YYYYMMDD`` of each partition of ``table``."""
    rows = op.get_bind().execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = :schema AND i.inhparent = CAST(:t AS regclass)"
        ),
        {"schema": SCHEMA, "t": f"public.{table}"},
    )
    return sorted(name.rsplit("_", 1)[1] for (name,) in rows)


def _bounds(table: str, day: str) -> str:
    return (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = :schema AND c.relname = :name"
            ),
            {"schema": SCHEMA, "name": f"{table}_{day}"},
        )
        .scalar_one()
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    arrays = ", ".join(
        f"{c} {'integer' if c in IDS else 'double precision'}[] NOT NULL" for c in PER_VM
    )
    op.execute(
        "CREATE TABLE sample_batches (interval_id BIGINT NOT NULL, batch_id BIGINT NOT NULL,"
        f" host_id INTEGER NOT NULL, late BOOLEAN NOT NULL, {arrays},"
        " CONSTRAINT pk_sample_batches PRIMARY KEY (interval_id, batch_id))"
        " PARTITION BY RANGE (interval_id)"
    )
    op.execute(
        "CREATE INDEX ix_sample_batches_interval_host ON sample_batches (interval_id, host_id)"
    )
    op.execute("CREATE INDEX ix_sample_batches_batch_id ON sample_batches (batch_id)")
    op.execute("CREATE INDEX ix_sample_batches_late ON sample_batches (interval_id) WHERE late")
    packed = ", ".join(f"array_agg({_stored(c)} ORDER BY id)" for c in PER_VM)
    for day in _partition_days("samples"):
        op.execute(
            f"CREATE TABLE {SCHEMA}.sample_batches_{day} PARTITION OF public.sample_batches"
            f" {_bounds('samples', day)}"
        )
        op.execute(
            "INSERT INTO sample_batches (interval_id, batch_id, host_id, late,"
            f" {', '.join(PER_VM)}) SELECT interval_id, batch_id, min(host_id), bool_or(late),"
            f" {packed}"
            f" FROM {SCHEMA}.samples_{day} GROUP BY interval_id, batch_id"
        )
    op.execute("DROP TABLE samples")
    for day in _partition_days("sample_batches"):  # a day's samples keep their name
        op.execute(f"ALTER TABLE {SCHEMA}.sample_batches_{day} RENAME TO samples_{day}")
    _create_view()


def _stored(column: str, row: str = "") -> str:
    """``column`` (of ``row``) as stored: NaN for a NULL flavor figure."""
    return f"coalesce({row}{column}, 'NaN')" if column in NULLABLE else f"{row}{column}"


def _shown() -> str:
    """The view's columns from the batch ``b`` and its unnested arrays ``u``."""
    return ", ".join(
        f"nullif(u.{c}, 'NaN') AS {c}" if c in NULLABLE else f"u.{c}" if c in PER_VM else f"b.{c}"
        for c in VIEW_COLUMNS
    )


def _create_view() -> None:
    unnested = ", ".join(f"b.{c}" for c in PER_VM)
    columns = _shown()
    op.execute(
        f"CREATE VIEW samples AS SELECT {columns} FROM sample_batches b,"
        f" unnest({unnested}) AS u({', '.join(PER_VM)})"
    )
    key = "interval_id = NEW.interval_id AND batch_id = NEW.batch_id"
    appended = ", ".join(f"{c} = array_append({c}, {_stored(c, 'NEW.')})" for c in PER_VM)
    values = ", ".join(f"ARRAY[{_stored(c, 'NEW.')}]" for c in PER_VM)
    # What the row table refused as NULL, the arrays refuse too: a NULL element would change
    # the batch's binary layout, which accounting reads in place.
    required = [c for c in VIEW_COLUMNS if c not in (*NULLABLE, "late")]
    missing = " OR ".join(f"NEW.{c} IS NULL" for c in required)
    op.execute(
        "CREATE FUNCTION gmd_samples_insert() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN IF {missing} THEN RAISE EXCEPTION USING ERRCODE = 'not_null_violation',"
        f" MESSAGE = 'a sample needs every one of {', '.join(required)}'; END IF;"
        f" UPDATE sample_batches SET {appended} WHERE {key};"
        " IF NOT FOUND THEN"
        f" INSERT INTO sample_batches (interval_id, batch_id, host_id, late, {', '.join(PER_VM)})"
        " VALUES (NEW.interval_id, NEW.batch_id, NEW.host_id, coalesce(NEW.late, false),"
        f" {values}); END IF; RETURN NEW; END $$"
    )
    old = key.replace("NEW.", "OLD.")
    # Spaced slices: ``[1:k`` would read as a bound parameter ``:k``.
    removed = ", ".join(f"{c} = {c}[1 : k - 1] || {c}[k + 1 : cardinality({c})]" for c in PER_VM)
    op.execute(
        "CREATE FUNCTION gmd_samples_delete() RETURNS trigger LANGUAGE plpgsql AS $$"
        " DECLARE k integer; BEGIN"
        f" SELECT array_position(vm_id, OLD.vm_id) INTO k FROM sample_batches WHERE {old};"
        " IF k IS NULL THEN RETURN NULL; END IF;"
        f" UPDATE sample_batches SET {removed} WHERE {old};"
        f" DELETE FROM sample_batches WHERE {old} AND cardinality(vm_id) = 0;"
        " RETURN OLD; END $$"
    )
    for kind in ("insert", "delete"):
        op.execute(
            f"CREATE TRIGGER samples_{kind} INSTEAD OF {kind.upper()} ON samples"
            f" FOR EACH ROW EXECUTE FUNCTION gmd_samples_{kind}()"
        )


def downgrade() -> None:
    """Back to a row per sample, each batch's rows numbered in its arrays' order."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP VIEW samples")
    for day in _partition_days("sample_batches"):
        op.execute(f"ALTER TABLE {SCHEMA}.samples_{day} RENAME TO sample_batches_{day}")
    op.execute("DROP FUNCTION gmd_samples_insert()")
    op.execute("DROP FUNCTION gmd_samples_delete()")
    op.execute("CREATE SEQUENCE samples_id_seq AS BIGINT")
    op.execute(
        "CREATE TABLE samples (id BIGINT DEFAULT nextval('samples_id_seq') NOT NULL,"
        " interval_id BIGINT NOT NULL, vm_id INTEGER NOT NULL, host_id INTEGER NOT NULL,"
        " customer_id INTEGER NOT NULL, batch_id BIGINT NOT NULL, "
        + ", ".join(
            f"{c} DOUBLE PRECISION{'' if c.startswith('flavor_') else ' NOT NULL'}" for c in FIGURES
        )
        + ", late BOOLEAN NOT NULL, CONSTRAINT pk_samples PRIMARY KEY (interval_id, id))"
        " PARTITION BY RANGE (interval_id)"
    )
    op.execute("ALTER SEQUENCE samples_id_seq OWNED BY samples.id")
    op.execute("CREATE INDEX ix_samples_interval_host_vm ON samples (interval_id, host_id, vm_id)")
    op.execute("CREATE INDEX ix_samples_batch_id ON samples (batch_id)")
    op.execute("CREATE INDEX ix_samples_late ON samples (interval_id) WHERE late")
    unnested = ", ".join(f"b.{c}" for c in PER_VM)
    columns = _shown()
    for day in _partition_days("sample_batches"):
        op.execute(
            f"CREATE TABLE {SCHEMA}.samples_{day} PARTITION OF public.samples"
            f" {_bounds('sample_batches', day)}"
        )
        op.execute(
            f"INSERT INTO samples ({', '.join(VIEW_COLUMNS)}) SELECT {columns}"
            f" FROM {SCHEMA}.sample_batches_{day} b"
            f" CROSS JOIN LATERAL unnest({unnested}) WITH ORDINALITY AS u({', '.join(PER_VM)}, k)"
            " ORDER BY b.batch_id, u.k"
        )
    op.execute("DROP TABLE sample_batches")
