"""The agent's edge for plans: an item the wire contract's ranges refuse (a NaN, infinite,
absurd, zero or negative cap, a weight out of range) is refused and reported with its reason,
its VM keeps its settings, and every other VM still gets its plan; the daemon's plan builder
keeps its items within the same ranges.

The plans arrive as JSON through the agent's real client (an httpx transport stands in for a
daemon, which never sends such items: that is the point), are applied on the libvirt test
driver and on a cgroup v2 tree of real files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from gmd.agent.apply.cgroup import CgroupApplier
from gmd.agent.apply.libvirt import LibvirtApplier
from gmd.agent.client import DaemonClient
from gmd.agent.collect.libvirt import LibvirtCollector
from gmd.agent.config import parse_agent
from gmd.agent.loop import AgentLoop
from gmd.agent.spool import Spool
from gmd.daemon.config import load
from gmd.wire import CPU_CAP_MIN_CORES, DISK_CAP_MIN_BYTES_PER_S, HostPlan, PlanReport
from tests.support.appliers import (
    UUID_A,
    UUID_B,
    UUID_C,
    V2_DEFAULTS,
    FakeCgroupfsIO,
    SchedConn,
    cgroup_tree,
    dump,
    files,
    item,
    weight,
)
from tests.support.contention import BUSY, FIRST, account, busy_vms, fetch, post, write_config
from tests.support.daemon_support import INTERVAL_S, serving

T0 = 1_800_000_000.0


def plan_json(mode: str, *items: dict[str, Any]) -> bytes:
    """A plan as a daemon would send it; ``allow_nan``: JSON's NaN and Infinity literals,
    which Python's and pydantic's JSON readers take."""
    doc = {"host": "cmp-1", "generated_s": 1_800_000_000, "mode": mode, "vms": list(items)}
    return json.dumps(doc, allow_nan=True).encode()


class Daemon:
    """The daemon's two plan routes, serving a given plan body and keeping the reports."""

    def __init__(self) -> None:
        self.body = plan_json("on")
        self.reports: list[PlanReport] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/report"):
            self.reports.append(PlanReport.model_validate_json(request.content))
            return httpx.Response(200, json={"recorded": 1})
        return httpx.Response(200, content=self.body, headers={"content-type": "application/json"})

    def client(self) -> DaemonClient:
        return DaemonClient("http://gmd", "t", transport=httpx.MockTransport(self.handler))


def agent_with(conn: Any, tmp_path: Path, applier: Any, daemon: Daemon) -> AgentLoop:
    config = parse_agent(
        {"agent": {"host": "cmp-1", "tick_s": 1, "plan_every_s": 30, "libvirt_uri": "test:///x"}}
    )
    collector = LibvirtCollector("test:///x", opener=lambda _u: conn)
    spool = Spool(tmp_path / "spool.db", max_bytes=2**20, max_batches=100)
    return AgentLoop(config, collector, spool, None, applier=applier, plans=daemon.client())


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        ({"cpu_quota_cores": math.nan}, "cpu_quota_cores=nan", "finite number"),
        ({"cpu_quota_cores": math.inf}, "cpu_quota_cores=inf", "finite number"),
        ({"cpu_quota_cores": 1e300}, "cpu_quota_cores=1e+300", "less than or equal to 65536"),
        ({"disk_read_bytes_per_s": 1e300}, "disk_read_bytes_per_s=1e+300", "less than"),
        ({"disk_write_bytes_per_s": -math.inf}, "disk_write_bytes_per_s=-inf", "finite"),
        ({"cpu_weight": 0}, "cpu_weight=0", "greater than or equal to 1"),
        ({"io_weight": 10**6}, "io_weight=1000000", "less than or equal to 10000"),
    ],
)
def test_one_bad_item_is_refused_and_reported_and_the_others_applied(
    conn: Any, tmp_path: Path, bad: dict[str, Any], field: str, words: str
) -> None:
    daemon = Daemon()
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    agent = agent_with(conn, tmp_path, applier, daemon)
    daemon.body = plan_json(
        "on", item(UUID_A, **bad), item(UUID_B, cpu_quota_cores=0.5), item(UUID_C)
    )
    report = agent.tick(T0)

    assert dump(list(report.enforcement)) == [
        (UUID_A, "apply", False),
        (UUID_B, "apply", True),
        (UUID_C, "apply", True),
    ]
    error = report.enforcement[0].error or ""
    assert error.startswith(f"VM {UUID_A}: plan item refused, settings kept: vms[0].{field}: ")
    assert words in error
    # The others got their plan; the refused VM was not touched at all.
    assert weight(conn, UUID_B) == 50 and weight(conn, UUID_C) == 50
    assert sched.params[UUID_B]["vcpu_quota"] == 50_000  # 0.5 core of its 1 vCPU
    assert weight(conn, UUID_A) == 0 and UUID_A not in applier.remembered
    # And the daemon was told.
    assert [[(r.uuid, r.ok) for r in rep.results] for rep in daemon.reports] == [
        [(UUID_A, False), (UUID_B, True), (UUID_C, True)]
    ]
    samples = agent.metrics.registry.get_sample_value
    labels = {"action": "apply", "outcome": "failed"}
    assert samples("gmd_agent_enforcement_results_total", labels) == 1
    agent.spool.close()


def test_a_vm_whose_item_turns_bad_keeps_its_settings_and_is_reported_once(
    conn: Any, tmp_path: Path
) -> None:
    """No news is not "lift the throttle": a VM throttled at the last plan stays throttled
    while its item is unreadable, and the same refusal is reported once, not every fetch."""
    daemon = Daemon()
    applier = LibvirtApplier(SchedConn(conn), state_path=tmp_path / "s.json")
    agent = agent_with(conn, tmp_path, applier, daemon)
    daemon.body = plan_json("on", item(UUID_B))
    assert dump(list(agent.tick(T0).enforcement)) == [(UUID_B, "apply", True)]
    daemon.body = plan_json("on", item(UUID_B, cpu_quota_cores=math.nan))
    assert dump(list(agent.tick(T0 + 30).enforcement)) == [(UUID_B, "apply", False)]
    assert weight(conn, UUID_B) == 50 and UUID_B in applier.remembered
    assert agent.tick(T0 + 60).enforcement == ()
    daemon.body = plan_json("on")  # a valid plan again: put back
    assert dump(list(agent.tick(T0 + 90).enforcement)) == [(UUID_B, "restore", True)]
    assert weight(conn, UUID_B) == 0
    agent.spool.close()


def test_an_item_naming_no_vm_is_logged_and_the_rest_applied(
    conn: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = Daemon()
    applier = LibvirtApplier(SchedConn(conn), state_path=tmp_path / "s.json")
    agent = agent_with(conn, tmp_path, applier, daemon)
    daemon.body = plan_json("on", item("../../etc/passwd"), 7, item(UUID_B))  # type: ignore[arg-type]
    assert dump(list(agent.tick(T0).enforcement)) == [(UUID_B, "apply", True)]
    refused = [r.getMessage() for r in caplog.records if "item refused" in r.getMessage()]
    assert len(refused) == 2 and "vms[0].uuid='../../etc/passwd'" in refused[0]
    assert "vms[1]=7: " in refused[1]
    agent.spool.close()


@pytest.mark.parametrize("cap", [0.0, -1.0, CPU_CAP_MIN_CORES / 2])
def test_a_cap_of_zero_or_below_is_refused_by_both_backends(
    conn: Any, tmp_path: Path, cap: float
) -> None:
    """One meaning for a cap ≤ 0: invalid. It once meant the kernel's 1 % floor on the
    libvirt backend and no cap at all on the cgroup backend."""
    body = plan_json("on", item(UUID_A, cpu_quota_cores=cap), item(UUID_B))
    received = HostPlan.model_validate_json(body)
    sched = SchedConn(conn)
    libvirt_applier = LibvirtApplier(sched, state_path=tmp_path / "l.json")
    results = libvirt_applier.sync(received)
    assert dump(results) == [(UUID_A, "apply", False), (UUID_B, "apply", True)]
    assert "cpu_quota_cores" in (results[0].error or "")
    assert sched.params.get(UUID_A, {}).get("vcpu_quota", -1) == -1

    root, dirs, locator = cgroup_tree(tmp_path, conn)
    io = FakeCgroupfsIO(devices={"8:0"})
    cgroup_applier = CgroupApplier(
        root, locator=locator, state_path=tmp_path / "c.json", libvirt_conn_or_uri=conn, io=io
    )
    results = cgroup_applier.sync(received)
    assert dump(results) == [(UUID_A, "apply", False), (UUID_B, "apply", True)]
    assert files(dirs[UUID_A]) == V2_DEFAULTS  # neither capped nor re-weighted
    assert files(dirs[UUID_B])["cpu.weight"] == "50\n"


def test_the_plan_builder_keeps_items_within_the_wire_ranges(tmp_path: Path) -> None:
    """A VM whose flavor says a vanishing number of vCPUs, and a disk cap configured below
    one byte/s, still give a valid item: the cap at the contract's floor, not a 500 for the
    whole host nor an item its agent must refuse."""
    config_path = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'ledger.db'}")
    text = config_path.read_text().replace("contended_above = 0.8", "contended_above = 0")
    config_path.write_text(
        text.replace("caps_bytes_per_s = [0, 200000", "caps_bytes_per_s = [0, 0.25")
    )
    config = load(config_path)
    vms = busy_vms()
    vms[0]["flavor"] = {"vcpus": 1e-300}
    with serving(config) as d:
        for k in range(3):
            post(d, BUSY, FIRST + k * INTERVAL_S, vms)
        account(d, config, FIRST + 3 * INTERVAL_S)
        (on_busy,) = fetch(d, BUSY).vms
    assert on_busy.level == 2
    assert on_busy.cpu_quota_cores == CPU_CAP_MIN_CORES
    assert on_busy.disk_read_bytes_per_s == DISK_CAP_MIN_BYTES_PER_S
