"""The Alembic migrations run forward on empty SQLite and PostgreSQL, and back down again."""

from __future__ import annotations

import sqlalchemy as sa

from gmd.ledger import migrate
from gmd.ledger.models import Base


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
