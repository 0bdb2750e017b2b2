"""A ledger that cannot write: ingest answers 503, the accountant closes nothing, /healthz says so.

The outage is real: SQLite's ``max_page_count`` makes the file "full" (SQLite's own
SQLITE_FULL, "database or disk is full", as a full disk gives), and PostgreSQL's
``default_transaction_read_only`` makes every write fail as a read-only server does. The
daemon's engine reconnects (``dispose``) so that its new connections meet the outage.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon_support import (
    INTERVAL_S,
    Daemon,
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    full_ledger,
    make_config,
    serving,
    unreachable_ledger,
)

A = HostSpec("cmp-a", cpu_cores=64, memory_bytes=512e9)
B = HostSpec("cmp-b", cpu_cores=64, memory_bytes=512e9)
GRACE_S = 30


def post(d: Daemon, body: dict[str, Any], host: HostSpec) -> httpx.Response:
    return httpx.post(
        f"{d.url}/v1/samples",
        content=json.dumps(body),
        headers={**auth(host.name), "Content-Type": "application/json"},
    )


def many_vms(host: HostSpec, n: int) -> list[dict[str, Any]]:
    """``n`` VMs of as many customers: enough new rows that no page has room for them all."""
    return [cpu_only(f"{host.name}-vm-{i}", f"{host.name}-c{i}", 1.0) for i in range(n)]


def metric(d: Daemon, name: str) -> float:
    """The unlabelled sample ``name`` of the daemon's /metrics."""
    text = httpx.get(f"{d.url}/metrics").text
    return next(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


def interval_state(d: Daemon, start_s: int) -> str | None:
    with d.engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT state FROM intervals WHERE start_s = :s"), {"s": start_s}
        ).scalar()


def test_no_interval_closes_while_the_ledger_cannot_write(database_url: str) -> None:
    """The outage's interval stays open while writes fail and for a grace period after they
    recover, so the batch the agent spooled during the outage counts on time; /healthz is 503
    naming the failure meanwhile."""
    start = aligned_past(3)
    now = {"s": float(start + INTERVAL_S + 5)}
    config = make_config(
        database_url,
        {A.name: "operator", B.name: "operator"},
        accounting={"grace_s": GRACE_S},
    )
    with serving(config, clock=lambda: now["s"]) as d:
        accountant = d.app.state.accountant
        before = batch(A, start - INTERVAL_S, [cpu_only("a-vm", "a", 10.0)])
        assert post(d, before, A).status_code == 200
        assert post(d, batch(A, start, [cpu_only("a-vm", "a", 10.0)]), A).status_code == 200
        accountant.run_once(now["s"])
        assert interval_state(d, start - INTERVAL_S) == "accounted"
        assert httpx.get(f"{d.url}/healthz").status_code == 200

        spooled = batch(B, start, many_vms(B, 300))
        with full_ledger(d, database_url):
            refused = post(d, spooled, B)
            assert refused.status_code == 503, refused.text
            health = httpx.get(f"{d.url}/healthz")
            assert health.status_code == 503
            assert health.json()["status"] == "unavailable"
            assert "ledger cannot write" in health.json()["detail"]
            assert metric(d, "gmd_ledger_write_failing") == 1
            assert metric(d, "gmd_ledger_write_failures_total") == 1
            # Long past the interval's end and grace: an outage holds it open.
            now["s"] = start + INTERVAL_S + GRACE_S + 600
            accountant.run_once(now["s"])
            assert interval_state(d, start) == "open"

        # The ledger writes again: the agent's spool replays the batch, on time.
        now["s"] += 5
        replayed = post(d, spooled, B)
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["late"] == 0
        assert httpx.get(f"{d.url}/healthz").status_code == 200
        assert metric(d, "gmd_ledger_write_failing") == 0
        # Within a grace period of the recovery other hosts are still replaying.
        accountant.run_once(now["s"] + GRACE_S / 2)
        assert interval_state(d, start) == "open"
        accountant.run_once(now["s"] + GRACE_S + 1)
        assert interval_state(d, start) == "accounted"
        with d.engine.connect() as conn:
            counted = conn.execute(
                sa.text(
                    "SELECT count(*) FROM customer_ledger l JOIN customers c"
                    " ON c.id = l.customer_id WHERE l.interval_id = :i AND c.name LIKE 'cmp-b-%'"
                ),
                {"i": start},
            ).scalar_one()
        assert counted == 300


def test_a_ledger_server_that_refuses_connections_is_a_503_on_the_known_hosts_path(
    postgres_server_url: str,
) -> None:
    """Issue 44: PostgreSQL stopped under steady ingest. A known host's batch takes the
    one-statement write (gmd.daemon.ingest.one_statement), whose pooled connection is taken
    outside SQLAlchemy's error handling: the server's refusal came out as psycopg's own error
    and the daemon answered 500, never entering its write-failing state, so the accountant
    closed the outage's intervals and the spooled batches arrived late. Now: 503, the state
    entered (/healthz, gmd_ledger_write_failing), the interval held open, and the batch
    replayed after the outage counts on time."""
    from tests.support.daemon_support import fresh_postgres_database

    start = aligned_past(3)
    now = {"s": float(start + 5)}
    with fresh_postgres_database(postgres_server_url) as url:
        config = make_config(url, {A.name: "operator"}, accounting={"grace_s": GRACE_S})
        with serving(config, clock=lambda: now["s"]) as d:
            accountant = d.app.state.accountant
            # A is known: its later batches take the one-statement write.
            assert post(
                d, batch(A, start - INTERVAL_S, [cpu_only("a-vm", "a", 10.0)]), A
            ).is_success
            spooled = batch(A, start, [cpu_only("a-vm", "a", 20.0)])
            with unreachable_ledger(d, url):
                refused = post(d, spooled, A)
                assert refused.status_code == 503, refused.text
                assert "ledger database unavailable" in refused.json()["detail"]
                health = httpx.get(f"{d.url}/healthz")
                assert health.status_code == 503
                assert metric(d, "gmd_ledger_write_failing") == 1
                now["s"] = start + INTERVAL_S + GRACE_S + 600
                accountant.run_once(now["s"])  # held: it cannot even reach the ledger
            now["s"] += 5
            replayed = post(d, spooled, A)
            assert replayed.status_code == 200, replayed.text
            assert replayed.json()["late"] == 0
            assert metric(d, "gmd_ledger_write_failing") == 0
            accountant.run_once(now["s"] + GRACE_S + 1)
            assert interval_state(d, start) == "accounted"


def test_a_database_outage_is_two_log_lines_not_a_traceback_a_run(
    postgres_server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 44: the accountant logged a traceback at every run (every few seconds) for the
    whole of a database outage. Now one line when it begins, naming the database's error, and
    one when the database answers again; a failure of gmd's own is still logged in full."""
    from tests.support.daemon_support import fresh_postgres_database

    with fresh_postgres_database(postgres_server_url) as url:
        config = make_config(url, {A.name: "operator"})
        with serving(config) as d:
            accountant = d.app.state.accountant
            caplog.set_level(logging.INFO, logger="gmd.daemon.ledger.schedule")
            with unreachable_ledger(d, url):
                for _ in range(3):
                    assert accountant.run_once() is None
            assert accountant.run_once() is not None
    said = [r for r in caplog.records if r.name == "gmd.daemon.ledger.schedule"]
    failing = [r for r in said if r.levelno >= logging.ERROR]
    assert len(failing) == 1, [r.getMessage() for r in failing]
    assert failing[0].exc_info is None
    assert "accountant: the ledger database fails (OperationalError: " in failing[0].getMessage()
    assert "not currently accepting connections" in failing[0].getMessage()
    assert any("accountant: the ledger database answers again" in r.getMessage() for r in said)


def test_a_daemon_that_received_no_batch_in_an_outage_holds_its_intervals_after_it(
    postgres_server_url: str,
) -> None:
    """Issue 44's soak: two daemons share the port; in a read-only spell of PostgreSQL every
    batch happened to reach the other one. This daemon's accountant failed at every run and,
    the moment the database wrote again, closed and accounted the outage's interval, before
    the agents' spooled batches were back: they were kept as late and counted nowhere. Its
    own failures now hold it as a failed batch does: the interval stays open until a grace
    period after the ledger writes again, and the replayed batch counts on time."""
    from tests.support.daemon_support import fresh_postgres_database

    start = aligned_past(3)
    now = {"s": float(start + 5)}
    with fresh_postgres_database(postgres_server_url) as url:
        hosts = {A.name: "operator", B.name: "operator"}
        config = make_config(url, hosts, accounting={"grace_s": GRACE_S})
        with serving(config, clock=lambda: now["s"]) as d:
            accountant = d.app.state.accountant
            assert post(
                d, batch(A, start - INTERVAL_S, [cpu_only("a-vm", "a", 10.0)]), A
            ).is_success
            # B's batch of the interval came before the outage; A's is in its spool.
            assert post(d, batch(B, start, [cpu_only("b-vm", "b", 10.0)]), B).is_success
            with full_ledger(d, url):  # read-only; no batch reaches this daemon meanwhile
                now["s"] = start + INTERVAL_S + GRACE_S + 60
                assert accountant.run_once(now["s"]) is None  # it cannot close: it fails
                assert interval_state(d, start) == "open"
            now["s"] += 5
            accountant.run_once(now["s"])  # the ledger writes again: held for a grace
            assert interval_state(d, start) == "open"
            replayed = post(d, batch(A, start, [cpu_only("a-vm", "a", 20.0)]), A)
            assert replayed.status_code == 200, replayed.text
            assert replayed.json()["late"] == 0
            accountant.run_once(now["s"] + GRACE_S + 1)
            assert interval_state(d, start) == "accounted"


def test_a_daemon_stopped_across_an_intervals_grace_waits_a_grace_before_closing_it(
    database_url: str,
) -> None:
    """Issue 44's soak: the only daemon, on SQLite, was stopped (SIGSTOP) for 13 s across an
    interval's close. The agents' batches waited in their spools and connections meanwhile; on
    SIGCONT the accountant ran first and closed the interval whose grace had passed, and the
    batches that came a second later were kept as late (8 samples counted nowhere). A scheduled
    run that comes long after the previous one now holds closing for one grace period, as the
    daemon's start does."""
    start = aligned_past(3)
    now = {"s": float(start + 5)}
    hosts = {A.name: "operator", B.name: "operator"}
    config = make_config(database_url, hosts, accounting={"grace_s": GRACE_S})
    with serving(config, clock=lambda: now["s"]) as d:
        accountant = d.app.state.accountant
        assert post(d, batch(B, start, [cpu_only("b-vm", "b", 10.0)]), B).is_success
        mono = 1000.0
        accountant.scheduled(at_s=mono, now_s=now["s"])  # on time: nothing due yet
        assert interval_state(d, start) == "open"
        # Stopped past the interval's end and grace: the next run comes 90 s later.
        now["s"] = start + INTERVAL_S + GRACE_S + 20
        accountant.scheduled(at_s=mono + 90, now_s=now["s"])
        assert interval_state(d, start) == "open"
        late = post(d, batch(A, start, [cpu_only("a-vm", "a", 20.0)]), A)
        assert late.status_code == 200, late.text
        assert late.json()["late"] == 0
        accountant.scheduled(at_s=mono + 91, now_s=now["s"] + GRACE_S + 1)
        assert interval_state(d, start) == "accounted"
