"""Issue 42: an apply's outcome is per knob — applied, unsupported here (why), failed (the
error) — and a knob the host lacks never makes gmd skip the VM or call the rest failed.

The libvirt applier runs on the test driver; the one answer it cannot give — libvirt's
VIR_ERR_OPERATION_INVALID for ``blkioParameters`` on a *running* domain of a host without BFQ —
is given by :class:`tests.support.appliers.SchedDomain` exactly as real libvirtd gives it
(the real-VM tests meet the real one). The cgroup applier writes a tree of regular files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import libvirt
import pytest

from gmd.agent.apply.cgroup import CgroupApplier
from gmd.agent.apply.cgroupfs_writes import CgroupIO
from gmd.agent.apply.libvirt import LibvirtApplier
from gmd.agent.libvirt_conn import DOMAIN_GONE, gone
from gmd.wire import HostCapabilities, Knob, KnobOutcome
from tests.support.appliers import (
    NO_BFQ,
    NODE,
    UUID_A,
    UUID_B,
    SchedConn,
    dump,
    item,
    plan,
    weight,
)


def knobs(result: Any) -> dict[str, tuple[str, str]]:
    return {k.knob.value: (k.outcome.value, k.detail) for k in result.knobs}


def test_operation_invalid_means_gone_only_for_a_domain_that_stopped(conn: Any) -> None:
    """The old DOMAIN_GONE held VIR_ERR_OPERATION_INVALID: every refusal of a knob was taken
    for a vanished VM."""
    dom = conn.lookupByUUIDString(UUID_A)
    assert libvirt.VIR_ERR_OPERATION_INVALID not in DOMAIN_GONE
    sched = SchedConn(conn).lookupByUUIDString(UUID_A)
    sched.no_proportional_scheduler = True
    with pytest.raises(libvirt.libvirtError) as refused:
        sched.blkioParameters(libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert not gone(dom, refused.value)  # it runs: the knob's refusal
    dom.destroy()
    with pytest.raises(libvirt.libvirtError) as stopped:
        dom.blkioParameters(libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert stopped.value.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID
    assert gone(dom, stopped.value)


def test_without_bfq_the_cpu_cap_is_applied_and_the_disk_weight_reported_unsupported(
    conn: Any, tmp_path: Path
) -> None:
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "state.json")
    sched.lookupByUUIDString(UUID_A).no_proportional_scheduler = True
    results = applier.sync(plan("on", item(UUID_A, cpu_weight=50, cpu_quota_cores=0.5)))
    assert dump(results) == [(UUID_A, "apply", True)]  # not skipped as gone, not failed
    assert results[0].error is None
    assert results[0].after == {"cpu_shares": 512, "vcpu_quota": 25000}
    assert sched.params[UUID_A] == {"cpu_shares": 512, "vcpu_quota": 25000, "vcpu_period": 100000}
    assert knobs(results[0]) == {
        "cpu_weight": ("applied", ""),
        "cpu_cap": ("applied", ""),
        "disk_weight": ("unsupported", f"libvirt: {NO_BFQ}"),
    }
    # said once: the same plan again reports nothing
    assert applier.sync(plan("on", item(UUID_A, cpu_weight=50, cpu_quota_cores=0.5))) == []
    # level 0: put back exactly, and the report says which knobs were restored
    results = applier.sync(plan("on"))
    assert dump(results) == [(UUID_A, "restore", True)]
    assert sched.params[UUID_A] == {"cpu_shares": 1024, "vcpu_quota": -1, "vcpu_period": 100000}
    assert knobs(results[0]) == {"cpu_weight": ("restored", ""), "cpu_cap": ("restored", "")}
    assert applier.remembered == {}


def test_a_plan_asking_only_a_missing_knob_is_reported_once(conn: Any, tmp_path: Path) -> None:
    """Nothing changes, nothing fails: still the daemon must hear that the weight is not
    there, once."""
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "state.json")
    sched.lookupByUUIDString(UUID_B).no_proportional_scheduler = True
    only_disk = item(UUID_B, cpu_weight=100, io_weight=50)
    results = applier.sync(plan("on", only_disk))
    assert dump(results) == [(UUID_B, "apply", True)]
    assert knobs(results[0]) == {"disk_weight": ("unsupported", f"libvirt: {NO_BFQ}")}
    assert results[0].after == {}
    assert applier.sync(plan("on", only_disk)) == []


def caps(**unsupported: str) -> HostCapabilities:
    return HostCapabilities.model_validate(
        {
            "backend": "libvirt",
            "cgroup": "v1",
            "knobs": [
                {
                    "knob": k.value,
                    "support": "unsupported" if k.value in unsupported else "supported",
                    "reason": unsupported.get(k.value, ""),
                }
                for k in Knob
            ],
            "probed_s": 1,
        }
    )


def test_a_knob_the_probe_found_missing_is_not_tried(conn: Any, tmp_path: Path) -> None:
    """The test driver stores blkio weights: with the probe's word that the host has no
    proportional scheduler, none is written (a weight there would do nothing)."""
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "state.json")
    applier.capabilities = caps(disk_weight="no proportional I/O scheduler on vda")
    results = applier.sync(plan("on", item(UUID_A, cpu_weight=25)))
    assert dump(results) == [(UUID_A, "apply", True)]
    assert weight(conn, UUID_A) == 0  # untouched
    assert knobs(results[0]) == {
        "cpu_weight": ("applied", ""),
        "disk_weight": ("unsupported", "no proportional I/O scheduler on vda"),
    }
    saved = json.loads((tmp_path / "state.json").read_text())
    assert "blkio_weight" in saved["vms"][UUID_A]["originals"]  # still put back as it was


def test_a_knob_that_fails_is_failed_and_the_others_applied(conn: Any, tmp_path: Path) -> None:
    """The test driver refuses iotune values below its minimum: the disk limit fails, the
    weights still go in, and the report says which is which."""
    sched = SchedConn(conn)
    applier = LibvirtApplier(sched, state_path=tmp_path / "state.json")
    results = applier.sync(plan("on", item(UUID_B, disk_read_bytes_per_s=5e6)))
    assert dump(results) == [(UUID_B, "apply", False)]
    outcome = knobs(results[0])
    assert outcome["cpu_weight"] == ("applied", "")
    assert outcome["disk_weight"] == ("applied", "")
    assert outcome["disk_limit"][0] == "failed"
    assert "setBlockIoTune failed" in outcome["disk_limit"][1]


# --- the cgroup applier on fixture trees ---------------------------------------------------------

V1_NO_BFQ = {
    "cpu": {"cpu.shares": "1024\n", "cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"},
    "blkio": {"blkio.throttle.read_bps_device": "", "blkio.throttle.write_bps_device": ""},
    "memory": {"memory.soft_limit_in_bytes": "9223372036854771712\n"},
}


def v1_tree(root: Path, name: str, files: dict[str, dict[str, str]]) -> None:
    for controller, contents in files.items():
        d = root / controller / "machine" / f"{name}.libvirt-qemu"
        d.mkdir(parents=True)
        for filename, text in contents.items():
            (d / filename).write_text(text)


class FileIO(CgroupIO):
    """Regular files stand in for control files (O_TRUNC writes, as cgroupfs's scalar ones)."""


def test_cgroup_backend_without_a_weight_file_applies_the_cap_and_says_so(
    conn: Any, tmp_path: Path
) -> None:
    """Before: the missing blkio weight file made the whole apply "failed", the CPU cap it
    had written included."""
    root = tmp_path / "cgroup"
    v1_tree(root, "vm-a", V1_NO_BFQ)
    applier = CgroupApplier(
        root,
        "machine/{name}.libvirt-qemu",
        state_path=tmp_path / "state.json",
        libvirt_conn_or_uri=conn,
        version="v1",
        io=FileIO(),
    )
    results = applier.sync(plan("on", item(UUID_A, cpu_weight=50, cpu_quota_cores=0.5)))
    assert dump(results) == [(UUID_A, "apply", True)]
    cpu = root / "cpu" / "machine" / "vm-a.libvirt-qemu"
    assert (cpu / "cpu.shares").read_text() == "512\n"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000\n"
    outcome = knobs(results[0])
    assert outcome["cpu_weight"] == ("applied", "")
    assert outcome["cpu_cap"] == ("applied", "")
    assert outcome["disk_weight"][0] == "unsupported"
    assert "neither blkio.weight nor blkio.bfq.weight exists" in outcome["disk_weight"][1]
    results = applier.sync(plan("on"))
    assert dump(results) == [(UUID_A, "restore", True)]
    assert (cpu / "cpu.shares").read_text() == "1024\n"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "-1\n"
    assert {k.outcome for k in results[0].knobs} == {KnobOutcome.restored}


def test_cgroup_backend_with_bfq_sets_its_weight(conn: Any, tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    files = {**V1_NO_BFQ, "blkio": {**V1_NO_BFQ["blkio"], "blkio.bfq.weight": "100\n"}}
    v1_tree(root, "vm-a", files)
    applier = CgroupApplier(
        root,
        "machine/{name}.libvirt-qemu",
        state_path=tmp_path / "state.json",
        libvirt_conn_or_uri=conn,
        version="v1",
        io=FileIO(),
    )
    results = applier.sync(plan("on", item(UUID_A, io_weight=50)))
    assert dump(results) == [(UUID_A, "apply", True)]
    blkio = root / "blkio" / "machine" / "vm-a.libvirt-qemu"
    assert (blkio / "blkio.bfq.weight").read_text() == "50\n"
    assert knobs(results[0])["disk_weight"] == ("applied", "")


# --- the agent: probe, tell the daemon, apply with it ---------------------------------------------


def test_the_agent_probes_tells_the_daemon_once_and_applies_with_the_probe(
    conn: Any, tmp_path: Path
) -> None:
    from gmd.agent.collect.libvirt import LibvirtCollector
    from gmd.agent.config import parse_agent
    from gmd.agent.loop import AgentLoop
    from gmd.agent.spool import Spool
    from tests.support.appliers import Plans
    from tests.support.knob_host import NO_BFQ, lay_out

    config = parse_agent(
        {"agent": {"host": "cmp-1", "tick_s": 1, "plan_every_s": 0, "libvirt_uri": "test:///x"}}
    )
    collector = LibvirtCollector("test:///x", opener=lambda _u: conn)
    spool = Spool(tmp_path / "spool.db", max_bytes=2**20, max_batches=100)
    applier = LibvirtApplier(SchedConn(conn), state_path=tmp_path / "s.json")
    plans = Plans()
    plans.plan = plan("on", item(UUID_A, cpu_weight=50))
    probe = lay_out(tmp_path / "host", "hybrid", {"vda": NO_BFQ})
    agent = AgentLoop(config, collector, spool, None, applier=applier, plans=plans, probe=probe)
    plans.report_outcome = "down"  # the daemon is away at first: the word waits
    first = agent.tick(1_800_000_000)
    assert plans.capabilities == []
    assert agent.capabilities is not None and applier.capabilities is agent.capabilities
    plans.report_outcome = "delivered"
    agent.tick(1_800_000_001)
    agent.tick(1_800_000_002)
    assert len(plans.capabilities) == 1  # said once, then not again while nothing changes
    said = plans.capabilities[0]
    assert said.support(Knob.disk_weight).support.value == "unsupported"
    assert weight(conn, UUID_A) == 0  # no weight written where it would do nothing
    assert [k.knob for k in first.enforcement[0].knobs] == [Knob.cpu_weight, Knob.disk_weight]
    gauge = agent.metrics.registry.get_sample_value(
        "gmd_agent_knob_support", {"knob": "disk_weight", "support": "unsupported"}
    )
    assert gauge == 1
    spool.close()


def test_the_probe_judges_the_disks_under_the_vms_not_every_disk(tmp_path: Path) -> None:
    """A VM whose image is a file on this machine: the applier names the host's whole disk
    under it, and the probe reads that disk's scheduler alone (an OS disk without BFQ beside a
    VMs' disk with it must not make the disk weight unsupported)."""
    import os

    from gmd.agent.apply.state import EnforceBackend
    from gmd.agent.capabilities import HostProbe

    image = tmp_path / "a.img"
    image.write_bytes(b"\0" * 4096)
    node = tmp_path / "node.xml"
    node.write_text(NODE.replace("/guest/a.img", str(image)))
    conn = libvirt.open(f"test://{node}")
    try:
        applier = LibvirtApplier(conn, state_path=tmp_path / "state.json")
        devices = applier.disk_devices([UUID_A, UUID_B])  # b's image is not here: not told
    finally:
        conn.close()
    dev = os.stat(image).st_dev
    sysdir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sysdir.exists():
        assert devices is None  # a filesystem of no block device (overlay, tmpfs)
        return
    whole = (
        (sysdir.resolve().parent / "dev").read_text().strip()
        if (sysdir / "partition").exists()
        else f"{os.major(dev)}:{os.minor(dev)}"
    )
    assert devices == [whole]
    caps = HostProbe(EnforceBackend.libvirt).probe(devices=devices).capabilities()
    name = Path(f"/sys/dev/block/{whole}").resolve().name
    assert list(caps.schedulers) == [name]
