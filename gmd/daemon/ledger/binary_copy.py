"""Rows in PostgreSQL's binary ``COPY`` format, laid out by numpy instead of row by row.

A batch's samples are columns of numbers, and the binary format is, per row, a field count
and each field's length and big-endian value: a fixed layout that a numpy structured array
fills column by column and hands over as one buffer. The server then stores the rows without
parsing any text (binary COPY is the ingest benchmark's ceiling), and the daemon builds no
per-row Python objects. A NULL is a field with length -1 and no value, which changes the row's
layout; rows are therefore grouped by which of their nullable fields are NULL (in a batch
almost always one group: every VM has a flavor, or none has), one array per group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from sqlalchemy import BigInteger, Boolean, Connection, Double, Integer, Table
from sqlalchemy.exc import DBAPIError

HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
"""The signature, then 32-bit flags (no OIDs) and header-extension length, both zero."""
TRAILER = b"\xff\xff"
"""A field count of -1 ends the data."""

_NUMPY_OF = {BigInteger: ">i8", Integer: ">i4", Double: ">f8", Boolean: "?"}
"""The binary wire form of each column type the layout supports (PostgreSQL's send
functions: network byte order; a boolean is one byte)."""


def numpy_type(table: Table, column: str) -> str:
    """The big-endian numpy type of ``column``'s binary form on PostgreSQL. Raises
    ``TypeError`` for a type that has no fixed-width form here."""
    sql_type = table.c[column].type
    for kind, code in _NUMPY_OF.items():
        # BigInteger before Integer: it is a subclass.
        if isinstance(sql_type, kind):
            return code
    raise TypeError(f"{table.name}.{column}: {sql_type} has no fixed-width binary COPY form")


@dataclass(frozen=True)
class CopyLayout:
    """How the rows of ``columns`` of ``table`` travel in binary COPY. Float columns named in
    ``nullable`` send NaN as NULL."""

    table: Table
    columns: tuple[str, ...]
    nullable: frozenset[str] = frozenset()
    types: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", tuple(numpy_type(self.table, c) for c in self.columns))
        bad = [c for c in self.nullable if numpy_type(self.table, c) != ">f8"]
        if bad:
            raise TypeError(f"only float columns can send NaN as NULL, not {', '.join(bad)}")

    @property
    def statement(self) -> str:
        return f"COPY {self.table.name} ({', '.join(self.columns)}) FROM STDIN (FORMAT BINARY)"

    def data(self, values: Mapping[str, np.ndarray | Sequence[int] | float | int | bool]) -> bytes:
        """Header, rows and trailer for ``values``: per column a sequence (one value per row)
        or a scalar (the same in every row). Every sequence has the same length."""
        lengths = {len(v) for v in values.values() if isinstance(v, np.ndarray | Sequence)}
        if len(lengths) != 1:
            raise ValueError(f"columns of unequal or no lengths: {sorted(lengths)}")
        (n,) = lengths
        arrays = {
            c: np.asarray(v) if isinstance(v, np.ndarray | Sequence) else v
            for c, v in values.items()
        }
        nullable = [c for c in self.columns if c in self.nullable]
        # Bit k set: the row's k-th nullable column is NULL.
        missing = np.zeros(n, dtype=np.int64)
        for k, c in enumerate(nullable):
            column = arrays[c]
            if isinstance(column, np.ndarray):
                missing |= np.isnan(column).astype(np.int64) << k
            elif column != column:
                missing |= 1 << k
        grouped = bool(missing.any())
        parts = [HEADER]
        for pattern in np.unique(missing).tolist() if grouped else [0]:
            nulls = frozenset(c for k, c in enumerate(nullable) if pattern >> k & 1)
            parts.append(self._rows(arrays, nulls, missing == pattern if grouped else None, n))
        parts.append(TRAILER)
        return b"".join(parts)

    def copy(self, conn: Connection, data: bytes) -> None:
        """Send ``data`` (from :meth:`data`) on ``conn``'s psycopg connection, in its current
        transaction.

        SQLAlchemy does not see a COPY, so its failures are handed back as SQLAlchemy's
        would be: a :class:`~sqlalchemy.exc.DBAPIError`, and a connection that broke is
        invalidated (SQLAlchemy discards it, and ingest retries the batch) rather than
        returned to the pool to fail again.
        """
        # Here, not at the top: psycopg is the ``postgres`` extra, and SQLite ledgers (the demo,
        # gmd-admin on a laptop) import the store without it.
        import psycopg

        raw = conn.connection.driver_connection
        if not isinstance(raw, psycopg.Connection):
            raise TypeError(f"binary COPY needs a psycopg connection, not {type(raw).__name__}")
        try:
            with raw.cursor().copy(self.statement) as copy:
                copy.write(data)
        except psycopg.Error as exc:
            broken = raw.broken or raw.closed
            if broken:
                conn.invalidate(exc)
            raise DBAPIError.instance(
                self.statement, None, exc, psycopg.Error, connection_invalidated=broken
            ) from exc

    def _rows(
        self,
        arrays: Mapping[str, object],
        nulls: frozenset[str],
        rows: np.ndarray | None,
        n: int,
    ) -> bytes:
        count = n if rows is None else int(rows.sum())
        out = np.empty(count, dtype=_row_type(self.columns, self.types, nulls))
        out["fields"] = len(self.columns)
        for column, code in zip(self.columns, self.types, strict=True):
            if column in nulls:
                out[f"{column}.length"] = -1
                continue
            out[f"{column}.length"] = np.dtype(code).itemsize
            value = arrays[column]
            if isinstance(value, np.ndarray) and rows is not None:
                value = value[rows]
            out[column] = value
        return out.tobytes()


@cache
def _row_type(columns: tuple[str, ...], types: tuple[str, ...], nulls: frozenset[str]) -> np.dtype:
    """One row's packed layout: the field count, then per field its length and (unless NULL)
    its value."""
    layout: list[tuple[str, str]] = [("fields", ">i2")]
    for column, code in zip(columns, types, strict=True):
        layout.append((f"{column}.length", ">i4"))
        if column not in nulls:
            layout.append((column, code))
    return np.dtype(layout)
