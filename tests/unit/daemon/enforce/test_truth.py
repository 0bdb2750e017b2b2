"""Enforcement tells the truth: plans hold the VMs a host runs now, the standings say
"applied" only for what a host reports applied, history says what was applied per interval,
a restore is recorded, and a host reports only on its own VMs. Against real SQLite and
PostgreSQL ledgers, through the daemon's real HTTP API."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import libvirt
import sqlalchemy as sa

from gmd.daemon.config import Config
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.reports.enforcement import plans as enforcement_plans
from gmd.daemon.reports.series import collect
from gmd.daemon.reports.standings import standings
from gmd.daemon.reports.usage import report as usage_report
from tests.support.appliers import NODE, UUID_B
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
    token_of,
)

AGENT = Path(sys.executable).with_name("gmd-agent")
ADMIN = AGENT.with_name("gmd-admin")

CMP1 = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
CMP2 = HostSpec("cmp-2", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
HOSTS = {CMP1.name: CMP1, CMP2.name: CMP2}
# Low thresholds: the greedy customer a climbs a level per interval and stays up.
ENFORCEMENT = {
    "enter": [0.02, 0.04, 0.08],
    "leave": [0.01, 0.03, 0.06],
    "dwell_s": 0,
    "max_step": 1,
    "weight_factors": [0.5, 0.25, 0.1],
    "cap_level": 2,
    "cpu_cap_fractions": [1.0, 0.75, 0.5],
}

Use = tuple[str, str, str, float]
"""(host, VM, customer, core-seconds) in one interval"""


def config_for(database_url: str, mode: str) -> Config:
    return make_config(
        database_url,
        {h: "operator" for h in HOSTS},
        accounting={"endowment": "equal", "half_life_s": "none"},
        enforcement={**ENFORCEMENT, "mode": mode},
    )


@contextmanager
def cloud(
    database_url: str, mode: str, intervals: list[list[Use]], starts: list[int] | None = None
) -> Iterator[Daemon]:
    """The daemon, after the hosts posted ``intervals`` (at ``starts``; by default the last one
    ending before the current interval) and the accountant decided levels after each. The
    starts are taken once: a test that names intervals passes its own, so that a minute
    turning meanwhile cannot shift them (CI failed on it)."""
    config = config_for(database_url, mode)
    if starts is None:
        starts = [aligned_past(len(intervals) + 1 - k) for k in range(len(intervals))]
    with serving(config) as d:
        for uses, start in zip(intervals, starts, strict=True):
            for host in sorted({u[0] for u in uses}):
                vms = [cpu_only(vm, c, cpu, vcpus=2) for h, vm, c, cpu in uses if h == host]
                body = batch(HOSTS[host], start, vms)
                r = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(host))
                assert r.is_success, r.text
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        yield d


def plan_of(d: Daemon, host: str) -> dict[str, Any]:
    r = httpx.get(f"{d.url}/v1/plan/{host}", headers=auth(host))
    assert r.status_code == 200, r.text
    return r.json()


def enforced(d: Daemon, mode: str) -> dict[str, Any]:
    config = config_for("sqlite://", mode)
    with d.engine.connect() as conn:
        rows = standings(conn, everyone=True, enforcement=config.enforcement).rows
    return {r["customer"]: (r["level"], r["vms"], r["enforced"]) for r in rows}


# Three VMs of a on cmp-1; in the last interval a3 is gone (stopped: cmp-1 no longer reports
# it). a4 ran on cmp-2 in the first interval only, and cmp-2 has been silent since.
THREE_THEN_TWO: list[list[Use]] = [
    [
        ("cmp-1", "a1", "a", 40.0),
        ("cmp-1", "a2", "a", 40.0),
        ("cmp-1", "a3", "a", 40.0),
        ("cmp-1", "b1", "b", 0.0),
        ("cmp-2", "a4", "a", 0.0),
    ],
    *[
        [
            ("cmp-1", "a1", "a", 40.0),
            ("cmp-1", "a2", "a", 40.0),
            ("cmp-1", "a3", "a", 40.0),
            ("cmp-1", "b1", "b", 0.0),
        ]
    ]
    * 2,
    [("cmp-1", "a1", "a", 60.0), ("cmp-1", "a2", "a", 60.0), ("cmp-1", "b1", "b", 0.0)],
    [("cmp-1", "a1", "a", 60.0), ("cmp-1", "a2", "a", 60.0), ("cmp-1", "b1", "b", 0.0)],
]


def test_a_plan_holds_only_the_vms_its_host_reported_last(database_url: str) -> None:
    """A VM the host stopped reporting leaves its plan (and enforce --plan's view), and a host
    silent for the contention window has no throttled VM at all."""
    with cloud(database_url, "on", THREE_THEN_TWO) as d:
        plan = plan_of(d, "cmp-1")
        assert plan["mode"] == "on"
        assert sorted(v["uuid"] for v in plan["vms"]) == sorted([as_uuid("a1"), as_uuid("a2")])
        assert all(v["customer"] == "a" and v["level"] >= 1 for v in plan["vms"])
        assert plan_of(d, "cmp-2")["vms"] == []
        with d.engine.connect() as conn:
            rows, _caps = enforcement_plans(conn, config_for(database_url, "on").enforcement)
        assert sorted((r["host"], r["uuid"]) for r in rows) == sorted(
            [("cmp-1", as_uuid("a1")), ("cmp-1", as_uuid("a2"))]
        )


def test_a_customer_without_a_running_vm_is_not_enforced(database_url: str) -> None:
    """Level 1 with no VM left running: nothing is applied, and the standings say so."""
    greedy = [("cmp-1", "a1", "a", 90.0), ("cmp-1", "b1", "b", 30.0)]
    with cloud(database_url, "on", [greedy, greedy, greedy, [("cmp-1", "b1", "b", 30.0)]]) as d:
        assert plan_of(d, "cmp-1")["vms"] == []
        level, vms, word = enforced(d, "on")["a"]
        assert level >= 1 and vms == 0
        assert word == "not applied"
        assert enforced(d, "dry-run")["a"][2] == "dry-run"
        assert enforced(d, "off")["a"][2] == "off"
        assert enforced(d, "on")["b"][2] is None


def report(d: Daemon, host: str, results: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"generated_s": aligned_past(0), "results": results, **extra}
    return httpx.post(f"{d.url}/v1/plan/{host}/report", json=body, headers=auth(host))


def applied(vm: str, **after: Any) -> dict[str, Any]:
    return {
        "uuid": as_uuid(vm),
        "action": "apply",
        "ok": True,
        "before": {"cpu_shares": 1024},
        "after": after or {"cpu_shares": 256},
    }


def restored(vm: str) -> dict[str, Any]:
    return {
        "uuid": as_uuid(vm),
        "action": "restore",
        "ok": True,
        "before": {"cpu_shares": 256},
        "after": {"cpu_shares": 1024},
    }


def log_rows(d: Daemon) -> list[tuple[Any, ...]]:
    with d.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT c.name, h.name, a.kind, a.status, a.after, a.reason"
                    " FROM enforcement_actions a LEFT JOIN customers c ON c.id = a.customer_id"
                    " LEFT JOIN hosts h ON h.id = a.host_id"
                    " WHERE a.kind IN ('host_apply', 'host_restore') ORDER BY a.id"
                )
            )
        ]


def test_the_standings_say_applied_only_while_a_host_reports_a_running_vm_throttled(
    database_url: str,
) -> None:
    with cloud(database_url, "on", THREE_THEN_TWO) as d:
        assert enforced(d, "on")["a"][2] == "not applied"  # no host has applied anything
        assert report(d, "cmp-1", [applied("a1"), applied("a2")]).status_code == 200
        assert enforced(d, "on")["a"][2] == "applied"
        assert report(d, "cmp-1", [restored("a1"), restored("a2")]).status_code == 200
        assert enforced(d, "on")["a"][2] == "not applied"


def test_a_host_reports_only_on_the_vms_that_run_on_it(database_url: str) -> None:
    """cmp-2 reports applying and restoring a's VM, which runs on cmp-1, and a VM the ledger
    never saw: neither lands in any log (the receipt names them); its own VM's result does."""
    uses: list[Use] = [("cmp-1", "a1", "a", 90.0), ("cmp-2", "b1", "b", 30.0)]
    with cloud(database_url, "on", [uses, uses]) as d:
        r = report(
            d, "cmp-2", [applied("a1"), restored("a1"), applied("b1"), applied("never-seen")]
        )
        assert r.status_code == 200, r.text
        assert r.json() == {
            "recorded": 1,
            "ignored": sorted([as_uuid("a1"), as_uuid("never-seen")]),
        }
        assert [(c, h, k) for c, h, k, *_ in log_rows(d)] == [("b", "cmp-2", "host_apply")]
        # the host the VM runs on may
        r = report(d, "cmp-1", [applied("a1")])
        assert r.json() == {"recorded": 1, "ignored": []}
        assert [(c, h, k) for c, h, k, *_ in log_rows(d)][-1] == ("a", "cmp-1", "host_apply")


def host_wide_rows(d: Daemon) -> list[tuple[Any, ...]]:
    with d.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT h.name, a.kind, a.status, a.after, a.reason FROM enforcement_actions a"
                    " JOIN hosts h ON h.id = a.host_id WHERE a.customer_id IS NULL ORDER BY a.id"
                )
            )
        ]


def test_gmd_agent_restore_all_is_recorded_and_the_standings_follow(
    database_url: str, tmp_path: Path
) -> None:
    """An agent applied a's plan to vm-b (on a test-driver host); ``gmd-agent --restore-all``
    puts it back and tells the daemon: a host_restore row for the VM and one for the host,
    and the standings no longer say "applied"."""
    vm = UUID_B
    uses: list[Use] = [("cmp-1", vm, "a", 90.0), ("cmp-1", "b1", "b", 30.0)]
    with cloud(database_url, "on", [uses, uses, uses]) as d:
        assert [v["uuid"] for v in plan_of(d, "cmp-1")["vms"]] == [vm]
        assert report(d, "cmp-1", [applied(vm)]).json() == {"recorded": 1, "ignored": []}
        assert enforced(d, "on")["a"][2] == "applied"

        node = tmp_path / "node.xml"
        node.write_text(NODE)
        probe = libvirt.open(f"test://{node}")
        run_id = probe.lookupByUUIDString(vm).ID()
        probe.close()
        state = tmp_path / "enforcement.json"
        record = {
            "name": "vm-b",
            "run_id": run_id,
            "since_s": 1.0,
            "originals": {"blkio_weight": 321},
        }
        state.write_text(json.dumps({"version": 1, "backend": "libvirt", "vms": {vm: record}}))
        toml = tmp_path / "agent.toml"
        toml.write_text(
            f'[agent]\nlibvirt_uri = "test://{node}"\nenforcement_state_path = "{state}"\n'
            f'host = "cmp-1"\ndaemon_url = "{d.url}"\ntoken = "{token_of("cmp-1")}"\n'
        )
        out = subprocess.run(
            [str(AGENT), "--config", str(toml), "--restore-all"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "the restore is recorded in the daemon's enforcement log" in out.stderr
        last = [r for r in log_rows(d) if r[0] is not None][-1]
        assert last[:4] == ("a", "cmp-1", "host_restore", "ok")
        assert json.loads(last[4]) == {"vm": vm, "blkio_weight": 321}
        assert "gmd-agent --restore-all, reported by host cmp-1" in last[5]
        ((host, kind, status, after, reason),) = host_wide_rows(d)
        assert (host, kind, status, json.loads(after)) == (
            "cmp-1",
            "host_restore",
            "ok",
            {"all": True},
        )
        assert reason.startswith("gmd-agent --restore-all on host cmp-1: every VM gmd had changed")
        assert enforced(d, "on")["a"][2] == "not applied"


def test_a_restore_all_report_ends_what_the_host_had_applied_even_unlisted(
    database_url: str,
) -> None:
    """The agent's state file had lost a VM it had throttled: --restore-all lists nothing, but
    says everything on the host is back; the daemon believes it for that host's VMs only."""
    uses: list[Use] = [
        ("cmp-1", "a1", "a", 90.0),
        ("cmp-1", "b1", "b", 30.0),
        ("cmp-2", "a2", "a", 90.0),
        ("cmp-2", "b2", "b", 30.0),
    ]
    with cloud(database_url, "on", [uses, uses, uses]) as d:
        assert report(d, "cmp-1", [applied("a1")]).status_code == 200
        assert report(d, "cmp-2", [applied("a2")]).status_code == 200
        assert report(d, "cmp-1", [], restore_all=True).json() == {"recorded": 1, "ignored": []}
        assert [h for h, *_ in host_wide_rows(d)] == ["cmp-1"]
        assert enforced(d, "on")["a"][2] == "applied"  # a2 on cmp-2 still is
        assert report(d, "cmp-2", [], restore_all=True).status_code == 200
        assert enforced(d, "on")["a"][2] == "not applied"


def test_gmd_admin_enforce_shows_the_plan_without_being_asked(tmp_path: Path) -> None:
    """``gmd-admin enforce`` shows levels, plans and caps, as ``--plan`` (still accepted) does;
    it used to exit 2 asking for --plan, its only mode."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with cloud(url, "on", THREE_THEN_TWO[:3]):
        pass
    toml = tmp_path / "gmd.toml"
    toml.write_text(f'[database]\nurl = "{url}"\n[enforcement]\nmode = "on"\n')

    def enforce(*args: str) -> Any:
        out = subprocess.run(
            [str(ADMIN), "--config", str(toml), "enforce", *args, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    shown = enforce()
    assert shown == enforce("--plan")
    assert set(shown) == {"mode", "levels", "plans", "caps"} and shown["mode"] == "on"
    assert [r["customer"] for r in shown["levels"]] == ["a"]
    assert {p["uuid"] for p in shown["plans"]} == {as_uuid(v) for v in ("a1", "a2", "a3")}


def test_history_says_what_the_hosts_applied_per_interval(database_url: str) -> None:
    """a's level was decided in dry-run; then the daemon was switched to "on" and cmp-1
    applied a's plan during the third interval. The report's throttle_mode and the plot's
    level panel said "dry-run" for all of it (the mode of the decision); per interval they
    now say what the hosts reported: dry-run before the apply, applied from it on."""
    greedy: list[Use] = [("cmp-1", "a1", "a", 90.0), ("cmp-1", "b1", "b", 30.0)]
    starts = [aligned_past(6 - k) for k in range(5)]
    with cloud(database_url, "dry-run", [greedy] * 5, starts) as d:
        url = str(d.engine.url.render_as_string(hide_password=False))
    config = config_for(url, "on")
    with serving(config, clock=lambda: starts[2] + 30) as d:
        assert report(d, "cmp-1", [applied("a1")]).json() == {"recorded": 1, "ignored": []}
        with d.engine.connect() as conn:
            whole = usage_report(conn, "customer", starts[0], starts[-1] + 60, customer="a")
            (row,) = whole.rows
            assert row["throttle_mode"] == "applied+dry-run"
            before = usage_report(conn, "customer", starts[0], starts[2], customer="a")
            assert before.rows[0]["throttle_mode"] == "dry-run"
            after = usage_report(conn, "customer", starts[2], starts[-1] + 60, customer="a")
            assert after.rows[0]["throttle_mode"] == "applied"
            (steps,) = collect(conn, customers=["a"], from_s=starts[2]).levels
            assert steps.applied == {"applied"} and steps.mark == ""
            (steps,) = collect(conn, customers=["a"], from_s=starts[0]).levels
            assert steps.mark == " (applied+dry-run)"
