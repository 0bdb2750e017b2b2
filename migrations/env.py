"""Alembic environment: runs gmd's migrations on the connection that
gmd.ledger_schema.migrate hands in."""

from alembic import context
from sqlalchemy import create_engine

from gmd.ledger_schema.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("gmd's migrations run online only: use `gmd-admin db upgrade`")
run_migrations_online()
