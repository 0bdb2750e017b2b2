"""What one host token may claim of the ledger ([daemon.limits]), over the real HTTP API against
each real database: every bound refused with its configuration key, nothing of a refused batch
written, retries still acknowledged, the next interval open again."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

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

HOST = HostSpec("cmp-1", cpu_cores=64, memory_bytes=512e9)
COUNTED = ("batches", "samples", "customers", "vms")


def post(d: Daemon, body: Any) -> httpx.Response:
    return httpx.post(
        f"{d.url}/v1/samples",
        content=json.dumps(body),
        headers={**auth(HOST.name), "Content-Type": "application/json"},
    )


def report(d: Daemon, results: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{d.url}/v1/plan/{HOST.name}/report",
        json={"generated_s": aligned_past(1), "results": results},
        headers=auth(HOST.name),
    )


def counts(d: Daemon) -> dict[str, int]:
    with d.engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in COUNTED}


def vms(names: list[str], customer: str | None = None) -> list[dict[str, Any]]:
    """A VM per name, owned by ``customer`` or by a customer of its own name."""
    return [cpu_only(n, customer or f"c-{n}", 1.0) for n in names]


class Clock:
    """The daemon's clock, moved by the test: the per-interval bounds count wall-clock
    intervals."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def limited(database_url: str, **limits: int) -> Any:
    return make_config(database_url, {HOST.name: "operator"}, daemon={"limits": limits})


def test_batches_per_interval_counts_distinct_batches(database_url: str) -> None:
    start = aligned_past(2)
    with serving(limited(database_url, batches_per_interval=2)) as d:
        first = batch(HOST, start, vms(["vm-1"]), key="k1")
        assert post(d, first).json()["status"] == "accepted"
        assert post(d, batch(HOST, start, vms(["vm-2"]), key="k2")).status_code == 200
        # A retry is acknowledged again and counts nothing.
        assert post(d, first).json()["status"] == "duplicate"
        before = counts(d)
        third = post(d, batch(HOST, start, vms(["vm-3"]), key="k3"))
        assert third.status_code == 422
        assert "daemon.limits.batches_per_interval" in third.json()["detail"]
        assert "at most 2" in third.json()["detail"]
        assert counts(d) == before
        # Another interval has room of its own.
        assert post(d, batch(HOST, start + INTERVAL_S, vms(["vm-3"]), key="k4")).is_success


def test_one_batch_an_interval_lets_each_interval_in_once(database_url: str) -> None:
    """A known host's batch is first tried as one statement (PostgreSQL), which stores nothing
    in an interval not made yet or for a retry; the general path then counts it instead, never
    besides: with one batch an interval, every interval's batch is let in, its retry is
    acknowledged, and a second batch refused."""
    start = aligned_past(4)
    with serving(limited(database_url, batches_per_interval=1)) as d:
        for k in range(3):
            first = batch(HOST, start + k * INTERVAL_S, vms(["vm-1", "vm-2"], "c"), key=f"k{k}")
            answer = post(d, first)
            assert answer.status_code == 200, answer.text
            assert post(d, first).json()["status"] == "duplicate"
        second = post(d, batch(HOST, start + 2 * INTERVAL_S, vms(["vm-1", "vm-2"], "c"), "x"))
        assert second.status_code == 422
        assert "batches_per_interval" in second.json()["detail"]
        assert counts(d)["batches"] == 3


@pytest.mark.parametrize(
    ("key", "new_vms"),
    [
        # Each VM of a customer of its own: customers and VMs both new.
        pytest.param("new_customers_per_interval", lambda names: vms(names), id="customers"),
        # VMs of one known customer: only the VMs are new.
        pytest.param("new_vms_per_interval", lambda names: vms(names, "known"), id="vms"),
    ],
)
def test_what_a_host_introduces_per_interval_is_bounded(
    database_url: str, key: str, new_vms: Any
) -> None:
    """The host's first batch since the daemon started takes its whole VM list (a new ledger);
    after it, at most the bound of new ones an interval: 429 with Retry-After while a later
    interval can take the batch, 422 for a batch beyond the bound by itself."""
    start = aligned_past(5)
    clock = Clock(start + 5 * INTERVAL_S + 1)
    other = (
        "new_vms_per_interval" if key != "new_vms_per_interval" else "new_customers_per_interval"
    )
    config = limited(database_url, **{key: 3, other: 1000})
    with serving(config, clock=clock) as d:
        seed = [f"seed-{k}" for k in range(10)]
        assert post(d, batch(HOST, start, vms(seed, "known") + vms(["seed-x"]))).is_success
        assert post(d, batch(HOST, start + 60, new_vms(["a1", "a2"]))).is_success
        before = counts(d)
        refused = post(d, batch(HOST, start + 120, new_vms(["b1", "b2"])))
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert f"daemon.limits.{key}" in detail and "after 2 this interval" in detail
        assert 1 <= int(refused.headers["Retry-After"]) <= INTERVAL_S
        assert counts(d) == before
        # Known VMs and customers are no claim: the host's usual batch goes on.
        assert post(d, batch(HOST, start + 180, vms(seed, "known"))).is_success
        too_many = post(d, batch(HOST, start + 240, new_vms(["c1", "c2", "c3", "c4"])))
        assert too_many.status_code == 422
        assert f"at most 3 an interval (daemon.limits.{key})" in too_many.json()["detail"]
        # The next interval takes the spooled batch.
        clock.now_s += INTERVAL_S
        assert post(d, batch(HOST, start + 120, new_vms(["b1", "b2"]))).is_success
        metrics = httpx.get(f"{d.url}/metrics").text
    assert 'gmd_ingest_rejected_batches_total{reason="over_limit"} 2.0' in metrics


def test_enforcement_log_rows_are_bounded_and_error_texts_cut(database_url: str) -> None:
    config = limited(database_url, report_rows_per_interval=3, max_error_chars=40)
    # The rows are counted per interval of the daemon's clock: held in the middle of one, so
    # that the two reports fall in the same interval however long the test takes (seen on CI:
    # the second report came in the next interval, and was admitted).
    length = config.accounting.interval_s
    now = time.time()
    middle = now - now % length + length / 2
    with serving(config, clock=lambda: middle) as d:
        assert post(d, batch(HOST, aligned_past(2), vms(["vm-1"]))).is_success
        with d.engine.connect() as conn:
            uuid = conn.execute(sa.text("SELECT uuid FROM vms")).scalar_one()
        failed = {"uuid": uuid, "action": "apply", "ok": False, "error": "x" * 2000}
        assert report(d, [failed, failed]).json()["recorded"] == 2
        with d.engine.connect() as conn:
            reasons = conn.execute(sa.text("SELECT reason FROM enforcement_actions")).scalars()
            reasons = list(reasons)
        assert len(reasons) == 2
        assert all(r.startswith("x" * 40 + "… (1960 more characters cut") for r in reasons)
        assert all("x" * 41 not in r for r in reasons)
        again = report(d, [failed, failed])
        assert again.status_code == 429
        assert "daemon.limits.report_rows_per_interval" in again.json()["detail"]
        assert "Retry-After" in again.headers
        whole = report(d, [failed] * 4)
        assert whole.status_code == 413
        assert "daemon.limits.report_rows_per_interval" in whole.json()["detail"]
        with d.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT count(*) FROM enforcement_actions")).scalar_one()
        assert rows == 2


def test_the_limits_are_configured_and_checked(tmp_path: Any) -> None:
    from gmd.common.config import ConfigError
    from gmd.daemon.config import DaemonConfig, LimitsConfig

    url = f"sqlite:///{tmp_path / 'l.db'}"
    assert make_config(url).daemon.limits == LimitsConfig()
    assert DaemonConfig().max_batch_vms == 2000
    given = limited(url, batches_per_interval=2, new_customers_per_interval=7)
    assert given.daemon.limits.new_customers_per_interval == 7
    with pytest.raises(ConfigError, match=r"daemon\.limits\.batches_per_intervals: unknown key"):
        limited(url, batches_per_intervals=2)
    with pytest.raises(ConfigError, match=r"daemon\.limits\.max_error_chars"):
        limited(url, max_error_chars=0)


def test_a_report_the_ledger_could_not_write_does_not_use_up_the_bound(database_url: str) -> None:
    """A report answered 503 (the agent sends it again) gives its rows back: after the outage
    the same report fits the bound it would otherwise have passed."""
    from tests.support.daemon_support import full_ledger

    config = limited(database_url, report_rows_per_interval=5, max_error_chars=2000)
    with serving(config) as d:
        assert post(d, batch(HOST, aligned_past(2), vms(["vm-1"]))).is_success
        with d.engine.connect() as conn:
            uuid = conn.execute(sa.text("SELECT uuid FROM vms")).scalar_one()
        # Rows larger than a page, so that SQLite needs room it does not have.
        failed = {"uuid": uuid, "action": "apply", "ok": False, "error": "x" * 2000}
        with full_ledger(d, database_url):
            assert report(d, [failed] * 3).status_code == 503
        again = report(d, [failed] * 3)
        assert again.status_code == 200, again.text
        assert again.json()["recorded"] == 3


def test_a_cloud_of_more_hosts_than_the_prune_bound_does_not_rebuild_its_counts_every_batch() -> (
    None
):
    """Counts of past intervals are dropped once the maps pass their bound; when every count is
    current (20,000 hosts posting the same interval) the map must not be rebuilt for every batch
    (it was: 4.1 ms of CPU a batch at 20,000 hosts against 1.7 at 5,000)."""
    from gmd.daemon.config import LimitsConfig
    from gmd.daemon.ingest.limits import HostLimits

    limits = HostLimits(LimitsConfig(), INTERVAL_S)
    start = 1_800_000_000 // INTERVAL_S * INTERVAL_S
    hosts = [f"cmp-{h}" for h in range(25_000)]
    for interval in (start, start + INTERVAL_S):  # the second batches count in windows
        now = interval + INTERVAL_S + 1
        for host in hosts:
            limits.admit_batch(host, interval, now, 0, 0, oldest_s=start - 3600)
    batches, windows = limits._batches, limits._windows
    assert len(batches) == 2 * len(hosts) and len(windows) == len(hosts)
    now = start + 2 * INTERVAL_S + 1
    for host in hosts[:100]:
        limits.admit_batch(host, start + INTERVAL_S * 2, now, 0, 0, oldest_s=start - 3600)
    assert limits._batches is batches and limits._windows is windows
    # Counts of intervals no batch can arrive for any more are still dropped.
    later = start + 10 * INTERVAL_S
    for interval in (later, later + INTERVAL_S):
        for host in hosts:
            limits.admit_batch(host, interval, interval + INTERVAL_S + 1, 0, 0, oldest_s=later)
    assert sorted({interval for _host, interval in limits._batches}) == [later, later + INTERVAL_S]
