"""What the kernel collector counts as a VM's disk use (issue 42): QEMU's block stats, always,
with the cgroup's bytes of the host devices under its disks as a check, and a VM whose cgroup
disagrees logged once per change and named in the reading.

The cgroup side is the kernel collector's own reading of laid-out cgroup trees
(tests/support/kernel_host.py), written as the kernel writes them: a v1
``blkio.throttle.io_service_bytes`` that says ``Total 0`` however much the guest reads (Linux
6.10 and later, until a throttle limit has been set on the device), then counts. The QEMU side
is figures: the test driver has no block stats in its bulk reply, so for the collector's tick a
wrapper of the test driver's connection adds them to its reply (as the agent's other tests add
QEMU's counters to it); the real QEMU's are the real-VM test's
(tests/realvm/test_agent_disk_realvm.py)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gmd.agent.collect.kernel_disks import (
    JUDGED_BYTES,
    DiskCheck,
    LocalDisk,
    disk_counters_agree,
    host_device,
)
from gmd.agent.collect.kernel_files import CgroupFiles, CounterFiles, CpuFile, IoFile, KernelSources
from gmd.agent.libvirt_conn import open_connection
from gmd.agent.metrics import AgentMetrics
from tests.support.kernel_host import (
    MACHINE,
    TEST_UUID,
    blkio_service_bytes,
    lay_out_image,
    v1_tree,
)

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize(
    ("cgroup", "qemu", "agree"),
    [
        ((0, 0), (0, 0), None),  # an idle guest: nothing to tell
        ((0, 0), (JUDGED_BYTES - 1, 4096), None),  # too little to tell
        ((0, 0), (25 * MIB, 768 * 1024), False),  # the cgroup counts nothing
        ((25 * MIB, 768 * 1024), (25 * MIB, 768 * 1024), True),  # byte for byte
        ((25 * MIB, 2 * MIB), (25 * MIB, 2 * MIB - 65536), True),  # a filesystem's own writes
        ((10 * MIB, 0), (20 * MIB, 0), True),  # half: still within the factor
        ((10 * MIB - 1, 0), (20 * MIB, 0), False),
        ((41 * MIB, 0), (20 * MIB, 0), False),  # the host did twice what the guest asked
        ((25 * MIB, 0), (25 * MIB, 8 * MIB), False),  # reads agree, writes are not counted
        ((25 * MIB, 4096), (25 * MIB, 0), True),  # writes too small to judge
    ],
)
def test_the_cgroup_agrees_within_a_factor_of_two_in_each_direction_that_moved_enough(
    cgroup: tuple[int, int], qemu: tuple[int, int], agree: bool | None
) -> None:
    assert disk_counters_agree(cgroup, qemu) is agree


def test_a_cgroup_read_around_qemus_figures_disagrees_only_whatever_it_counted_between() -> None:
    # 8 MiB moved between the cgroup's two looks of one end of the span: 0 or 8 MiB counted.
    assert disk_counters_agree((0, 0), (8 * MIB, 0), (8 * MIB, 0)) is True
    assert disk_counters_agree((0, 0), (8 * MIB, 0), (3 * MIB, 0)) is False
    assert disk_counters_agree((17 * MIB, 0), (8 * MIB, 0), (20 * MIB, 0)) is False


@pytest.fixture
def cgroup(tmp_path: Path) -> Iterator[tuple[CounterFiles, Path, str]]:
    """A VM's cgroup counter files as the collector reads them (a v1 tree), its
    ``blkio.throttle.io_service_bytes`` counting nothing yet, and its disk's device."""
    _image, device = lay_out_image(tmp_path)
    group = tmp_path / "blkio" / MACHINE
    group.mkdir(parents=True)
    (group / "cpuacct.usage").write_text("1\n")
    (tmp_path / "statm").write_text("100 25 3 1 0 20 0\n")
    blkio = group / "blkio.throttle.io_service_bytes"
    blkio.write_text("Total 0\n")
    files = CounterFiles(
        KernelSources(
            CgroupFiles(
                (CpuFile.CPUACCT_USAGE, group / "cpuacct.usage"),
                (IoFile.BLKIO_SERVICE_BYTES, blkio),
            ),
            tmp_path / "statm",
            (),
        )
    )
    yield files, blkio, device
    files.close()


class Looks:
    """A check fed as the collector feeds it: the cgroup's file read before QEMU's figures and
    again after them (:meth:`CounterFiles.io_again`), a tick every 10 s."""

    def __init__(self, files: CounterFiles, check: DiskCheck) -> None:
        self.files, self.check, self.at_s = files, check, 0.0

    def tick(
        self, qemu: dict[str, tuple[int, int]], between: Callable[[], None] = lambda: None
    ) -> Any:
        self.at_s += 10.0
        before = self.files.read({}, PAGE).disks
        between()  # what happens while QEMU's figures are asked
        return self.check.observe(self.at_s, before, qemu, self.files.io_again())


def test_a_cgroup_counting_nothing_disagrees_once_and_agrees_again_once_it_counts(
    cgroup: tuple[CounterFiles, Path, str],
) -> None:
    """Linux 6.10 and later, cgroup v1: ``Total 0`` while the guest reads 25 MiB a tick. The
    check says so once, after two judged spans, not at every tick; once a throttle limit set
    on the device makes the kernel count (from zero, from then on), it says they agree again,
    once."""
    files, blkio, device = cgroup
    check = DiskCheck((f"host:{device}",), ("vda",))
    looks = Looks(files, check)
    guest = [0, 0]

    def tick() -> Any:
        guest[0] += 25 * MIB
        guest[1] += 768 * 1024
        return looks.tick({"vda": (guest[0], guest[1])})

    assert [tick(), tick()] == [None, None]  # the first look, one judged span
    verdict = tick()
    assert verdict is not None and not verdict.agree
    assert verdict.cgroup == (0, 0) and verdict.qemu == (50 * MIB, 2 * 768 * 1024)
    assert verdict.span_s == 20.0 and verdict.unseen == (f"host:{device}",)
    assert [tick(), tick(), tick()] == [None, None, None] and check.agree is False

    counted = list(guest)  # a limit set on the device: the kernel counts from now on
    verdicts = []
    for _ in range(4):
        blkio.write_text(
            blkio_service_bytes({device: (guest[0] - counted[0], guest[1] - counted[1])})
        )
        verdicts.append(tick())
    # The span when counting started saw none of it; two spans that agree, then it says so.
    assert verdicts[:2] == [None, None]
    verdict = verdicts[2]
    assert verdict is not None and verdict.agree and verdict.unseen == ()
    assert verdict.cgroup == verdict.qemu == (50 * MIB, 2 * 768 * 1024)
    assert verdicts[3] is None and check.agree is True


def test_one_span_swayed_by_io_in_flight_changes_nothing(
    cgroup: tuple[CounterFiles, Path, str],
) -> None:
    """A cgroup that counts, at a tick where a burst the cgroup counted (sent) was not yet
    done for QEMU: one span disagrees, the next makes up for it; the check holds."""
    files, blkio, device = cgroup
    check = DiskCheck((f"host:{device}",), ("vda",))
    looks = Looks(files, check)
    said = []
    for host, guest in [(0, 0), (20, 20), (40, 40), (60, 40), (80, 80), (100, 100)]:
        blkio.write_text(blkio_service_bytes({device: (host * MIB, 0)}))
        said.append(looks.tick({"vda": (guest * MIB, 0)}))
    assert said == [None] * 6 and check.agree is True


def test_a_burst_between_the_two_looks_of_a_tick_sways_nothing(
    cgroup: tuple[CounterFiles, Path, str],
) -> None:
    """8 MiB read between the cgroup's first look and QEMU's figures (the bulk call waits on
    each QEMU in turn): without the second look the cgroup would seem to have missed them."""
    files, blkio, device = cgroup
    check = DiskCheck((f"host:{device}",), ("vda",))
    looks = Looks(files, check)
    host = [0]

    def burst() -> None:
        host[0] += 8 * MIB
        blkio.write_text(blkio_service_bytes({device: (host[0], 0)}))

    said = [looks.tick({"vda": (k * 8 * MIB, 0)}, burst) for k in range(1, 7)]
    assert said == [None] * 6 and check.agree is True


def test_a_first_verdict_that_they_agree_is_not_news_and_other_devices_do_not_count(
    cgroup: tuple[CounterFiles, Path, str],
) -> None:
    """Where the kernel counts the disk's device, nothing is said; the bytes the cgroup
    counts on other devices (a loop device's backing file, the host's own disk) are not the
    disk's."""
    files, blkio, device = cgroup
    check = DiskCheck((f"host:{device}",), ("vda",))
    looks = Looks(files, check)
    other = "7:99" if device != "7:99" else "7:98"
    said = []
    for k in range(4):
        blkio.write_text(blkio_service_bytes({device: (k * 5 * MIB, 0), other: (k * 90 * MIB, 0)}))
        said.append(looks.tick({"vda": (k * 5 * MIB, 0)}))
    assert said == [None] * 4 and check.agree is True


def test_too_little_io_and_a_tick_without_qemus_figures_leave_the_span_open(
    cgroup: tuple[CounterFiles, Path, str],
) -> None:
    """A guest reading 300 KiB a tick is judged once a mebibyte has moved, over the ticks it
    took; a tick whose block stats were not read (a busy domain) judges nothing."""
    files, _blkio, device = cgroup
    check = DiskCheck((f"host:{device}",), ("vda",))
    looks = Looks(files, check)
    assert looks.tick({"vda": (0, 0)}) is None
    assert looks.tick({}) is None  # busy
    said = [looks.tick({"vda": (k * 300 * 1024, 0)}) for k in range(2, 10)]
    # Judged at 1200 KiB (40 s after the first look) and at 2400 KiB: then it says so.
    assert said[:6] == [None] * 6
    verdict = said[6]
    assert verdict is not None and not verdict.agree and verdict.span_s == 80.0
    assert verdict.qemu == (2400 * 1024, 0) and said[7] is None


def test_a_cgroup_whose_counts_went_down_is_judged_anew(
    cgroup: tuple[CounterFiles, Path, str],
) -> None:
    """``blkio.reset_stats`` sets the cgroup's counts back to zero: no span reaches over it."""
    files, blkio, device = cgroup
    check = DiskCheck((f"host:{device}",), ("vda",))
    looks = Looks(files, check)
    said = []
    for host, guest in [(80, 80), (0, 90), (10, 100), (20, 110), (30, 120)]:
        blkio.write_text(blkio_service_bytes({device: (host * MIB, 0)}))
        said.append(looks.tick({"vda": (guest * MIB, 0)}))
    assert said == [None] * 5 and check.agree is True


def test_a_disks_host_device_is_its_filesystems_whole_disk_or_none(tmp_path: Path) -> None:
    image, device = lay_out_image(tmp_path)
    sys_block = tmp_path / "sys/dev/block"
    assert host_device(LocalDisk("vda", str(image), False), sys_block) == f"host:{device}"
    # On a partition: the cgroup counts the whole disk's queue, and names it.
    partitioned = tmp_path / "sysfs"
    whole = partitioned / "devices/virtual/block/sdz"
    (whole / "sdz1").mkdir(parents=True)
    (whole / "dev").write_text("8:240\n")
    (whole / "sdz1" / "dev").write_text(f"{device}\n")
    (whole / "sdz1" / "partition").write_text("1\n")
    (partitioned / "dev/block").mkdir(parents=True)
    (partitioned / "dev/block" / device).symlink_to(whole / "sdz1")
    disk = LocalDisk("vda", str(image), False)
    assert host_device(disk, partitioned / "dev/block") == "host:8:240"
    # No such device (an anonymous one: NFS, tmpfs, overlay, btrfs), no such image, or a
    # "block" source that is a file: not checked.
    assert host_device(disk, tmp_path / "nowhere") is None
    assert host_device(LocalDisk("vda", str(tmp_path / "gone.img"), False), sys_block) is None
    assert host_device(LocalDisk("vda", str(image), True), sys_block) is None


def test_a_block_device_disk_is_checked_on_that_device(tmp_path: Path) -> None:
    node = tmp_path / "disk0"
    try:
        os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(7, 99))
    except PermissionError:
        pytest.skip("making a block device node needs CAP_MKNOD")
    (tmp_path / "sys/dev/block/7:99").mkdir(parents=True)
    disk = LocalDisk("vdb", str(node), True)
    assert host_device(disk, tmp_path / "sys/dev/block") == "host:7:99"


class QemuBlockStats:
    """The test driver's connection with QEMU's block stats in its bulk reply: ``disks``, the
    guest's devices' (read, written) bytes, which the test moves as a guest would."""

    def __init__(self, real: Any, disks: dict[str, tuple[int, int]]) -> None:
        self.real, self.disks = real, disks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def domainListGetStats(self, doms: list[Any], stats: int, flags: int) -> list[Any]:
        block: dict[str, Any] = {"block.count": len(self.disks)}
        for i, (name, (read, written)) in enumerate(self.disks.items()):
            block |= {f"block.{i}.name": name, f"block.{i}.rd.bytes": read}
            block[f"block.{i}.wr.bytes"] = written
        return [
            (dom, {**st, **block}) for dom, st in self.real.domainListGetStats(doms, stats, flags)
        ]


def test_the_collector_counts_the_cgroups_bytes_and_names_a_vm_whose_cgroup_disagrees(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A VM whose disk QEMU opens O_DIRECT, its cgroup counting nothing at first: every
    reading's disks are what its cgroup counted on the host's device (the I/O that contends
    the disk); the VM is named in the readings (and the agent's gauge) while QEMU's figures
    say otherwise, logged once; once the cgroup counts, once more, and no longer named."""
    qemu: dict[str, tuple[int, int]] = {}
    collector = v1_tree(
        tmp_path,
        opener=lambda uri: QemuBlockStats(open_connection(uri, read_only=True), qemu),
        checked=True,
    )
    _image, device = lay_out_image(tmp_path)
    blkio = tmp_path / "sys/fs/cgroup/blkio" / MACHINE / "blkio.throttle.io_service_bytes"
    metrics = AgentMetrics()
    gauge = "gmd_agent_vms_disk_counters_disagreeing"
    readings, gauges = [], []
    guest = [0, 0]
    caplog.set_level(logging.INFO, logger="gmd.agent.collect.kernel")
    try:
        for k in range(9):
            if k == 5:  # a throttle limit set on the device: the kernel counts from now on
                counted = list(guest)
            if k >= 5:
                blkio.write_text(
                    blkio_service_bytes({device: (guest[0] - counted[0], guest[1] - counted[1])})
                )
            qemu["vda"] = (guest[0], guest[1])
            readings.append(collector.collect())
            metrics.read(readings[-1])
            gauges.append(metrics.registry.get_sample_value(gauge))
            guest = [guest[0] + 25 * MIB, guest[1] + 768 * 1024]
    finally:
        collector.close()
    for k, reading in enumerate(readings):
        assert reading.ok and reading.fallbacks == frozenset(), reading
        (vm,) = reading.vms
        assert vm.uuid == TEST_UUID and vm.run_id == 1
        host = (max(k - 5, 0) * 25 * MIB, max(k - 5, 0) * 768 * 1024)
        assert vm.disks == ({} if k < 5 else {f"host:{device}": host})
    named = [TEST_UUID in r.disk_disagreements for r in readings]
    assert named == [False, False, True, True, True, True, True, False, False]
    assert gauges == [float(n) for n in named]
    said = [r for r in caplog.records if TEST_UUID in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO], caplog.messages
    assert f"its cgroup has no line for host:{device}" in said[0].getMessage()
    assert "only once a throttle limit has been set" in said[0].getMessage()
    assert "agree with QEMU's block stats again" in said[1].getMessage()


def test_a_vm_without_its_image_here_is_counted_all_the_same_and_not_checked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No image to find the device of (the test driver's ``/guest/diskimage1``): QEMU's bytes
    are its disk use, its cgroup's I/O file is not even read."""
    qemu: dict[str, tuple[int, int]] = {}
    collector = v1_tree(
        tmp_path, opener=lambda uri: QemuBlockStats(open_connection(uri, read_only=True), qemu)
    )
    blkio = tmp_path / "sys/fs/cgroup/blkio" / MACHINE / "blkio.throttle.io_service_bytes"
    blkio.write_text("not what the kernel writes\n")  # never read: no error
    caplog.set_level(logging.INFO, logger="gmd.agent.collect.kernel")
    try:
        readings = []
        for k in range(3):
            qemu["vda"] = (k * 25 * MIB, 0)
            readings.append(collector.collect())
    finally:
        collector.close()
    assert [r.vms[0].disks for r in readings] == [{"vda": (k * 25 * MIB, 0)} for k in range(3)]
    assert all(not r.disk_disagreements and not r.fallbacks for r in readings)
    assert not [m for m in caplog.messages if TEST_UUID in m]


def test_qemu_is_asked_for_a_checked_vm_only_every_check_every_s(tmp_path: Path) -> None:
    """A VM whose disks its cgroup counts needs QEMU's block stats only for the check: asked
    once a minute, not every tick (QEMU's monitor is the costly part of a tick)."""
    asked: list[float] = []
    now = [1000.0]

    class Counting(QemuBlockStats):
        def domainListGetStats(self, *args: Any, **kwargs: Any) -> Any:
            asked.append(now[0])
            return super().domainListGetStats(*args, **kwargs)

    qemu: dict[str, tuple[int, int]] = {"vda": (0, 0)}
    collector = v1_tree(
        tmp_path,
        opener=lambda uri: Counting(open_connection(uri, read_only=True), qemu),
        checked=True,
        check_every_s=60.0,
    )
    collector._monotonic = lambda: now[0]  # the collector's clock, a tick every 10 s
    try:
        for _ in range(13):
            reading = collector.collect()
            assert reading.ok
            now[0] += 10.0
    finally:
        collector.close()
    assert asked == [1000.0, 1060.0, 1120.0]


def test_the_kernel_is_made_to_count_a_devices_io_and_nothing_is_left_behind() -> None:
    """On this host's v1 blkio hierarchy (root): the limit set and lifted in a group of gmd's
    own, the group removed; a device that is not there is said, not raised."""
    from gmd.agent.collect.kernel_disks import ACCOUNTING_GROUP, enable_io_accounting

    root = Path("/sys/fs/cgroup/blkio")
    if os.geteuid() != 0 or not (root / "blkio.throttle.read_bps_device").exists():
        pytest.fail("this test needs root and a cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio")
    disk = next(
        p for p in sorted(Path("/sys/block").iterdir()) if not p.name.startswith(("loop", "ram"))
    )
    device = (disk / "dev").read_text().strip()
    assert enable_io_accounting(root, [f"host:{device}"]) == {}
    assert not (root / ACCOUNTING_GROUP).exists()
    missing = enable_io_accounting(root, ["host:254:999"])
    assert set(missing) == {"host:254:999"} and "No such device" in missing["host:254:999"]
    assert not (root / ACCOUNTING_GROUP).exists()
