"""Request bodies that once got a 5xx get the 4xx that says what is wrong: a chunked body over
``daemon.max_body_bytes`` (was 500), a plan report that is not JSON (was 500), numbers beyond
what the ledger's columns hold. Against the real app under uvicorn."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from tests.support.daemon_support import (
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

HOST = HostSpec("cmp-1")
LIMIT = 4096


@pytest.fixture
def daemon(tmp_path: object) -> Iterator[Daemon]:
    config = make_config(
        f"sqlite:///{tmp_path}/ledger.db", {HOST.name: "operator"}, daemon={"max_body_bytes": LIMIT}
    )
    with serving(config) as d:
        yield d


def chunks(total: int, size: int = 1024) -> Iterator[bytes]:
    """A body sent without a length (Transfer-Encoding: chunked)."""
    body = json.dumps(batch(HOST, aligned_past(3), [cpu_only("vm-a", "a", 1.0)]))
    padded = (body[:-1] + ', "pad": "' + "x" * total + '"}').encode()
    for i in range(0, len(padded), size):
        yield padded[i : i + size]


@pytest.mark.parametrize("path", ["/v1/samples", "/v1/plan/cmp-1/report"])
def test_a_chunked_body_over_the_limit_is_413_not_500(daemon: Daemon, path: str) -> None:
    response = httpx.post(
        f"{daemon.url}{path}",
        content=chunks(4 * LIMIT),
        headers={**auth(HOST.name), "Content-Type": "application/json"},
    )
    assert response.status_code == 413, response.text
    assert f"exceeds the limit of {LIMIT}" in response.json()["detail"]
    with daemon.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one() == 0


def test_a_chunked_body_under_the_limit_is_read_whole(daemon: Daemon) -> None:
    body = json.dumps(batch(HOST, aligned_past(3), [cpu_only("vm-a", "a", 1.0)])).encode()
    response = httpx.post(
        f"{daemon.url}/v1/samples",
        content=iter([body[:100], body[100:]]),
        headers={**auth(HOST.name), "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text


def report(**changes: object) -> dict[str, object]:
    result = {
        "uuid": as_uuid("vm-a"),
        "action": "apply",
        "ok": True,
        "error": None,
        "before": {"cpu_shares": 100},
        "after": {"cpu_shares": 25},
    }
    body: dict[str, object] = {"generated_s": 1_800_000_000, "results": [result]}
    for key, value in changes.items():
        if key in result:
            result[key] = value
        else:
            body[key] = value
    return body


REPORT_REFUSALS = [
    pytest.param(
        {"Content-Type": "text/plain"},
        b"generated_s=1",
        415,
        "content type 'text/plain'",
        id="text",
    ),
    pytest.param(
        {"Content-Type": "application/x-www-form-urlencoded"},
        b"generated_s=1&results=",
        415,
        "send application/json",
        id="form",
    ),
    pytest.param({}, json.dumps(report()).encode(), 415, "'(none)'", id="no-content-type"),
    pytest.param(
        {"Content-Type": "application/json"}, b'{"generated_s": ', 400, "malformed JSON", id="cut"
    ),
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(generated_s=2**63)).encode(),
        422,
        "generated_s",
        id="generated-2**63",
    ),
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(generated_s="1")).encode(),
        422,
        "generated_s",
        id="generated-string",
    ),
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(before={f"k{i}": i for i in range(40)})).encode(),
        422,
        "results[0].before",
        id="before-too-many-keys",
    ),
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(uuid="../../etc/passwd")).encode(),
        422,
        "results[0].uuid",
        id="uuid-path",
    ),
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(ok="yes")).encode(),
        422,
        "results[0].ok",
        id="ok-string",
    ),
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(ok=False, error="e" * 2001)).encode(),
        422,
        "results[0].error: String should have at most 2000 characters",
        id="error-2001-chars",
    ),
    # PostgreSQL's text cannot hold NUL: there such an error was a database error, a 503 that
    # agents retry for ever (SQLite stored it).
    pytest.param(
        {"Content-Type": "application/json"},
        json.dumps(report(ok=False, error="no such file: /sys/fs/cgroup/\x00")).encode(),
        422,
        "results[0].error",
        id="error-NUL",
    ),
]


@pytest.mark.parametrize(("headers", "body", "status", "words"), REPORT_REFUSALS)
def test_plan_reports_are_refused_with_a_4xx_that_says_why(
    daemon: Daemon, headers: dict[str, str], body: bytes, status: int, words: str
) -> None:
    response = httpx.post(
        f"{daemon.url}/v1/plan/{HOST.name}/report",
        content=body,
        headers={**auth(HOST.name), **headers},
    )
    assert response.status_code == status, response.text
    problem = response.json()
    assert words in problem["detail"] + " ".join(problem["errors"])
    with daemon.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM enforcement_actions")).scalar_one() == 0


def runs_vm_a(d: Daemon) -> None:
    """The host reports vm-a, so that its plan reports on vm-a are recorded (a report on a VM
    the ledger does not place on the host is ignored)."""
    body = batch(HOST, aligned_past(3), [cpu_only("vm-a", "a", 1.0)])
    assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name)).is_success


def test_a_good_plan_report_is_recorded(daemon: Daemon) -> None:
    runs_vm_a(daemon)
    response = httpx.post(
        f"{daemon.url}/v1/plan/{HOST.name}/report", json=report(), headers=auth(HOST.name)
    )
    assert response.status_code == 200 and response.json()["recorded"] == 1


def test_samples_need_a_json_content_type(daemon: Daemon) -> None:
    body = json.dumps(batch(HOST, aligned_past(3), [cpu_only("vm-a", "a", 1.0)]))
    response = httpx.post(
        f"{daemon.url}/v1/samples",
        content=body,
        headers={**auth(HOST.name), "Content-Type": "text/plain"},
    )
    assert response.status_code == 415


def test_the_spec_describes_both_bodies_and_every_refusal(daemon: Daemon) -> None:
    spec = httpx.get(f"{daemon.url}/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert {"SampleBatch", "PlanReport", "VmApplyResult"} <= set(schemas)
    report_op = spec["paths"]["/v1/plan/{host}/report"]["post"]
    assert report_op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PlanReport"
    }
    assert {"400", "413", "415", "422"} <= set(report_op["responses"])


def test_a_chunked_body_over_the_limit_is_one_warning_and_no_error(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    """The guard's line alone: no 500 from Starlette, no "Exception in ASGI application"."""
    with caplog.at_level(logging.WARNING):
        response = httpx.post(
            f"{daemon.url}/v1/plan/{HOST.name}/report",
            content=chunks(4 * LIMIT),
            headers={**auth(HOST.name), "Content-Type": "application/json"},
        )
    assert response.status_code == 413
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"POST /v1/plan/{HOST.name}/report refused (413): body of ")
    assert lines[0].endswith(f"bytes exceeds daemon.max_body_bytes = {LIMIT}")


def test_extreme_values_in_a_plan_report_are_recorded_as_sent(daemon: Daemon) -> None:
    """What fits the schema is no 5xx: the largest numbers JSON has, the longest error (cut to
    what the daemon keeps)."""
    before = {"cpu_shares": 1e308, "cpu.max": -1e308, "weight": 2**63, "path": "p" * 256}
    after = {"cpu_shares": 2**70, "cpu.max": "max", "weight": None}
    runs_vm_a(daemon)
    body = report(
        generated_s=2**53 - 1, ok=False, error="E" * 1999 + "\n", before=before, after=after
    )
    response = httpx.post(
        f"{daemon.url}/v1/plan/{HOST.name}/report", json=body, headers=auth(HOST.name)
    )
    assert response.status_code == 200 and response.json()["recorded"] == 1, response.text
    with daemon.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT status, before, after, reason FROM enforcement_actions")
        ).one()
    vm = {"vm": as_uuid("vm-a")}
    assert row.status == "failed"
    assert json.loads(row.before) == {**vm, **before}
    assert json.loads(row.after) == {
        **vm,
        "cpu_shares": float(2**70),
        "cpu.max": "max",
        "weight": None,
    }
    # The longest error the wire takes is cut at daemon.limits.max_error_chars (500).
    cut = "E" * 500 + "… (1500 more characters cut: daemon.limits.max_error_chars)"
    assert row.reason == cut + f" (plan of {2**53 - 1}, reported by host {HOST.name})"


def test_a_hidden_character_in_the_path_host_is_422_even_without_auth(tmp_path: object) -> None:
    config = make_config(f"sqlite:///{tmp_path}/l.db", {}, daemon={"auth": "none"})
    with serving(config) as d:
        got = httpx.get(f"{d.url}/v1/plan/a%00b")
        posted = httpx.post(f"{d.url}/v1/plan/a%E2%80%8Bb/report", json=report())
    assert got.status_code == 422 and "U+0000" in got.json()["detail"]
    assert posted.status_code == 422 and "ZERO WIDTH SPACE" in posted.json()["detail"]
