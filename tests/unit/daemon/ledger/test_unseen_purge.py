"""Retention purges VMs and customers unseen past raw retention, on SQLite and PostgreSQL:
a VM once no sample of it is left, a customer once nothing kept names it (the audit trail
keeps it); one that comes back is created again, even by a daemon that still had it cached."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.config import Config, RetentionConfig
from gmd.daemon.ingest.ids import mark_period
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.retention import purge
from gmd.ledger_schema.tables import actions, customers, levels, vms
from tests.support.daemon_support import (
    HostSpec,
    as_uuid,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

HOUR = 3600
DAY = 86400
H1 = HostSpec("cmp-1", cpu_cores=4, memory_bytes=8e9, disk_bytes_per_s=1e8)
H2 = HostSpec("cmp-2", cpu_cores=4, memory_bytes=8e9, disk_bytes_per_s=1e8)
RETENTION = RetentionConfig(raw_days=2, ledger_days=1, rollup_days=1, delete_chunk=1)


def hourly(url: str) -> Config:
    return make_config(
        url,
        {H1.name: "operator", H2.name: "operator"},
        # Balances decay by half an hour: a customer gone for three days has no standing
        # left, so no ledger row names it.
        accounting={"interval_s": HOUR, "grace_s": 0, "endowment": "equal", "half_life_s": 1800},
    )


def post(d: Any, host: HostSpec, start: int, owners: dict[str, str]) -> None:
    vms_ = [cpu_only(uuid, customer, 600.0) for uuid, customer in owners.items()]
    body = {**batch(host, start, vms_, key=f"{host.name}-{start}"), "interval_s": HOUR}
    response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(host.name))
    assert response.is_success, response.text


def names(engine: sa.Engine, table: sa.Table, column: str) -> dict[str, int]:
    with engine.connect() as conn:
        return {str(n): int(i) for n, i in conn.execute(sa.select(table.c[column], table.c.id))}


def vm_names(engine: sa.Engine) -> set[str]:
    """The test's names of the VMs in the ledger."""
    readable = {as_uuid(n): n for n in ("vm-a", "vm-b", "vm-c", "vm-d", "vm-e")}
    return {readable[u] for u in names(engine, vms, "uuid")}


def dangling(engine: sa.Engine) -> dict[str, int]:
    """Samples and ledger rows whose VM or customer row is missing (the foreign keys
    migration 0010 dropped no longer guard them)."""
    checks = {
        "samples.vm_id": "SELECT count(*) FROM samples s"
        " WHERE NOT EXISTS (SELECT 1 FROM vms v WHERE v.id = s.vm_id)",
        "samples.customer_id": "SELECT count(*) FROM samples s"
        " WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.id = s.customer_id)",
        "customer_resource_ledger": "SELECT count(*) FROM customer_resource_ledger r"
        " WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.id = r.customer_id)",
        "customer_resource_rollups": "SELECT count(*) FROM customer_resource_rollups r"
        " WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.id = r.customer_id)",
    }
    with engine.connect() as conn:
        return {k: int(conn.execute(sa.text(q)).scalar_one()) for k, q in checks.items()}


@pytest.fixture
def clock() -> tuple[int, int]:
    """``old``, three days before ``recent``; ``recent`` ended an hour ago or more."""
    now = int(time.time())
    recent = now - now % HOUR - 2 * HOUR
    return recent - 3 * DAY, recent


def test_unseen_vms_and_customers_go_the_audit_trail_keeps_its_customers_and_they_come_back(
    database_url: str, clock: tuple[int, int]
) -> None:
    old, recent = clock
    config = hourly(database_url)
    with serving(config) as d:
        engine = d.engine
        # Three days ago: a, b, c and e on cmp-1, d on cmp-2. Since: only a.
        post(d, H1, old, {"vm-a": "a", "vm-b": "b", "vm-c": "c", "vm-e": "e"})
        post(d, H2, old, {"vm-d": "d"})
        post(d, H1, recent, {"vm-a": "a"})
        account_due(engine, config.accounting, now_s=recent + HOUR)
        ids = names(engine, customers, "name")
        with engine.begin() as conn:
            # c was acted upon (the enforcement log names it); e is still throttled.
            conn.execute(
                sa.insert(actions).values(
                    customer_id=ids["c"], kind="level", status="applied", dry_run=False, reason="r"
                )
            )
            conn.execute(
                sa.insert(levels).values(
                    customer_id=ids["e"], level=2, since_s=old, score=1.0, interval_id=old
                )
            )
            # b's level 0 is no reason to keep it, and goes with it.
            conn.execute(
                sa.insert(levels).values(
                    customer_id=ids["b"], level=0, since_s=old, score=0.0, interval_id=old
                )
            )

        # Not yet: raw retention has not passed since the old day.
        early = purge(engine, RETENTION, now_s=old + DAY)
        assert "vms" not in early.rows and "customers" not in early.rows

        # The daemon is not told (no ``forget``): its caches still hold what goes.
        report = purge(engine, RETENTION, now_s=recent + HOUR)
        assert report.unseen_before_s is not None
        assert report.unseen_before_s <= recent - DAY
        assert report.rows["vms"] == 4 and report.rows["customers"] == 2
        assert vm_names(engine) == {"vm-a"}
        assert set(names(engine, customers, "name")) == {"a", "c", "e"}
        with engine.connect() as conn:
            assert {int(c) for c in conn.execute(sa.select(levels.c.customer_id)).scalars()} <= {
                ids["a"],
                ids["c"],
                ids["e"],
            }
        assert dangling(engine) == dict.fromkeys(dangling(engine), 0)

        # They come back: b and a VM of c on cmp-1 (its VM list changed), d on cmp-2 (the same
        # list as its memory of three days ago). Each is created anew; nothing dangles.
        back = recent + HOUR
        post(d, H1, back, {"vm-a": "a", "vm-b": "b", "vm-c": "c"})
        post(d, H2, back, {"vm-d": "d"})
        after = names(engine, customers, "name")
        assert set(after) == {"a", "b", "c", "d", "e"}
        assert after["a"] == ids["a"] and after["c"] == ids["c"]
        assert after["b"] != ids["b"] and after["d"] != ids["d"]
        assert vm_names(engine) == {"vm-a", "vm-b", "vm-c", "vm-d"}
        assert dangling(engine) == dict.fromkeys(dangling(engine), 0)
        # And they are accounted: their ledger rows' keys hold.
        account_due(engine, config.accounting, now_s=back + HOUR)
        with engine.connect() as conn:
            accounted = set(
                conn.execute(
                    sa.text(
                        "SELECT c.name FROM customer_ledger l JOIN customers c"
                        " ON c.id = l.customer_id WHERE l.interval_id = :i"
                    ),
                    {"i": back},
                ).scalars()
            )
        assert {"a", "b", "c", "d"} <= accounted


def test_a_vm_is_marked_seen_once_a_period_and_the_purge_tells_ingest_to_let_go(
    database_url: str, clock: tuple[int, int]
) -> None:
    old, recent = clock
    config = hourly(database_url)
    with serving(config) as d:
        engine = d.engine
        store = d.app.state.store
        post(d, H1, old, {"vm-a": "a", "vm-b": "b"})
        post(d, H1, old + HOUR, {"vm-a": "a", "vm-b": "b"})
        with engine.connect() as conn:
            seen = dict(conn.execute(sa.select(vms.c.uuid, vms.c.last_seen_s)).all())
        # Within the host's marking period the row is written once: the first batch's
        # interval stays.
        if mark_period(H1.name, old) == mark_period(H1.name, old + HOUR):
            assert seen == {as_uuid("vm-a"): old, as_uuid("vm-b"): old}
        post(d, H1, recent, {"vm-a": "a"})
        with engine.connect() as conn:
            seen = dict(conn.execute(sa.select(vms.c.uuid, vms.c.last_seen_s)).all())
            seen_customers = dict(
                conn.execute(sa.select(customers.c.name, customers.c.last_seen_s)).all()
            )
        assert seen[as_uuid("vm-a")] == recent and seen[as_uuid("vm-b")] <= old + HOUR
        assert seen_customers["a"] == recent
        account_due(engine, config.accounting, now_s=recent + HOUR)
        forgotten: list[tuple[list[str], list[str]]] = []

        def forget(uuids: Any, customer_names: Any) -> None:
            forgotten.append((list(uuids), list(customer_names)))
            store.forget(uuids, customer_names)

        purge(engine, RETENTION, now_s=recent + HOUR, forget=forget)
        assert forgotten == [([as_uuid("vm-b")], []), ([], ["b"])]
        assert as_uuid("vm-b") not in store.ids.cache.vms and "b" not in store.ids.cache.customers
        assert as_uuid("vm-a") in store.ids.cache.vms


def test_marking_periods_spread_a_clouds_hosts_over_the_day() -> None:
    """Each host marks its VMs once a period beginning at a time of day of its own, so that a
    5,000-host cloud does not mark every VM in the batches of one interval."""
    t = 1_800_000_000
    turns = set()
    for h in range(1000):
        host = f"compute-{h:04d}"
        period = mark_period(host, t)
        assert mark_period(host, t + DAY) == period + 1
        # The first interval (of 5 minutes) of the day at which this host's period turns.
        turns.add(next(m for m in range(300, DAY + 1, 300) if mark_period(host, t + m) != period))
    assert len(turns) > 200  # of 288 five-minute intervals a day


def waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                )
            ).scalar_one()
        )


def poll(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_batch_waiting_on_a_purge_that_deletes_its_vm_makes_the_vm_again(
    database_url: str, clock: tuple[int, int]
) -> None:
    """The purge deletes the VM first (uncommitted); the batch that names it, with its id
    cached, waits on the row and, once the delete commits, finds it gone and creates it."""
    old, recent = clock
    config = hourly(database_url)
    with serving(config) as d:
        engine = d.engine
        post(d, H1, old, {"vm-a": "a"})
        first = names(engine, vms, "uuid")[as_uuid("vm-a")]
        purger = engine.connect()
        tx = purger.begin()
        purger.execute(sa.text("DELETE FROM samples"))
        purger.execute(sa.delete(vms).where(vms.c.id == first))
        done: list[Exception | None] = []

        def ingest() -> None:
            try:
                post(d, H1, recent, {"vm-a": "a"})
                done.append(None)
            except Exception as exc:  # reported below
                done.append(exc)

        thread = threading.Thread(target=ingest)
        thread.start()
        poll(lambda: waiting_on_a_lock(engine), "the batch to wait on the VM's row")
        tx.commit()
        purger.close()
        thread.join(30)
        assert done == [None]
        again = names(engine, vms, "uuid")[as_uuid("vm-a")]
        assert again != first
        with engine.connect() as conn:
            used = conn.execute(sa.select(sa.text("vm_id")).select_from(sa.text("samples")))
            assert set(used.scalars()) == {again}
        assert dangling(engine) == dict.fromkeys(dangling(engine), 0)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_purge_waiting_on_a_batch_that_marks_its_vm_seen_leaves_the_vm(
    database_url: str, clock: tuple[int, int]
) -> None:
    """The batch marks the VM first (uncommitted); the purge, which had found it unseen, waits
    on the row and, once the batch commits, reads it again and leaves it."""
    old, recent = clock
    config = hourly(database_url)
    with serving(config) as d:
        engine = d.engine
        post(d, H1, old, {"vm-a": "a"})
        account_due(engine, config.accounting, now_s=old + HOUR)
        vm = names(engine, vms, "uuid")[as_uuid("vm-a")]
        batch_tx = engine.connect()
        tx = batch_tx.begin()
        batch_tx.execute(sa.update(vms).where(vms.c.id == vm).values(last_seen_s=recent))
        reports: list[Any] = []
        thread = threading.Thread(
            target=lambda: reports.append(purge(engine, RETENTION, now_s=recent + HOUR))
        )
        thread.start()
        poll(lambda: waiting_on_a_lock(engine), "the purge to wait on the VM's row")
        tx.commit()
        batch_tx.close()
        thread.join(60)
        assert len(reports) == 1 and "vms" not in reports[0].rows
        assert names(engine, vms, "uuid") == {as_uuid("vm-a"): vm}


def test_a_vm_marked_exactly_a_period_before_the_raw_cutoff_is_purged(
    database_url: str, clock: tuple[int, int]
) -> None:
    """A VM marked at ``m`` has samples only of intervals before ``m`` + a marking period, so
    one marked exactly a period before the raw cutoff has none left and goes. (Before the
    cut was inclusive, the test above failed one hour a day: in the hour at which cmp-1's
    marking period turns between ``old`` and ``old + HOUR``, vm-b's mark sat exactly there.)"""
    old, _ = clock
    now = old + 3 * DAY  # raw cutoff old + 1 day; the cut a marking period before: old
    config = hourly(database_url)
    with serving(config) as d:
        engine = d.engine
        post(d, H1, old, {"vm-a": "a", "vm-b": "b"})
        post(d, H1, now - HOUR, {"vm-a": "a"})
        account_due(engine, config.accounting, now_s=now)
        report = purge(engine, RETENTION, now_s=now)
        assert report.unseen_before_s == old + 1
        assert vm_names(engine) == {"vm-a"}
        assert set(names(engine, customers, "name")) == {"a"}
