"""Issue 42: which knobs a host has, probed from its own files — fixture trees of the layouts
hosts run (cgroup v1, this machine's hybrid, v2 with and without the io cost model; disks run
by none/mq-deadline/kyber, BFQ or CFQ), in the manner of node_exporter's fixture trees — and
this machine's own kernel, read for real, against what its files say."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmd.agent.apply.state import EnforceBackend
from gmd.agent.capabilities import (
    HostProbe,
    describe,
    disks,
    io_cost_enabled,
    parse_scheduler,
    table,
)
from gmd.wire import HostCapabilities, Knob, KnobSupport
from tests.support.knob_host import BFQ_ACTIVE, BFQ_OFFERED, NO_BFQ, lay_out


def support(caps: HostCapabilities) -> dict[str, str]:
    return {k.knob.value: k.support.value for k in caps.knobs}


def test_parse_scheduler() -> None:
    assert parse_scheduler("[none] mq-deadline kyber\n") == (
        "none",
        ("none", "mq-deadline", "kyber"),
    )
    assert parse_scheduler("none\n") == ("none", ("none",))
    assert parse_scheduler("mq-deadline [bfq]") == ("bfq", ("mq-deadline", "bfq"))
    assert io_cost_enabled("8:0 enable=1 ctrl=auto rpct=0.00\n8:16 enable=0 ctrl=auto\n") == {"8:0"}


def test_hybrid_v1_without_bfq_this_machines_layout(tmp_path: Path) -> None:
    caps = (
        lay_out(tmp_path, "hybrid", {"vda": NO_BFQ, "loop0": "none"}).probe(["vm"]).capabilities()
    )
    assert caps.cgroup == "hybrid"
    assert caps.schedulers == {"vda": "none"}  # loop devices say nothing of a VM's disk
    assert support(caps) == {
        "cpu_weight": "supported",
        "cpu_cap": "supported",
        "disk_weight": "unsupported",
        "disk_limit": "supported",
        "network_limit": "unsupported",
    }
    why = caps.support(Knob.disk_weight).reason
    assert "no proportional I/O scheduler on vda" in why
    assert "this kernel offers no BFQ" in why
    assert caps.support(Knob.cpu_cap).via == "libvirt vcpu_quota → cpu.cfs_quota_us (cgroup hybrid)"
    assert caps.support(Knob.disk_limit).via.startswith("libvirt blockIoTune")


def test_v1_with_bfq_offered_but_not_running_says_how_to_enable_it(tmp_path: Path) -> None:
    probe = lay_out(tmp_path, "v1", {"sda": BFQ_OFFERED}, extra=("blkio.bfq.weight",))
    caps = probe.probe(["vm"]).capabilities()
    assert caps.cgroup == "v1"
    assert support(caps)["disk_weight"] == "unsupported"
    assert "echo bfq > /sys/block/DEV/queue/scheduler" in caps.support(Knob.disk_weight).reason


def test_v1_with_bfq_running_every_disk(tmp_path: Path) -> None:
    probe = lay_out(
        tmp_path, "v1", {"sda": BFQ_ACTIVE, "sdb": BFQ_ACTIVE}, extra=("blkio.bfq.weight",)
    )
    caps = probe.probe(["vm"]).capabilities()
    assert support(caps)["disk_weight"] == "supported"
    assert (
        caps.support(Knob.disk_weight).via == "libvirt blkio weight → blkio.bfq.weight (cgroup v1)"
    )


def test_bfq_on_one_disk_of_two_is_not_enough(tmp_path: Path) -> None:
    probe = lay_out(
        tmp_path, "v1", {"sda": BFQ_ACTIVE, "nvme0n1": NO_BFQ}, extra=("blkio.bfq.weight",)
    )
    caps = probe.probe(["vm"]).capabilities()
    assert support(caps)["disk_weight"] == "unsupported"
    assert "on nvme0n1" in caps.support(Knob.disk_weight).reason


def test_v2_with_the_io_cost_model_on(tmp_path: Path) -> None:
    probe = lay_out(tmp_path, "v2", {"nvme0n1": NO_BFQ}, io_cost="259:0 enable=1 ctrl=auto\n")
    caps = probe.probe(["vm"]).capabilities()
    assert caps.cgroup == "v2"
    assert support(caps) == {
        "cpu_weight": "supported",
        "cpu_cap": "supported",
        "disk_weight": "supported",
        "disk_limit": "supported",
        "network_limit": "unsupported",
    }
    assert caps.support(Knob.cpu_weight).via == "libvirt cpu_shares → cpu.weight (cgroup v2)"
    assert caps.support(Knob.disk_weight).via == "libvirt blkio weight → io.weight (cgroup v2)"


def test_v2_without_io_cost_nor_bfq_has_no_disk_weight(tmp_path: Path) -> None:
    """io.weight is there, and writing it works, and it does nothing."""
    probe = lay_out(tmp_path, "v2", {"nvme0n1": NO_BFQ}, io_cost="259:0 enable=0 ctrl=auto\n")
    assert support(probe.probe(["vm"]).capabilities())["disk_weight"] == "unsupported"


def test_v2_without_cpu_max_in_the_vms_group(tmp_path: Path) -> None:
    """A kernel without CFS bandwidth control: no cpu.max, no cap."""
    probe = lay_out(tmp_path, "v2", {"vda": NO_BFQ}, v2_files=("cpu.weight", "io.max"))
    probe.backend = EnforceBackend.cgroup
    caps = probe.probe(["vm"]).capabilities()
    assert support(caps)["cpu_cap"] == "unsupported"
    assert caps.support(Knob.cpu_cap).reason.startswith("no cpu.max in the group of VM vm")
    assert support(caps)["disk_limit"] == "supported"
    assert caps.support(Knob.disk_limit).via == "io.max (cgroup v2)"


def test_no_vm_running_reads_the_roots(tmp_path: Path) -> None:
    probe = lay_out(tmp_path, "v2", {"vda": NO_BFQ}, vm=False)
    caps = probe.probe(["vm"]).capabilities()
    assert support(caps)["cpu_cap"] == "supported"  # cpu in the root's cgroup.controllers


def test_libvirts_refusal_outranks_the_files(tmp_path: Path) -> None:
    probe = lay_out(tmp_path, "v1", {"sda": BFQ_ACTIVE}, extra=("blkio.bfq.weight",))
    said = {
        Knob.disk_weight: (
            KnobSupport.unsupported,
            "libvirt: blkio device weight is valid only for bfq or cfq scheduler",
        )
    }
    caps = probe.probe(["vm"], libvirt_said=said).capabilities()
    assert caps.support(Knob.disk_weight).support == KnobSupport.unsupported
    assert caps.support(Knob.disk_weight).reason == said[Knob.disk_weight][1]
    # where the files say why too, both are said
    probe = lay_out(tmp_path / "nvme", "v1", {"nvme0n1": NO_BFQ})
    caps = probe.probe(["vm"], libvirt_said=said).capabilities()
    why = caps.support(Knob.disk_weight).reason
    assert why.startswith("libvirt: blkio device weight") and "on nvme0n1" in why


def test_backend_none_sets_nothing(tmp_path: Path) -> None:
    probe = lay_out(tmp_path, "hybrid", {"vda": NO_BFQ})
    probe.backend = EnforceBackend.none
    caps = probe.probe(["vm"]).capabilities()
    assert set(support(caps).values()) == {"unsupported"}
    assert {k.reason for k in caps.knobs} == {"agent.enforce_backend = none"}


def test_the_table_and_the_log_line_name_every_knob(tmp_path: Path) -> None:
    caps = lay_out(tmp_path, "hybrid", {"vda": NO_BFQ}).probe(["vm"]).capabilities()
    assert [r["knob"] for r in table(caps)] == [k.value for k in Knob]
    line = describe(caps)
    assert line.startswith("cgroup hybrid, backend libvirt: cpu_weight yes; cpu_cap yes;")
    assert "disk_weight no (no proportional I/O scheduler on vda" in line


# --- this machine, for real -----------------------------------------------------------------------


def test_this_hosts_probe_agrees_with_its_files() -> None:
    """Whatever kernel runs the tests: the disk weight is supported exactly where every disk
    runs a proportional scheduler, and the CPU knobs exactly where their files exist."""
    found = disks()
    if not found:
        pytest.fail("no disk under /sys/block: this host cannot be probed")
    caps = HostProbe(EnforceBackend.cgroup).probe().capabilities()
    assert set(caps.schedulers) == {d.name for d in found}
    for d in found:
        text = (Path("/sys/block") / d.name / "queue" / "scheduler").read_text()
        assert f"[{caps.schedulers[d.name]}]" in text or text.strip() == caps.schedulers[d.name]
    proportional = all(d.active in ("bfq", "cfq") for d in found)
    if not proportional:
        assert caps.support(Knob.disk_weight).support == KnobSupport.unsupported
    if caps.cgroup in ("v1", "hybrid"):
        quota = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists()
        assert (caps.support(Knob.cpu_cap).support == KnobSupport.supported) == quota
    assert caps.support(Knob.network_limit).support == KnobSupport.unsupported
