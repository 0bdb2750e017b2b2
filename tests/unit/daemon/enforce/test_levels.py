"""Levels decided after each accounted interval, audited, and turned into host plans."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    as_uuid,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
# G_a = +0.125 and G_b = −0.0625 per interval (see tests/unit/daemon/reports/test_standings.py), no
# decay: a's balance is 0.125·k after k intervals.
ENFORCEMENT = {
    "enter": [0.2, 0.4, 0.8],
    "leave": [0.1, 0.3, 0.6],
    "dwell_s": 0,
    "max_step": 1,
    "weight_factors": [0.5, 0.25, 0.1],
    "cap_level": 2,
    "cpu_cap_fractions": [1.0, 0.75, 0.5],
}


def run(database_url: str, mode: str, intervals: int) -> tuple[list[Any], dict[str, Any]]:
    config = make_config(
        database_url,
        {HOST.name: "operator"},
        accounting={"endowment": "equal", "half_life_s": "none"},
        enforcement={**ENFORCEMENT, "mode": mode},
    )
    with serving(config) as d:
        for k in range(intervals, 0, -1):
            body = batch(
                HOST,
                aligned_past(k + 1),
                [cpu_only("vm-a", "a", 90.0, vcpus=2), cpu_only("vm-b", "b", 30.0, vcpus=2)],
            )
            assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name)).is_success
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        with d.engine.connect() as conn:
            actions = conn.execute(
                sa.text(
                    "SELECT c.name, a.kind, a.status, a.dry_run, a.before, a.after, a.reason"
                    " FROM enforcement_actions a JOIN customers c ON c.id = a.customer_id"
                    " JOIN intervals i ON i.id = a.interval_id ORDER BY i.start_s, a.id"
                )
            ).all()
        plan = httpx.get(f"{d.url}/v1/plan/{HOST.name}", headers=auth(HOST.name)).json()
    return actions, plan


def test_a_greedy_customer_climbs_levels_and_its_vm_gets_a_plan(database_url: str) -> None:
    actions, plan = run(database_url, "dry-run", 4)
    # balances 0.125, 0.25, 0.375, 0.5 → levels 0, 1, 1, 2 (one step per decision)
    assert [(a[0], json.loads(a[4])["level"], json.loads(a[5])["level"]) for a in actions] == [
        ("a", 0, 1),
        ("a", 1, 2),
    ]
    assert all(a[1] == "level" and a[2] == "decided" and bool(a[3]) for a in actions)
    assert actions[0][6].startswith("score 0.25 ≥ enter 0.2 of level 1 (balance 0.25")
    assert plan["mode"] == "dry-run"
    assert plan["vms"] == [
        {
            "uuid": as_uuid("vm-a"),
            "customer": "a",
            "level": 2,
            "cpu_weight": 25,
            "io_weight": 25,
            "cpu_quota_cores": 1.5,
            "disk_read_bytes_per_s": None,
            "disk_write_bytes_per_s": None,
        }
    ]


def test_mode_off_decides_nothing(database_url: str) -> None:
    actions, plan = run(database_url, "off", 4)
    assert actions == []
    assert plan["mode"] == "off" and plan["vms"] == []


@pytest.mark.parametrize("intervals", [1])
def test_below_the_first_threshold_nothing_happens(database_url: str, intervals: int) -> None:
    actions, plan = run(database_url, "on", intervals)
    assert actions == [] and plan["vms"] == [] and plan["mode"] == "on"


def test_admin_shows_the_log_and_the_plan(tmp_path: Any) -> None:
    """gmd-admin actions and enforce --plan read back exactly what the daemon decided."""
    import subprocess
    import sys
    from pathlib import Path

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    run(url, "dry-run", 4)
    toml = tmp_path / "gmd.toml"
    lists = {k: v for k, v in ENFORCEMENT.items() if isinstance(v, list)}
    toml.write_text(
        f'[database]\nurl = "{url}"\n[enforcement]\nmode = "dry-run"\n'
        + "".join(f"{k} = {v}\n" for k, v in lists.items())
        + "dwell_s = 0\ncap_level = 2\n"
    )
    admin = Path(sys.executable).with_name("gmd-admin")

    def gmd_admin(*args: str) -> Any:
        out = subprocess.run(
            [str(admin), "--config", str(toml), *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    log = gmd_admin("actions", "--format", "json", "--customer", "a")["actions"]
    assert [(r["kind"], r["before"]["level"], r["after"]["level"]) for r in log] == [
        ("level", 0, 1),
        ("level", 1, 2),
    ]
    assert all(r["dry_run"] and r["customer"] == "a" for r in log)
    assert gmd_admin("actions", "--format", "json", "--customer", "b")["actions"] == []
    assert gmd_admin("actions", "--format", "json", "--to", "2000-01-01")["actions"] == []

    shown = gmd_admin("enforce", "--plan", "--format", "json")
    assert shown["mode"] == "dry-run"
    assert [(r["customer"], r["level"], r["score"]) for r in shown["levels"]] == [("a", 2, 0.5)]
    assert [
        (p["host"], p["uuid"], p["cpu_weight"], p["cpu_quota_cores"]) for p in shown["plans"]
    ] == [("cmp-1", as_uuid("vm-a"), 25, 1.5)]
    bad = subprocess.run(
        [str(admin), "--config", str(toml), "actions", "--from", "yesterday"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "'yesterday' is not a time" in bad.stderr


def test_host_reports_land_in_the_enforcement_log(database_url: str) -> None:
    config = make_config(database_url, {HOST.name: "operator", "cmp-2": "operator"})
    with serving(config) as d:
        body = batch(HOST, aligned_past(3), [cpu_only("vm-a", "a", 90.0, vcpus=2)])
        assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name)).is_success
        report = {
            "generated_s": 1_800_000_000,
            "results": [
                {
                    "uuid": as_uuid("vm-a"),
                    "action": "apply",
                    "ok": True,
                    "before": {"cpu_shares": 100},
                    "after": {"cpu_shares": 25},
                },
                {
                    "uuid": as_uuid("vm-gone"),
                    "action": "restore",
                    "ok": False,
                    "error": "no domain",
                },
            ],
        }
        url = f"{d.url}/v1/plan/{HOST.name}/report"
        assert httpx.post(url, json=report, headers=auth("cmp-2")).status_code == 403
        r = httpx.post(url, json=report, headers=auth(HOST.name))
        # vm-gone never ran on cmp-1 as far as the ledger knows: not recorded
        assert r.status_code == 200 and r.json() == {
            "recorded": 1,
            "ignored": [as_uuid("vm-gone")],
        }
        bad = httpx.post(url, json={**report, "extra": 1}, headers=auth(HOST.name))
        assert bad.status_code == 422 and "extra: unknown field" in bad.json()["detail"]
        with d.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT c.name, h.name, a.kind, a.status, a.dry_run, a.after, a.reason"
                    " FROM enforcement_actions a LEFT JOIN customers c ON c.id = a.customer_id"
                    " JOIN hosts h ON h.id = a.host_id ORDER BY a.id"
                )
            ).all()
    assert [(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows] == [
        ("a", "cmp-1", "host_apply", "ok", False),
    ]
    assert json.loads(rows[0][5]) == {"vm": as_uuid("vm-a"), "cpu_shares": 25}
    assert rows[0][6] == " (plan of 2027-01-15T08:00:00Z, reported by host cmp-1)"
