"""The Alembic migrations run forward on empty SQLite and PostgreSQL, and back down again."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext

from gmd.ledger_schema import migrate
from gmd.ledger_schema.models import stored_metadata


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {migrate.VERSION_TABLE}


def stored(engine: sa.Engine) -> set[str]:
    return set(stored_metadata(engine.dialect.name).tables)


def alembic_reads(engine: sa.Engine) -> str | None:
    """The revision as Alembic itself reads it (what migrate.current reads without it)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def test_the_schema_this_gmd_reads_is_where_its_migrations_end() -> None:
    """A new migration moves ``migrate.SCHEMA`` too: until it does, this fails."""
    assert migrate.head() == migrate.SCHEMA


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    engine = migrate.engine_for(database_url)
    try:
        assert migrate.current(engine) is None
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.SCHEMA == alembic_reads(engine)
        assert tables(engine) == stored(engine)
        migrate.downgrade(engine, "0014")
        assert migrate.current(engine) == "0014" == alembic_reads(engine)
        migrate.downgrade(engine, "base")
        assert migrate.current(engine) is None
        assert alembic_reads(engine) is None
        assert tables(engine) == set()
        migrate.upgrade(engine)
        assert tables(engine) == stored(engine)
    finally:
        engine.dispose()


def test_a_version_table_of_several_revisions_is_no_schema_gmd_made(tmp_path: Path) -> None:
    engine = migrate.engine_for(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
            conn.execute(sa.text("INSERT INTO alembic_version VALUES ('0014'), ('0015')"))
        with pytest.raises(migrate.SchemaMismatch, match="several schema revisions"):
            migrate.current(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_daemons_started_together_on_an_empty_postgresql_make_the_schema_once(
    database_url: str,
) -> None:
    """Several ingest daemons may share a ledger and start at the same moment: each upgrades
    an empty database, and none may fail on the others' half-made schema."""
    engines = [migrate.engine_for(database_url) for _ in range(3)]
    start = threading.Barrier(len(engines))
    failures: list[BaseException] = []

    def upgrade(engine: sa.Engine) -> None:
        start.wait()
        try:
            migrate.upgrade(engine)
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=upgrade, args=(e,)) for e in engines]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert failures == []
        assert migrate.current(engines[0]) == migrate.SCHEMA
        assert tables(engines[0]) == stored(engines[0])
    finally:
        for e in engines:
            e.dispose()


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    """Autogenerate finds nothing to do: the migrations create exactly the models' schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, stored_metadata(engine.dialect.name)) == []
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


DAY = 86400
T0 = 1_764_000_000 - 1_764_000_000 % DAY + 3600  # an hour into a UTC day
ROWS_0006 = [
    "INSERT INTO customers (id, name) VALUES (7, 'p')",
    "INSERT INTO organizations (id, name) VALUES (1, 'op')",
    "INSERT INTO hosts (id, name, organization_id) VALUES (1, 'h', 1)",
    "INSERT INTO vms (id, uuid, customer_id, host_id) VALUES (3, 'v', 7, 1)",
    # ids 1, 2, 3 in order of creation; the third interval a day later, created first
    f"INSERT INTO intervals (id, start_s, length_s, state) VALUES (3, {T0 + DAY}, 60, 'open')",
    f"INSERT INTO intervals (id, start_s, length_s, state) VALUES (1, {T0}, 60, 'accounted')",
    f"INSERT INTO intervals (id, start_s, length_s, state) VALUES (2, {T0 + 60}, 60, 'closed')",
    "INSERT INTO batches (id, key, digest, host_id, interval_id, samples) VALUES"
    " (1, 'k1', 'd', 1, 1, 1), (2, 'k2', 'd', 1, 2, 1), (3, 'k3', 'd', 1, 3, 1)",
    "INSERT INTO host_intervals VALUES (1, 1, 1, 2, 8e9, 1e8, 1e8), (3, 1, 1, 2, 8e9, 1e8, 1e8)",
    "INSERT INTO samples (id, interval_id, vm_id, host_id, customer_id, batch_id, cpu_s,"
    " memory_byte_s, disk_read_bytes, disk_write_bytes, network_rx_bytes, network_tx_bytes,"
    " late) VALUES (10, 1, 3, 1, 7, 1, 1, 2, 3, 4, 5, 6, false),"
    " (11, 2, 3, 1, 7, 2, 1, 2, 3, 4, 5, 6, true), (12, 3, 3, 1, 7, 3, 9, 2, 3, 4, 5, 6, false)",
    "INSERT INTO customer_ledger (interval_id, customer_id, greediness, balance, utility_work,"
    " utility_moment, utility, priority, vms) VALUES (1, 7, 0.5, 0.5, 2, 0, 2, -2, 1)",
    "INSERT INTO customer_resource_ledger VALUES (1, 7, 'cpu', 0.5)",
    "INSERT INTO organization_ledger VALUES (1, 1, 1, 0, 1, 0, 1)",
    "INSERT INTO customer_levels VALUES (7, 1, 0, 0.5, 1)",
    "INSERT INTO enforcement_actions (id, interval_id, customer_id, kind, status, dry_run,"
    " reason) VALUES (5, 1, 7, 'level', 'ok', false, 'r')",
]


def test_0007_renumbers_intervals_by_their_start_and_keeps_every_row(database_url: str) -> None:
    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine, "0006")
        with engine.begin() as conn:
            for statement in ROWS_0006:
                conn.execute(sa.text(statement))
        # 0007's work, before 0013 packs the samples (its own test below).
        migrate.upgrade(engine, "0012")
        with engine.begin() as conn:

            def rows(sql: str) -> list[tuple]:
                return [tuple(r) for r in conn.execute(sa.text(sql))]

            assert rows("SELECT id, start_s FROM intervals ORDER BY id") == [
                (T0, T0),
                (T0 + 60, T0 + 60),
                (T0 + DAY, T0 + DAY),
            ]
            assert rows(
                "SELECT id, interval_id, batch_id, late, cpu_s FROM samples ORDER BY id"
            ) == [
                (10, T0, 1, False, 1.0),
                (11, T0 + 60, 2, True, 1.0),
                (12, T0 + DAY, 3, False, 9.0),
            ]
            assert rows("SELECT key, interval_id FROM batches ORDER BY id") == [
                ("k1", T0),
                ("k2", T0 + 60),
                ("k3", T0 + DAY),
            ]
            assert rows("SELECT interval_id FROM host_intervals ORDER BY 1") == [(T0,), (T0 + DAY,)]
            for table in (
                "customer_ledger",
                "customer_resource_ledger",
                "organization_ledger",
                "customer_levels",
                "enforcement_actions",
            ):
                assert rows(f"SELECT interval_id FROM {table}") == [(T0,)], table
            # Sequences go on from the copied rows, in 64 bits.
            conn.execute(
                sa.text(
                    "INSERT INTO batches (key, digest, host_id, interval_id, samples)"
                    f" VALUES ('k4', 'd', 1, {T0}, 0)"
                )
            )
            assert rows("SELECT max(id) FROM batches") == [(4,)]
            # A key is unique per interval.
            with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():
                conn.execute(
                    sa.text(
                        "INSERT INTO batches (key, digest, host_id, interval_id, samples)"
                        f" VALUES ('k4', 'd', 1, {T0}, 0)"
                    )
                )
            if conn.dialect.name == "postgresql":
                days = {
                    r[0]
                    for r in conn.execute(
                        sa.text(
                            "SELECT c.relname FROM pg_inherits i JOIN pg_class c"
                            " ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
                            " WHERE p.relname = 'samples'"
                        )
                    )
                }
                first = time.strftime("%Y%m%d", time.gmtime(T0))
                second = time.strftime("%Y%m%d", time.gmtime(T0 + DAY))
                assert {f"samples_{first}", f"samples_{second}"} <= days
        migrate.downgrade(engine, "0006")
        with engine.connect() as conn:
            got = conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one()
            assert got == 3
            assert conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one() == 4
        migrate.upgrade(engine)
    finally:
        engine.dispose()


def test_a_sqlite_file_gets_its_directory_and_a_sqlite_uri_is_left_to_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path's directories are made; a ``uri=true`` database is SQLite's URI, not a path: no
    ``file:`` directory appears where the program runs."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "new" / "dir" / "l.db"
    migrate.upgrade(migrate.engine_for(f"sqlite:///{path}"))
    assert path.exists()
    engine = migrate.engine_for(f"sqlite:///file:{path}?mode=ro&uri=true")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM customers")).scalar() == 0
    engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_0010_counts_every_vm_and_customer_seen_now_and_lets_them_go_without_a_scan(
    database_url: str,
) -> None:
    """Rows written before 0010 count as seen on the upgrade's day (kept one raw retention
    from it); the foreign keys whose check scanned samples and the per-resource rows are gone;
    and no id of a deleted VM or customer is given again (SQLite's AUTOINCREMENT)."""
    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine, "0006")
        with engine.begin() as conn:
            for statement in ROWS_0006:
                conn.execute(sa.text(statement))
        migrate.upgrade(engine, "0009")
        before = time.time()
        migrate.upgrade(engine)
        today = int(before) // DAY * DAY
        with engine.begin() as conn:
            for table in ("vms", "customers"):
                seen = conn.execute(sa.text(f"SELECT last_seen_s FROM {table}")).scalars().all()
                assert seen and all(s in (today, today + DAY) for s in seen), (table, seen)
            # The VM's samples and the customer's per-resource row no longer hold them.
            conn.execute(sa.text("DELETE FROM vms WHERE id = 3"))
            conn.execute(sa.text("DELETE FROM customer_resource_ledger"))
            assert conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one() == 3
            for table, insert in (
                ("customers", "INSERT INTO customers (name) VALUES (:n)"),
                ("vms", "INSERT INTO vms (uuid, customer_id, host_id) VALUES (:n, 7, 1)"),
            ):
                key = "name" if table == "customers" else "uuid"
                made = []
                for name in ("q", "r"):
                    conn.execute(sa.text(insert), {"n": name})
                    made.append(
                        conn.execute(
                            sa.text(f"SELECT id FROM {table} WHERE {key} = :n"), {"n": name}
                        ).scalar_one()
                    )
                    # The newest row goes: SQLite without AUTOINCREMENT gives its id again.
                    conn.execute(sa.text(f"DELETE FROM {table} WHERE {key} = :n"), {"n": name})
                assert made[1] > made[0], table
    finally:
        engine.dispose()


TODAY = int(time.time()) // DAY * DAY + 3600
"""an hour into today: 0007 made partitions for the days around it"""

SAMPLE_VALUES = [
    # (id, interval_id, vm_id, host_id, customer_id, batch_id, cpu_s, flavor_vcpus, late)
    (1, TODAY, 3, 1, 7, 1, 1.5, 2.0, False),
    (2, TODAY, 4, 1, 7, 1, 2.5, None, False),
    (3, TODAY, 5, 1, 8, 1, 3.5, 4.0, False),
    (4, TODAY + 60, 3, 1, 7, 2, 4.5, 2.0, True),
    (5, TODAY + DAY, 6, 2, 8, 3, 5.5, 1.0, False),
]


def _samples(conn: sa.Connection) -> list[tuple]:
    return [
        tuple(r)
        for r in conn.execute(
            sa.text(
                "SELECT interval_id, vm_id, host_id, customer_id, batch_id, cpu_s, flavor_vcpus,"
                " late FROM samples ORDER BY batch_id, vm_id"
            )
        )
    ]


def test_0013_packs_each_batch_into_one_row_the_view_shows_as_before(database_url: str) -> None:
    """0013 packs each batch's samples into one row of ``sample_batches`` on PostgreSQL (SQLite
    keeps its rows); ``samples`` reads the same rows as before, an operator's INSERT and DELETE
    on it land in the right batch, and a downgrade gives the rows back."""
    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine, "0012")
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO samples (id, interval_id, vm_id, host_id, customer_id, batch_id,"
                    " cpu_s, memory_byte_s, disk_read_bytes, disk_write_bytes, network_rx_bytes,"
                    " network_tx_bytes, flavor_vcpus, late)"
                    " VALUES (:id, :i, :vm, :h, :c, :b, :cpu, 0, 0, 0, 0, 0, :f, :late)"
                ),
                [
                    dict(zip(("id", "i", "vm", "h", "c", "b", "cpu", "f", "late"), v, strict=True))
                    for v in SAMPLE_VALUES
                ],
            )
        expected = [v[1:] for v in sorted(SAMPLE_VALUES, key=lambda v: (v[5], v[2]))]
        migrate.upgrade(engine)
        with engine.begin() as conn:
            assert _samples(conn) == expected
            if conn.dialect.name == "postgresql":
                packed = conn.execute(
                    sa.text(
                        "SELECT batch_id, vm_id, array_replace(flavor_vcpus, 'NaN', -1)"
                        " FROM sample_batches ORDER BY 1"
                    )
                ).all()
                assert [tuple(r) for r in packed] == [
                    (1, [3, 4, 5], [2.0, -1.0, 4.0]),  # stored NaN, NULL in the view
                    (2, [3], [2.0]),
                    (3, [6], [1.0]),
                ]
            # An operator's SQL on the view: one VM out of the middle of a batch, one in.
            conn.execute(sa.text("DELETE FROM samples WHERE batch_id = 1 AND vm_id = 4"))
            conn.execute(
                sa.text(
                    "INSERT INTO samples (interval_id, vm_id, host_id, customer_id, batch_id,"
                    " cpu_s, memory_byte_s, disk_read_bytes, disk_write_bytes, network_rx_bytes,"
                    " network_tx_bytes, late)"
                    f" VALUES ({TODAY}, 9, 1, 7, 1, 6.5, 0, 0, 0, 0, 0, false)"
                )
            )
            conn.execute(sa.text("DELETE FROM samples WHERE batch_id = 2"))
            with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():
                conn.execute(  # no use figure may be NULL, in a row or in an array
                    sa.text(
                        "INSERT INTO samples (interval_id, vm_id, host_id, customer_id,"
                        " batch_id, cpu_s, memory_byte_s, disk_read_bytes, disk_write_bytes,"
                        " network_rx_bytes, network_tx_bytes, late)"
                        f" VALUES ({TODAY}, 8, 1, 7, 1, NULL, 0, 0, 0, 0, 0, false)"
                    )
                )
            changed = [v for v in expected if v[4] != 2 and v[1] != 4]
            changed.append((TODAY, 9, 1, 7, 1, 6.5, None, False))
            changed.sort(key=lambda v: (v[4], v[1]))
            assert _samples(conn) == changed
            if conn.dialect.name == "postgresql":
                batches = conn.execute(sa.text("SELECT batch_id FROM sample_batches")).scalars()
                assert sorted(batches) == [1, 3]  # a batch left empty is gone
        migrate.downgrade(engine, "0012")
        with engine.connect() as conn:
            assert _samples(conn) == changed
    finally:
        engine.dispose()


def test_0015_gives_each_project_id_keystones_spelling_unless_another_customer_has_it(
    database_url: str,
) -> None:
    project, other = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
    dashed = "01234567-89AB-CDEF-0123-456789ABCDEF"
    twin = "FEDCBA98-7654-3210-FEDC-BA9876543210"
    engine = migrate.engine_for(database_url)
    try:
        migrate.upgrade(engine, "0014")
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO customers (id, name) VALUES (1, :a), (2, :b), (3, :c), (4, :d)"
                ),
                {"a": dashed, "b": other, "c": twin, "d": "alice-co"},
            )
        migrate.upgrade(engine)
        with engine.connect() as conn:
            names = dict(conn.execute(sa.text("SELECT id, name FROM customers")).all())
        # Renamed where the one spelling was free; a twin of another customer keeps its
        # name (merging two customers' history is the operator's); other names stay.
        assert names == {1: project, 2: other, 3: twin, 4: "alice-co"}
    finally:
        engine.dispose()
