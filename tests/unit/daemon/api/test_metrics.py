"""What an operator's Prometheus reads on the daemon's /metrics, over real HTTP: why batches
were refused, when each host last delivered (across a restart), how many customers each
throttle level holds, which version runs; and the daemon's log naming customers by project."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gmd.common.version import version
from gmd.daemon.api.metrics import Rejection
from gmd.daemon.ledger.accounting import account_due
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

H1, H2 = HostSpec("cmp-1", cpu_cores=2), HostSpec("cmp-2", cpu_cores=2)
ACME = "7f3e1c2b9a8d4e5f6a7b8c9d0e1f2a3b"


def scrape(d: Daemon) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics: (name, labels) → value."""
    text = httpx.get(f"{d.url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(d: Daemon, name: str, **labels: str) -> float | None:
    return scrape(d).get((name, frozenset(labels.items())))


def post(d: Daemon, body: Any, host: str = H1.name, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{d.url}/v1/samples",
        content=content,
        headers={**auth(host), "Content-Type": "application/json", **headers},
    )


def usage(start: int, cpu_s: float = 30.0, host: HostSpec = H1, **kw: Any) -> dict[str, Any]:
    return batch(host, start, [cpu_only("vm-1", "proj-a", cpu_s)], **kw)


def test_metrics_carry_no_created_series_and_name_the_version(tmp_path: Path) -> None:
    with serving(make_config(f"sqlite:///{tmp_path / 'l.db'}", {H1.name: "operator"})) as d:
        assert post(d, usage(aligned_past(2))).status_code == 200
        text = httpx.get(f"{d.url}/metrics").text
    assert "_created" not in text
    assert f'gmd_build_info{{version="{version()}"}} 1.0' in text


def refusals(d: Daemon, taken: int) -> dict[Rejection, Callable[[], httpx.Response]]:
    """One request per kind of refusal, each refused for that reason alone; ``taken`` is the
    accounted interval of the batch whose key is "taken" (fixed once: a minute may turn while
    the requests are sent)."""
    start = taken - INTERVAL_S
    eight_days_ago = (int(time.time()) // INTERVAL_S - 8 * 1440) * INTERVAL_S
    three_vms = batch(H1, start, [cpu_only(f"vm-{k}", "proj-a", 1.0) for k in range(3)])
    return {
        Rejection.content_type: lambda: post(d, usage(start), **{"Content-Type": "text/plain"}),
        Rejection.malformed_json: lambda: post(d, b"{"),
        Rejection.invalid_fields: lambda: post(d, {**usage(start), "bogus": 1}),
        Rejection.too_large: lambda: post(d, three_vms),
        Rejection.unauthorized: lambda: post(d, usage(start), Authorization=""),
        Rejection.wrong_host: lambda: post(d, usage(start), host=H2.name),
        Rejection.interval_mismatch: lambda: post(d, {**usage(start), "interval_s": 30}),
        Rejection.future: lambda: post(d, usage(aligned_past(-20))),
        Rejection.too_old: lambda: post(d, usage(eight_days_ago)),
        Rejection.implausible: lambda: post(d, usage(start, cpu_s=1e6)),
        Rejection.key_reused: lambda: post(d, usage(taken, key="taken", cpu_s=7.0)),
        Rejection.capacity_conflict: lambda: post(
            d, usage(taken, host=HostSpec(H1.name, cpu_cores=4), key="other")
        ),
        Rejection.before_origin: lambda: post(d, usage(aligned_past(20))),
        # a second batch for the interval of "taken", beyond batches_per_interval = 1
        Rejection.over_limit: lambda: post(d, usage(taken, key="second")),
    }


def test_every_refused_batch_is_counted_by_its_reason(tmp_path: Path) -> None:
    config = make_config(
        f"sqlite:///{tmp_path / 'l.db'}",
        {H1.name: "operator", H2.name: "operator"},
        daemon={
            "max_batch_vms": 2,
            "max_body_bytes": 4096,
            "limits": {"batches_per_interval": 1},
        },
    )
    with serving(config) as d:
        # A key to reuse, a capacity to contradict, and accounting begun (an origin).
        taken = aligned_past(2)
        assert post(d, usage(taken, key="taken")).status_code == 200
        assert post(d, usage(taken - INTERVAL_S)).status_code == 200
        account_due(d.engine, config.accounting)
        statuses = {reason: send().status_code for reason, send in refusals(d, taken).items()}
        too_big = post(d, b"[" + b" " * 5000 + b"]")
        metrics = scrape(d)
    assert statuses == {
        Rejection.content_type: 415,
        Rejection.malformed_json: 400,
        Rejection.invalid_fields: 422,
        Rejection.too_large: 413,
        Rejection.unauthorized: 401,
        Rejection.wrong_host: 403,
        Rejection.interval_mismatch: 422,
        Rejection.future: 425,
        Rejection.too_old: 422,
        Rejection.implausible: 422,
        Rejection.key_reused: 409,
        Rejection.capacity_conflict: 409,
        Rejection.before_origin: 422,
        Rejection.over_limit: 422,
    }
    assert too_big.status_code == 413
    counted = {
        Rejection(dict(labels)["reason"]): value
        for (name, labels), value in metrics.items()
        if name == "gmd_ingest_rejected_batches_total"
    }
    # Placement's refusals need the real Placement (tests/cloud/test_placement_verify.py counts
    # them).
    assert counted == {
        **dict.fromkeys(Rejection, 1.0),
        Rejection.too_large: 2.0,
        Rejection.placement: 0.0,
    }
    rejected = metrics[("gmd_ingest_batches_total", frozenset({("outcome", "rejected")}))]
    assert rejected == sum(counted.values())


def test_each_hosts_last_batch_is_a_gauge_that_survives_a_restart(database_url: str) -> None:
    config = make_config(database_url, {H1.name: "operator"})
    seen_s = int(time.time()) - 7
    with serving(config, clock=lambda: seen_s + 0.75) as d:
        assert sample(d, "gmd_ingest_last_batch_seconds", host=H1.name) is None
        assert post(d, usage(aligned_past(2))).status_code == 200
        assert post(d, usage(aligned_past(-20), key="future")).status_code == 425
        assert post(d, usage(aligned_past(2)), host="cmp-9").status_code == 401
        after_post = scrape(d)
    hosts = {
        dict(labels)["host"]: value
        for (name, labels), value in after_post.items()
        if name == "gmd_ingest_last_batch_seconds"
    }
    assert hosts == {H1.name: seen_s}
    # A new daemon on the same ledger knows it before the host posts again: a host silent
    # since before the restart still shows how long it has been.
    with serving(config) as again:
        assert sample(again, "gmd_ingest_last_batch_seconds", host=H1.name) == seen_s


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


def test_customers_per_level_and_level_changes_logged_by_project_name(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """acme uses 90 of the host's 120 core-seconds, "b" (no project name) 30: acme's balance
    grows 0.125 an interval, and it climbs a level at each of the 2nd and 4th."""
    config = make_config(
        database_url,
        {H1.name: "operator"},
        accounting={"endowment": "equal", "half_life_s": "none"},
        enforcement=ENFORCEMENT,
    )
    last = aligned_past(2)
    with serving(config) as ingest:
        for k in range(5, 1, -1):
            body = batch(
                H1,
                aligned_past(k),
                [cpu_only("vm-a", ACME, 90.0, vcpus=2), cpu_only("vm-b", "b", 30.0, vcpus=2)],
            )
            body["customer_names"] = {ACME: "acme"}
            assert post(ingest, body).status_code == 200
        # Ingest-only: no decision here, so no level is shown.
        assert sample(ingest, "gmd_enforcement_customers", level="1") is None
    caplog.set_level(logging.INFO, logger="gmd.daemon.enforce.levels")
    with serving(config, accountant=True) as d:
        deadline = time.monotonic() + 30
        while (sample(d, "gmd_accounting_last_interval_start_seconds") or 0) < last:
            assert time.monotonic() < deadline, "the accountant did not reach the batches"
            time.sleep(0.1)
        levels = {k: sample(d, "gmd_enforcement_customers", level=k) for k in ("1", "2", "3")}
    assert levels == {"1": 0.0, "2": 1.0, "3": 0.0}
    changes = [r.getMessage() for r in caplog.records if "level" in r.getMessage()]
    assert changes[:2] == [
        f"customer acme ({ACME}): level 0 → 1 (dry-run): score 0.25 ≥ enter 0.2 of level 1",
        f"customer acme ({ACME}): level 1 → 2 (dry-run): score 0.5 ≥ enter 0.4 of level 2",
    ]
    with serving(config, accountant=True) as again:
        assert sample(again, "gmd_enforcement_customers", level="2") == 1.0


def test_process_python_mode_and_every_help_names_a_real_series(tmp_path: Path) -> None:
    """The process and Python series every Prometheus client exports; the configured mode as
    one of its pre-created values; counters that start at 0; and no HELP text naming a
    metric that is not exposed (a counter is scraped as ``…_total``)."""
    config = make_config(
        f"sqlite:///{tmp_path / 'l.db'}", {H1.name: "operator"}, enforcement={"mode": "on"}
    )
    with serving(config) as d:
        text = httpx.get(f"{d.url}/metrics").text
    families = list(text_string_to_metric_families(text))
    names = {s.name for f in families for s in f.samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    values = {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}
    assert {
        m: values[("gmd_enforcement_mode", frozenset({("mode", m)}))]
        for m in ("off", "dry-run", "on")
    } == {"off": 0.0, "dry-run": 0.0, "on": 1.0}
    for action in ("apply", "restore"):
        assert values[("gmd_enforcement_host_failures_total", frozenset({("action", action)}))] == 0
    for action in ("lower", "restore"):
        assert values[("gmd_enforcement_quota_writes_total", frozenset({("action", action)}))] == 0
    assert values[("gmd_enforcement_quota_write_failures_total", frozenset())] == 0
    assert values[("gmd_ledger_write_failures_total", frozenset())] == 0
    assert values[("gmd_ledger_write_failing", frozenset())] == 0
    helps = [line for line in text.splitlines() if line.startswith("# HELP gmd_")]
    named = {n for line in helps for n in re.findall(r"\bgmd_[a-z_]+", line.split(" ", 3)[3])}
    assert named <= names, f"HELP texts name {sorted(named - names)}, which are not exposed"


def test_host_apply_failures_are_counted_by_action(tmp_path: Path) -> None:
    with serving(make_config(f"sqlite:///{tmp_path / 'l.db'}", {H1.name: "operator"})) as d:
        assert post(d, usage(aligned_past(2))).status_code == 200
        vm = batch(H1, 0, [cpu_only("vm-1", "proj-a", 1.0)])["vms"][0]["uuid"]
        results = [
            {"uuid": vm, "action": "apply", "ok": False, "error": "libvirt: domain is busy"},
            {"uuid": vm, "action": "would_restore", "ok": False, "error": "no such file"},
            {"uuid": vm, "action": "apply", "ok": True},
            # Not the host's VM: not recorded, not counted.
            {"uuid": as_uuid("someone-else"), "action": "apply", "ok": False, "error": "no"},
        ]
        answer = httpx.post(
            f"{d.url}/v1/plan/{H1.name}/report",
            json={"generated_s": int(time.time()), "results": results},
            headers=auth(H1.name),
        )
        assert answer.status_code == 200, answer.text
        assert sample(d, "gmd_enforcement_host_failures_total", action="apply") == 1
        assert sample(d, "gmd_enforcement_host_failures_total", action="restore") == 1


@pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")
def test_quota_writes_and_failures_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's quota job against a cloud that answers 503, then heals: one failure, then
    one quota lowered (the fake cloud of tests/support/fake_openstack.py: a real one cannot be
    made to fail on demand)."""
    from gmd.daemon.enforce.quota_job import QuotaReconciler
    from tests.support.fake_openstack import FakeOpenStack, write_clouds_yaml
    from tests.support.quota_job import config_for, drive

    with FakeOpenStack() as cloud:
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(write_clouds_yaml(tmp_path, cloud)))
        config = config_for(tmp_path, "on")
        with serving(config) as d:
            services = d.app.state.services
            services.quotas = QuotaReconciler(d.engine, config.enforcement)
            drive(config, d, [90.0] * 4, first_ago=20)
            cloud.fail(503, times=None, path="")
            assert services.run_quotas().failed == 1
            cloud.heal()
            assert services.run_quotas().lowered == 1
            assert sample(d, "gmd_enforcement_quota_write_failures_total") == 1
            assert sample(d, "gmd_enforcement_quota_writes_total", action="lower") == 1
            assert sample(d, "gmd_enforcement_quota_writes_total", action="restore") == 0
