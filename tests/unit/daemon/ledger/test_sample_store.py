"""The samples' storage (``gmd.daemon.ledger.sample_store``) on both databases: what is
written a batch at a time is what ``samples`` shows a row at a time, and what accounting
reads from the stored arrays is what the rows say, NULL flavors, late and quarantined
batches included."""

from __future__ import annotations

import time

import numpy as np
import pytest
import sqlalchemy as sa

from gmd.admin.db_usage import usage
from gmd.daemon.config import RetentionConfig
from gmd.daemon.ledger import partitions, sample_store
from gmd.daemon.ledger.interval_samples import (
    SAMPLE_CUSTOMER,
    SAMPLE_FLAVOR,
    SAMPLE_HOST,
    SAMPLE_USE,
    SAMPLE_VM,
    read_samples,
)
from gmd.ledger_schema import migrate
from gmd.ledger_schema.models import FLAVOR_COLUMNS, USE_COLUMNS
from gmd.ledger_schema.tables import samples

START = int(time.time()) // 86400 * 86400 + 600


def batches(rng: np.random.Generator) -> list[dict]:
    """Three hosts' batches for one interval (one late, one whose VMs report no flavor at
    all, one with a single VM's flavor missing), and one batch of the next interval."""
    out = []
    for batch_id, (host, n, late, interval) in enumerate(
        [
            (1, 5, False, START),
            (2, 3, False, START),
            (3, 4, True, START),
            (1, 2, False, START + 60),
        ],
        start=1,
    ):
        flavor = rng.uniform(1, 8, (n, len(FLAVOR_COLUMNS)))
        if batch_id == 2:
            flavor[:] = np.nan
        if batch_id == 1:
            flavor[2, 1] = np.nan
        out.append(
            {
                "interval_id": interval,
                "batch_id": batch_id,
                "host_id": host,
                "late": late,
                "vm_ids": list(range(10 * batch_id, 10 * batch_id + n)),
                "customer_ids": [int(c) for c in rng.integers(1, 4, n)],
                "use": rng.uniform(0, 100, (n, len(USE_COLUMNS))),
                "flavor": flavor,
            }
        )
    return out


@pytest.fixture
def ledger(database_url: str):
    engine = migrate.engine_for(database_url)
    migrate.upgrade(engine)
    partitions.ensure_days(engine, [START // 86400])
    yield engine
    engine.dispose()


def rows_of(conn: sa.Connection) -> list[tuple]:
    keys = ("interval_id", "batch_id", "host_id", "vm_id", "customer_id")
    columns = ", ".join((*keys, *USE_COLUMNS, *FLAVOR_COLUMNS, "late"))
    return [
        tuple(r)
        for r in conn.exec_driver_sql(f"SELECT {columns} FROM samples ORDER BY batch_id, vm_id")
    ]


def expected_rows(written: list[dict]) -> list[tuple]:
    out = []
    for b in written:
        for k, vm in enumerate(b["vm_ids"]):
            flavor = [None if v != v else v for v in b["flavor"][k].tolist()]
            head = (b["interval_id"], b["batch_id"], b["host_id"], vm, b["customer_ids"][k])
            out.append((*head, *b["use"][k].tolist(), *flavor, b["late"]))
    return out


def test_a_batch_written_at_once_reads_back_as_its_rows(ledger: sa.Engine) -> None:
    written = batches(np.random.default_rng(1))
    with ledger.begin() as conn:
        for b in written:
            sample_store.write_batch(conn, **b)
        sample_store.write_batch(  # a batch of no VMs stores nothing
            conn, **{**written[0], "batch_id": 99, "vm_ids": [], "customer_ids": []}
        )
    with ledger.connect() as conn:
        assert rows_of(conn) == expected_rows(written)


def test_many_batches_written_in_one_statement_read_back_as_their_rows(ledger: sa.Engine) -> None:
    written = batches(np.random.default_rng(2))
    columns: dict[str, list] = {}
    for b in written:
        n = len(b["vm_ids"])
        for c in ("interval_id", "batch_id", "host_id", "late"):
            columns.setdefault(c, []).extend([b[c]] * n)
        columns.setdefault("vm_id", []).extend(b["vm_ids"])
        columns.setdefault("customer_id", []).extend(b["customer_ids"])
        for k, c in enumerate(USE_COLUMNS):
            columns.setdefault(c, []).extend(b["use"][:, k].tolist())
        for k, c in enumerate(FLAVOR_COLUMNS):
            columns.setdefault(c, []).extend(b["flavor"][:, k].tolist())
    # Handed over out of batch order: the store groups them.
    order = np.random.default_rng(3).permutation(len(columns["vm_id"]))
    with ledger.begin() as conn:
        sample_store.write_batches(conn, {c: np.asarray(v)[order] for c, v in columns.items()})
    with ledger.connect() as conn:
        assert rows_of(conn) == expected_rows(written)


def test_accounting_reads_the_on_time_samples_the_rows_hold(ledger: sa.Engine) -> None:
    """On PostgreSQL from the stored arrays, on SQLite from the rows: the same numbers as the
    general query over ``samples`` (the path taken with extra columns)."""
    written = batches(np.random.default_rng(4))
    with ledger.begin() as conn:
        for b in written:
            sample_store.write_batch(conn, **b)
    with ledger.connect() as conn:
        got = read_samples(conn, START)
        general = read_samples(conn, START, extra=(samples.c.host_id,))[:, :-1]
        some = read_samples(conn, START, batch_ids=[2])
    np.testing.assert_array_equal(got, general)
    on_time = [b for b in written if b["interval_id"] == START and not b["late"]]
    assert sorted(zip(got[:, SAMPLE_HOST], got[:, SAMPLE_VM], strict=True)) == sorted(
        (b["host_id"], vm) for b in on_time for vm in b["vm_ids"]
    )
    first = on_time[0]
    row = got[got[:, SAMPLE_VM] == first["vm_ids"][2]][0]
    assert row[SAMPLE_CUSTOMER] == first["customer_ids"][2]
    np.testing.assert_array_equal(row[SAMPLE_USE], first["use"][2])
    np.testing.assert_array_equal(row[SAMPLE_FLAVOR], first["flavor"][2])  # a NaN kept
    assert np.isnan(some[:, SAMPLE_FLAVOR]).all() and len(some) == 3


def test_an_interval_with_no_on_time_samples_reads_empty(ledger: sa.Engine) -> None:
    with ledger.connect() as conn:
        assert read_samples(conn, START).shape[0] == 0


def test_a_batchs_arrays_hold_its_values_nan_included_in_postgresql_binary_form() -> None:
    values = np.array([1.5, np.nan, -2.0])
    use = np.arange(3 * len(USE_COLUMNS), dtype=float).reshape(3, -1)
    flavor = np.zeros((3, len(FLAVOR_COLUMNS)))
    flavor[:, 1] = values
    arrays = sample_store.batch_arrays([7, 8, 9], [4, 4, 5], use, flavor)
    assert list(arrays) == ["vm_id", "customer_id", *USE_COLUMNS, *FLAVOR_COLUMNS]

    def cells(array: bytes, oid: int, code: str) -> np.ndarray:
        header = np.frombuffer(array[:20], dtype=">i4").tolist()
        assert header == [1, 0, oid, 3, 1]  # one dimension, no NULLs, its type, 3 from index 1
        found = np.frombuffer(array[20:], dtype=[("length", ">i4"), ("value", code)])
        assert found["length"].tolist() == [np.dtype(code).itemsize] * 3
        return found["value"]

    np.testing.assert_array_equal(cells(arrays[FLAVOR_COLUMNS[1]], 701, ">f8"), values)
    np.testing.assert_array_equal(cells(arrays["vm_id"], 23, ">i4"), [7, 8, 9])
    np.testing.assert_array_equal(cells(arrays["customer_id"], 23, ">i4"), [4, 4, 5])
    for k, column in enumerate(USE_COLUMNS):
        np.testing.assert_array_equal(cells(arrays[column], 701, ">f8"), use[:, k])


def test_db_usage_counts_samples_not_batches_without_exact(ledger: sa.Engine) -> None:
    """``gmd-admin db usage`` without ``--exact`` estimates the samples from the stored
    batches (on PostgreSQL a row holds a batch) and gives the samples' count, not theirs."""
    written = batches(np.random.default_rng(5))
    with ledger.begin() as conn:
        for b in written:
            sample_store.write_batch(conn, **b)
    if ledger.dialect.name == "postgresql":
        with ledger.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE sample_batches")
    with ledger.connect() as conn:
        found = usage(conn, RetentionConfig(), exact=False)
    (row,) = [r for r in found.rows if r["table"] == "samples"]
    assert row["rows"] == sum(len(b["vm_ids"]) for b in written)
