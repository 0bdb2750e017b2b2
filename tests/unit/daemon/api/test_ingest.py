"""POST /v1/samples over real HTTP into real SQLite and PostgreSQL: what is accepted, what is
refused with which message, and that a refused batch leaves no trace."""

from __future__ import annotations

import copy
import json
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.ingest.checks import BatchProblem, ProblemCode, batch_problems
from gmd.daemon.ingest.parse import record_of
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.interval_samples import SAMPLE_USE, read_samples
from gmd.wire import SampleBatch
from tests.support.daemon_support import (
    INTERVAL_S,
    Daemon,
    HostSpec,
    aligned_past,
    as_uuid,
    auth,
    batch,
    make_config,
    serving,
)

H1, H2 = HostSpec("cmp-1"), HostSpec("cmp-2")
TABLES = ("batches", "samples", "customers", "vms", "intervals", "host_intervals")

TOO_MANY = "4 VMs in one batch; at most 3 (daemon.max_batch_vms): split the batch"


def vm(uuid: str, customer: str = "proj-a", cpu_s: float = 30.0, **extra: Any) -> dict[str, Any]:
    return {
        "uuid": as_uuid(uuid),
        "customer": customer,
        "cpu_s": cpu_s,
        "memory_byte_s": 1e9 * INTERVAL_S,
        "disk_read_bytes": 1e6,
        "disk_write_bytes": 2e6,
        "network_rx_bytes": 3e6,
        "network_tx_bytes": 4e6,
        "flavor": {"vcpus": 2, "memory_bytes": 4e9},
        **extra,
    }


@pytest.fixture
def daemon(database_url: str) -> Iterator[Daemon]:
    config = make_config(
        database_url,
        {H1.name: "operator", H2.name: "lab"},
        daemon={"max_batch_vms": 3, "max_body_bytes": 4096, "clock_skew_s": 120},
    )
    with serving(config) as d:
        yield d


def counts(d: Daemon) -> dict[str, int]:
    with d.engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def post(d: Daemon, body: Any, host: str = H1.name, **kw: Any) -> httpx.Response:
    headers = {**auth(host), **kw.pop("headers", {})}
    if isinstance(body, bytes | str):
        headers["Content-Type"] = "application/json"
        return httpx.post(f"{d.url}/v1/samples", content=body, headers=headers, **kw)
    # json.dumps writes NaN/Infinity tokens for non-finite floats, as a careless agent would.
    return httpx.post(
        f"{d.url}/v1/samples",
        content=json.dumps(body),
        headers={**headers, "Content-Type": "application/json"},
        **kw,
    )


def good(start: int | None = None) -> dict[str, Any]:
    return batch(H1, aligned_past(3) if start is None else start, [vm("vm-1"), vm("vm-2", "b")])


def test_a_batch_is_stored_once_and_acknowledged_twice(daemon: Daemon) -> None:
    body = good()
    first = post(daemon, body)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "status": "accepted",
        "key": body["key"],
        "samples": 2,
        "late": 0,
        "set_aside": [],
    }
    after_first = counts(daemon)
    again = post(daemon, body)
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert counts(daemon) == after_first
    assert after_first["samples"] == 2 and after_first["batches"] == 1
    with daemon.engine.connect() as conn:
        cpu = conn.execute(sa.text("SELECT sum(cpu_s) FROM samples")).scalar_one()
    assert cpu == 60.0


def test_a_retry_serialized_in_another_key_order_is_still_a_duplicate(daemon: Daemon) -> None:
    body = good()
    assert post(daemon, body).json()["status"] == "accepted"
    shuffled = {k: body[k] for k in reversed(list(body))}
    shuffled["vms"] = [{k: v[k] for k in reversed(list(v))} for v in body["vms"]]
    assert json.dumps(shuffled) != json.dumps(body)
    assert post(daemon, shuffled).json()["status"] == "duplicate"


def test_two_batches_for_one_vm_and_interval_add_up(daemon: Daemon) -> None:
    """An agent restarted mid-interval sends the rest under a new key: both parts count."""
    start = aligned_past(3)
    assert post(daemon, batch(H1, start, [vm("vm-1", cpu_s=10)], key="a")).status_code == 200
    assert post(daemon, batch(H1, start, [vm("vm-1", cpu_s=5)], key="b")).status_code == 200
    with daemon.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT cpu_s FROM samples ORDER BY batch_id")).all()
        interval_id = conn.execute(sa.text("SELECT id FROM intervals")).scalar_one()
        merged = read_samples(conn, interval_id)
    assert [tuple(r) for r in rows] == [(10.0,), (5.0,)]  # each batch's own row
    assert merged.shape[0] == 1  # accounting sees the VM once, with both parts
    assert merged[0, SAMPLE_USE].tolist()[:2] == [15.0, 2 * 60 * 1e9]


def test_every_number_is_stored_exactly_and_a_missing_flavor_amount_as_null(
    daemon: Daemon,
) -> None:
    """The samples travel to PostgreSQL by binary COPY, laid out per group of rows with the
    same missing flavor amounts: every value comes back bit for bit, and NULL where the agent
    gave no amount, whatever the mix of rows in a batch."""
    vms = [
        vm("vm-1", cpu_s=0.1, network_tx_bytes=5e-324, flavor={"vcpus": 2, "memory_bytes": 4e9}),
        {**vm("vm-2", "b", cpu_s=1 / 3, disk_read_bytes=123456789.123456789), "flavor": {}},
        {**vm("vm-3", cpu_s=0.0), "flavor": {"network_bytes_per_s": 1.25e9, "vcpus": None}},
    ]
    del vms[1]["flavor"]
    assert post(daemon, batch(H1, aligned_past(3), vms)).status_code == 200
    columns = [
        "cpu_s",
        "memory_byte_s",
        "disk_read_bytes",
        "disk_write_bytes",
        "network_rx_bytes",
        "network_tx_bytes",
    ]
    flavors = ["vcpus", "memory_bytes", "disk_bytes_per_s", "network_bytes_per_s"]
    with daemon.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT vms.uuid, {', '.join(columns)},"
                f" {', '.join('flavor_' + f for f in flavors)}, samples.late, customers.name"
                " FROM samples JOIN vms ON vms.id = samples.vm_id"
                " JOIN customers ON customers.id = samples.customer_id ORDER BY vms.uuid"
            )
        ).all()
    expected = sorted(
        (
            v["uuid"],
            *(v[c] for c in columns),
            *(v.get("flavor", {}).get(f) for f in flavors),
            False,
            v["customer"],
        )
        for v in batch(H1, 0, vms)["vms"]
    )
    assert [tuple(r) for r in rows] == expected


def test_a_vm_that_moves_away_and_back_is_where_its_last_batch_says(daemon: Daemon) -> None:
    """A host's batch that lists the same VMs and owners as its last one reuses their ids,
    but never after a VM moved or changed hands meanwhile."""
    start = aligned_past(6)

    def placed() -> dict[str, tuple[str, str]]:
        with daemon.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT vms.uuid, hosts.name, customers.name FROM vms"
                    " JOIN hosts ON hosts.id = vms.host_id"
                    " JOIN customers ON customers.id = vms.customer_id"
                )
            ).all()
        return {u: (h, c) for u, h, c in rows}

    pair = [vm("vm-1"), vm("vm-2", "b")]
    one, two = as_uuid("vm-1"), as_uuid("vm-2")
    assert post(daemon, batch(H1, start, pair)).status_code == 200
    assert post(daemon, batch(H2, start + INTERVAL_S, [vm("vm-1")]), H2.name).status_code == 200
    assert placed()[one] == (H2.name, "proj-a")
    assert post(daemon, batch(H1, start + 2 * INTERVAL_S, pair)).status_code == 200
    assert placed()[one] == (H1.name, "proj-a")
    handed = [vm("vm-1"), vm("vm-2", "c")]
    assert post(daemon, batch(H1, start + 3 * INTERVAL_S, handed)).status_code == 200
    assert placed() == {one: (H1.name, "proj-a"), two: (H1.name, "c")}
    with daemon.engine.connect() as conn:
        owners = conn.execute(
            sa.text(
                "SELECT customers.name FROM samples"
                " JOIN customers ON customers.id = samples.customer_id"
                " WHERE samples.vm_id = (SELECT id FROM vms WHERE uuid = :u)"
                " ORDER BY samples.interval_id"
            ),
            {"u": two},
        ).scalars()
        assert list(owners) == ["b", "b", "c"]


def test_a_new_vm_elsewhere_leaves_other_hosts_memory_in_use(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VM started on one host (new to the ledger) cannot make another host's remembered VMs
    wrong: that host's next batch with the same VMs is still written from its memory, without
    looking its VMs up. A VM that moved does make it look them up."""
    store = daemon.app.state.services.store
    looked_up: list[str] = []
    look_up = store.ids.look_up

    def counting(conn: Any, record: Any, *args: Any) -> Any:
        looked_up.append(record.host)
        return look_up(conn, record, *args)

    monkeypatch.setattr(store.ids, "look_up", counting)
    start = aligned_past(6)
    pair = [vm("vm-1"), vm("vm-2", "b")]
    assert post(daemon, batch(H1, start, pair)).status_code == 200
    assert post(daemon, batch(H2, start, [vm("vm-3", "c")]), H2.name).status_code == 200
    assert post(daemon, batch(H1, start + INTERVAL_S, pair)).status_code == 200
    assert looked_up == [H1.name, H2.name]
    # vm-2 moves to H2; H1's memory, which lists it, is not used again.
    moved = [vm("vm-3", "c"), vm("vm-2", "b")]
    assert post(daemon, batch(H2, start + INTERVAL_S, moved), H2.name).status_code == 200
    assert post(daemon, batch(H1, start + 2 * INTERVAL_S, pair)).status_code == 200
    assert looked_up == [H1.name, H2.name, H2.name, H1.name]


REFUSALS = [
    pytest.param(b'{"key": "k", "host": ', 400, "malformed JSON", id="malformed-json"),
    pytest.param(
        json.dumps(good(0)).replace('"cpu_s": 30.0', '"cpu_s": 1e999', 1).encode(),
        400,
        "number is infinity",
        id="overflowing-number",
    ),
    pytest.param(
        lambda b: b.update(colour="blue"), 422, "colour: unknown field", id="unknown-field"
    ),
    pytest.param(
        lambda b: b["vms"][1].update(gpu_s=1),
        422,
        "vms[1].gpu_s: unknown field",
        id="unknown-vm-field",
    ),
    pytest.param(
        lambda b: b["vms"][1].update(cpu_s=-3.0),
        422,
        "vms[1].cpu_s: Input should be greater",
        id="negative",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(network_rx_bytes=float("nan")),
        400,
        "NaN and Infinity are not JSON",
        id="nan",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(memory_byte_s=float("inf")),
        400,
        '"memory_byte_s": Infinity',
        id="infinite",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(cpu_s="lots"),
        422,
        "vms[0].cpu_s: Input should be a valid number",
        id="wrong-type",
    ),
    pytest.param(
        lambda b: b["capacity"].update(cpu_cores=0),
        422,
        "capacity.cpu_cores: Input should be greater than 0",
        id="zero-capacity",
    ),
    pytest.param(lambda b: b.pop("capacity"), 422, "capacity: Field required", id="missing-field"),
    pytest.param(
        lambda b: b["vms"][1].update(uuid=b["vms"][1]["uuid"].upper()),
        422,
        "vms[1].uuid: a VM id must be a UUID: 8-4-4-4-12 lowercase hex digits (got",
        id="uuid-upper-case",
    ),
    pytest.param(
        lambda b: b.update(interval_start_s=aligned_past(-5)),
        425,  # early: the agent keeps it and sends it again
        "in the future",
        id="clock-skew",
    ),
    pytest.param(
        lambda b: b.update(interval_s=30),
        422,
        "this daemon accounts 60 s intervals",
        id="interval-length",
    ),
    pytest.param(
        lambda b: b.update(interval_start_s=b["interval_start_s"] + 7),
        422,
        "not a multiple of 60",
        id="misaligned",
    ),
    pytest.param(
        lambda b: b["vms"].append(dict(b["vms"][0])),
        422,
        f"VM {as_uuid('vm-1')} appears twice",
        id="vm-twice",
    ),
    pytest.param(
        lambda b: b["vms"].extend([vm("vm-3"), vm("vm-4")]),
        413,
        TOO_MANY,
        id="too-many-vms",
    ),
    pytest.param(
        lambda b: (
            b.update(interval_start_s=b["interval_start_s"] + 7),
            b["vms"].extend([vm("vm-3"), vm("vm-4")]),
        ),
        413,
        "not a multiple of 60 (and 1 more)",
        id="too-many-vms-among-others",
    ),
    pytest.param(
        lambda b: b["vms"][0].update(uuid="x" * 5000),
        413,
        "exceeds the limit of 4096",
        id="body-too-large",
    ),
]


@pytest.mark.parametrize(("change", "status", "message"), REFUSALS)
def test_bad_batches_are_refused_with_a_reason_and_leave_nothing(
    daemon: Daemon, change: Any, status: int, message: str
) -> None:
    if isinstance(change, bytes):
        body: Any = change
    else:
        body = copy.deepcopy(good())
        change(body)
    before = counts(daemon)
    response = post(daemon, body)
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]
    assert counts(daemon) == before == dict.fromkeys(TABLES, 0)


@pytest.mark.parametrize(
    ("change", "codes"),
    [
        (lambda b: None, []),
        (lambda b: b.update(interval_s=30), [ProblemCode.INTERVAL_LENGTH]),
        (lambda b: b.update(interval_start_s=607), [ProblemCode.INTERVAL_ALIGNMENT]),
        (lambda b: b.update(interval_start_s=1200), [ProblemCode.FUTURE]),
        (lambda b: b["vms"].extend([vm("vm-3"), vm("vm-4")]), [ProblemCode.TOO_MANY_VMS]),
        (lambda b: b["vms"].append(vm("vm-1")), [ProblemCode.DUPLICATE_VM]),
        (
            lambda b: (b.update(interval_start_s=1207), b["vms"].extend([vm("vm-1"), vm("vm-3")])),
            [
                ProblemCode.INTERVAL_ALIGNMENT,
                ProblemCode.FUTURE,
                ProblemCode.TOO_MANY_VMS,
                ProblemCode.DUPLICATE_VM,
            ],
        ),
    ],
    ids=["fine", "length", "alignment", "future", "too-many", "duplicate", "all"],
)
def test_each_batch_problem_has_a_code(change: Any, codes: list[ProblemCode]) -> None:
    body = good(600)
    change(body)
    problems = batch_problems(
        record_of(SampleBatch.model_validate(body)),
        interval_s=60,
        now_s=1000,
        clock_skew_s=120,
        max_vms=3,
    )
    assert [p.code for p in problems] == codes


def test_batch_problems_keep_their_messages() -> None:
    body = good(1207)
    body["vms"] += [vm("vm-1"), vm("vm-3")]
    problems = batch_problems(
        record_of(SampleBatch.model_validate(body)),
        interval_s=60,
        now_s=1000,
        clock_skew_s=120,
        max_vms=3,
    )
    assert [p.message for p in problems] == [
        "interval_start_s = 1207 is not a multiple of 60",
        "interval ends at 1267, 267 s in the future (allowed clock skew: 120 s): is cmp-1's"
        " clock right?",
        TOO_MANY,
        f"vms[2]: VM {as_uuid('vm-1')} appears twice in the batch",
    ]
    assert problems[2] == BatchProblem(ProblemCode.TOO_MANY_VMS, TOO_MANY)


def test_a_reused_key_with_other_content_is_a_conflict(daemon: Daemon) -> None:
    body = good()
    assert post(daemon, body).status_code == 200
    before = counts(daemon)
    changed = copy.deepcopy(body)
    changed["vms"][0]["cpu_s"] = 31.0
    response = post(daemon, changed)
    assert response.status_code == 409
    assert f"batch key {body['key']!r} was already used" in response.json()["detail"]
    assert counts(daemon) == before
    with daemon.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT sum(cpu_s) FROM samples")).scalar_one() == 60.0


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda b: b["vms"][1].update(customer="c"), id="owner"),
        pytest.param(lambda b: b["vms"][0]["flavor"].pop("vcpus"), id="flavor-amount-dropped"),
        pytest.param(lambda b: b["vms"][0].update(created_s=1), id="created"),
        pytest.param(lambda b: b.update(customer_names={"b": "Bee"}), id="project-name"),
        pytest.param(lambda b: b["vms"].reverse(), id="vm-order"),
        pytest.param(lambda b: b["capacity"].update(cpu_cores=9), id="capacity"),
    ],
)
def test_every_part_of_a_batch_is_in_its_digest(daemon: Daemon, change: Any) -> None:
    body = good()
    assert post(daemon, body).status_code == 200
    changed = copy.deepcopy(body)
    change(changed)
    assert post(daemon, changed).status_code == 409


def test_a_batch_stored_with_a_digest_of_the_first_kind_is_acknowledged_on_retry(
    daemon: Daemon,
) -> None:
    """Digests stored before ``v2:`` cannot be compared: a retry across the upgrade (same key,
    same interval) is a duplicate, and the key is still refused for another interval."""
    body = good()
    assert post(daemon, body).status_code == 200
    with daemon.engine.begin() as conn:
        conn.execute(sa.text("UPDATE batches SET digest = :d"), {"d": "ab" * 32})
    before = counts(daemon)
    assert post(daemon, body).json()["status"] == "duplicate"
    elsewhere = copy.deepcopy(body)
    elsewhere["interval_start_s"] -= INTERVAL_S
    assert post(daemon, elsewhere).status_code == 409
    assert counts(daemon) == before


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"Authorization": ""}, 401, "missing Authorization"),
        ({"Authorization": "Basic dTpw"}, 401, "must be 'Bearer TOKEN'"),
        ({"Authorization": "Bearer guessed"}, 401, "matches no host"),
        (auth(H2.name), 403, "belongs to host 'cmp-2', not 'cmp-1'"),
    ],
    ids=["missing", "not-bearer", "unknown-token", "other-host"],
)
def test_tokens_are_checked_per_host(
    daemon: Daemon, headers: dict[str, str], status: int, message: str
) -> None:
    response = post(daemon, good(), headers=headers)
    assert response.status_code == status
    assert message in response.json()["detail"]
    if status == 401:
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert counts(daemon) == dict.fromkeys(TABLES, 0)


def test_samples_after_their_interval_closed_are_kept_as_late(daemon: Daemon) -> None:
    start = aligned_past(3)
    assert post(daemon, good(start)).status_code == 200
    report = account_due(daemon.engine, make_config("sqlite://").accounting)
    assert start in report.accounted
    with daemon.engine.connect() as conn:
        ledger_before = conn.execute(sa.text("SELECT * FROM customer_ledger ORDER BY 2")).all()
    late = post(daemon, batch(H1, start, [vm("vm-1", cpu_s=12)], key="late-one"))
    assert late.json() == {
        "status": "accepted",
        "key": "late-one",
        "samples": 1,
        "late": 1,
        "set_aside": [],
    }
    with daemon.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT cpu_s, late FROM samples JOIN vms ON vms.id = samples.vm_id"
                " WHERE vms.uuid = :u ORDER BY late"
            ),
            {"u": as_uuid("vm-1")},
        ).all()
        ledger_after = conn.execute(sa.text("SELECT * FROM customer_ledger ORDER BY 2")).all()
    assert [(r[0], bool(r[1])) for r in rows] == [(30.0, False), (12.0, True)]
    assert ledger_after == ledger_before


def test_samples_behind_the_frontier_are_late_and_before_the_origin_refused(
    daemon: Daemon,
) -> None:
    """A spool replayed after accounting went past its interval: stored, flagged, not counted;
    but before the ledger's first interval there is no standing to add it to: refused."""
    assert post(daemon, good(aligned_past(6))).status_code == 200
    assert post(daemon, good(aligned_past(3))).status_code == 200
    account_due(daemon.engine, make_config("sqlite://").accounting)
    behind = aligned_past(5)
    response = post(daemon, batch(H1, behind, [vm("vm-1")], key="from-the-spool"))
    assert response.json()["late"] == 1
    with daemon.engine.connect() as conn:
        state = conn.execute(
            sa.text("SELECT state, ledger_rows FROM intervals WHERE start_s = :s"), {"s": behind}
        ).one()
    assert tuple(state) == ("accounted", 0)
    before = counts(daemon)
    refused = post(daemon, batch(H1, aligned_past(10), [vm("vm-1")], key="older-than-ledger"))
    assert refused.status_code == 422
    assert "before the ledger's first interval" in refused.json()["detail"]
    assert counts(daemon) == before


def test_unknown_host_without_auth_is_owned_by_the_default_owner(database_url: str) -> None:
    config = make_config(
        database_url, daemon={"auth": "none"}, organizations={"default_owner": "ops"}
    )
    with serving(config) as d:
        response = post(d, batch(HostSpec("stray"), aligned_past(2), [vm("v")]), headers={})
        assert response.status_code == 200, response.text
        with d.engine.connect() as conn:
            owner = conn.execute(
                sa.text(
                    "SELECT o.name FROM hosts h JOIN organizations o ON o.id = h.organization_id"
                    " WHERE h.name = 'stray'"
                )
            ).scalar_one()
    assert owner == "ops"


def test_health_plan_and_metrics(daemon: Daemon) -> None:
    health = httpx.get(f"{daemon.url}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    plan = httpx.get(f"{daemon.url}/v1/plan/{H1.name}", headers=auth(H1.name))
    assert plan.status_code == 200
    assert plan.json()["host"] == H1.name and plan.json()["vms"] == []
    assert httpx.get(f"{daemon.url}/v1/plan/{H1.name}", headers=auth(H2.name)).status_code == 403
    post(daemon, good())
    post(daemon, good())
    post(daemon, b"{")
    text = httpx.get(f"{daemon.url}/metrics").text
    assert 'gmd_ingest_batches_total{outcome="accepted"} 1.0' in text
    assert 'gmd_ingest_batches_total{outcome="duplicate"} 1.0' in text
    assert 'gmd_ingest_batches_total{outcome="rejected"} 1.0' in text
    assert 'gmd_ingest_samples_total{timing="on_time"} 2.0' in text


def test_openapi_describes_the_batch(daemon: Daemon) -> None:
    spec = httpx.get(f"{daemon.url}/openapi.json").json()
    schema = spec["components"]["schemas"]["SampleBatch"]
    assert schema["additionalProperties"] is False
    assert {"key", "host", "interval_start_s", "interval_s", "capacity", "vms"} <= set(
        schema["properties"]
    )


def test_a_broken_database_is_a_503_that_tells_the_agent_to_retry(tmp_path: Any) -> None:
    """The ledger cannot be written: batches get 503 (agents spool them), nothing half-stored."""
    config = make_config(f"sqlite:///{tmp_path / 'ledger.db'}", {H1.name: "operator"})
    with serving(config) as d:
        with d.engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE samples"))
        response = post(d, good())
        assert response.status_code == 503
        assert "ledger database unavailable" in response.json()["detail"]
        with d.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one() == 0


def test_tls_when_a_certificate_is_configured(tmp_path: Any) -> None:
    """HTTPS with the configured certificate; plain HTTP is not served on that port."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(tmp_path / "d.key"),
            "-out",
            str(tmp_path / "d.crt"),
        ],
        check=True,
        capture_output=True,
    )
    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {H1.name: "operator"},
        daemon={"tls_cert": str(tmp_path / "d.crt"), "tls_key": str(tmp_path / "d.key")},
    )
    with serving(config) as d:
        assert d.url.startswith("https://")
        response = httpx.post(
            f"{d.url}/v1/samples",
            json=good(),
            headers=auth(H1.name),
            verify=ssl.create_default_context(cafile=str(tmp_path / "d.crt")),
        )
        assert response.status_code == 200 and response.json()["status"] == "accepted"
        with pytest.raises(httpx.HTTPError):
            httpx.get(d.url.replace("https", "http") + "/healthz")
