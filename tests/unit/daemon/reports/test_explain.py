"""gmd-admin explain on a ledger whose every number is worked out by hand.

Two 2-core hosts, 60 s intervals, equal endowments, γ = 0.5, no decay, two intervals alike:
- cmp-1: a's VM uses 90 core-s, b's 30. Endowment 60 each: a is over by 30; b leaves 30,
  which a took in full (α = β = 30, κ = 1), so b's offset is −γ·κ·30 = −15.
- cmp-2: a's second VM and c's VM use 60 each: exactly their endowments, offsets 0.
Three customers ran VMs; the cloud supplies 240 core-s, so one share is s = 80 core-s, and with
m = 4 resources G_a = 30/(4·80) = 0.09375, G_b = −15/320 = −0.046875 per interval. Balances
after the two intervals: a 0.1875, b −0.09375. Level 1 is entered at 0.15 (left below 0.1):
a reaches it after the second interval, not the first.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gmd.daemon.config import load
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    as_uuid,
    auth,
    batch,
    cpu_only,
    serving,
    token_of,
)

ADMIN = Path(sys.executable).with_name("gmd-admin")
CMP1 = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
CMP2 = HostSpec("cmp-2", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
FIRST = aligned_past(4)


def write_config(path: Path, url: str) -> Path:
    """gmd's configuration for this ledger; its read API answers on the loopback."""
    hosts = "".join(
        f'[hosts."{h}"]\nowner = "operator"\n'
        f'token_sha256 = "{hashlib.sha256(token_of(h).encode()).hexdigest()}"\n'
        for h in ("cmp-1", "cmp-2")
    )
    path.write_text(
        f'[database]\nurl = "{url}"\n'
        '[accounting]\ninterval_s = 60\ngrace_s = 0\nendowment = "equal"\nhalf_life_s = "none"\n'
        "gamma = 0.5\n"
        '[enforcement]\nmode = "dry-run"\nenter = [0.15]\nleave = [0.1]\ndwell_s = 0\n'
        "max_step = 1\nweight_factors = [0.5]\ncap_level = 2\nquota_level = 2\n"
        "cpu_cap_fractions = [0.5]\ndisk_caps_bytes_per_s = [0]\n"
        '[daemon]\nbind = "127.0.0.1"\n[read_api]\nauth = "local"\n' + hosts
    )
    return path


@pytest.fixture
def ledger(database_url: str, tmp_path: Path) -> Path:
    path = write_config(tmp_path / "gmd.toml", database_url)
    config = load(path)
    with serving(config) as d:
        for start in (FIRST, FIRST + 60):
            for host, vms in (
                (CMP1, [cpu_only("vm-a1", "a", 90.0), cpu_only("vm-b", "b", 30.0)]),
                (CMP2, [cpu_only("vm-a2", "a", 60.0), cpu_only("vm-c", "c", 60.0)]),
            ):
                body = batch(host, start, vms)
                response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(host.name))
                assert response.is_success, response.text
            account_due(
                d.engine,
                config.accounting,
                now_s=start + 60,
                after=after_interval(config.enforcement),
            )
    return path


def admin(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(path), "explain", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def explained(path: Path, *args: str) -> dict:
    out = admin(path, *args, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_latest_interval_explained_host_by_host(ledger: Path) -> None:
    doc = explained(ledger, "a")
    assert doc["interval"]["start_s"] == FIRST + 60
    assert doc["active_customers"] == 3
    assert doc["share"]["cpu"] == pytest.approx(80.0, abs=1e-9)
    assert doc["greediness"] == pytest.approx(0.09375, abs=1e-15)
    assert doc["ledger_greediness"] == pytest.approx(0.09375, abs=1e-15)
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert set(hosts) == {"cmp-1", "cmp-2"}
    cpu1 = next(r for r in hosts["cmp-1"]["resources"] if r["resource"] == "cpu")
    assert (cpu1["over"], cpu1["unused"], cpu1["credit"]) == pytest.approx((30, 30, 1))
    (vm_a1,) = hosts["cmp-1"]["vms"]
    assert vm_a1["uuid"] == as_uuid("vm-a1")
    cpu = next(r for r in vm_a1["resources"] if r["resource"] == "cpu")
    assert (cpu["used"], cpu["endowment"], cpu["offset"]) == pytest.approx((90, 60, 30))
    assert cpu["term"] == pytest.approx(0.09375, abs=1e-15)
    (vm_a2,) = hosts["cmp-2"]["vms"]
    assert vm_a2["greediness"] == 0.0
    assert hosts["cmp-2"]["greediness"] == 0.0

    balance = doc["balance"]
    assert balance["previous"] == pytest.approx(0.09375, abs=1e-15)
    assert balance["decay"] == 1.0 and balance["reset"] is False
    assert balance["balance"] == pytest.approx(0.1875, abs=1e-15)
    level = doc["level"]
    assert level["level"] == 1 and level["mode"] == "dry-run"
    assert level["score"] == pytest.approx(0.1875, abs=1e-15)
    assert level["enter"] == [0.15] and level["leave"] == [0.1]
    assert level["since_s"] == FIRST + 120  # decided after the second interval, at its end
    kinds = [a["kind"] for a in doc["actions"]]
    assert kinds == ["level"] and doc["actions"][0]["after"]["level"] == 1
    assert doc["notes"] == []


def test_a_customer_that_ceded_is_shown_its_credit(ledger: Path) -> None:
    doc = explained(ledger, "b", "--at", str(FIRST + 5))
    assert doc["interval"]["start_s"] == FIRST
    (host,) = doc["hosts"]
    cpu = next(r for r in host["vms"][0]["resources"] if r["resource"] == "cpu")
    assert (cpu["used"], cpu["endowment"], cpu["offset"]) == pytest.approx((30, 60, -15))
    assert doc["ledger_greediness"] == pytest.approx(-0.046875, abs=1e-15)
    assert doc["balance"]["previous_interval_start_s"] is None
    assert doc["level"]["level"] == 0 and doc["actions"] == []


def test_the_text_says_it_in_words(ledger: Path) -> None:
    out = admin(ledger, "a")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "On host cmp-1 (owned by operator; 2 VM(s) share it)" in text
    assert "cpu        used 1.5 cores, endowment 1 cores: over its endowment by 0.5 cores" in text
    assert "3. Balance: 0.09375 (after the interval of" in text
    assert "+ 0.09375 (this interval's greediness) = 0.1875" in text
    assert "memory, disk, network: less than its endowment, but nobody else" in text
    assert "level 1 from 0.15, left below 0.1" in text
    assert "Level 1 after this interval" in text and "dry-run" in text
    earlier = admin(ledger, "b", "--at", str(FIRST + 5)).stdout
    assert "left 0.5 cores unused; others on the host took 100% of what was left" in earlier
    assert "credited γ·κ = 0.5 of it → −0.04688" in earlier


def test_a_range_explains_its_greediest_interval_and_sums_it(ledger: Path) -> None:
    doc = explained(ledger, "a", "--from", str(FIRST), "--to", str(FIRST + 120))
    summary = doc["range"]
    assert summary["intervals_with_a_standing"] == 2
    assert summary["greediness_sum"] == pytest.approx(0.1875, abs=1e-15)
    assert summary["terms"]["cpu"] == pytest.approx(0.1875, abs=1e-15)
    assert summary["first_balance"] == pytest.approx(0.09375, abs=1e-15)
    assert summary["last_balance"] == pytest.approx(0.1875, abs=1e-15)


def test_errors_have_exit_codes(ledger: Path) -> None:
    unknown = admin(ledger, "nobody")
    assert unknown.returncode == 3 and "'nobody' is not in the ledger" in unknown.stderr
    never = admin(ledger, "a", "--at", "2001-01-01")
    assert never.returncode == 3 and "no interval of the ledger holds" in never.stderr
    both = admin(ledger, "a", "--at", "now", "--from", "now-1h")
    assert both.returncode == 2
    csv_ = admin(ledger, "a", "--format", "csv")
    assert csv_.returncode == 2 and "not CSV" in csv_.stderr
    bad = admin(ledger, "a", "--at", "yesterday-ish")
    assert bad.returncode == 2 and "is not a time" in bad.stderr


def test_a_host_report_on_a_throttled_customer_is_explained(ledger: Path) -> None:
    """A stock agent in dry-run reports what it would do to a's VM once a is at level 1: the
    report's time (a datetime the database wrote) is compared with the level decision's
    when explaining. SQLite hands both back without a zone; the read API, the web page and
    gmd-admin still explain (this crashed with "can't compare offset-naive and offset-aware
    datetimes")."""
    config = load(ledger)
    report = {
        "generated_s": FIRST + 120,
        "results": [
            {
                "uuid": as_uuid("vm-a1"),
                "action": "apply",
                "ok": True,
                "before": {"cpu_shares": 1024},
                "after": {"cpu_shares": 512},
            }
        ],
    }
    with serving(config) as d:
        url = f"{d.url}/v1/plan/cmp-1/report"
        assert httpx.post(url, json=report, headers=auth("cmp-1")).json()["recorded"] == 1
        api = httpx.get(f"{d.url}/v1/customers/a/explain", timeout=120)
        page = httpx.get(f"{d.url}/ui/customers/a", timeout=120)
    assert api.status_code == 200, api.text
    assert page.status_code == 200, page.text
    kinds = [a["kind"] for a in api.json()["actions"]]
    assert kinds == ["level", "host_apply"]
    assert explained(ledger, "a") == api.json()


def test_the_why_cites_the_greed_that_made_the_level_not_the_latest_crumb(
    database_url: str, tmp_path: Path
) -> None:
    """a takes 50 core-s beyond its share once (+50/240 = +0.2083: level 1 from 0.15), then
    1 core-s twice (+0.004167 each). Explained after the third interval, the why cites the
    first, not the latest negligible one, and tells the score now (0.2167) from the one the
    level was decided with (0.2083)."""
    from gmd.common.timespec import iso

    config = load(write_config(tmp_path / "gmd.toml", database_url))
    with serving(config) as d:
        for k, (a, b) in enumerate([(110.0, 10.0), (61.0, 59.0), (61.0, 59.0)]):
            start = FIRST + 60 * k
            vms = [cpu_only("vm-a1", "a", a), cpu_only("vm-b", "b", b)]
            body = batch(CMP1, start, vms)
            assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth("cmp-1")).is_success
            account_due(
                d.engine,
                config.accounting,
                now_s=start + 60,
                after=after_interval(config.enforcement),
            )
    doc = explained(tmp_path / "gmd.toml", "a")
    assert doc["interval"]["start_s"] == FIRST + 120
    level = doc["level"]
    assert level["level"] == 1 and level["since_s"] == FIRST + 60
    assert level["score"] == pytest.approx(52 / 240, abs=1e-12)
    entered = level["entered_after"]
    assert entered["start_s"] == FIRST and entered["score"] == pytest.approx(50 / 240, abs=1e-12)
    (driver,) = level["drivers"]
    assert driver["start_s"] == FIRST and driver["resource"] == "cpu"
    assert driver["greediness"] == pytest.approx(50 / 240, abs=1e-12)
    why = doc["summary"][1]
    assert f"balance is 0.2167 now (after the interval of {iso(FIRST + 120)})" in why
    assert f"it was 0.2083 when the level was decided, after the interval of {iso(FIRST)}" in why
    assert (
        f"the greed that made its balance: the interval of {iso(FIRST)} (+0.2083, mostly cpu)"
        in (why)
    )
    assert "0.004167" not in why
    text = admin(tmp_path / "gmd.toml", "a").stdout
    assert f"decided after the interval of {iso(FIRST)}: score 0.2083 ≥ enter 0.15" in text
    assert "its score now, after this interval, is 0.216667" in text


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (30, "30 s"),
        (90, "90 s"),
        (600, "10 min"),
        (5400, "90 min"),
        (3 * 3600, "3.0 h"),
        (3 * 86400, "3.0 days"),
    ],
)
def test_durations_read_as_people_say_them(seconds: float, said: str) -> None:
    """A 30 s half-life was said as "halves every 0 min" (seen in make cloud-demo)."""
    from gmd.daemon.reports.explanation import duration

    assert duration(seconds) == said
