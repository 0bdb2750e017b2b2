"""One bad batch must never stop, bloat or rewrite the ledger.

Each case is what a fuzzing and fault-injection run against the daemon found: numbers no host
can produce, poison that stopped accounting for good, a batch from 1970, a late batch that
changed an accounted interval's inputs, coerced types, hostile ids and names. Batches that the
door now refuses are also stored straight through the ledger store (as an older daemon would
have accepted them) to show that accounting isolates them.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.ingest.parse import record_of
from gmd.daemon.ingest.store import LedgerStore
from gmd.daemon.ledger.accounting import (
    CLOSE_CHUNK,
    AccountingStuck,
    account_due,
    account_next,
    compute_rows,
)
from gmd.daemon.reports.explain import explain
from gmd.fairness import interval as interval_step
from gmd.wire import SampleBatch
from tests.support.daemon_support import (
    INTERVAL_S,
    Daemon,
    HostSpec,
    aligned_past,
    as_uuid,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

ADMIN = Path(sys.executable).with_name("gmd-admin")
SMALL = HostSpec("cmp-1", cpu_cores=4, memory_bytes=16e9, disk_bytes_per_s=1e8)
OTHER = HostSpec("cmp-2", cpu_cores=4, memory_bytes=16e9, disk_bytes_per_s=1e8)
LATE_ONLY = HostSpec("cmp-3", cpu_cores=64, memory_bytes=512e9, disk_bytes_per_s=1e9)
TABLES = ("batches", "samples", "customers", "vms", "intervals", "host_intervals")


@pytest.fixture
def daemon(database_url: str) -> Iterator[Daemon]:
    config = make_config(
        database_url, {SMALL.name: "operator", OTHER.name: "operator", LATE_ONLY.name: "lab"}
    )
    with serving(config) as d:
        yield d


def post(d: Daemon, body: Any, host: str = SMALL.name) -> httpx.Response:
    return httpx.post(
        f"{d.url}/v1/samples",
        content=json.dumps(body),
        headers={**auth(host), "Content-Type": "application/json"},
    )


def counts(d: Daemon) -> dict[str, int]:
    with d.engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def ok_batch(start: int, host: HostSpec = SMALL, key: str | None = None) -> dict[str, Any]:
    return batch(
        host, start, [cpu_only("vm-a", "a", 90.0, vcpus=2), cpu_only("vm-b", "b", 30.0)], key
    )


# --- plausibility at the door ----------------------------------------------------------------


IMPLAUSIBLE = [
    pytest.param(
        lambda b: b["vms"][0].update(cpu_s=100000.0),
        ["vms[0]", as_uuid("vm-a"), "cpu_s = 100000", "cpu_cores 4 × 60 s", "= 264"],
        id="cpu-beyond-the-host",
    ),
    pytest.param(
        lambda b: b["vms"][1].update(disk_read_bytes=1e308, disk_write_bytes=1e308),
        ["vms[1]", "disk_read_bytes = 1e+308", "disk_bytes_per_s 1e+08"],
        id="disk-1e308",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(memory_byte_s=16e9 * 60 * 1.2),
        ["vms[0]", "memory_byte_s", "memory_bytes 1.6e+10"],
        id="memory-beyond-the-host",
    ),
    pytest.param(
        lambda b: [v.update(cpu_s=200.0) for v in b["vms"]],
        ["together used cpu_s = 400", "= 264"],
        id="host-sum",
    ),
    pytest.param(
        lambda b: b["capacity"].update(cpu_cores=1e308),
        ["capacity.cpu_cores = 1e+308", "daemon.max_host_cores = 4096"],
        id="capacity-1e308",
    ),
    pytest.param(
        lambda b: b["vms"][0]["flavor"].update(vcpus=1e308),
        ["vms[0]", "flavor.vcpus = 1e+308", "daemon.max_host_cores"],
        id="flavor-1e308",
    ),
    pytest.param(
        lambda b: b.update(interval_start_s=0),
        ["ago", "daemon.max_late_s = 604800"],
        id="batch-from-1970",
    ),
    pytest.param(
        lambda b: b.update(interval_start_s=aligned_past(7 * 24 * 60 + 5)),
        ["daemon.max_late_s"],
        id="a-week-late",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(created_s=2**63),
        ["vms[0].created_s", "less than or equal to 9007199254740991"],
        id="created-2**63",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(created_s=2**50),
        ["created_s = 1125899906842624 is in the future"],
        id="created-in-the-future",
    ),
]


@pytest.mark.parametrize(("change", "words"), IMPLAUSIBLE)
def test_implausible_batches_are_refused_naming_vm_resource_and_bound(
    daemon: Daemon, change: Any, words: list[str]
) -> None:
    body = ok_batch(aligned_past(3))
    change(body)
    response = post(daemon, body)
    assert response.status_code == 422, response.text
    text = response.json()["detail"] + " " + " ".join(response.json()["errors"])
    for word in words:
        assert word in text
    assert counts(daemon) == dict.fromkeys(TABLES, 0)


def test_use_at_the_host_capacity_plus_margin_is_accepted(daemon: Daemon) -> None:
    """The bound is capacity × interval × (1 + margin): a VM at its host's full capacity, read
    a little late, is real."""
    body = batch(SMALL, aligned_past(3), [cpu_only("vm-a", "a", 4 * 60 * 1.09)])
    assert post(daemon, body).status_code == 200


COERCED = [
    pytest.param(lambda b: b["vms"][0].update(cpu_s="5"), "vms[0].cpu_s", id="string-number"),
    pytest.param(lambda b: b["vms"][0].update(cpu_s=True), "vms[0].cpu_s", id="true"),
    pytest.param(lambda b: b["vms"][0].update(cpu_s=False), "vms[0].cpu_s", id="false"),
    pytest.param(
        lambda b: b.update(interval_start_s=str(b["interval_start_s"])),
        "interval_start_s",
        id="start-as-string",
    ),
    pytest.param(lambda b: b.update(interval_s=60.0), "interval_s", id="length-as-float"),
    pytest.param(
        lambda b: b["capacity"].update(cpu_cores="4"), "capacity.cpu_cores", id="capacity-string"
    ),
    pytest.param(
        lambda b: b["vms"][0]["flavor"].update(vcpus=True), "vms[0].flavor.vcpus", id="flavor-true"
    ),
    pytest.param(
        lambda b: b["vms"][0].update(uuid="../../etc/passwd"), "vms[0].uuid", id="uuid-path"
    ),
    pytest.param(
        lambda b: b["vms"][0].update(uuid=as_uuid("vm-a").upper()), "vms[0].uuid", id="uuid-upper"
    ),
    pytest.param(
        lambda b: b["vms"][0].update(customer="proj\u202egnp.exe"),
        "vms[0].customer: character 4 is U+202E (RIGHT-TO-LEFT OVERRIDE)",
        id="bidi-name",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(customer="pro\u200bj-a"),
        "vms[0].customer: character 3 is U+200B (ZERO WIDTH SPACE)",
        id="zero-width-name",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(customer="proj\x1b[31m"),
        "vms[0].customer: character 4 is U+001B",
        id="escape-in-name",
    ),
    pytest.param(lambda b: b.update(host="cmp-1\u200d"), "host: character 5", id="host-zwj"),
]


@pytest.mark.parametrize(("change", "where"), COERCED)
def test_wrong_types_and_hostile_names_are_refused_not_coerced(
    daemon: Daemon, change: Any, where: str
) -> None:
    body = ok_batch(aligned_past(3))
    change(body)
    response = post(daemon, body)
    assert response.status_code == 422, response.text
    assert any(line.startswith(where) for line in response.json()["errors"]), response.json()
    assert counts(daemon) == dict.fromkeys(TABLES, 0)


# --- an interval's inputs are fixed --------------------------------------------------------------


def stored_rows(conn: sa.Connection, table: str, interval_id: int, key: str) -> list[dict]:
    return [
        dict(r._mapping)
        for r in conn.execute(
            sa.text(f"SELECT * FROM {table} WHERE interval_id = :i ORDER BY {key}"),
            {"i": interval_id},
        )
    ]


def test_a_later_batch_with_another_capacity_is_refused_never_applied(daemon: Daemon) -> None:
    start = aligned_past(3)
    assert post(daemon, ok_batch(start, key="first")).status_code == 200
    other = ok_batch(start, key="second")
    other["capacity"]["cpu_cores"] = 8
    response = post(daemon, other)
    assert response.status_code == 409
    assert "cpu_cores 8 (first batch: 4)" in response.json()["detail"]
    with daemon.engine.connect() as conn:
        cores = conn.execute(sa.text("SELECT cpu_cores FROM host_intervals")).scalars().all()
        keys = conn.execute(sa.text("SELECT key FROM batches")).scalars().all()
    assert cores == [4.0] and keys == ["first"]


def test_late_batches_leave_every_accounted_input_as_it_was(daemon: Daemon) -> None:
    """A late batch of a host that reported on time, and one of a host that did not (whose
    capacity row would have joined the cloud's supply): the accounted interval recomputes to
    exactly its stored rows, and a late batch with another capacity is refused."""
    config = make_config(str(daemon.engine.url.render_as_string(hide_password=False)))
    start = aligned_past(3)
    assert post(daemon, ok_batch(start)).status_code == 200
    other = batch(OTHER, start, [cpu_only("vm-c", "c", 200.0)])
    assert post(daemon, other, OTHER.name).status_code == 200
    account_due(daemon.engine, config.accounting)
    with daemon.engine.connect() as conn:
        interval_id = conn.execute(
            sa.text("SELECT id FROM intervals WHERE start_s = :s"), {"s": start}
        ).scalar_one()
        before = stored_rows(conn, "customer_ledger", interval_id, "customer_id")
        capacity_before = stored_rows(conn, "host_intervals", interval_id, "host_id")
    late_small = batch(SMALL, start, [cpu_only("vm-a", "a", 10.0)], key="late-1")
    assert post(daemon, late_small).json()["late"] == 1
    late_new = batch(LATE_ONLY, start, [cpu_only("vm-d", "a", 10.0)], key="late-2")
    assert post(daemon, late_new, LATE_ONLY.name).json()["late"] == 1
    bigger = batch(SMALL, start, [cpu_only("vm-a", "a", 1.0)], key="late-3")
    bigger["capacity"]["memory_bytes"] = 32e9
    assert post(daemon, bigger).status_code == 409
    with daemon.engine.connect() as conn:
        again = compute_rows(conn, interval_id, config.accounting)
        after = stored_rows(conn, "customer_ledger", interval_id, "customer_id")
        capacity_after = stored_rows(conn, "host_intervals", interval_id, "host_id")
    assert after == before
    assert sorted(again.customers, key=lambda r: r["customer_id"]) == before
    with daemon.engine.connect() as conn:
        explained = explain(conn, config, "a", at_s=start)
    assert not any("has changed" in note for note in explained.notes), explained.notes
    assert any("arrived after it was accounted" in note for note in explained.notes)
    # The late host's row exists (a report can show it), the accounted hosts' are unchanged.
    assert capacity_after[: len(capacity_before)] == capacity_before
    assert len(capacity_after) == len(capacity_before) + 1


# --- poison isolation ----------------------------------------------------------------------------


def store_directly(engine: sa.Engine, body: dict[str, Any]) -> None:
    """Store ``body`` as a daemon without the plausibility check would have."""
    record = record_of(SampleBatch.model_validate(body))
    LedgerStore(engine, lambda _host: "operator").ingest(record)


POISONS = [
    pytest.param(
        lambda b: b["vms"][1].update(disk_read_bytes=1e308, disk_write_bytes=1e308), id="disk"
    ),
    pytest.param(lambda b: b["capacity"].update(cpu_cores=1e308), id="capacity"),
    pytest.param(lambda b: b["vms"][0]["flavor"].update(vcpus=1e308), id="flavor"),
]


@pytest.mark.parametrize("poison", POISONS)
def test_a_poison_batch_is_quarantined_and_accounting_goes_on(
    database_url: str, poison: Any
) -> None:
    config = make_config(database_url, {SMALL.name: "operator", OTHER.name: "operator"})
    with serving(config) as d:
        first = aligned_past(6)
        bad = ok_batch(first, OTHER, key="poison")
        poison(bad)
        store_directly(d.engine, bad)
        for k in range(3):
            assert post(d, ok_batch(first + k * INTERVAL_S)).status_code == 200
        report = account_due(d.engine, config.accounting)
        assert [q.key for q in report.quarantined] == ["poison"]
        assert report.accounted[:3] == [first, first + INTERVAL_S, first + 2 * INTERVAL_S]
        with d.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT i.start_s, c.name, l.balance FROM customer_ledger l"
                    " JOIN intervals i ON i.id = l.interval_id"
                    " JOIN customers c ON c.id = l.customer_id ORDER BY 1, 2"
                )
            ).all()
            state = conn.execute(
                sa.text("SELECT state, error FROM batches WHERE key = 'poison'")
            ).one()
            quarantined = conn.execute(
                sa.text("SELECT count(*) FROM quarantined_samples")
            ).scalar_one()
            in_samples = conn.execute(
                sa.text(
                    "SELECT count(*) FROM samples s JOIN batches b ON b.id = s.batch_id"
                    " WHERE b.key = 'poison'"
                )
            ).scalar_one()
            logged = conn.execute(
                sa.text("SELECT reason FROM enforcement_actions WHERE kind = 'batch_quarantine'")
            ).scalar_one()
        assert state[0] == "quarantined" and "not a finite number" in state[1]
        assert quarantined == 2 and in_samples == 0
        assert "accounting failed with this batch" in logged
        # The interval with the poison is accounted from the good batch alone: the same
        # standing as the next interval's, where only the good host reported.
        first_interval = {name: bal for start, name, bal in rows if start == first}
        assert set(first_interval) == {"a", "b"}
        assert all(abs(v) < 1e3 for _s, _n, v in rows)


def test_the_daemon_counts_and_logs_what_it_quarantines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(f"sqlite:///{tmp_path / 'l.db'}", {SMALL.name: "operator"})
    with serving(config) as d:
        bad = ok_batch(aligned_past(4), key="poison")
        bad["vms"][0].update(disk_read_bytes=1e308, disk_write_bytes=1e308)
        store_directly(d.engine, bad)
        assert post(d, ok_batch(aligned_past(3))).status_code == 200
        report = d.app.state.services.accountant.run_once()
        metrics = httpx.get(f"{d.url}/metrics").text
    assert report is not None and [q.key for q in report.quarantined] == ["poison"]
    assert "gmd_accounting_quarantined_batches_total 1.0" in metrics
    assert "gmd_accounting_errors_total 0.0" in metrics
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("1 batch(es) quarantined" in e and "poison from cmp-1" in e for e in errors)


def test_the_operator_lists_releases_and_drops_quarantined_batches(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = make_config(url, {SMALL.name: "operator", OTHER.name: "operator"})
    toml = tmp_path / "gmd.toml"
    toml.write_text(f'[database]\nurl = "{url}"\n')
    with serving(config) as d:
        first = aligned_past(5)
        for k, key in enumerate(("poison-1", "poison-2")):
            bad = ok_batch(first + k * INTERVAL_S, OTHER, key=key)
            bad["capacity"]["cpu_cores"] = 1e308
            store_directly(d.engine, bad)
            assert post(d, ok_batch(first + k * INTERVAL_S)).status_code == 200
        report = account_due(d.engine, config.accounting)
        assert sorted(q.key for q in report.quarantined) == ["poison-1", "poison-2"]

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ADMIN), "--config", str(toml), *args], capture_output=True, text=True, timeout=60
        )

    listed = admin("batches", "--quarantined", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    batches = json.loads(listed.stdout)["batches"]
    assert [b["key"] for b in batches] == ["poison-2", "poison-1"]
    assert all(b["state"] == "quarantined" and "finite" in b["error"] for b in batches)

    released = admin("batches", "release", "poison-1", "--reason", "engine bug fixed", "--by", "op")
    assert released.returncode == 0, released.stderr
    assert "released" in released.stdout
    dropped = admin("batches", "drop", "poison-2", "--reason", "bad agent", "--by", "op")
    assert dropped.returncode == 0, dropped.stderr
    again = admin("batches", "drop", "poison-2", "--reason", "twice")
    assert again.returncode == 3 and "is dropped, not quarantined" in again.stderr
    unknown = admin("batches", "release", "nope", "--reason", "x")
    assert unknown.returncode == 3 and "no batch with key 'nope'" in unknown.stderr
    no_reason = admin("batches", "drop", "poison-1", "--reason", " ")
    assert no_reason.returncode == 2 and "Traceback" not in no_reason.stderr

    engine = sa.create_engine(url)
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT key, state FROM batches")).all())
        late = conn.execute(
            sa.text(
                "SELECT count(*) FROM samples s JOIN batches b ON b.id = s.batch_id"
                " WHERE b.key = 'poison-1' AND s.late"
            )
        ).scalar_one()
        left = conn.execute(sa.text("SELECT count(*) FROM quarantined_samples")).scalar_one()
        audit = conn.execute(
            sa.text(
                "SELECT kind, reason, after FROM enforcement_actions"
                " WHERE kind IN ('batch_release', 'batch_drop') ORDER BY id"
            )
        ).all()
    engine.dispose()
    assert states["poison-1"] == "released" and states["poison-2"] == "dropped"
    assert late == 2 and left == 0
    assert [(k, r) for k, r, _a in audit] == [
        ("batch_release", "engine bug fixed"),
        ("batch_drop", "bad agent"),
    ]
    assert all(json.loads(a)["by"] == "op" for _k, _r, a in audit)
    listed = admin("batches", "--state", "released", "--state", "dropped", "--format", "csv")
    assert listed.returncode == 0 and "poison-1" in listed.stdout and "poison-2" in listed.stdout


def test_a_failure_no_batch_explains_stops_accounting_loudly(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When every batch fails on its own, the fault is not in them (a bug, a broken standing):
    nothing is quarantined and accounting stops at that interval with a specific error."""
    config = make_config(database_url, {SMALL.name: "operator", OTHER.name: "operator"})
    with serving(config) as d:
        start = aligned_past(3)
        assert post(d, ok_batch(start)).status_code == 200
        assert post(d, ok_batch(start, OTHER), OTHER.name).status_code == 200
        account_due(d.engine, config.accounting, now_s=start - 1)  # nothing due yet

        def broken(*_args: Any, **_kwargs: Any) -> Any:
            raise ValueError("an engine bug")

        # The engine inside the interval step accounting calls.
        monkeypatch.setattr(interval_step, "cloud_greediness", broken)
        with pytest.raises(AccountingStuck, match="no batch of it explains why: an engine bug"):
            account_due(d.engine, config.accounting)
        with d.engine.connect() as conn:
            states = conn.execute(sa.text("SELECT DISTINCT state FROM batches")).scalars().all()
            interval = conn.execute(
                sa.text("SELECT state FROM intervals WHERE start_s = :s"), {"s": start}
            ).scalar_one()
        assert states == ["accepted"] and interval == "closed"
        monkeypatch.undo()
        assert account_next(d.engine, config.accounting) == start


# --- bounded past and catch-up -------------------------------------------------------------------


def test_a_catch_up_over_days_goes_in_bounded_chunks_and_stops_when_asked(
    database_url: str,
) -> None:
    """A batch two days back on a fresh ledger: the accountant creates the missing intervals a
    chunk at a time (not all in one statement), with bounded memory, stays within its time
    budget, and ends between two intervals when the daemon stops."""
    config = make_config(database_url, {SMALL.name: "operator"})
    with serving(config) as d:
        old = aligned_past(2 * 1440 + 10)
        assert post(d, ok_batch(old)).status_code == 200
        tracemalloc.start()
        report = account_due(d.engine, config.accounting, budget_s=1.0)
        _now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        with d.engine.connect() as conn:
            created = conn.execute(sa.text("SELECT count(*) FROM intervals")).scalar_one()
        assert report.accounted and report.accounted[0] == old
        assert created <= len(report.accounted) + CLOSE_CHUNK + 1
        assert created < 2 * 1440
        assert peak < 64 * 2**20
        # Ingest is not held up by the catch-up: a batch for now is taken at once.
        assert post(d, ok_batch(aligned_past(2), key="now")).status_code == 200
        calls = []

        def stop_after_two() -> bool:
            calls.append(1)
            return len(calls) > 2

        stopped = account_due(d.engine, config.accounting, should_stop=stop_after_two)
        assert stopped.stopped and len(stopped.accounted) == 2


def test_batches_refused_for_bad_input_are_never_partly_stored(daemon: Daemon) -> None:
    """Every refusal above leaves no trace; a good batch after them is stored whole."""
    body = ok_batch(aligned_past(3))
    for change, _words in [(p.values[0], p.values[1]) for p in IMPLAUSIBLE]:
        bad = copy.deepcopy(body)
        change(bad)
        assert post(daemon, bad).status_code == 422
    assert counts(daemon) == dict.fromkeys(TABLES, 0)
    assert post(daemon, body).status_code == 200
    assert counts(daemon)["samples"] == 2
