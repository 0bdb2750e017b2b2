"""Where a batch's samples are stored, and the writes and reads that depend on it.

On PostgreSQL a batch is one row of :data:`~gmd.ledger_schema.models.sample_batches`, each
VM's figures an element of its arrays (migration 0013): a sample row cost 239 bytes on disk
for ~110 bytes of figures, a row of arrays ~1.0×. ``samples`` is a view of it with the rows
every reader knows, so reports and explain keep their SQL. On SQLite ``samples`` is the table.

Writes go to whole batches (ingest, quarantine, release), and so does accounting's read:
those are here. The arrays travel in PostgreSQL's binary form, laid out by numpy
(:func:`batch_arrays`), both ways.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
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
    update,
)
from sqlalchemy.dialects.postgresql import distinct_on

from gmd.daemon.ledger.binary_copy import HEADER, TRAILER, binary_rows, send_copy
from gmd.ledger_schema.models import (
    FLAVOR_COLUMNS,
    PER_VM,
    SAMPLE_FIGURES,
    SAMPLE_IDS,
    USE_COLUMNS,
    sample_batches,
)
from gmd.ledger_schema.tables import quarantined_samples, samples

_INT4, _FLOAT8 = 23, 701
"""PostgreSQL's type oids of an array's elements (``pg_type``)."""
_ARRAY_HEADER = np.dtype(
    [("ndim", ">i4"), ("nulls", ">i4"), ("oid", ">i4"), ("n", ">i4"), ("lbound", ">i4")]
)
"""A one-dimensional array's binary header (``array_send``): then per element its length
(-1: NULL) and value."""
BATCH_COLUMNS = ("interval_id", "batch_id", "host_id", "late", *PER_VM)
"""``sample_batches``' columns: a batch's scalars, then its arrays."""
SAMPLE_COLUMNS = tuple(c.name for c in samples.columns if c.name != "id")
"""The columns of ``samples`` on either database (the view has no ``id``)."""
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
_COPY = f"COPY sample_batches ({', '.join(BATCH_COLUMNS)}) FROM STDIN (FORMAT BINARY)"


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


def _array_values(rows: np.ndarray, integer: bool) -> list[bytes]:
    """Each row of the matrix ``rows`` as PostgreSQL's binary form of a one-dimensional
    ``int4[]`` (``integer``) or ``float8[]`` (``array_send``'s): the header, then each
    element's length and value, big-endian; laid out by one numpy assignment for them all (a
    batch's ten figure arrays cost one, not ten). A NaN stays NaN: a flavor figure not
    reported is stored so (the view shows NULL), and an array without NULLs has one layout,
    which accounting reads in place."""
    code, oid = (">i4", _INT4) if integer else (">f8", _FLOAT8)
    k, n = rows.shape
    cells = np.empty((k, n), dtype=[("length", ">i4"), ("value", code)])
    cells["length"] = np.dtype(code).itemsize
    cells["value"] = rows
    header = np.array([(1, 0, oid, n, 1)], dtype=_ARRAY_HEADER).tobytes()
    return [header + row.tobytes() for row in cells]


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
        batch = {"interval_id": interval_id, "batch_id": batch_id, "host_id": host_id, "late": late}
        per_vm = _per_vm(vm_ids, customer_ids, use, flavor)
        _insert_rows(conn, {**{c: np.full(len(vm_ids), v) for c, v in batch.items()}, **per_vm})
        return
    arrays = batch_arrays(vm_ids, customer_ids, use, flavor)
    row = _batch_row(interval_id, batch_id, host_id, late, arrays)
    send_copy(conn, _COPY, b"".join((HEADER, row, TRAILER)))


def _per_vm(
    vm_ids: Sequence[int], customer_ids: Sequence[int], use: np.ndarray, flavor: np.ndarray
) -> dict[str, np.ndarray]:
    """A batch's per-VM columns (:data:`PER_VM`) from its ids and its figures by VM."""
    return {
        "vm_id": np.asarray(vm_ids),
        "customer_id": np.asarray(customer_ids),
        **{c: use[:, k] for k, c in enumerate(USE_COLUMNS)},
        **{c: flavor[:, k] for k, c in enumerate(FLAVOR_COLUMNS)},
    }


def batch_arrays(
    vm_ids: Sequence[int], customer_ids: Sequence[int], use: np.ndarray, flavor: np.ndarray
) -> dict[str, bytes]:
    """A batch's per-VM columns by name, each in its array's binary form
    (:func:`_array_values`): the parameters of a statement that writes the batch's row."""
    return _arrays(np.array([vm_ids, customer_ids]), np.concatenate((use, flavor), axis=1).T)


def _matrices(per_vm: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``per_vm``'s columns (:data:`PER_VM`, each an array by VM) as two matrices, a row per
    column: the ids, then the figures."""
    return (
        np.array([per_vm[c] for c in SAMPLE_IDS]),
        np.array([per_vm[c] for c in SAMPLE_FIGURES], dtype=np.float64),
    )


def _arrays(ids: np.ndarray, figures: np.ndarray) -> dict[str, bytes]:
    """The binary arrays of a batch's :data:`PER_VM` columns by name, from its ``ids`` and
    ``figures`` matrices (a row per column, in :data:`PER_VM`'s order)."""
    encoded = _array_values(ids, integer=True) + _array_values(figures, integer=False)
    return dict(zip(PER_VM, encoded, strict=True))


def write_batches(conn: Connection, columns: Mapping[str, np.ndarray]) -> None:
    """Store many batches' samples at once: ``columns`` holds one array per column of
    ``samples`` (but ``id``), a sample per element, in one statement (a benchmark's seeding,
    a day of samples at a time)."""
    n = len(columns["vm_id"])
    if not n:
        return
    if not packed(conn):
        _insert_rows(conn, columns)
        return
    order = np.argsort(columns["batch_id"], kind="stable")
    batch = columns["batch_id"][order]
    starts = np.flatnonzero(np.concatenate(([True], batch[1:] != batch[:-1])))
    ends = np.append(starts[1:], n)
    ordered = {c: np.asarray(columns[c])[order] for c in ("interval_id", "host_id", "late")}
    ids, figures = _matrices({c: np.asarray(columns[c])[order] for c in PER_VM})
    packed_rows = [
        _batch_row(
            int(ordered["interval_id"][a]),
            int(batch[a]),
            int(ordered["host_id"][a]),
            bool(ordered["late"][a]),
            _arrays(ids[:, a:b], figures[:, a:b]),
        )
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    send_copy(conn, _COPY, b"".join((HEADER, *packed_rows, TRAILER)))


def _insert_rows(conn: Connection, columns: Mapping[str, np.ndarray]) -> None:
    """Insert ``columns`` (one array per column of :data:`SAMPLE_COLUMNS`) into the
    ``samples`` table, a row per element; a NaN flavor figure is NULL."""
    lists = [columns[c].tolist() for c in SAMPLE_COLUMNS]
    rows = [dict(zip(SAMPLE_COLUMNS, values, strict=True)) for values in zip(*lists, strict=True)]
    for row in rows:
        for c in FLAVOR_COLUMNS:
            if row[c] != row[c]:
                row[c] = None
    conn.execute(samples.insert(), rows)


def _batch_row(
    interval_id: int, batch_id: int, host_id: int, late: bool, arrays: Mapping[str, bytes]
) -> bytes:
    """One ``sample_batches`` row in binary COPY form: the batch's scalars, then each array of
    ``arrays`` (:func:`_arrays`) as a field, its length before it, in :data:`PER_VM`'s order."""
    scalars = np.array(
        [(len(BATCH_COLUMNS), 8, interval_id, 8, batch_id, 4, host_id, 1, late)],
        dtype=_SCALARS,
    )
    fields = (len(arrays[c]).to_bytes(4, "big") + arrays[c] for c in PER_VM)
    return b"".join((scalars.tobytes(), *fields))


def delete_batches(conn: Connection, batch_ids: Sequence[int]) -> None:
    """Delete the samples of ``batch_ids``, whole batches at a time."""
    table = stored_table(conn)
    conn.execute(delete(table).where(table.c.batch_id.in_(list(batch_ids))))


def mark_late(conn: Connection, interval_id: int, batch_ids: Sequence[int]) -> None:
    """Make the samples of ``batch_ids`` (of interval ``interval_id``, whose partition alone
    is read) late ones: kept for reports, read by no accounting."""
    table = stored_table(conn)
    conn.execute(
        update(table)
        .where(table.c.interval_id == interval_id, table.c.batch_id.in_(list(batch_ids)))
        .values(late=True)
    )


def restore_quarantined(conn: Connection, batch_id: int) -> None:
    """Put a quarantined batch's samples back in ``samples``, as late ones."""
    q = quarantined_samples.c
    if not packed(conn):
        columns = [c for c in SAMPLE_COLUMNS if c != "late"]
        conn.execute(
            insert(samples).from_select(
                [*columns, "late"],
                select(*(q[c] for c in columns), true()).where(q.batch_id == batch_id),
            )
        )
        return
    conn.execute(
        insert(sample_batches).from_select(
            list(BATCH_COLUMNS),
            select(
                q.interval_id,
                q.batch_id,
                func.min(q.host_id),
                true(),
                *(func.array_agg(literal_column(f"{_stored(c)} ORDER BY id")) for c in PER_VM),
            )
            .where(q.batch_id == batch_id)
            .group_by(q.interval_id, q.batch_id),
        )
    )


def _stored(column: str) -> str:
    """``column`` of ``quarantined_samples`` as ``sample_batches`` stores it: NaN for a flavor
    figure not reported."""
    return f"coalesce({column}, 'NaN')" if column in FLAVOR_COLUMNS else column


def read_on_time(
    conn: Connection, interval_id: int, batch_ids: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """The interval's on-time samples straight from ``sample_batches``, column by column:
    ``(host_id, batch_id, counts, {column: values})``, one entry of the first three per batch
    and of each column per sample (batch by batch, in no particular order), or None where
    samples are rows (SQLite).

    Each batch comes as its host, its id and one byte string of its arrays in their binary
    form: the server sends what it stores, with no row per sample to build. Batches of the
    same size have the same layout, so each such group is read by numpy in place as one
    structured array, with no per-sample work in Python. At 1M samples in 50,000 batches this
    took 0.9 s where one ``string_agg`` of every batch took 1.5-2.0 s (and a binary COPY of
    the stored rows 0.7 s)."""
    if not packed(conn):
        return None
    b = sample_batches.c
    arrays: Any = literal_column(" || ".join(f"array_send({c})" for c in PER_VM))
    query = select(b.host_id, b.batch_id, arrays).where(
        b.interval_id == interval_id, b.late.is_(False), func.cardinality(b.vm_id) > 0
    )
    if batch_ids is not None:
        query = query.where(b.batch_id.in_(list(batch_ids)))
    rows = binary_rows(conn, query)
    by_size: dict[int, list[tuple[int, int, bytes]]] = {}
    for row in rows:
        by_size.setdefault(len(row[2]), []).append(row)
    hosts, batches, counts = [], [], []
    values: dict[str, list[np.ndarray]] = {c: [] for c in PER_VM}
    for size, group in by_size.items():
        n, extra = divmod(size - len(PER_VM) * _ARRAY_HEADER.itemsize, _PER_VM_BYTES)
        if extra or n < 1:
            raise ValueError(f"a stored batch of {size} bytes of arrays is not a whole one")
        records = np.frombuffer(b"".join(r[2] for r in group), dtype=_record_type(n))
        if any((records[f"{c}.head"]["n"] != n).any() for c in PER_VM):
            raise ValueError(f"stored batches of {size} bytes do not all hold {n} VMs")
        hosts.append(np.array([r[0] for r in group], dtype=np.int64))
        batches.append(np.array([r[1] for r in group], dtype=np.int64))
        counts.append(np.full(len(group), n, dtype=np.int64))
        for c in PER_VM:
            values[c].append(records[c]["value"].reshape(-1))
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, {c: np.zeros(0) for c in PER_VM}
    return (
        np.concatenate(hosts),
        np.concatenate(batches),
        np.concatenate(counts),
        {c: np.concatenate(v) for c, v in values.items()},
    )


def latest_lists(conn: Connection, since_s: int) -> dict[int, tuple[list[int], list[int]]]:
    """Each host's VMs and their owners as its latest batch of an interval from ``since_s``
    on listed them, in the batch's order: host id → (VM ids, customer ids)."""
    if packed(conn):
        b = sample_batches.c
        rows = conn.execute(
            select(b.host_id, b.vm_id, b.customer_id)
            .where(b.interval_id >= since_s)
            .order_by(b.host_id, b.interval_id.desc(), b.batch_id.desc())
            .ext(distinct_on(b.host_id))
        )
        return {host: (list(vms), list(owners)) for host, vms, owners in rows}
    s = samples.c
    lists: dict[int, tuple[list[int], list[int]]] = {}
    latest: dict[int, int] = {}
    for host, batch, vm, owner in conn.execute(
        select(s.host_id, s.batch_id, s.vm_id, s.customer_id)
        .where(s.interval_id >= since_s)
        .order_by(s.host_id, s.interval_id.desc(), s.batch_id.desc(), s.id)
    ):
        if latest.setdefault(host, batch) != batch:
            continue
        vms, owners = lists.setdefault(host, ([], []))
        vms.append(vm)
        owners.append(owner)
    return lists


_PER_VM_BYTES = sum(4 + (4 if c in SAMPLE_IDS else 8) for c in PER_VM)
"""One VM's share of a batch's arrays: per column its element's length and value."""


@cache
def _record_type(n: int) -> np.dtype:
    """A batch of ``n`` VMs' arrays, one after another as ``array_send`` writes them: per
    column a header, then ``n`` cells of a length and a value."""
    fields: list[Any] = []
    for c in PER_VM:
        code = ">i4" if c in SAMPLE_IDS else ">f8"
        fields.append((f"{c}.head", _ARRAY_HEADER))
        fields.append((c, np.dtype([("length", ">i4"), ("value", code)]), (n,)))
    return np.dtype(fields)
