"""Work-conserving caps on a real ledger: a level's hard caps reach only the hosts contended
for the capped resource, weights reach every host, and the plan, the appliers, ``enforce
--plan`` and ``explain`` all say so.

Two hosts, 60 s intervals, equal endowments, no decay:
- cmp-busy: 2 cores. a's VM (UUID_A, 2 vCPUs) uses 90 core-s, b's 30: the CPUs are fully used
  (100 % ≥ 80 %); nobody touches the disk (0 %).
- cmp-idle: 16 cores, a disk of 1 MB/s. a's second VM uses 60 core-s (6.25 %) and reads 48 MB,
  b's second VM 6 MB (together 90 % of the disk; b's 10 % is someone a's disk cap protects).
a is over its endowment on cmp-busy by 30 core-s an interval, so it climbs to level 2, where
its VMs get weight 25, a CPU cap of half their vCPUs and a disk cap of 200 kB/s. The CPU cap
lands on cmp-busy only, the disk cap on cmp-idle only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import libvirt
import pytest
import sqlalchemy as sa

from gmd.agent.apply.cgroup import CgroupApplier
from gmd.agent.apply.libvirt import LibvirtApplier
from gmd.daemon.config import Config, load
from gmd.daemon.enforce.plans import host_plan
from gmd.wire import HostPlan
from tests.support.appliers import (
    NODE,
    UUID_A,
    V2_DEFAULTS,
    FakeCgroupfsIO,
    SchedConn,
    cgroup_tree,
)
from tests.support.contention import (
    BUSY,
    DISK_CAP,
    FIRST,
    IDLE,
    account,
    busy_vms,
    fetch,
    idle_vms,
    post,
    write_config,
)
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    as_uuid,
    auth,
    batch,
    serving,
)

ADMIN = Path(sys.executable).with_name("gmd-admin")


def three_busy_intervals(d: Any, config: Config) -> None:
    for k in range(3):
        post(d, BUSY, FIRST + k * INTERVAL_S, busy_vms())
        post(d, IDLE, FIRST + k * INTERVAL_S, idle_vms())
    account(d, config, FIRST + 3 * INTERVAL_S)


def test_caps_land_only_where_their_resource_is_contended(
    database_url: str, tmp_path: Path
) -> None:
    config = load(write_config(tmp_path / "gmd.toml", database_url))
    with serving(config) as d:
        three_busy_intervals(d, config)
        busy, idle = fetch(d, BUSY), fetch(d, IDLE)

    # Weights on both hosts; the CPU cap where the CPUs are busy, the disk cap where the disk is.
    assert [(v.uuid, v.level, v.cpu_weight, v.io_weight) for v in busy.vms] == [(UUID_A, 2, 25, 25)]
    (on_busy,) = busy.vms
    assert on_busy.cpu_quota_cores == 1.0  # half of its 2 vCPUs
    assert (on_busy.disk_read_bytes_per_s, on_busy.disk_write_bytes_per_s) == (None, None)
    (on_idle,) = idle.vms
    assert (on_idle.uuid, on_idle.level, on_idle.cpu_weight) == (as_uuid("vm-a2"), 2, 25)
    assert on_idle.cpu_quota_cores is None
    assert (on_idle.disk_read_bytes_per_s, on_idle.disk_write_bytes_per_s) == (DISK_CAP, DISK_CAP)

    # The plan says why, per resource.
    def caps(plan: HostPlan) -> dict[str, tuple[bool, str, float | None, int]]:
        return {c.resource: (c.applied, c.reason, c.utilisation, c.intervals) for c in plan.caps}

    assert caps(busy) == {"cpu": (True, "contended", 1.0, 3), "disk": (False, "idle", 0.0, 3)}
    assert caps(idle) == {
        "cpu": (False, "idle", pytest.approx(0.0625), 3),
        "disk": (True, "contended", pytest.approx(0.9), 3),
    }
    assert [c.why for c in busy.caps] == [
        "applied: cpu 100 % ≥ 80 %",
        "not applied: disk 0 % < 80 %",
    ]
    assert [c.why for c in idle.caps] == [
        "not applied: cpu 6 % < 80 %",
        "applied: disk 90 % ≥ 80 %",
    ]


def test_a_host_that_reported_nothing_lately_gets_no_caps(
    database_url: str, tmp_path: Path
) -> None:
    """cmp-idle stops reporting: after three accounted intervals without it, its utilisation
    is unmeasured and its caps are withheld, while cmp-busy, still reporting, keeps its; and
    nothing gmd knows of runs on cmp-idle any more, so its plan throttles no VM."""
    config = load(write_config(tmp_path / "gmd.toml", database_url))
    with serving(config) as d:
        three_busy_intervals(d, config)
        for k in range(3, 6):
            post(d, BUSY, FIRST + k * INTERVAL_S, busy_vms())
        account(d, config, FIRST + 6 * INTERVAL_S)
        busy, idle = fetch(d, BUSY), fetch(d, IDLE)
    assert busy.vms[0].cpu_quota_cores == 1.0
    assert idle.vms == []
    assert {(c.resource, c.applied, c.reason, c.utilisation) for c in idle.caps} == {
        ("cpu", False, "unmeasured", None),
        ("disk", False, "unmeasured", None),
    }
    assert idle.caps[0].why == "not applied: cpu: no use reported in the last 3 interval(s)"


def test_a_host_busy_with_other_work_is_contended_though_its_vms_idle(
    database_url: str, tmp_path: Path
) -> None:
    """cmp-idle's VM uses 6 % of its 16 cores, but the host's agent reports the host busy
    90 % of the time (other work: ``host_cpu_s``, here in two batches per interval, as from
    an agent restarted mid-interval, which add up): it is contended for CPU, and a's VM there
    gets its CPU cap. On cmp-busy the host's figure is below its VMs' use, which still counts:
    the larger of the two decides (issue 27)."""
    config = load(write_config(tmp_path / "gmd.toml", database_url))
    cores_s = IDLE.capacity["cpu_cores"] * INTERVAL_S
    with serving(config) as d:
        for k in range(3):
            start = FIRST + k * INTERVAL_S
            post_doc(d, BUSY, {**batch(BUSY, start, busy_vms()), "host_cpu_s": 10.0})
            post_doc(d, IDLE, {**batch(IDLE, start, idle_vms()), "host_cpu_s": 0.45 * cores_s})
            rest = batch(IDLE, start, [], key=f"{IDLE.name}:{start}:restarted")
            post_doc(d, IDLE, {**rest, "host_cpu_s": 0.45 * cores_s})
        account(d, config, FIRST + 3 * INTERVAL_S)
        busy, idle = fetch(d, BUSY), fetch(d, IDLE)
        # More than the host's cores can give is refused, naming the field.
        late = FIRST + 3 * INTERVAL_S
        r = httpx.post(
            f"{d.url}/v1/samples",
            json={**batch(IDLE, late, idle_vms()), "host_cpu_s": 2.5 * cores_s},
            headers=auth(IDLE.name),
        )
    (on_idle,) = idle.vms
    assert on_idle.cpu_quota_cores == 2.0  # half of its 4 vCPUs
    cpu = {c.resource: c for c in idle.caps}["cpu"]
    assert (cpu.applied, cpu.reason, cpu.utilisation) == (True, "contended", pytest.approx(0.9))
    assert cpu.why == "applied: cpu 90 % ≥ 80 %"
    assert {c.resource: c for c in busy.caps}["cpu"].utilisation == 1.0
    assert r.status_code == 422, r.text
    assert "host_cpu_s = 2400 core-s is more than host cmp-idle can give" in r.json()["detail"]


def test_a_customer_alone_on_a_host_it_keeps_busy_is_not_capped_there(
    database_url: str, tmp_path: Path
) -> None:
    """Caps protect others (issue 43: a greedy project alone on a host lost 18 % of its work
    to its caps, and nobody gained). a's VM fills cmp-busy (100 % ≥ 80 %) beside b's idle one
    (0.5 %): a takes far more than its half and climbs to level 2, but with nobody else using
    cmp-busy (others 0.5 % < 5 %) its CPU cap is withheld there, and the plan, explain and the
    host's own decision say so; once b's VM uses 10 % of cmp-busy, a's cap lands. The weights
    apply throughout."""
    config = load(write_config(tmp_path / "gmd.toml", database_url))
    assert config.enforcement.contention.others_above == 0.05
    with serving(config) as d:
        for k in range(3):
            post(d, BUSY, FIRST + k * INTERVAL_S, busy_vms(a_cpu_s=119.4, b_cpu_s=0.6))
            post(d, IDLE, FIRST + k * INTERVAL_S, idle_vms())
        account(d, config, FIRST + 3 * INTERVAL_S)
        alone = fetch(d, BUSY)
        words = explain_caps(d, config, "a")
        for k in range(3, 6):
            post(d, BUSY, FIRST + k * INTERVAL_S, busy_vms(a_cpu_s=108.0, b_cpu_s=12.0))
            post(d, IDLE, FIRST + k * INTERVAL_S, idle_vms())
        account(d, config, FIRST + 6 * INTERVAL_S)
        shared = fetch(d, BUSY)
    (vm,) = [v for v in alone.vms if v.uuid == UUID_A]
    assert (vm.level, vm.cpu_weight) == (2, 25)
    assert vm.cpu_quota_cores is None  # alone: no cap
    assert {c.resource: c.why for c in alone.caps}["cpu"] == "applied: cpu 100 % ≥ 80 %"
    assert words["cmp-busy"].startswith(
        "not applied: cpu 100 % ≥ 80 %, but the other customers used 0.5 % < 5 %: nobody to protect"
    )
    (vm,) = [v for v in shared.vms if v.uuid == UUID_A]
    assert (vm.level, vm.cpu_weight, vm.cpu_quota_cores) == (2, 25, 1.0)


def explain_caps(d: Any, config: Config, customer: str) -> dict[str, str]:
    """Per host, what ``explain`` says of the customer's caps there (through the daemon's
    own explanation, as the read API serves it)."""
    from gmd.daemon.reports.explain import explain

    with d.engine.connect() as conn:
        doc = explain(conn, config, customer)
    return {c.host: c.words for c in doc.caps}


def post_doc(d: Any, host: HostSpec, doc: dict[str, Any]) -> None:
    r = httpx.post(f"{d.url}/v1/samples", json=doc, headers=auth(host.name))
    assert r.is_success, r.text


def _statements(engine: sa.Engine, run: Callable[[], object]) -> list[tuple[str, Any]]:
    """The SQL ``run`` sends through ``engine``, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        seen.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        run()
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    return seen


def test_the_plan_reads_only_the_recent_intervals_of_the_raw_tables(
    database_url: str, tmp_path: Path
) -> None:
    """Every statement of a plan that touches samples or host capacities is bounded by the
    window's interval ids: on SQLite a search of the (interval_id, host_id, …) index, never a
    scan; on PostgreSQL only the daily partitions of the window's days (the daemon keeps
    partitions of the next days ahead, which an unbounded query would visit too)."""
    config = load(write_config(tmp_path / "gmd.toml", database_url))
    with serving(config) as d:
        three_busy_intervals(d, config)

        def plan() -> None:
            with d.engine.connect() as conn:
                assert host_plan(conn, BUSY.name, config.enforcement).vms

        statements = _statements(d.engine, plan)
        raw = [(s, p) for s, p in statements if re.search(r"\b(samples|host_intervals)\b", s)]
        assert len(raw) >= 3, statements
        days = {time.strftime("%Y%m%d", time.gmtime(FIRST + k * INTERVAL_S)) for k in range(3)}
        with d.engine.connect() as conn:
            for statement, params in raw:
                if conn.dialect.name == "sqlite":
                    plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
                    details = [str(row[-1]) for row in plan]
                    scans = [x for x in details if re.match(r"SCAN (samples|host_intervals)\b", x)]
                    assert not scans, (statement, details)
                else:
                    plan = conn.exec_driver_sql(f"EXPLAIN {statement}", params).all()
                    text = "\n".join(str(row[0]) for row in plan)
                    visited = set(re.findall(r"(?:samples|host_intervals)_(\d{8})", text))
                    assert visited and visited <= days, (statement, text)


@pytest.fixture
def node(tmp_path: Path) -> Any:
    """A private test-driver host whose vm-a is a's VM on cmp-busy (UUID_A, 2 vCPUs)."""
    path = tmp_path / "node.xml"
    path.write_text(NODE)
    conn = libvirt.open(f"test://{path}")
    yield conn
    conn.close()


def test_a_cap_is_lifted_when_its_host_stops_being_contended(
    database_url: str, tmp_path: Path, node: Any
) -> None:
    """The agent's appliers take the daemon's plans as they come: capped while cmp-busy is
    busy, and once three quiet intervals show it is not, the cap goes back to the VM's
    original while the weight stays (a's level is unchanged: its balance does not decay)."""
    config = load(write_config(tmp_path / "gmd.toml", database_url))
    sched = SchedConn(node)
    via_libvirt = LibvirtApplier(sched, state_path=tmp_path / "libvirt.json")
    root, dirs, locator = cgroup_tree(tmp_path, node)
    via_cgroup = CgroupApplier(
        root,
        locator=locator,
        state_path=tmp_path / "cgroup.json",
        libvirt_conn_or_uri=node,
        io=FakeCgroupfsIO(devices={"8:0"}),
    )
    cgroup_a = dirs[UUID_A]
    with serving(config) as d:
        three_busy_intervals(d, config)
        plan = fetch(d, BUSY)
        assert plan.vms[0].cpu_quota_cores == 1.0
        via_libvirt.sync(plan)
        via_cgroup.sync(plan)
        # 1 core over 2 vCPUs: half of each vCPU's period; the whole VM: 1 core per period
        assert sched.params[UUID_A] == {
            "cpu_shares": 256,
            "vcpu_quota": 50000,
            "vcpu_period": 100000,
        }
        assert (cgroup_a / "cpu.max").read_text() == "100000 100000\n"
        assert (cgroup_a / "cpu.weight").read_text() == "25\n"

        for k in range(3, 6):  # the same VMs, now nearly idle: a no longer over its share
            post(d, BUSY, FIRST + k * INTERVAL_S, busy_vms(a_cpu_s=6.0, b_cpu_s=6.0))
            post(d, IDLE, FIRST + k * INTERVAL_S, idle_vms())
        account(d, config, FIRST + 6 * INTERVAL_S)
        plan = fetch(d, BUSY)
    (item,) = plan.vms
    assert (item.level, item.cpu_weight, item.cpu_quota_cores) == (2, 25, None)
    assert plan.caps[0].why == "not applied: cpu 10 % < 80 %"

    results = via_libvirt.sync(plan)
    assert [(r.uuid, r.action, r.ok) for r in results] == [(UUID_A, "apply", True)]
    assert results[0].before == {"vcpu_quota": 50000} and results[0].after == {"vcpu_quota": -1}
    assert sched.params[UUID_A] == {"cpu_shares": 256, "vcpu_quota": -1, "vcpu_period": 100000}
    results = via_cgroup.sync(plan)
    assert [(r.action, r.ok, r.after) for r in results] == [
        ("apply", True, {"cpu.max": V2_DEFAULTS["cpu.max"].strip()})
    ]
    assert (cgroup_a / "cpu.max").read_text() == V2_DEFAULTS["cpu.max"]
    assert (cgroup_a / "cpu.weight").read_text() == "25\n"


def test_an_agent_reads_a_plan_with_or_without_the_caps_it_does_not_need() -> None:
    """A plan from a daemon before caps were explained parses (no ``caps``), and so does one
    carrying fields and reasons this agent does not know: the wire stays compatible."""
    old = {"host": "h", "generated_s": 1, "mode": "on", "vms": []}
    assert HostPlan.model_validate(old).caps == []
    newer = {
        **old,
        "caps": [{"resource": "gpu", "applied": True, "reason": "overheated", "threshold": 0.5}],
        "someday": {"anything": 1},
    }
    (caps,) = HostPlan.model_validate(newer).caps
    assert (caps.resource, caps.reason, caps.utilisation, caps.why) == (
        "gpu",
        "overheated",
        None,
        "",
    )


def gmd_admin(config: Path, *args: str) -> str:
    out = subprocess.run(
        [str(ADMIN), "--config", str(config), *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_enforce_plan_and_explain_say_where_caps_apply_and_why(tmp_path: Path) -> None:
    path = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'ledger.db'}")
    config = load(path)
    with serving(config) as d:
        three_busy_intervals(d, config)

    shown = json.loads(gmd_admin(path, "enforce", "--plan", "--format", "json"))
    assert [(p["host"], p["cpu_quota_cores"], p["caps"]) for p in shown["plans"]] == [
        ("cmp-busy", 1.0, "applied: cpu 100 % ≥ 80 %; not applied: disk 0 % < 80 %"),
        ("cmp-idle", None, "not applied: cpu 6 % < 80 %; applied: disk 90 % ≥ 80 %"),
    ]
    table = gmd_admin(path, "enforce", "--plan")
    assert "Caps" in table and "applied: cpu 100 % ≥ 80 %" in table

    doc = json.loads(gmd_admin(path, "explain", "a", "--format", "json"))
    caps = {c["host"]: c for c in doc["caps"]}
    assert caps["cmp-busy"]["caps"] == "applied: cpu 100 % ≥ 80 %; not applied: disk 0 % < 80 %"
    assert caps["cmp-idle"]["caps"] == "not applied: cpu 6 % < 80 %; applied: disk 90 % ≥ 80 %"
    cpu = next(r for r in caps["cmp-idle"]["resources"] if r["resource"] == "cpu")
    assert (cpu["applied"], cpu["reason"], cpu["threshold"], cpu["window"]) == (
        False,
        "idle",
        0.8,
        3,
    )
    summary = doc["summary"]
    assert len(summary) == 5
    assert summary[0].startswith("Customer a is at throttle level 2 of 3 since ")
    assert "enforcement is on" in summary[0]
    assert summary[1].startswith("Why: its balance is 0.04612 now")
    assert "at or above 0.02, where level 2 begins" in summary[1]
    assert "it was 0.03075 when the level was decided" in summary[1]
    assert summary[1].count("(+0.01537, mostly cpu)") == 3  # the greed that made the balance
    assert summary[2] == (
        "On its hosts: CPU and I/O weights × 0.25 on cmp-busy, cmp-idle (they only take effect"
        " where a host is busy); a CPU cap of 50 % of its vCPUs on cmp-busy (cpu 100 % ≥ 80 %);"
        " not on cmp-idle (cpu 6 % < 80 %), where nobody needs protecting from it; disk caps"
        " of 0.2 MB/s per VM on cmp-idle (disk 90 % ≥ 80 %); not on cmp-busy (disk 0 % < 80 %),"
        " where nobody needs protecting from it."
    )
    assert summary[3] == "Quota: unchanged."
    assert summary[4] == "What would lift it: a balance below 0.015 brings level 1."

    text = gmd_admin(path, "explain", "a")
    lines = text.splitlines()
    assert lines[:5] == summary and lines[5] == ""
    assert "Customer a, interval " in lines[6]
    assert (
        "   - cmp-busy: applied: cpu 100 % ≥ 80 %; not applied: disk 0 % < 80 % (over the" in text
    )
    assert gmd_admin(path, "explain", "a", "--summary").splitlines() == summary
    only = json.loads(gmd_admin(path, "explain", "a", "--summary", "--format", "json"))
    assert only == {"customer": "a", "name": None, "summary": summary}
