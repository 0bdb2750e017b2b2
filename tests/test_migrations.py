"""The Alembic migrations run forward on empty SQLite and PostgreSQL, and back down again."""

from __future__ import annotations

import sqlalchemy as sa

from gmd.daemon.ledger import migrate
from gmd.daemon.ledger.models import Base


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    engine = migrate.engine_for(database_url)
    try:
        assert migrate.current(engine) is None
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.head()
        assert tables(engine) == set(Base.metadata.tables)
        migrate.downgrade(engine, "base")
        assert migrate.current(engine) is None
        assert tables(engine) == set()
        migrate.upgrade(engine)
        assert tables(engine) == set(Base.metadata.tables)
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    """Autogenerate finds nothing to do: the migrations create exactly the models' schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        engine.dispose()


OLD_ROWS = [
    "INSERT INTO customers (id, name) VALUES (7, 'p')",
    "INSERT INTO organizations (id, name) VALUES (1, 'op')",
    "INSERT INTO hosts (id, name, organization_id) VALUES (1, 'h', 1)",
    "INSERT INTO vms (id, uuid, customer_id, host_id) VALUES (3, 'v', 7, 1)",
    "INSERT INTO intervals (id, start_s, length_s, state) VALUES (1, 0, 60, 'accounted')",
    "INSERT INTO batches (id, key, host_id, interval_id, samples) VALUES (1, 'k', 1, 1, 1)",
    "INSERT INTO samples (interval_id, vm_id, host_id, batch_id, cpu_s, memory_byte_s,"
    " disk_read_bytes, disk_write_bytes, network_rx_bytes, network_tx_bytes, late)"
    " VALUES (1, 3, 1, 1, 1, 2, 3, 4, 5, 6, false)",
    "INSERT INTO customer_ledger (interval_id, customer_id, greediness, balance, utility_work,"
    " utility_moment, utility, vms) VALUES (1, 7, 0.5, 0.5, 2, 0, 2, 1)",
]


def test_0002_keeps_rows_written_under_0001(database_url: str) -> None:
    """Samples written before 0002 get their owner from ``vms``; ledger rows a priority."""
    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine, "0001")
        with engine.begin() as conn:
            for statement in OLD_ROWS:
                conn.execute(sa.text(statement))
        migrate.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT customer_id FROM samples")).scalar_one() == 7
            assert conn.execute(sa.text("SELECT priority FROM customer_ledger")).scalar_one() == -2
            assert conn.execute(sa.text("SELECT digest FROM batches")).scalar_one() == ""
    finally:
        engine.dispose()
