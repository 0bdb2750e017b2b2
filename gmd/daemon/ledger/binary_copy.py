"""PostgreSQL's binary forms on a SQLAlchemy connection: a ``COPY`` stream sent, a query's
rows fetched.

The binary COPY format is, per row, a field count and each field's length and big-endian
value: numpy lays it out column by column (:mod:`.sample_store`), and the server stores the
rows without parsing any text (binary COPY is the ingest benchmark's ceiling). Rows fetched in
binary hand ``bytea`` values over as they are, for numpy to read in place.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
"""The signature, then 32-bit flags (no OIDs) and header-extension length, both zero."""
TRAILER = b"\xff\xff"
"""A field count of -1 ends the data."""


def send_copy(conn: Connection, statement: str, data: bytes) -> None:
    """Send ``data`` (a whole binary COPY stream) for the ``COPY … FROM STDIN`` ``statement``
    on ``conn``'s psycopg connection, in its current transaction.

    SQLAlchemy does not see a COPY, so its failures are handed back as SQLAlchemy's would be: a
    :class:`~sqlalchemy.exc.DBAPIError`, and a connection that broke is invalidated
    (SQLAlchemy discards it, and ingest retries the batch) rather than returned to the pool to
    fail again.
    """
    # Here, not at the top: psycopg is the ``postgres`` extra, and SQLite ledgers (the demo,
    # gmd-admin on a laptop) import the store without it.
    import psycopg

    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"binary COPY needs a psycopg connection, not {type(raw).__name__}")
    try:
        with raw.cursor().copy(statement) as copy:
            copy.write(data)
    except psycopg.Error as exc:
        broken = raw.broken or raw.closed
        if broken:
            conn.invalidate(exc)
        raise DBAPIError.instance(
            statement, None, exc, psycopg.Error, connection_invalidated=broken
        ) from exc


def binary_rows(conn: Connection, query: Any) -> list[tuple[Any, ...]]:
    """``query``'s rows in binary, on ``conn``'s psycopg connection (its parameters bound
    into the SQL): a ``bytea`` comes as the bytes it holds, with no hex text to decode."""
    compiled = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    raw = conn.connection.driver_connection
    assert raw is not None, "a connection in use has a driver connection"
    with raw.cursor(binary=True) as cursor:
        cursor.execute(str(compiled))
        return [tuple(row) for row in cursor.fetchall()]
