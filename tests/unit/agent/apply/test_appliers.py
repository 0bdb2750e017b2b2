"""The host-side appliers: plans applied, originals remembered on disk and put back exactly.

The libvirt applier runs against the test driver: it stores blkio parameters (read back here)
but refuses scheduler parameters with the LIVE flag and caps blockIoTune at its ``*_max``
fields, which shows per-knob failures being reported while the other knobs and VMs go on. The
scheduler arithmetic (shares relative to the original, per-vCPU quota) is checked through a
thin wrapper that keeps scheduler parameters in memory, as the QEMU driver does. The real
kernel effect is in tests/realvm/test_enforce_realvm.py. The cgroup applier runs on a temporary
v2 tree with the stand-in for cgroupfs. The host, the plans, the wrapper and the stand-in are
tests/support/appliers.py's, shared with the agent's and the daemon's tests of plans.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import httpx
import libvirt
import pytest

from gmd.agent.apply.cgroup import CgroupApplier
from gmd.agent.apply.libvirt import (
    LIVE,
    LibvirtApplier,
    disk_caps,
    scaled_blkio_weight,
    scaled_shares,
)
from gmd.agent.apply.state import EnforcementStateError
from gmd.agent.client import DaemonClient, PlanUnavailable
from gmd.agent.config import parse_agent
from gmd.agent.loop import AgentLoop
from gmd.wire import PlanReport
from tests.support.appliers import (
    NODE,
    UUID_A,
    UUID_B,
    UUID_C,
    V2_DEFAULTS,
    FakeCgroupfsIO,
    Plans,
    SchedConn,
    cgroup_tree,
    dump,
    files,
    item,
    plan,
    weight,
)

# --- pure arithmetic ------------------------------------------------------------------------------


def test_weights_are_relative_to_the_vms_original() -> None:
    assert scaled_shares(100, 25) == 25  # cgroup v2: the plan's number itself
    assert scaled_shares(1024, 25) == 256  # cgroup v1 default: the same proportion
    assert scaled_shares(2048, 50) == 1024  # a flavor's quota:cpu_shares keeps its proportion
    assert scaled_shares(100, 1) == 2  # the kernel's floor
    assert scaled_shares(20000, 200) == 40000  # only cgroup v1 has shares above 10000
    assert scaled_shares(1024, 10000) == 10000  # 1024 may be a v2 weight: stay within v2's range
    assert scaled_blkio_weight(100, 25) == 25
    assert scaled_blkio_weight(500, 50) == 250  # CFQ's default 500
    assert scaled_blkio_weight(0, 50) == 50  # unset counts as BFQ's 100
    assert scaled_blkio_weight(100, 1) == 10  # blkio's floor


def test_disk_caps_split_over_disks_and_never_loosen() -> None:
    none = {"total_bytes_sec": 0, "read_bytes_sec": 0, "write_bytes_sec": 0}
    assert disk_caps(none, 1000, 500, 2) == {
        "total_bytes_sec": 0,
        "read_bytes_sec": 500,
        "write_bytes_sec": 250,
    }
    assert disk_caps(none, None, None, 1) == none
    tighter = {"total_bytes_sec": 0, "read_bytes_sec": 300, "write_bytes_sec": 0}
    assert disk_caps(tighter, 1000, None, 1) == {
        "total_bytes_sec": 0,
        "read_bytes_sec": 300,
        "write_bytes_sec": 0,
    }
    # QEMU refuses a total together with per-direction caps: the total becomes each direction's
    total = {"total_bytes_sec": 800, "read_bytes_sec": 0, "write_bytes_sec": 0}
    assert disk_caps(total, 1000, 500, 1) == {
        "total_bytes_sec": 0,
        "read_bytes_sec": 800,
        "write_bytes_sec": 500,
    }


# --- libvirt on the test driver -------------------------------------------------------------------


def test_scheduler_refusal_is_reported_per_vm_and_blkio_still_applied(
    conn: Any, tmp_path: Path
) -> None:
    applier = LibvirtApplier(conn, state_path=tmp_path / "state.json")
    results = applier.sync(plan("on", item(UUID_A, cpu_quota_cores=0.5), item(UUID_B)))
    assert dump(results) == [(UUID_A, "apply", False), (UUID_B, "apply", False)]
    a = results[0]
    assert a.before == {"blkio_weight": 0} and a.after == {"blkio_weight": 50}
    assert a.error is not None
    assert a.error.startswith(f"VM {UUID_A} (vm-a): cpu_shares/vcpu_quota/vcpu_period: cannot")
    assert "schedulerParametersFlags: unsupported flags" in a.error
    assert weight(conn, UUID_A) == 50 and weight(conn, UUID_B) == 50
    assert weight(conn, UUID_C) == 0  # not in the plan: untouched

    # The same failure again is not reported again, and nothing else changed.
    assert applier.sync(plan("on", item(UUID_A, cpu_quota_cores=0.5), item(UUID_B))) == []
    # Back to level 0: restored exactly.
    results = applier.sync(plan("on"))
    assert dump(results) == [(UUID_A, "restore", True), (UUID_B, "restore", True)]
    assert results[0].before == {"blkio_weight": 50} and results[0].after == {"blkio_weight": 0}
    assert weight(conn, UUID_A) == 0 and weight(conn, UUID_B) == 0
    assert applier.remembered == {}


def test_disk_cap_refused_by_the_driver_is_reported_with_the_disk_named(
    conn: Any, tmp_path: Path
) -> None:
    applier = LibvirtApplier(conn, state_path=tmp_path / "state.json")
    results = applier.sync(plan("on", item(UUID_B, disk_read_bytes_per_s=5e6)))
    assert dump(results) == [(UUID_B, "apply", False)]
    assert results[0].error is not None
    assert "disk vda bytes caps: setBlockIoTune failed: invalid argument: read_bytes_sec" in (
        results[0].error
    )
    assert results[0].after == {"blkio_weight": 50}  # the rest went on
    tune = conn.lookupByUUIDString(UUID_B).blockIoTune("vda", LIVE)
    assert tune["read_bytes_sec"] == 0


ORIGINALS_A = {
    "cpu_shares": 1024,
    "vcpu_quota": -1,
    "vcpu_period": 100000,
    "blkio_weight": 0,
    "vda.read_bytes_sec": 0,
    "vda.write_bytes_sec": 0,
    "vda.total_bytes_sec": 0,
}


def test_originals_are_kept_on_disk_and_restored_by_a_new_instance(
    conn: Any, tmp_path: Path
) -> None:
    sched = SchedConn(conn)
    state = tmp_path / "agent" / "enforcement.json"
    first = LibvirtApplier(sched, state_path=state)
    results = first.sync(plan("on", item(UUID_A, cpu_weight=25, cpu_quota_cores=0.5)))
    assert dump(results) == [(UUID_A, "apply", True)]
    # 0.5 cores over 2 vCPUs: a quarter of each vCPU's period
    # only the knobs that changed (the period stays the VM's own)
    assert results[0].before == {"cpu_shares": 1024, "vcpu_quota": -1, "blkio_weight": 0}
    assert results[0].after == {"cpu_shares": 256, "vcpu_quota": 25000, "blkio_weight": 50}
    assert sched.params[UUID_A] == {"cpu_shares": 256, "vcpu_quota": 25000, "vcpu_period": 100000}
    doc = json.loads(state.read_text())
    assert doc["backend"] == "libvirt" and doc["version"] == 1
    assert doc["vms"][UUID_A]["originals"] == ORIGINALS_A
    assert doc["vms"][UUID_A]["name"] == "vm-a"
    first.close()

    # The agent restarts: a new applier knows only the file. The customer left its level.
    second = LibvirtApplier(sched, state_path=state)
    assert set(second.remembered) == {UUID_A}
    results = second.sync(plan("on"))
    assert dump(results) == [(UUID_A, "restore", True)]
    assert sched.params[UUID_A] == {"cpu_shares": 1024, "vcpu_quota": -1, "vcpu_period": 100000}
    assert weight(conn, UUID_A) == 0
    assert json.loads(state.read_text())["vms"] == {}


def test_a_lower_level_lifts_the_cap_but_keeps_the_weight(conn: Any, tmp_path: Path) -> None:
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    applier.sync(plan("on", item(UUID_B, cpu_weight=10, cpu_quota_cores=0.3)))
    assert sched.params[UUID_B] == {"cpu_shares": 102, "vcpu_quota": 30000, "vcpu_period": 100000}
    results = applier.sync(plan("on", item(UUID_B, cpu_weight=50)))
    assert results[0].before == {"cpu_shares": 102, "vcpu_quota": 30000}
    assert results[0].after == {"cpu_shares": 512, "vcpu_quota": -1}
    assert sched.params[UUID_B] == {"cpu_shares": 512, "vcpu_quota": -1, "vcpu_period": 100000}
    # Someone put the shares back by hand: the next round re-applies.
    sched.params[UUID_B]["cpu_shares"] = 1024
    results = applier.sync(plan("on", item(UUID_B, cpu_weight=50)))
    assert results[0].before == {"cpu_shares": 1024} and results[0].after == {"cpu_shares": 512}


def test_dry_run_applies_nothing_and_reports_each_would_do_once(conn: Any, tmp_path: Path) -> None:
    sched = SchedConn(conn)
    state = tmp_path / "s.json"
    applier = LibvirtApplier(sched, state_path=state)
    p = plan("dry-run", item(UUID_A, cpu_quota_cores=1.0))
    results = applier.sync(p)
    assert dump(results) == [(UUID_A, "would_apply", True)]
    assert results[0].after == {"cpu_shares": 512, "vcpu_quota": 50000, "blkio_weight": 50}
    assert results[0].before == {"cpu_shares": 1024, "vcpu_quota": -1, "blkio_weight": 0}
    assert applier.sync(p) == []  # once, not every round
    assert LibvirtApplier(sched, state_path=state).sync(p) == []  # not after a restart either
    assert sched.params[UUID_A] == {"cpu_shares": 1024, "vcpu_quota": -1, "vcpu_period": 100000}
    assert weight(conn, UUID_A) == 0
    assert applier.remembered == {}

    results = applier.sync(plan("dry-run", item(UUID_A, cpu_weight=25)))  # a new would-do
    assert dump(results) == [(UUID_A, "would_apply", True)]
    assert results[0].after == {"cpu_shares": 256, "blkio_weight": 50}
    results = applier.sync(plan("dry-run"))
    assert dump(results) == [(UUID_A, "would_restore", True)]
    assert results[0].before == {"cpu_shares": 256, "blkio_weight": 50}
    assert results[0].after == {"cpu_shares": 1024, "blkio_weight": 0}
    assert applier.sync(plan("dry-run")) == []
    assert sched.params[UUID_A]["cpu_shares"] == 1024 and weight(conn, UUID_A) == 0


def test_dry_run_puts_back_what_mode_on_had_changed(conn: Any, tmp_path: Path) -> None:
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    applier.sync(plan("on", item(UUID_A)))
    assert weight(conn, UUID_A) == 50
    results = applier.sync(plan("dry-run", item(UUID_A)))
    assert dump(results) == [(UUID_A, "restore", True), (UUID_A, "would_apply", True)]
    assert weight(conn, UUID_A) == 0 and sched.params[UUID_A]["cpu_shares"] == 1024


def test_mode_off_restores_every_vm(conn: Any, tmp_path: Path) -> None:
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    applier.sync(plan("on", item(UUID_A, cpu_quota_cores=0.2), item(UUID_B), item(UUID_C)))
    assert set(applier.remembered) == {UUID_A, UUID_B, UUID_C}
    results = applier.sync(plan("off", item(UUID_A)))  # "off" wins over any item
    assert dump(results) == [
        (UUID_A, "restore", True),
        (UUID_B, "restore", True),
        (UUID_C, "restore", True),
    ]
    for uuid in (UUID_A, UUID_B, UUID_C):
        assert weight(conn, uuid) == 0
        assert sched.params[uuid] == {"cpu_shares": 1024, "vcpu_quota": -1, "vcpu_period": 100000}
    assert applier.remembered == {}
    assert applier.sync(plan("off")) == []


def test_a_vm_vanishing_mid_apply_is_forgotten_and_the_others_applied(
    conn: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sched = SchedConn(conn)
    sched.lookupByUUIDString(UUID_A).fail_blkio_by_destroying = True
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    with caplog.at_level(logging.INFO, "gmd.agent.apply.base"):
        results = applier.sync(plan("on", item(UUID_A), item(UUID_B)))
    assert dump(results) == [(UUID_B, "apply", True)]
    assert set(applier.remembered) == {UUID_B}
    assert f"VM {UUID_A} (vm-a) vanished while being changed" in caplog.text
    # Still in the plan but not running: nothing to do, nothing reported.
    assert applier.sync(plan("on", item(UUID_A), item(UUID_B))) == []


def test_a_restarted_vm_gets_fresh_originals_and_the_plan_again(conn: Any, tmp_path: Path) -> None:
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    applier.sync(plan("on", item(UUID_B, cpu_weight=25)))
    old_id = applier.remembered[UUID_B].run_id
    dom = conn.lookupByUUIDString(UUID_B)
    dom.destroy()  # the live settings go with the process
    dom.create()
    sched.params[UUID_B].update(cpu_shares=2048)  # the new process starts from its definition
    assert dom.blkioParameters(LIVE)["weight"] == 0
    results = applier.sync(plan("on", item(UUID_B, cpu_weight=25)))
    assert dump(results) == [(UUID_B, "apply", True)]
    assert results[0].after == {"cpu_shares": 512, "blkio_weight": 50}
    record = applier.remembered[UUID_B]
    assert record.run_id != old_id and record.originals["cpu_shares"] == 2048


def test_a_vm_that_left_the_host_is_forgotten(conn: Any, tmp_path: Path) -> None:
    applier = LibvirtApplier(SchedConn(conn), state_path=tmp_path / "s.json")
    # a VM of the plan that is not here (or not even a uuid libvirt can parse) is skipped
    results = applier.sync(plan("on", item("not-a-uuid"), item(UUID_B)))
    assert dump(results) == [(UUID_B, "apply", True)]
    conn.lookupByUUIDString(UUID_B).destroy()  # migrated away, or stopped
    assert applier.sync(plan("on")) == []
    assert applier.remembered == {}


def test_libvirt_down_forgets_nothing_and_the_next_round_restores(
    conn: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.agent_fixtures import unreachable_libvirt_error

    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "s.json")
    applier.sync(plan("on", item(UUID_A), item(UUID_B)))
    real_lookup = sched.lookupByUUIDString

    def down(uuid: str) -> Any:
        raise unreachable_libvirt_error()

    sched.lookupByUUIDString = down  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, "gmd.agent.apply.base"):
        assert applier.sync(plan("on")) == []
    assert "the rest of the plan waits for the next round" in caplog.text
    assert set(applier.remembered) == {UUID_A, UUID_B}
    assert weight(conn, UUID_A) == 50
    sched.lookupByUUIDString = real_lookup  # type: ignore[method-assign]
    assert dump(applier.sync(plan("on"))) == [(UUID_A, "restore", True), (UUID_B, "restore", True)]
    assert weight(conn, UUID_A) == 0 and weight(conn, UUID_B) == 0


def test_a_state_file_of_another_backend_or_garbage_is_refused(conn: Any, tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    LibvirtApplier(conn, state_path=state).sync(plan("on", item(UUID_B)))
    with pytest.raises(EnforcementStateError, match="through the 'libvirt' backend"):
        CgroupApplier(tmp_path, state_path=state, libvirt_conn_or_uri=conn, version="v2")
    state.write_text("{not json")
    with pytest.raises(EnforcementStateError, match="not a gmd enforcement state file"):
        LibvirtApplier(conn, state_path=state)


# --- cgroup v2 on a temporary tree ----------------------------------------------------------------


def test_cgroup_applier_applies_restores_and_dry_runs(conn: Any, tmp_path: Path) -> None:
    root, dirs, locator = cgroup_tree(tmp_path, conn)
    state = tmp_path / "s.json"
    io = FakeCgroupfsIO(devices={"8:0"})
    applier = CgroupApplier(
        root, locator=locator, state_path=state, libvirt_conn_or_uri=conn, io=io
    )

    results = applier.sync(plan("dry-run", item(UUID_A, cpu_weight=25, cpu_quota_cores=0.5)))
    assert dump(results) == [(UUID_A, "would_apply", True)]
    assert results[0].after == {
        "cpu.weight": "25",
        "cpu.max": "50000 100000",
        "io.weight": "default 50\n8:16 300",  # the file as it would read
    }
    assert files(dirs[UUID_A]) == V2_DEFAULTS and io.writes == []

    results = applier.sync(plan("on", item(UUID_A, cpu_weight=25, cpu_quota_cores=0.5)))
    assert dump(results) == [(UUID_A, "apply", True)]
    assert files(dirs[UUID_A]) == {
        **V2_DEFAULTS,
        "cpu.weight": "25\n",
        "cpu.max": "50000 100000\n",
        "io.weight": "default 50\n8:16 300\n",
    }
    assert files(dirs[UUID_B]) == V2_DEFAULTS
    assert json.loads(state.read_text())["vms"][UUID_A]["originals"]["files"]["cpu.max"] == (
        "max 100000"
    )

    # A new instance (agent restart) restores from the file, exactly.
    again = CgroupApplier(root, locator=locator, state_path=state, libvirt_conn_or_uri=conn, io=io)
    results = again.sync(plan("on"))
    assert dump(results) == [(UUID_A, "restore", True)]
    assert files(dirs[UUID_A]) == V2_DEFAULTS
    assert again.remembered == {}


def test_a_cgroup_dry_run_logs_what_it_would_do_once_and_no_write(
    conn: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In dry-run the cgroup files' module logged writes it did not make ("wrote …", "apply
    done, 2 file(s) changed") at every plan round; the backend says what it would do, once."""
    root, _dirs, locator = cgroup_tree(tmp_path, conn)
    applier = CgroupApplier(
        root,
        locator=locator,
        state_path=tmp_path / "s.json",
        libvirt_conn_or_uri=conn,
        io=FakeCgroupfsIO(devices={"8:0"}),
    )
    wanted = plan("dry-run", item(UUID_A, cpu_weight=25, cpu_quota_cores=0.5))
    with caplog.at_level("INFO"):
        for _ in range(3):
            applier.sync(wanted)
    said = [(r.name, r.getMessage()) for r in caplog.records]
    assert not [m for name, m in said if name.startswith("gmd.agent.apply.cgroupfs")], said
    would = [m for _, m in said if "would_apply" in m]
    assert len(would) == 1 and UUID_A in would[0] and "50000 100000" in would[0], said


def test_cgroup_applier_reports_a_missing_cgroup_and_goes_on(conn: Any, tmp_path: Path) -> None:
    root, dirs, locator = cgroup_tree(tmp_path, conn)
    (dirs[UUID_A] / "cpu.max").unlink()
    applier = CgroupApplier(
        root,
        locator=locator,
        state_path=tmp_path / "s.json",
        libvirt_conn_or_uri=conn,
        io=FakeCgroupfsIO(set()),
    )
    results = applier.sync(
        plan("on", item(UUID_A, cpu_quota_cores=0.5, disk_read_bytes_per_s=1e6), item(UUID_B))
    )
    assert dump(results) == [(UUID_A, "apply", False), (UUID_B, "apply", True)]
    error = results[0].error or ""
    assert error.startswith(f"VM {UUID_A} (vm-a): disk caps: no local block device")
    assert "ENOENT" in error and "cpu.max" in error
    assert (dirs[UUID_A] / "cpu.weight").read_text() == "50\n"
    assert (dirs[UUID_B] / "cpu.weight").read_text() == "50\n"


class VanishingIO(FakeCgroupfsIO):
    """cgroupfs as libvirt leaves it when a VM stops under gmd: the VM's first write finds its
    directory gone (and, when ``stop`` is set, the VM shut off)."""

    def __init__(self, conn: Any, cgroup: Path, *, stop: bool) -> None:
        super().__init__(set())
        self.conn, self.cgroup, self.stop = conn, cgroup, stop

    def write(self, path: Path, line: str) -> None:
        if path.parent == self.cgroup and self.cgroup.exists():
            shutil.rmtree(self.cgroup)
            if self.stop:
                self.conn.lookupByUUIDString(UUID_A).destroy()
        super().write(path, line)


@pytest.mark.parametrize("stop", [True, False])
def test_cgroup_applier_forgets_a_vm_whose_cgroup_went_with_it(
    conn: Any, tmp_path: Path, stop: bool
) -> None:
    root, dirs, locator = cgroup_tree(tmp_path, conn)
    io = VanishingIO(conn, dirs[UUID_A], stop=stop)
    applier = CgroupApplier(
        root, locator=locator, state_path=tmp_path / "s.json", libvirt_conn_or_uri=conn, io=io
    )
    results = applier.sync(plan("on", item(UUID_A), item(UUID_B)))
    if stop:  # every file ENOENT and the VM stopped: nothing to report, nothing to put back
        assert dump(results) == [(UUID_B, "apply", True)]
        assert set(applier.remembered) == {UUID_B}
    else:  # still running: a cgroup gone under a live VM is a failure to report
        assert dump(results) == [(UUID_A, "apply", False), (UUID_B, "apply", True)]
        assert "ENOENT" in (results[0].error or "")
        assert set(applier.remembered) == {UUID_A, UUID_B}


# --- the agent: fetch, apply, report --------------------------------------------------------------


def test_the_agent_fetches_at_most_every_plan_every_s_and_keeps_settings_when_unreachable(
    conn: Any, tmp_path: Path
) -> None:
    from gmd.agent.collect.libvirt import LibvirtCollector
    from gmd.agent.spool import Spool

    config = parse_agent(
        {"agent": {"host": "cmp-1", "tick_s": 1, "plan_every_s": 30, "libvirt_uri": "test:///x"}}
    )
    collector = LibvirtCollector("test:///x", opener=lambda _u: conn)
    spool = Spool(tmp_path / "spool.db", max_bytes=2**20, max_batches=100)
    applier = LibvirtApplier(SchedConn(conn), state_path=tmp_path / "s.json")
    plans = Plans()
    agent = AgentLoop(config, collector, spool, None, applier=applier, plans=plans)
    t0 = 1_800_000_000.0
    plans.plan = plan("on", item(UUID_B))
    report = agent.tick(t0)
    assert dump(list(report.enforcement)) == [(UUID_B, "apply", True)]
    assert [len(r.results) for r in plans.reports] == [1]
    assert agent.tick(t0 + 10).enforcement == () and plans.fetches == 1  # not due yet

    plans.plan = None  # the daemon is unreachable: the throttle stays
    assert agent.tick(t0 + 30).enforcement == () and plans.fetches == 2
    assert weight(conn, UUID_B) == 50

    plans.plan, plans.report_outcome = plan("on"), "unavailable"
    report = agent.tick(t0 + 60)
    assert dump(list(report.enforcement)) == [(UUID_B, "restore", True)]
    assert weight(conn, UUID_B) == 0 and len(plans.reports) == 1  # kept for the next round
    plans.report_outcome = "delivered"
    agent.tick(t0 + 90)
    assert [[r.action for r in rep.results] for rep in plans.reports] == [["apply"], ["restore"]]
    samples = agent.metrics.registry.get_sample_value
    assert samples("gmd_agent_plan_fetches_total", {"outcome": "unavailable"}) == 1
    labels = {"action": "restore", "outcome": "ok"}
    assert samples("gmd_agent_enforcement_results_total", labels) == 1
    spool.close()


def test_the_client_fetches_plans_and_posts_reports() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        seen.append((request.method, path, request.content))
        if path == "/v1/plan/cmp%201":
            return httpx.Response(200, json=plan("dry-run", item(UUID_A)).model_dump())
        if path.endswith("/report"):
            return httpx.Response(200, json={"recorded": 1})
        return httpx.Response(503, json={"detail": "database unavailable"})

    client = DaemonClient("http://gmd", "t", transport=httpx.MockTransport(handler))
    got = client.get_plan("cmp 1")
    assert got.mode == "dry-run" and got.vms[0].uuid == UUID_A
    with pytest.raises(PlanUnavailable, match="HTTP 503: database unavailable"):
        client.get_plan("cmp-2")
    outcome = client.post_report("cmp 1", PlanReport(generated_s=5, results=[]))
    assert (outcome.kind, outcome.status) == ("delivered", 200)
    assert seen[-1][1] == "/v1/plan/cmp%201/report"
    assert json.loads(seen[-1][2]) == {"generated_s": 5, "results": []}


def test_gmd_agent_restore_all_puts_back_what_the_state_file_remembers(tmp_path: Path) -> None:
    """``gmd-agent --restore-all`` as an operator runs it, on a fresh test-driver host whose
    vm-b has blkio weight 0: the state file says it had 321 before gmd changed it."""
    import subprocess
    import sys

    node = tmp_path / "node.xml"
    node.write_text(NODE)
    state = tmp_path / "enforcement.json"
    probe = libvirt.open(f"test://{node}")
    run_id = probe.lookupByUUIDString(UUID_B).ID()
    probe.close()
    originals = {"blkio_weight": 321}
    record = {"name": "vm-b", "run_id": run_id, "since_s": 1.0, "originals": originals}
    doc = {"version": 1, "backend": "libvirt", "vms": {UUID_B: record}}
    state.write_text(json.dumps(doc))
    toml = tmp_path / "gmd.toml"
    toml.write_text(f'[agent]\nlibvirt_uri = "test://{node}"\nenforcement_state_path = "{state}"\n')
    agent = Path(sys.executable).with_name("gmd-agent")
    out = subprocess.run(
        [str(agent), "--config", str(toml), "--restore-all"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    printed = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["uuid"], r["action"], r["ok"], r["after"]) for r in printed] == [
        (UUID_B, "restore", True, {"blkio_weight": 321})
    ]
    assert json.loads(state.read_text())["vms"] == {}
    assert "every VM gmd had changed is back to its original settings" in out.stderr
