"""The cgroup backend: v2 against a temporary tree of control files, v1 against the real kernel.

This machine has a hybrid layout (v1 controllers under /sys/fs/cgroup, a cgroup2 at unified/
offering only hugetlb), so cgroup v2 files cannot be created here: the v2 writer is run on
regular files, with a small stand-in for the kernel's per-line semantics of ``io.max`` and
``io.weight`` (tests/support/appliers.py). The v1 writer is run on real child cgroups that the
tests create and always remove, and the values are read back from the kernel.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmd.agent.apply.cgroupfs import (
    LIBVIRT_TEMPLATE,
    SYSTEMD_TEMPLATE,
    CgroupError,
    VmCgroup,
    VmIdentity,
    detect,
    from_domain,
    from_template,
    libvirt_machine_name,
    render_template,
    systemd_escape,
)
from gmd.agent.apply.cgroupfs_report import Snapshot
from gmd.agent.apply.cgroupfs_writes import CgroupBackend, apply, read_current, restore
from gmd.agent.apply.limits import (
    LimitsError,
    VmLimits,
    blkio_to_io_weight,
    cpu_quota_to_us,
    cpu_weight_to_shares,
    io_weight_to_blkio,
    quota_us_to_cores,
    round_down_to_page,
    shares_to_cpu_weight,
)
from gmd.agent.cgroups import CgroupLocator, DomainCgroups
from gmd.agent.collect.kernel_files import counter_files
from tests.support.appliers import V2_DEFAULTS, FakeCgroupfsIO

PAGE = 4096
GIB = 1 << 30


# --- limits: validation and pure conversions ---------------------------------------------------


def test_cpu_weight_and_shares_map_linearly_around_the_defaults() -> None:
    assert cpu_weight_to_shares(100) == 1024
    assert cpu_weight_to_shares(50) == 512
    assert cpu_weight_to_shares(1) == 10
    assert cpu_weight_to_shares(10000) == 102400
    assert shares_to_cpu_weight(1024) == 100
    assert shares_to_cpu_weight(512) == 50
    assert shares_to_cpu_weight(2) == 1  # 0.195 rounds to 0, clamped to the v2 minimum
    assert shares_to_cpu_weight(262144) == 10000  # 25600, clamped to the v2 maximum
    for weight in (1, 7, 33, 100, 101, 999, 10000):
        assert shares_to_cpu_weight(cpu_weight_to_shares(weight)) == weight


def test_io_weight_maps_to_blkio_anchored_at_each_schedulers_default() -> None:
    assert io_weight_to_blkio(100) == 100  # blkio.bfq.weight: default 100
    assert io_weight_to_blkio(100, 500) == 500  # CFQ blkio.weight: default 500
    assert io_weight_to_blkio(300) == 300
    assert io_weight_to_blkio(1) == 10  # clamped to the blkio minimum
    assert io_weight_to_blkio(10000) == 1000  # clamped to the blkio maximum
    assert io_weight_to_blkio(50, 500) == 250
    assert blkio_to_io_weight(500, 500) == 100
    assert blkio_to_io_weight(10) == 10
    assert blkio_to_io_weight(1000, 500) == 200


def test_cpu_quota_in_cores_becomes_microseconds_per_period() -> None:
    assert cpu_quota_to_us(0.2, 100_000) == 20_000
    assert cpu_quota_to_us(1.5, 100_000) == 150_000
    assert cpu_quota_to_us(0.5, 250_000) == 125_000
    assert cpu_quota_to_us(0.001, 100_000) == 1000  # the kernel's 1 ms minimum, not EINVAL
    assert quota_us_to_cores(20_000, 100_000) == 0.2
    assert quota_us_to_cores(-1, 100_000) is None
    assert round_down_to_page(100_000_000, PAGE) == 99_999_744
    with pytest.raises(LimitsError, match="period 0"):
        cpu_quota_to_us(1.0, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_weight": 0}, r"cpu_weight=0: must be an integer in 1\.\.10000"),
        ({"cpu_weight": 10001}, "cpu_weight=10001"),
        ({"cpu_weight": True}, "cpu_weight=True"),
        ({"io_weight": 2.5}, "io_weight=2.5"),
        ({"cpu_quota": 0}, "cpu_quota=0: must be a positive"),
        ({"cpu_quota": float("nan")}, "cpu_quota=nan"),
        ({"memory_high_bytes": 4096}, "memory_high_bytes=4096: must be an integer >= 1048576"),
        ({"io_bytes_per_s": {"sda": (1, 1)}}, "device 'sda': must be 'MAJ:MIN'"),
        ({"io_bytes_per_s": {"8:0": (0, None)}}, r"io_bytes_per_s\['8:0'\] read=0"),
        ({"io_bytes_per_s": {"8:0": (1,)}}, "must be a \\(read, write\\) pair"),
    ],
)
def test_limits_reject_values_no_backend_can_apply(kwargs: dict, message: str) -> None:
    with pytest.raises(LimitsError, match=message):
        VmLimits(**kwargs)


def test_limits_round_trip_through_json_and_are_private_copies() -> None:
    caps = {"8:0": (1_000_000, None)}
    limits = VmLimits(cpu_weight=50, cpu_quota=0.5, io_bytes_per_s=caps, memory_high_bytes=GIB)
    caps["8:16"] = (1, 1)
    assert limits.io_bytes_per_s == {"8:0": (1_000_000, None)}
    wire = json.loads(json.dumps(limits.to_dict()))
    assert wire["io_bytes_per_s"] == {"8:0": [1_000_000, None]}
    assert VmLimits.from_dict(wire) == limits
    with pytest.raises(LimitsError, match="unknown VmLimits fields: \\['cpu_wieght'\\]"):
        VmLimits.from_dict({"cpu_wieght": 5})


# --- finding cgroups ---------------------------------------------------------------------------


def test_detect_tells_v2_from_v1_and_names_the_path_otherwise(tmp_path: Path) -> None:
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpu io memory\n")
    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    (tmp_path / "none").mkdir()
    assert detect(tmp_path / "v2") == "v2"
    assert detect(tmp_path / "v1") == "v1"
    with pytest.raises(CgroupError, match=str(tmp_path / "none")):
        detect(tmp_path / "none")
    assert detect(Path("/sys/fs/cgroup")) == "v1"  # this machine's hybrid layout


def test_templates_give_libvirts_real_cgroup_names() -> None:
    vm = VmIdentity(name="instance-0000002a", uuid="6c1c8a3e-0000-4000-8000-000000000001", id=3)
    assert libvirt_machine_name(3, "instance-0000002a") == "qemu-3-instance-0000002a"
    assert systemd_escape("qemu-3-a_b.c") == r"qemu\x2d3\x2da_b.c"
    assert str(render_template(SYSTEMD_TEMPLATE, vm)) == (
        r"machine.slice/machine-qemu\x2d3\x2dinstance\x2d0000002a.scope"
    )
    assert str(render_template(LIBVIRT_TEMPLATE, vm)) == (
        "machine/qemu-3-instance-0000002a.libvirt-qemu"
    )
    assert str(render_template("/vms/{uuid}", vm)) == "vms/6c1c8a3e-0000-4000-8000-000000000001"
    # libvirt keeps host-name characters only and cuts the machine name at 64 characters
    assert libvirt_machine_name(12, "my vm/ü" + "x" * 80) == ("qemu-12-myvm" + "x" * 80)[:64]
    with pytest.raises(CgroupError, match="fields are"):
        render_template("machine/{nmae}", vm)
    with pytest.raises(CgroupError, match=r"without '\.\.'"):
        render_template("../{name}", vm)


def test_v1_locate_gives_one_directory_per_controller(tmp_path: Path) -> None:
    cg = from_template(tmp_path, LIBVIRT_TEMPLATE, VmIdentity("web", id=7), version="v1")
    assert cg.file("cpu.shares") == tmp_path / "cpu/machine/qemu-7-web.libvirt-qemu/cpu.shares"
    assert cg.file("blkio.bfq.weight") == (
        tmp_path / "blkio/machine/qemu-7-web.libvirt-qemu/blkio.bfq.weight"
    )
    assert cg.file("memory.soft_limit_in_bytes").parent == (
        tmp_path / "memory/machine/qemu-7-web.libvirt-qemu"
    )


# --- cgroup v2 on a temporary tree --------------------------------------------------------------


@pytest.fixture
def v2_tree(tmp_path: Path) -> tuple[Path, VmCgroup, FakeCgroupfsIO]:
    """A v2 root with one VM's cgroup at the systemd path, files at the kernel's defaults."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    vm = VmIdentity(name="instance-0000002a", id=3)
    cg = from_template(root, SYSTEMD_TEMPLATE, vm)
    assert cg.version == "v2"
    cg.dirs[""].mkdir(parents=True)
    for name, text in V2_DEFAULTS.items():
        (cg.dirs[""] / name).write_text(text)
    return root, cg, FakeCgroupfsIO(devices={"8:0", "8:16"})


def _v2_files(cg: VmCgroup) -> dict[str, str]:
    return {name: (cg.dirs[""] / name).read_text() for name in V2_DEFAULTS}


THROTTLE = VmLimits(
    cpu_weight=50,
    cpu_quota=0.5,
    io_weight=200,
    io_bytes_per_s={"8:0": (1_048_576, None), "8:16": (None, 2_097_152)},
    memory_high_bytes=2 * GIB + 123,
)


def test_v2_apply_writes_each_knob_in_the_kernels_format(v2_tree) -> None:
    _root, cg, io = v2_tree
    report = apply(cg, THROTTLE, io=io, page_size=PAGE)
    assert report.ok, report.failures
    assert report.action == "apply"
    assert _v2_files(cg) == {
        "cpu.weight": "50\n",
        "cpu.max": "50000 100000\n",
        "io.weight": "default 200\n8:16 300\n",  # the per-device override is kept
        "io.max": (
            "8:0 rbps=1048576 wbps=max riops=max wiops=max\n"
            "8:16 rbps=max wbps=2097152 riops=max wiops=max\n"
        ),
        "memory.high": f"{2 * GIB}\n",  # whole pages, as the kernel keeps it
    }
    cpu_max = report.result("cpu.max")
    assert cpu_max is not None
    assert (cpu_max.before, cpu_max.after, cpu_max.written) == (
        "max 100000",
        "50000 100000",
        ("50000 100000",),
    )
    json.dumps(report.to_dict())  # reported back to the daemon as JSON


def test_v2_apply_twice_writes_nothing_the_second_time(v2_tree) -> None:
    _root, cg, io = v2_tree
    first = apply(cg, THROTTLE, io=io, page_size=PAGE)
    assert first.changed
    files = _v2_files(cg)
    io.writes.clear()
    second = apply(cg, THROTTLE, io=io, page_size=PAGE)
    assert second.ok
    assert not second.changed
    assert io.writes == []
    assert _v2_files(cg) == files
    assert all(r.before == r.after for r in second.results)


def test_v2_restore_puts_back_exactly_what_was_there(v2_tree) -> None:
    _root, cg, io = v2_tree
    original = _v2_files(cg)
    snapshot = read_current(cg, io)
    apply(cg, THROTTLE, io=io, page_size=PAGE)
    # the agent keeps the snapshot on disk across restarts
    stored = Snapshot.from_dict(json.loads(json.dumps(snapshot.to_dict())))
    assert stored == snapshot
    report = restore(cg, stored, io=io)
    assert report.ok, report.failures
    assert report.action == "restore"
    assert _v2_files(cg) == original
    io.writes.clear()
    assert not restore(cg, stored, io=io).changed
    assert io.writes == []


def test_v2_a_failing_file_is_reported_and_the_others_still_go(v2_tree) -> None:
    _root, cg, io = v2_tree
    (cg.dirs[""] / "memory.high").unlink()  # e.g. the memory controller is not enabled
    (cg.dirs[""] / "cpu.max").chmod(0o444)
    limits = VmLimits(
        cpu_weight=50,
        cpu_quota=0.5,
        io_weight=200,
        io_bytes_per_s={"8:0": (1_048_576, None), "9:9": (5, 5)},
        memory_high_bytes=GIB,
    )
    report = apply(cg, limits, io=io, page_size=PAGE)
    assert not report.ok
    failed = {Path(r.path).name: r.error for r in report.failures}
    assert set(failed) == {"memory.high", "cpu.max", "io.max"}
    assert failed["memory.high"].startswith("ENOENT")
    assert failed["cpu.max"] == (
        f"EACCES (Permission denied) writing '50000 100000' to {cg.dirs[''] / 'cpu.max'}"
    )
    assert "ENODEV" in failed["io.max"] and "'9:9 rbps=5 wbps=5" in failed["io.max"]
    codes = {Path(r.path).name: r.errno for r in report.failures}
    assert codes == {"memory.high": errno.ENOENT, "cpu.max": errno.EACCES, "io.max": errno.ENODEV}
    files = {n: (cg.dirs[""] / n).read_text() for n in ("cpu.weight", "io.weight", "io.max")}
    assert files == {
        "cpu.weight": "50\n",
        "io.weight": "default 200\n8:16 300\n",
        "io.max": "8:0 rbps=1048576 wbps=max riops=max wiops=max\n",  # the good device went in
    }
    assert (cg.dirs[""] / "cpu.max").read_text() == "max 100000\n"


def test_v2_none_goes_back_to_the_baseline_so_lower_levels_lift_caps(v2_tree) -> None:
    _root, cg, io = v2_tree
    (cg.dirs[""] / "cpu.max").write_text("200000 100000\n")  # the operator's own 2-core cap
    baseline = read_current(cg, io)
    apply(cg, THROTTLE, baseline, io=io, page_size=PAGE)
    assert (cg.dirs[""] / "cpu.max").read_text() == "50000 100000\n"
    report = apply(cg, VmLimits(cpu_weight=80), baseline, io=io, page_size=PAGE)
    assert report.ok, report.failures
    assert _v2_files(cg) == {**V2_DEFAULTS, "cpu.weight": "80\n", "cpu.max": "200000 100000\n"}
    # without a baseline, a knob the limits leave at None is not touched
    apply(cg, VmLimits(cpu_quota=0.25), io=io, page_size=PAGE)
    io.writes.clear()
    apply(cg, VmLimits(cpu_weight=80), io=io, page_size=PAGE)
    assert io.writes == []
    assert (cg.dirs[""] / "cpu.max").read_text() == "25000 100000\n"


def _qemu_process(tmp_path: Path, name: str, pid: int, proc_cgroup: str, mountinfo: str):
    """A canned ``/proc`` and libvirt run directory: domain ``name``'s QEMU is process
    ``pid`` in the cgroups ``proc_cgroup``."""
    proc, run = tmp_path / "proc", tmp_path / "run"
    (proc / str(pid)).mkdir(parents=True)
    (proc / "self").mkdir()
    run.mkdir()
    (proc / str(pid) / "cgroup").write_text(proc_cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (run / f"{name}.pid").write_text(f"{pid}\n")
    return CgroupLocator(proc=proc, run_dir=run)


def test_backend_writes_where_the_collector_reads_on_v2(v2_tree, tmp_path: Path) -> None:
    """By default the VM's cgroup is found from its QEMU process: recent libvirt on v2 puts
    QEMU in ``…scope/libvirt/emulator``, so the VM's group is ``…scope/libvirt``, where the
    kernel collector reads its counters too."""
    root, _scope, io = v2_tree
    name = "instance-0000002a"
    group = r"machine.slice/machine-qemu\x2d3\x2dinstance\x2d0000002a.scope/libvirt"
    (root / group).mkdir(parents=True)
    for filename, text in V2_DEFAULTS.items():
        (root / group / filename).write_text(text)
    locator = _qemu_process(
        tmp_path,
        name,
        4242,
        f"0::/{group}/emulator\n",
        f"24 30 0:22 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    backend = CgroupBackend(Path("/unused"), locator=locator, io=io)
    vm = VmIdentity(name=name, id=3)
    cg = backend.locate(vm)
    assert (cg.version, cg.dirs) == ("v2", {"": root / group})
    assert counter_files(locator.of_domain(name)).cpu[1] == root / group / "cpu.stat"
    snapshot = backend.read_current(vm)
    assert backend.apply(vm, VmLimits(cpu_weight=10)).ok
    assert (root / group / "cpu.weight").read_text() == "10\n"
    assert backend.restore(vm, snapshot).ok
    assert _v2_files(cg) == V2_DEFAULTS
    with pytest.raises(CgroupError, match="snapshot is cgroup v1, the host is v2"):
        backend.restore(vm, Snapshot(version="v1", label="x", files={}))
    # a VM whose QEMU cannot be found is a one-line error naming what is missing
    with pytest.raises(CgroupError, match=r"other\.pid: No such file"):
        backend.locate(VmIdentity(name="other"))


def test_backend_with_a_template_detects_the_version_and_renders_it(v2_tree) -> None:
    root, cg, io = v2_tree
    backend = CgroupBackend(root, SYSTEMD_TEMPLATE, io=io)
    vm = VmIdentity(name="instance-0000002a", id=3)
    assert backend.version == "v2"
    assert backend.locate(vm) == cg
    assert backend.apply(vm, VmLimits(cpu_weight=10)).ok
    assert (cg.dirs[""] / "cpu.weight").read_text() == "10\n"


def test_a_domain_in_v1_groups_of_some_controllers_only_is_refused() -> None:
    groups = DomainCgroups({"cpu": Path("/cg/cpu/vm"), "memory": Path("/cg/memory/vm")}, None)
    with pytest.raises(CgroupError, match="for cpu, memory but not for blkio"):
        from_domain(groups)
    with pytest.raises(CgroupError, match="no cpu/blkio/memory"):
        from_domain(DomainCgroups({}, None))


# --- cgroup v1 against the real kernel ------------------------------------------------------------

V1_ROOT = Path("/sys/fs/cgroup")
UNLIMITED_SOFT = str((2**63 - 1) // os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PAGE_SIZE"))


def _block_device() -> str:
    """MAJ:MIN of a real disk (blkio throttles are refused for devices that do not exist)."""
    devices = sorted(
        Path("/sys/block").iterdir(), key=lambda p: p.name.startswith(("loop", "zram"))
    )
    if not devices:
        pytest.fail("no block device in /sys/block to throttle")
    return (devices[0] / "dev").read_text().strip()


def _absent_device(major: str) -> str:
    for minor in range(200, 1200):
        if not Path(f"/sys/dev/block/{major}:{minor}").exists():
            return f"{major}:{minor}"
    raise AssertionError("no free minor number found")


@pytest.fixture
def v1_cgroup() -> Iterator[tuple[VmIdentity, dict[str, Path]]]:
    """A fresh child cgroup in the real cpu, blkio and memory hierarchies, always removed."""
    if os.geteuid() != 0 or detect(V1_ROOT) != "v1":
        pytest.fail(f"these tests need root and cgroup v1 hierarchies under {V1_ROOT}")
    name = f"gmd-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    created: list[Path] = []
    try:
        for controller in ("cpu", "blkio", "memory"):
            path = V1_ROOT / controller / name
            path.mkdir()
            created.append(path)
        yield VmIdentity(name=name), {p.parent.name: p for p in created}
    finally:
        for path in reversed(created):
            for child in sorted(path.glob("*/"), reverse=True):
                if child.is_dir():
                    child.rmdir()
            path.rmdir()


def test_v1_real_kernel_apply_read_back_idempotent_restore(v1_cgroup) -> None:
    """On this host's kernel, whichever disk weight file it has: BFQ's (kernels built with
    it), CFQ's (before 5.0), or none (no proportional scheduler: the weight is reported
    unsupported and everything else is still applied)."""
    vm, dirs = v1_cgroup
    device = _block_device()
    backend = CgroupBackend(V1_ROOT, "{name}")
    assert backend.version == "v1"
    bfq = (dirs["blkio"] / "blkio.bfq.weight").exists()
    cfq = (dirs["blkio"] / "blkio.weight").exists()
    snapshot = backend.read_current(vm)
    assert snapshot.files == {  # a new v1 child cgroup, as the kernel creates it
        "cpu.shares": "1024",
        "cpu.cfs_quota_us": "-1",
        "blkio.weight": "500" if cfq else None,
        "blkio.bfq.weight": "100" if bfq else None,
        "blkio.throttle.read_bps_device": "",
        "blkio.throttle.write_bps_device": "",
        "memory.soft_limit_in_bytes": UNLIMITED_SOFT,
    }
    limits = VmLimits(
        cpu_weight=50,
        cpu_quota=0.2,
        io_weight=300,
        io_bytes_per_s={device: (1_048_576, 2_097_152)},
        memory_high_bytes=100_000_000,
    )
    report = backend.apply(vm, limits)
    assert report.ok, report.failures
    if bfq or cfq:
        assert report.unsupported == {}
    else:
        assert set(report.unsupported) == {"disk_weight"}
        assert (
            "neither blkio.weight nor blkio.bfq.weight exists" in report.unsupported["disk_weight"]
        )
    weights = {n: dirs["blkio"] / n for n in ("blkio.bfq.weight", "blkio.weight")}
    kernel = {
        "cpu.shares": (dirs["cpu"] / "cpu.shares").read_text(),
        "cpu.cfs_quota_us": (dirs["cpu"] / "cpu.cfs_quota_us").read_text(),
        "cpu.cfs_period_us": (dirs["cpu"] / "cpu.cfs_period_us").read_text(),
        **{n: p.read_text() for n, p in weights.items() if p.exists()},
        "read": (dirs["blkio"] / "blkio.throttle.read_bps_device").read_text(),
        "write": (dirs["blkio"] / "blkio.throttle.write_bps_device").read_text(),
        "soft": (dirs["memory"] / "memory.soft_limit_in_bytes").read_text(),
    }
    assert kernel == {
        "cpu.shares": "512\n",
        "cpu.cfs_quota_us": "20000\n",
        "cpu.cfs_period_us": "100000\n",
        **({"blkio.bfq.weight": "300\n"} if bfq else {}),
        **({"blkio.weight": "1000\n"} if cfq else {}),  # 300 on CFQ's scale of 500, clamped
        "read": f"{device} 1048576\n",
        "write": f"{device} 2097152\n",
        "soft": "99999744\n",  # the kernel keeps whole 4 KiB pages: 100000000 // 4096 * 4096
    }
    assert not backend.apply(vm, limits).changed  # idempotent against the kernel's own values
    restored = backend.restore(vm, snapshot)
    assert restored.ok, restored.failures
    assert backend.read_current(vm) == snapshot
    # throttles are removed by writing "MAJ:MIN 0", which is what restore wrote
    assert restored.result("blkio.throttle.read_bps_device").written == (f"{device} 0",)
    assert restored.result("memory.soft_limit_in_bytes").written == (UNLIMITED_SOFT,)


def test_v1_real_kernel_refusals_are_reported_cleanly(v1_cgroup) -> None:
    vm, dirs = v1_cgroup
    device = _block_device()
    missing = _absent_device(device.split(":")[0])
    # A parent with a 50 % cap: v1 refuses a child quota above its parent's (EINVAL).
    (dirs["cpu"] / "cpu.cfs_quota_us").write_text("50000")
    (dirs["cpu"] / "vm").mkdir()
    backend = CgroupBackend(V1_ROOT, "{name}/vm")
    for controller in ("blkio", "memory"):
        (dirs[controller] / "vm").mkdir()
    snapshot = backend.read_current(vm)
    limits = VmLimits(
        cpu_weight=200,
        cpu_quota=1.0,
        io_bytes_per_s={missing: (1000, None), device: (4096, None)},
    )
    report = backend.apply(vm, limits)
    failed = {Path(r.path).name: r.error for r in report.failures}
    cpu_dir = dirs["cpu"] / "vm"
    blkio_file = dirs["blkio"] / "vm" / "blkio.throttle.read_bps_device"
    assert failed == {
        "cpu.cfs_quota_us": (
            f"EINVAL (Invalid argument) writing '100000' to {cpu_dir / 'cpu.cfs_quota_us'}"
        ),
        "blkio.throttle.read_bps_device": (
            f"ENODEV (No such device) writing '{missing} 1000' to {blkio_file}"
        ),
    }
    assert (cpu_dir / "cpu.shares").read_text() == "2048\n"  # the rest still went in
    assert (cpu_dir / "cpu.cfs_quota_us").read_text() == "-1\n"
    assert blkio_file.read_text() == f"{device} 4096\n"
    # The kernel's own normalisation is caught, not mistaken for success: it clamps
    # cpu.shares to >= 2 and turns any negative quota into -1.
    odd = Snapshot(
        version="v1",
        label="odd",
        files={**snapshot.files, "cpu.shares": "1", "cpu.cfs_quota_us": "-5"},
    )
    report = backend.restore(vm, odd)
    failed = {Path(r.path).name: r.error for r in report.failures}
    assert set(failed) == {"cpu.shares"}  # "-5" -> "-1" wrote nothing: -1 is already there
    assert report.failures[0].errno is None  # the kernel took the write, and changed it
    assert failed["cpu.shares"] == (
        f"{cpu_dir / 'cpu.shares'} reads '2' after writing ['1'], expected '1'"
    )
    assert backend.restore(vm, snapshot).ok
    assert backend.read_current(vm) == snapshot


def test_v1_real_kernel_quota_holds_a_busy_process_to_a_fifth_of_a_core(v1_cgroup) -> None:
    vm, dirs = v1_cgroup
    backend = CgroupBackend(V1_ROOT, "{name}")
    snapshot = backend.read_current(vm)
    assert backend.apply(vm, VmLimits(cpu_quota=0.2)).ok
    assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "20000\n"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (dirs["cpu"] / "cgroup.procs").write_text(str(spinner.pid))
        time.sleep(0.2)  # let it settle under the cap

        def cpu_seconds() -> float:
            fields = Path(f"/proc/{spinner.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        cpu0, wall0 = cpu_seconds(), time.monotonic()
        time.sleep(1.0)
        cpu1, wall1 = cpu_seconds(), time.monotonic()
        share = (cpu1 - cpu0) / (wall1 - wall0)
        stat = dict(ln.split() for ln in (dirs["cpu"] / "cpu.stat").read_text().splitlines())
    finally:
        spinner.kill()
        spinner.wait()
    # The cap bounds it from above; from below only the machine's load does (a busy machine
    # gives it less than the cap), so the invariant is: under the cap, still running, and
    # held back by the kernel.
    assert 0 < share <= 0.30, f"busy loop used {share:.2f} of a core under a 0.2 cap"
    assert int(stat["nr_throttled"]) >= 5
    assert backend.restore(vm, snapshot).ok
    assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "-1\n"


def test_v1_real_kernel_backend_writes_where_the_collector_reads(tmp_path: Path) -> None:
    """A real process in real v1 ``…/NAME/emulator`` groups, as libvirt places QEMU: the
    backend finds the VM's groups from the process (no template), in the same directories
    where the kernel collector reads its counters, and its limits land there."""
    if os.geteuid() != 0 or detect(V1_ROOT) != "v1":
        pytest.fail(f"this test needs root and cgroup v1 hierarchies under {V1_ROOT}")
    name = f"gmd-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    controllers = ("cpu", "cpuacct", "blkio", "memory")
    made: list[Path] = []
    qemu = subprocess.Popen(["sleep", "600"])
    try:
        for controller in controllers:
            group = V1_ROOT / controller / name
            (group / "emulator").mkdir(parents=True)
            made += [group, group / "emulator"]
            (group / "emulator" / "cgroup.procs").write_text(str(qemu.pid))
        (tmp_path / f"{name}.pid").write_text(f"{qemu.pid}\n")
        locator = CgroupLocator(run_dir=tmp_path)
        backend = CgroupBackend(Path("/unused"), locator=locator)
        vm = VmIdentity(name=name)
        cg = backend.locate(vm)
        assert cg.version == "v1"
        assert cg.dirs == {c: V1_ROOT / c / name for c in ("cpu", "blkio", "memory")}
        files = counter_files(locator.of_domain(name))
        assert files.cpu[1] == V1_ROOT / "cpuacct" / name / "cpuacct.usage"
        assert files.io is not None and files.io[1].parent == cg.dirs["blkio"]
        snapshot = backend.read_current(vm)
        assert backend.apply(vm, VmLimits(cpu_quota=0.2)).ok
        assert (V1_ROOT / "cpu" / name / "cpu.cfs_quota_us").read_text() == "20000\n"
        assert backend.restore(vm, snapshot).ok
        assert (V1_ROOT / "cpu" / name / "cpu.cfs_quota_us").read_text() == "-1\n"
    finally:
        qemu.kill()
        qemu.wait()
        for group in reversed(made):
            for _ in range(50):  # the killed process leaves its group a moment later
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
