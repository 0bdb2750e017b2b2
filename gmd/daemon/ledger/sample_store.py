"""Where a batch's samples are stored, and the writes and reads that depend on it.

On PostgreSQL a batch is one row of :data:`~gmd.daemon.ledger.models.sample_batches`, each
VM's figures an element of its arrays (migration 0013): a sample row cost 239 bytes on disk
for ~110 bytes of figures, a row of arrays ~1.0×. ``samples`` is a view of it with the rows
every reader knows, so reports and explain keep their SQL. On SQLite ``samples`` is the table.

Writes go to whole batches (ingest, quarantine, release), and so does accounting's read:
those are here. The arrays travel in PostgreSQL's binary form, laid out by numpy
(:func:`array_field`), both ways.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import (
    Connection,
    Table,
    delete,
    func,
    insert,
    literal_column,
    select,
    text,
    true,
)

from gmd.daemon.ledger.binary_copy import HEADER, TRAILER, send_copy
from gmd.daemon.ledger.models import (
    FLAVOR_COLUMNS,
    PER_VM,
    SAMPLE_IDS,
    USE_COLUMNS,
    sample_batches,
)
from gmd.daemon.ledger.tables import quarantined_samples, samples

_INT4, _FLOAT8 = 23, 701
"""PostgreSQL's type oids of an array's elements (``pg_type``)."""
_ARRAY_HEADER = np.dtype(
    [("ndim", ">i4"), ("nulls", ">i4"), ("oid", ">i4"), ("n", ">i4"), ("lbound", ">i4")]
)
"""A one-dimensional array's binary header (``array_send``): then per element its length
(-1: NULL) and value."""
_BATCH_COLUMNS = ("interval_id", "batch_id", "host_id", "late", *PER_VM)
_SCALARS = np.dtype(
    [
        ("fields", ">i2"),
        ("l0", ">i4"),
        ("interval_id", ">i8"),
        ("l1", ">i4"),
        ("batch_id", ">i8"),
        ("l2", ">i4"),
        ("host_id", ">i4"),
        ("l3", ">i4"),
        ("late", "?"),
    ]
)
"""A row's field count, then each scalar field's length and value."""
_COPY = f"COPY sample_batches ({', '.join(_BATCH_COLUMNS)}) FROM STDIN (FORMAT BINARY)"


def packed(conn: Connection) -> bool:
    """Whether ``conn``'s ledger stores a batch as one row of arrays (PostgreSQL)."""
    return conn.dialect.name == "postgresql"


def stored_table(conn: Connection) -> Table:
    """The table that holds the samples on ``conn``'s ledger (for sizes and retention)."""
    return sample_batches if packed(conn) else samples


def estimated_samples(conn: Connection, batches: int) -> int:
    """The samples in ``batches`` stored batches, estimated from the VMs per batch of a 1 %
    sample of the table's pages (counting them all would read every raw day)."""
    mean = conn.execute(
        text("SELECT avg(cardinality(vm_id)) FROM sample_batches TABLESAMPLE SYSTEM (1)")
    ).scalar()
    if mean is None:  # a small table's 1 % can be no page at all
        mean = conn.execute(text("SELECT avg(cardinality(vm_id)) FROM sample_batches")).scalar()
    return round(batches * float(mean or 0))


def array_field(values: np.ndarray, integer: bool) -> bytes:
    """``values`` as one binary COPY field holding an array: its length, the header and the
    elements, big-endian; a float NaN is a NULL element."""
    code, oid = (">i4", _INT4) if integer else (">f8", _FLOAT8)
    n = len(values)
    cells = np.empty(n, dtype=[("length", ">i4"), ("value", code)])
    cells["length"] = np.dtype(code).itemsize
    cells["value"] = values
    missing = np.zeros(n, dtype=bool) if integer else np.isnan(values)
    header = np.array([(1, int(missing.any()), oid, n, 1)], dtype=_ARRAY_HEADER)
    if missing.any():
        cells["length"][missing] = -1
        keep = np.ones((n, cells.itemsize), dtype=bool)
        keep[missing, 4:] = False
        body = cells.view(np.uint8).reshape(n, cells.itemsize)[keep].tobytes()
    else:
        body = cells.tobytes()
    size = header.itemsize + len(body)
    return size.to_bytes(4, "big") + header.tobytes() + body


def write_batch(
    conn: Connection,
    *,
    interval_id: int,
    batch_id: int,
    host_id: int,
    late: bool,
    vm_ids: Sequence[int],
    customer_ids: Sequence[int],
    use: np.ndarray,
    flavor: np.ndarray,
) -> None:
    """Store one batch's samples (``use`` and ``flavor``: a row per VM, columns as
    ``USE_COLUMNS`` and ``FLAVOR_COLUMNS``; a NaN flavor figure is not reported).

    PostgreSQL: one row, sent by binary COPY (one round trip, no number turned into text).
    SQLite: a row per VM."""
    if not len(vm_ids):
        return
    if not packed(conn):
        rows = [
            {
                "interval_id": interval_id,
                "vm_id": vm_id,
                "host_id": host_id,
                "customer_id": customer_id,
                "batch_id": batch_id,
                "late": late,
                **dict(zip(USE_COLUMNS, u, strict=True)),
                **{c: None if v != v else v for c, v in zip(FLAVOR_COLUMNS, f, strict=True)},
            }
            for vm_id, customer_id, u, f in zip(
                vm_ids, customer_ids, use.tolist(), flavor.tolist(), strict=True
            )
        ]
        conn.execute(samples.insert(), rows)
        return
    per_vm = [
        np.asarray(vm_ids),
        np.asarray(customer_ids),
        *(use[:, k] for k in range(len(USE_COLUMNS))),
        *(flavor[:, k] for k in range(len(FLAVOR_COLUMNS))),
    ]
    row = _batch_row(interval_id, batch_id, host_id, late, per_vm)
    send_copy(conn, _COPY, b"".join((HEADER, row, TRAILER)))


def write_batches(conn: Connection, columns: Mapping[str, np.ndarray]) -> None:
    """Store many batches' samples at once: ``columns`` holds one array per column of
    ``samples`` (but ``id``), a sample per element, in one statement (a benchmark's seeding,
    a day of samples at a time)."""
    n = len(columns["vm_id"])
    if not n:
        return
    if not packed(conn):
        names = [c.name for c in samples.columns if c.name != "id"]
        lists = [columns[c].tolist() for c in names]
        rows = [dict(zip(names, values, strict=True)) for values in zip(*lists, strict=True)]
        for row in rows:
            for c in FLAVOR_COLUMNS:
                if row[c] != row[c]:
                    row[c] = None
        conn.execute(samples.insert(), rows)
        return
    order = np.argsort(columns["batch_id"], kind="stable")
    batch = columns["batch_id"][order]
    starts = np.flatnonzero(np.concatenate(([True], batch[1:] != batch[:-1])))
    ends = np.append(starts[1:], n)
    ordered = {c: np.asarray(columns[c])[order] for c in ("interval_id", "host_id", "late")}
    per_vm = [np.asarray(columns[c])[order] for c in PER_VM]
    packed_rows = [
        _batch_row(
            int(ordered["interval_id"][a]),
            int(batch[a]),
            int(ordered["host_id"][a]),
            bool(ordered["late"][a]),
            [v[a:b] for v in per_vm],
        )
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    send_copy(conn, _COPY, b"".join((HEADER, *packed_rows, TRAILER)))


def _batch_row(
    interval_id: int, batch_id: int, host_id: int, late: bool, per_vm: Sequence[np.ndarray]
) -> bytes:
    """One ``sample_batches`` row in binary COPY form: the batch's scalars, then an array per
    column of :data:`PER_VM` (``per_vm``, in that order)."""
    scalars = np.array(
        [(len(_BATCH_COLUMNS), 8, interval_id, 8, batch_id, 4, host_id, 1, late)],
        dtype=_SCALARS,
    )
    arrays = [array_field(v, c in SAMPLE_IDS) for c, v in zip(PER_VM, per_vm, strict=True)]
    return b"".join((scalars.tobytes(), *arrays))


def delete_batches(conn: Connection, batch_ids: Sequence[int]) -> None:
    """Delete the samples of ``batch_ids``, whole batches at a time."""
    table = stored_table(conn)
    conn.execute(delete(table).where(table.c.batch_id.in_(list(batch_ids))))


def restore_quarantined(conn: Connection, batch_id: int) -> None:
    """Put a quarantined batch's samples back in ``samples``, as late ones."""
    q = quarantined_samples.c
    if not packed(conn):
        columns = [c.name for c in samples.columns if c.name not in ("id", "late")]
        conn.execute(
            insert(samples).from_select(
                [*columns, "late"],
                select(*(q[c] for c in columns), true()).where(q.batch_id == batch_id),
            )
        )
        return
    conn.execute(
        insert(sample_batches).from_select(
            list(_BATCH_COLUMNS),
            select(
                q.interval_id,
                q.batch_id,
                func.min(q.host_id),
                true(),
                *(func.array_agg(literal_column(f"{c} ORDER BY id")) for c in PER_VM),
            )
            .where(q.batch_id == batch_id)
            .group_by(q.interval_id, q.batch_id),
        )
    )


def read_on_time(
    conn: Connection, interval_id: int, batch_ids: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """The interval's on-time samples straight from ``sample_batches``, column by column:
    ``(host_id, batch_id, counts, {column: values})``, one entry of the first three per batch
    and of each column per sample, or None where samples are rows (SQLite).

    One ``string_agg`` joins every batch as its host, its id and its arrays in their binary
    form: the server sends what it stores, with no row per sample to build (0.10 s at 100,000
    samples, where an aggregate per column, each sorting the batches, took 0.2 s), and numpy
    reads the elements in place. A NULL element (a flavor figure not reported) comes as NaN."""
    if not packed(conn):
        return None
    b = sample_batches.c
    arrays = " || ".join(
        f"array_send({c})" if c in SAMPLE_IDS else f"array_send(array_replace({c}, NULL, 'NaN'))"
        for c in PER_VM
    )
    record: Any = literal_column(f"int4send(host_id) || int8send(batch_id) || {arrays}")
    query = select(func.string_agg(record, literal_column("''::bytea"))).where(
        b.interval_id == interval_id, b.late.is_(False), func.cardinality(b.vm_id) > 0
    )
    if batch_ids is not None:
        query = query.where(b.batch_id.in_(list(batch_ids)))
    row = _binary_row(conn, query)
    blob = b"" if row is None or row[0] is None else row[0]
    return _records(blob)


_WIDTHS = np.array([4 if c in SAMPLE_IDS else 8 for c in PER_VM], dtype=np.int64)
_CELLS = 4 + _WIDTHS
"""Each per-VM array's element: its length, then its value."""
_RECORD_HEAD = 12
"""A record's host (4 bytes) and batch id (8) before its arrays."""


def _records(blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Split :func:`read_on_time`'s records: a walk over the batches finds each one's start and
    VM count (every array of a batch has its count), then each column's elements are gathered
    from every batch at once."""
    starts, counts = [], []
    at, end = 0, len(blob)
    per_vm = int(_CELLS.sum())
    fixed = _RECORD_HEAD + len(PER_VM) * _ARRAY_HEADER.itemsize
    while at < end:
        vms = int.from_bytes(blob[at + _RECORD_HEAD + 12 : at + _RECORD_HEAD + 16], "big")
        starts.append(at)
        counts.append(vms)
        at += fixed + vms * per_vm
    if at != end:
        raise ValueError(f"stored batches of {end} bytes do not split into records")
    start = np.array(starts, dtype=np.int64)
    count = np.array(counts, dtype=np.int64)
    # Every field is a multiple of 4 bytes long, so every value starts on a 4-byte word: the
    # values are gathered a word (int4) or two (float8) at a time, their bytes kept in order.
    words = np.frombuffer(blob, dtype=np.uint32)
    head = words[(start // 4)[:, None] + np.arange(3)]
    host = head[:, :1].copy().view(">i4").reshape(-1).astype(np.int64)
    batch = head[:, 1:].copy().view(">i8").reshape(-1).astype(np.int64)
    total = int(count.sum())
    # Sample t, the j-th of its batch i, in column k: the record's start, its head, the
    # headers and arrays before column k, column k's header and j cells, then the length.
    before = np.cumsum(count) - count
    j = np.arange(total) - np.repeat(before, count)
    base = np.repeat(start // 4, count)
    n = np.repeat(count, count)
    values = {}
    preceding = 0
    for k, column in enumerate(PER_VM):
        offset = (_RECORD_HEAD + (k + 1) * _ARRAY_HEADER.itemsize + 4) // 4 + n * preceding
        first = base + offset + j * int(_CELLS[k] // 4)
        if _WIDTHS[k] == 4:
            values[column] = words[first].view(">i4").astype(np.int64)
        else:
            pair = words[first[:, None] + np.arange(2)]
            values[column] = pair.view(">f8").reshape(total).astype(np.float64)
        preceding += int(_CELLS[k] // 4)
    return host, batch, count, values


def _binary_row(conn: Connection, query: Any) -> tuple[Any, ...] | None:
    compiled = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    raw = conn.connection.driver_connection
    assert raw is not None, "a connection in use has a driver connection"
    with raw.cursor(binary=True) as cursor:
        cursor.execute(str(compiled))
        row = cursor.fetchone()
    return None if row is None else tuple(row)
