"""Schemathesis against a real gmd-daemon: no request, valid or not, gets a 5xx or an answer the
OpenAPI spec does not describe, and the ledger holds exactly the batches it acknowledged.

Why: the daemon's spec is the agents' contract, and hand-written refusal tests only try what
their authors thought of. A fuzzing run of ~30,000 requests found 5xx answers (a created_s of
2^63, a plan report that was not JSON, a chunked body over the size limit) and types coerced
against the README's word; this keeps a bounded run of the same kind in the suite.

How: the spec is the one the running daemon serves at /openapi.json (the real app under
uvicorn, on SQLite, its accountant on, a valid bearer token), on a ledger seeded with a few
hand-made batches (so that the comparison below is never empty and the host's plan lists a VM).
For every operation: schemathesis' coverage cases (methods not listed, missing and wrong-typed
fields, other content types: hypothesis explicit examples), then EXAMPLES generated requests
with data that fits the schema and, separately, data that does not; every check schemathesis
has. Half of the generated requests are steered to the configured host (the path's {host}; for
a schema-valid batch also its host, capacity and a recent aligned interval), or nearly all
would meet a 403 and never reach the ledger. After every request the ledger must hold exactly
the batches /v1/samples acknowledged as "accepted", with as many samples as their receipts
said. Derandomized: CI sees the same requests every run (up to the clock, which the steered
intervals follow).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    CHECKS as REGISTERED_CHECKS,
    allow_header_conformance,
    content_type_conformance,
    ensure_resource_availability,
    ignored_auth,
    max_response_time,
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    object_level_authorization,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
    use_after_free,
)

from gmd.daemon.api.app import create_app
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    INTERVAL_S,
    Daemon,
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

# A small host, and the enforcement of tests/unit/daemon/enforce/test_levels.py (no decay: customer
# a, using 3/4 of the host against b's 1/4, reaches level 2 after four intervals).
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
OWNER = "operator"
ENFORCEMENT = {
    "mode": "dry-run",
    "enter": [0.2, 0.4, 0.8],
    "leave": [0.1, 0.3, 0.6],
    "dwell_s": 0,
    "max_step": 1,
    "weight_factors": [0.5, 0.25, 0.1],
    "cap_level": 2,
    "cpu_cap_fractions": [1.0, 0.75, 0.5],
}
SEED_INTERVALS = 5
# Generated requests per operation and generation mode (plus the coverage cases): ~50 s for the
# whole file on an idle 2-core machine.
EXAMPLES = 300
# Every check schemathesis has (test_every_schemathesis_check_is_on keeps it so as schemathesis
# grows). Some can only speak in some runs, and stay on so that they speak when they can:
# unsupported_method and missing_required_header judge coverage cases (we run them);
# allow_header_conformance judges OPTIONS answers (coverage sends OPTIONS); ignored_auth needs a
# securityScheme, which the daemon's spec does not declare (it documents `authorization` as a
# header parameter, and 401/403); use_after_free, ensure_resource_availability and
# object_level_authorization judge stateful sequences through links, which the spec has none of.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    missing_required_header,
    unsupported_method,
    allow_header_conformance,
    ignored_auth,
    use_after_free,
    ensure_resource_availability,
    object_level_authorization,
    max_response_time,
]
# An answer slower than the agent's default timeout_s (gmd/agent/config.py) is no answer to it.
MAX_RESPONSE_TIME_S = 10.0
# positive_data_acceptance expects 2xx for data that fits the schema, but the daemon rightly
# refuses some of that by rules the JSON schema does not say, with statuses the spec documents:
# 403, the token names another host than the path's {host} or the batch's host; 409, a batch
# key already used for a different batch; 413, more VMs than daemon.max_batch_vms (the agent
# must split the batch); 425, an interval in the future (beyond the allowed clock skew); 422,
# an interval misaligned or before the ledger's first, more use than the host can give, a VM
# created in the future, and the wire types' own
# rules: names (host, customer) without control, bidi or zero-width characters, integers
# written as integers (JSON Schema's "integer" admits 5.0, the strict wire types do not). So
# these count as accepted. 400 (not JSON), 401 (no or a wrong token) and 415 (not
# application/json) do not: schemathesis sends JSON and we a valid token, so one of those for
# valid data is a defect.
POSITIVE_REFUSALS = ["2xx", "403", "409", "413", "422", "425"]
# The read API's routes (read_api.auth = "local" here): every check but the one above, whose
# statuses are the ingest's; the test checks theirs itself.
READ_PATHS = (
    "/v1/standings",
    "/v1/enforcement",
    "/v1/customers/{customer}/explain",
    "/v1/customers/{customer}/report",
    "/v1/customers/{customer}/plot.svg",
    "/v1/whatif",
    "/v1/federation",
    "/v1/federation/events",
    "/v1/hosts",
    "/v1/hosts/{host}",
)
READ_CHECKS = [c for c in CHECKS if c is not positive_data_acceptance]


def configured(url: str) -> Any:
    # The read API too, in the operator's local mode (the test daemon listens on loopback).
    return make_config(
        url,
        {HOST.name: OWNER},
        accounting={"endowment": "equal", "half_life_s": "none"},
        enforcement=ENFORCEMENT,
        daemon={"bind": "127.0.0.1"},
        read_api={"auth": "local"},
    )


def app_operations() -> list[tuple[str, str]]:
    """(method, path) of every operation in the spec of the daemon's app (for collection: the
    test then fuzzes the spec the running daemon serves, and checks that they are the same)."""
    spec = create_app(configured("sqlite://"), sa.create_engine("sqlite://")).openapi()
    return [(method.upper(), path) for path, item in spec["paths"].items() for method in item]


OPERATIONS = app_operations()
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
]


@dataclass
class Ledger:
    """What /v1/samples acknowledged: batch key → samples, for receipts saying "accepted"."""

    acknowledged: dict[str, int] = field(default_factory=dict)
    accepted_by_fuzzing: int = 0
    fuzzed: set[str] = field(default_factory=set)


@pytest.fixture(scope="module")
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, ledger: Ledger) -> Iterator[Daemon]:
    """The daemon to fuzz, on a ledger that already holds a few hand-made batches (accounted,
    so that the greedy customer's VM is in the host's plan): the comparison of the ledger with
    the acknowledgements is never empty, and a plan has VM items to conform to the spec."""
    config = configured(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'ledger.db'}")
    with serving(config) as d:  # no accountant yet: the seed must not race it
        for k in range(SEED_INTERVALS, 0, -1):
            body = batch(
                HOST,
                aligned_past(k + 1),
                [cpu_only("vm-a", "a", 90.0, vcpus=2), cpu_only("vm-b", "b", 30.0, vcpus=2)],
                key=f"seed-{k}",
            )
            response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name))
            assert response.status_code == 200, response.text
            receipt = response.json()
            assert receipt["status"] == "accepted" and receipt["samples"] == 2, receipt
            ledger.acknowledged[receipt["key"]] = receipt["samples"]
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        plan = httpx.get(f"{d.url}/v1/plan/{HOST.name}", headers=auth(HOST.name)).json()
        assert [vm["customer"] for vm in plan["vms"]] == ["a"], plan
    with serving(config, accountant=True) as d:
        yield d


@pytest.fixture(scope="module")
def schema(daemon: Daemon) -> Any:
    """The spec the running daemon serves, with the checks configured as described above."""
    loaded = schemathesis.openapi.from_url(f"{daemon.url}/openapi.json")
    loaded.config.checks.update(
        included_check_names=[check.__name__ for check in CHECKS],
        max_response_time=MAX_RESPONSE_TIME_S,
    )
    loaded.config.checks.positive_data_acceptance.expected_statuses = POSITIVE_REFUSALS
    # Failures show the request as sent: the batch key, and the token (a test's, no secret).
    loaded.config.output.sanitization.update(enabled=False)
    return loaded


def coverage_cases(schema: Any, operation: Any, mode: GenerationMode) -> list[Any]:
    """Schemathesis' coverage phase for ``operation`` (what `st run` does before fuzzing)."""
    config = schema.config.generation_for(operation=operation, phase="coverage")
    return list(
        schema.iter_coverage_cases(operation, generation_modes=[mode], generation_config=config)
    )


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_request_gets_a_5xx_or_an_undocumented_answer(
    daemon: Daemon, schema: Any, ledger: Ledger, method: str, path: str, mode: GenerationMode
) -> None:
    operation = schema[path][method]
    # Data that does not fit the schema exists only where there is a body to get wrong (a
    # path's {host} is any string, and `authorization` any string or none); without one, the
    # negative coverage cases (other methods and content types) are all there is to send.
    generate = mode is GenerationMode.POSITIVE or len(operation.body) > 0

    def run(case: Any, own: bool, intervals_ago: int) -> None:
        if own:
            steer(case, mode, intervals_ago)
        headers = {**(case.headers or {}), **auth(HOST.name)}
        response = case.call(base_url=daemon.url, headers=headers, timeout=30)
        if path in READ_PATHS:
            # A time the schema cannot tell from another string (400), a customer the ledger
            # has never seen or a range with nothing in it (404): refusals the spec documents.
            case.validate_response(response, checks=READ_CHECKS, headers=headers)
            if mode is GenerationMode.POSITIVE and case.method.upper() == "GET":
                assert response.status_code in (200, 400, 404), response.text
        else:
            case.validate_response(response, checks=CHECKS, headers=headers)
        note_and_compare(daemon, ledger, case, response, headers)

    test = given(
        case=operation.as_strategy(generation_mode=mode),
        own=st.booleans(),
        # the seed's intervals, the newest closed one, and one before the ledger's first
        intervals_ago=st.integers(1, SEED_INTERVALS + 2),
    )(run)
    for case in coverage_cases(schema, operation, mode):
        test = example(case=case, own=True, intervals_ago=1)(test)
    settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink] if generate else [Phase.explicit],
        suppress_health_check=list(HealthCheck),
    )(test)()
    ledger.fuzzed.add(f"{method} {path} {mode.value}")


def steer(case: Any, mode: GenerationMode, intervals_ago: int) -> None:
    """Aim the request at the configured host: its path, and (for a batch that fits the
    schema, so that it still does) the batch's host, its capacity and a recent aligned
    interval, so that only the VMs' use decides whether it is accepted."""
    if "host" in (case.path_parameters or {}):
        case.path_parameters["host"] = HOST.name
    if "customer" in (case.path_parameters or {}):
        case.path_parameters["customer"] = "a"  # the seed's greedy customer
    body = case.body if case.path == "/v1/samples" else None
    if mode is GenerationMode.POSITIVE and isinstance(body, dict):
        body.update(
            host=HOST.name,
            capacity=HOST.capacity,
            interval_s=INTERVAL_S,
            interval_start_s=aligned_past(intervals_ago),
        )


def note_and_compare(
    daemon: Daemon, ledger: Ledger, case: Any, response: Any, headers: dict[str, str]
) -> None:
    """Record an acknowledged batch, then compare the ledger with the acknowledgements."""
    request = case.as_curl_command(headers=headers, base_url=daemon.url)
    acknowledges = case.path == "/v1/samples" and case.method.upper() == "POST"
    if acknowledges and response.status_code == 200:
        receipt = response.json()
        if receipt["status"] == "accepted":
            assert receipt["key"] not in ledger.acknowledged, (
                f"accepted a second time: {request}\n-> {response.text}"
            )
            ledger.acknowledged[receipt["key"]] = receipt["samples"]
            ledger.accepted_by_fuzzing += 1
        else:
            assert receipt["key"] in ledger.acknowledged, (
                f"a duplicate of a batch never accepted: {request}\n-> {response.text}"
            )
    stored, samples = ledger_contents(daemon)
    assert stored == ledger.acknowledged, (
        f"after {request}\n-> {response.status_code} {response.text[:500]}\n"
        f"stored batches (key: samples) {stored} != acknowledged {ledger.acknowledged}"
    )
    assert samples == sum(ledger.acknowledged.values()), (
        f"after {request}\n-> {response.status_code} {response.text[:500]}\n"
        f"{samples} samples stored, receipts say {sum(ledger.acknowledged.values())}"
    )


def ledger_contents(daemon: Daemon) -> tuple[dict[str, int], int]:
    with daemon.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key, samples FROM batches")).all()
        stored = {key: n for key, n in rows}
        samples = conn.execute(sa.text("SELECT count(*) FROM samples")).scalar_one()
    return stored, samples


def test_the_ledger_holds_only_acknowledged_batches(daemon: Daemon, ledger: Ledger) -> None:
    """After the fuzzing (which compared the ledger after each request; this runs after it, in
    file order): every stored batch was acknowledged, with as many samples as its receipt said,
    and nothing else is stored; the hand-made batches keep the comparison from being empty."""
    stored, samples = ledger_contents(daemon)
    assert stored == ledger.acknowledged
    assert samples == sum(ledger.acknowledged.values())
    assert len(stored) >= SEED_INTERVALS
    if "POST /v1/samples positive" in ledger.fuzzed:
        # else the steering above no longer reaches the ledger, and this test says little
        assert ledger.accepted_by_fuzzing > 0, "no generated batch was accepted"
    with daemon.engine.connect() as conn:
        intervals = conn.execute(sa.text("SELECT length_s FROM intervals")).scalars().all()
    assert set(intervals) == {INTERVAL_S}


def test_the_fuzzed_spec_is_the_daemons(daemon: Daemon) -> None:
    """The operations fuzzed are those the running daemon serves."""
    served = httpx.get(f"{daemon.url}/openapi.json").json()
    assert sorted(OPERATIONS) == sorted(
        (method.upper(), path) for path, item in served["paths"].items() for method in item
    )


def test_every_schemathesis_check_is_on() -> None:
    """A check a newer schemathesis adds is not left out silently (max_response_time is not
    registered: it is on when given a limit, as here)."""
    assert {c.__name__ for c in CHECKS} == {
        *REGISTERED_CHECKS.get_all_names(),
        "max_response_time",
    }
