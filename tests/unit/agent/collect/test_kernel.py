"""The kernel-counter collector's parsers and fallback, on directory trees laid out like
``/sys/fs/cgroup`` (v1 and v2), ``/proc`` and ``/sys/class/net``, with libvirt's test driver
for the listing and the domain XML (it has one running domain, ``test``, with disk ``vda``
and interface ``testnet0``). The files are really read; only their place is a tmp directory,
because a real host cannot be made to lose a cgroup file on demand."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gmd.agent.cgroups import (
    CgroupMounts,
    domain_cgroup,
    domain_cgroups,
    parse_mountinfo,
    parse_proc_cgroup,
)
from gmd.agent.collect.kernel import KernelCollector, kernel_collector_fits
from gmd.agent.collect.kernel_disks import DiskPlan, LocalDisk, plan_disks
from gmd.agent.collect.kernel_files import (
    CgroupFiles,
    CounterFiles,
    CpuFile,
    IoFile,
    KeptFile,
    KernelReadError,
    KernelSources,
    counter_files,
)
from gmd.agent.collect.kernel_parsers import (
    parse_blkio_service_bytes,
    parse_cpu_stat,
    parse_cpuacct_usage,
    parse_io_stat,
    parse_net_dev,
)
from tests.support.kernel_host import (
    MACHINE,
    MOUNTINFO_V1,
    PID,
    PROC_CGROUP_V1,
    TEST_UUID,
    lay_out_domain,
    net_dev,
    v1_tree,
)

TEST_URI = "test:///default"
PAGE = 4096

V2_SCOPE = "machine.slice/machine-qemu\\x2d1\\x2dtest.scope/libvirt"
MOUNTINFO_V2 = "24 30 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
PROC_CGROUP_V2 = f"0::/{V2_SCOPE}/emulator\n"


def _files(proc_cgroup: dict[str, str], mounts: CgroupMounts) -> CgroupFiles:
    """The counter files of a QEMU process in ``proc_cgroup``, as the collector finds them."""
    return counter_files(domain_cgroups(proc_cgroup, mounts))


def test_mountinfo_and_proc_cgroup_locate_the_domain_group_not_the_emulators() -> None:
    mounts = parse_mountinfo(MOUNTINFO_V1)
    assert mounts.v1["cpuacct"] == Path("/sys/fs/cgroup/cpuacct")
    assert mounts.v2 == Path("/sys/fs/cgroup/unified")
    groups = parse_proc_cgroup(PROC_CGROUP_V1)
    assert domain_cgroup(groups["cpuacct"]) == domain_cgroup(groups["blkio"])
    files = _files(groups, mounts)
    # The vCPU threads live in vcpuN beside emulator: the domain's group counts them all.
    assert files.cpu == (
        CpuFile.CPUACCT_USAGE,
        Path(f"/sys/fs/cgroup/cpuacct/{MACHINE}/cpuacct.usage"),
    )
    assert files.io == (
        IoFile.BLKIO_SERVICE_BYTES,
        Path(f"/sys/fs/cgroup/blkio/{MACHINE}/blkio.throttle.io_service_bytes"),
    )


def test_a_hybrid_host_without_a_cpuacct_group_reads_cpu_from_the_v2_group() -> None:
    """What libvirt does here: cpuacct stays at the root, so cpu.time is the v2 cpu.stat."""
    groups = parse_proc_cgroup(
        PROC_CGROUP_V1.replace(f"2:cpuacct:/{MACHINE}/emulator", "2:cpuacct:/")
    )
    files = _files(groups, parse_mountinfo(MOUNTINFO_V1))
    assert files.cpu == (CpuFile.CPU_STAT, Path(f"/sys/fs/cgroup/unified/{MACHINE}/cpu.stat"))


def test_pure_v2_locates_cpu_stat_and_io_stat_in_the_libvirt_group() -> None:
    files = _files(parse_proc_cgroup(PROC_CGROUP_V2), parse_mountinfo(MOUNTINFO_V2))
    assert files.cpu == (CpuFile.CPU_STAT, Path(f"/sys/fs/cgroup/{V2_SCOPE}/cpu.stat"))
    assert files.io == (IoFile.IO_STAT, Path(f"/sys/fs/cgroup/{V2_SCOPE}/io.stat"))


def test_a_process_in_no_cgroup_of_its_own_cannot_be_located() -> None:
    with pytest.raises(KernelReadError, match="no cpuacct"):
        _files(parse_proc_cgroup("2:cpuacct:/\n0::/\n"), parse_mountinfo(MOUNTINFO_V1))


def test_blkio_and_io_stat_give_read_and_written_bytes_per_device() -> None:
    blkio = "254:0 Read 5378048\n254:0 Write 4096\n254:0 Sync 5382144\n254:0 Total 5382144\n"
    blkio += "8:0 Read 0\n8:0 Write 512\nTotal 5382656\n"
    assert parse_blkio_service_bytes(blkio) == {"host:254:0": (5378048, 4096), "host:8:0": (0, 512)}
    assert parse_blkio_service_bytes("Total 0\n") == {}
    io = "254:0 rbytes=5378048 wbytes=4096 rios=10 wios=1 dbytes=0 dios=0\n"
    assert parse_io_stat(io) == {"host:254:0": (5378048, 4096)}


def test_a_v1_tree_is_read_as_the_guest_sees_it(tmp_path: Path) -> None:
    collector = v1_tree(tmp_path)
    try:
        reading = collector.collect()
    finally:
        collector.close()
    assert reading.ok and reading.fallbacks == frozenset()
    (vm,) = reading.vms
    assert vm.uuid == TEST_UUID and vm.run_id == 1 and vm.name == "test"
    assert vm.cpu_time_ns == 7_000_000_123
    assert vm.memory_rss_bytes == 25000 * PAGE
    # Its disks are QEMU's block stats, which the test driver's bulk reply does not give: none,
    # never the cgroup's bytes of a host device (its disk is not even checked here: no image).
    assert vm.disks == {}
    # The host's tap transmitted 999 bytes: the guest received them.
    assert vm.nics == {"testnet0": (999, 111)}


def test_a_v2_tree_reads_cpu_stat_and_io_stat(tmp_path: Path) -> None:
    cg = tmp_path / V2_SCOPE
    cg.mkdir(parents=True)
    (cg / "cpu.stat").write_text("usage_usec 4321\nuser_usec 4000\nsystem_usec 321\n")
    (cg / "io.stat").write_text("254:0 rbytes=10 wbytes=20 rios=1 wios=1 dbytes=0 dios=0\n")
    (tmp_path / "statm").write_text("1 2 3 4 5 6 7\n")
    files = _files(parse_proc_cgroup(PROC_CGROUP_V2), CgroupMounts({}, tmp_path))
    counters = CounterFiles(KernelSources(files, tmp_path / "statm", ())).read({}, PAGE)
    assert counters.cpu_time_ns == 4_321_000
    assert counters.memory_rss_bytes == 2 * PAGE
    assert counters.disks == {"host:254:0": (10, 20)}


def test_a_v2_cpu_stat_without_usage_is_an_error_naming_the_file(tmp_path: Path) -> None:
    cg = tmp_path / V2_SCOPE
    cg.mkdir(parents=True)
    (cg / "cpu.stat").write_text("nr_periods 0\n")
    (cg / "io.stat").write_text("")
    files = _files(parse_proc_cgroup(PROC_CGROUP_V2), CgroupMounts({}, tmp_path))
    counter_files = CounterFiles(KernelSources(files, tmp_path / "statm", ()))
    with pytest.raises(KernelReadError, match=r"/statm: No such file"):
        counter_files.read({}, PAGE)
    (tmp_path / "statm").write_text("1 2 3 4 5 6 7\n")
    with pytest.raises(KernelReadError, match=r"cpu\.stat: unexpected content"):
        counter_files.read({}, PAGE)
    (cg / "cpu.stat").write_text("usage_usec 5\n")
    assert counter_files.read({}, PAGE).cpu_time_ns == 5000


def test_a_missing_file_falls_back_to_libvirt_for_the_tick_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    collector = v1_tree(tmp_path)
    usage = tmp_path / "sys/fs/cgroup/cpuacct" / MACHINE / "cpuacct.usage"
    try:
        first = collector.collect()
        assert first.fallbacks == frozenset()
        # Written in place, as the kernel's files change: the file kept open reads it.
        usage.write_text("not a number\n")
        with caplog.at_level(logging.WARNING, logger="gmd.agent.collect.kernel"):
            second, third = collector.collect(), collector.collect()
        usage.write_text("8000000000\n")
        fourth = collector.collect()
    finally:
        collector.close()
    for fell_back in (second, third):
        assert fell_back.fallbacks == {TEST_UUID}
        (vm,) = fell_back.vms
        # libvirt's test driver: info()'s CPU time (the wall clock), not the tree's figure.
        assert vm.cpu_time_ns is not None and vm.cpu_time_ns != 7_000_000_123
        # Its disks are QEMU's block stats, read through libvirt as at any tick.
        assert set(vm.disks) == {"vda"}
        # The tap's counter is the one libvirt reads too: libvirt's figure is kept.
        assert set(vm.nics) == {"testnet0"}
        assert vm.owner.flavor.vcpus == 2
    warnings = [r for r in caplog.records if TEST_UUID in r.getMessage()]
    assert len(warnings) == 1 and "cpuacct.usage: unexpected content" in warnings[0].getMessage()
    assert fourth.fallbacks == frozenset()
    assert fourth.vms[0].cpu_time_ns == 8_000_000_000


def test_a_vm_unreadable_at_its_first_reading_is_read_from_its_files_once_it_can_be(
    tmp_path: Path,
) -> None:
    """Read through libvirt, then from its files: its disks are named by the guest's devices
    (``vda``) both ways, never by a host device, so each reading measures from the last."""
    collector = v1_tree(tmp_path)
    pid_file = tmp_path / "run" / "test.pid"
    pid_file.unlink()
    try:
        first = collector.collect()
        pid_file.write_text(f"{PID}")
        collector.describe_every_s = 0.0  # describe again: the pid is there now
        second = collector.collect()
    finally:
        collector.close()
    assert first.fallbacks == {TEST_UUID} and set(first.vms[0].disks) == {"vda"}
    assert second.fallbacks == frozenset() and second.vms[0].cpu_time_ns == 7_000_000_123
    assert set(second.vms[0].disks) <= {"vda"}


def _own_cpu_file() -> tuple[Path, Callable[[str], int]]:
    """This process's cgroup CPU counter, where the collector would look for a VM's."""
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    if "cpuacct" in mounts.v1 and "cpuacct" in own:
        path = mounts.v1["cpuacct"] / own["cpuacct"].lstrip("/") / "cpuacct.usage"
        return path, parse_cpuacct_usage
    assert mounts.v2 is not None, "no cgroup hierarchy with a CPU counter"
    return mounts.v2 / own[""].lstrip("/") / "cpu.stat", parse_cpu_stat


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_files_read_the_kernels_files_anew_from_their_start() -> None:
    """procfs, cgroupfs and sysfs each make their content again at a read from offset 0: the
    counters move between two reads of the same open file."""
    statm = Path("/proc/self/statm")
    cgroup, parse_cpu = _own_cpu_file()
    lo = Path("/sys/class/net/lo/statistics/tx_bytes")
    files = {path: KeptFile(path) for path in (statm, cgroup, lo)}
    before = {path: file.read() for path, file in files.items()}
    fds = _open_fds()
    ballast = bytearray(64 << 20)  # touched: 64 MiB more resident
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"x" * 1000, ("127.0.0.1", 9))
    after = {path: file.read() for path, file in files.items()}
    assert _open_fds() == fds, "a second reading opened the files again"
    assert int(after[statm].split()[1]) >= int(before[statm].split()[1]) + (60 << 20) // PAGE
    assert parse_cpu(after[cgroup]) > parse_cpu(before[cgroup])
    assert int(after[lo]) >= int(before[lo]) + 1000
    del ballast
    for file in files.values():
        file.close()
    assert _open_fds() == fds - 3


def test_an_open_file_that_fails_is_opened_again_by_path(tmp_path: Path) -> None:
    path = tmp_path / "usage"
    file = KeptFile(path)
    with pytest.raises(KernelReadError, match="usage: No such file"):
        file.read()
    path.write_text("5\n")
    assert file.read() == "5\n"
    path.write_text("6\n")
    assert file.read() == "6\n"
    file.close()


def test_parsers_refuse_a_device_they_cannot_read_whole() -> None:
    with pytest.raises(ValueError, match="Read and Write"):
        parse_blkio_service_bytes("254:0 Read 5\n254:0 Sync 5\nTotal 5\n")
    with pytest.raises(ValueError, match="rbytes"):
        parse_io_stat("254:0 rios=1 rbytes=10 wbytes=20\n")
    with pytest.raises(ValueError, match="usage_usec"):
        parse_cpu_stat("user_usec 5\n")


def test_net_dev_gives_every_interfaces_bytes_as_the_host_sees_them() -> None:
    assert parse_net_dev(net_dev({"lo": (1, 2), "tap-x.1": (30, 40)})) == {
        "lo": (1, 2),
        "tap-x.1": (30, 40),
    }
    # This host's own file: one line per interface in /sys/class/net, all of them read
    # (the kernel hands a page of lines per read, so a short read is not the end).
    real = parse_net_dev(KeptFile(Path("/proc/net/dev")).read(whole=True))
    assert set(real) == set(os.listdir("/sys/class/net"))


def test_a_tick_asks_libvirt_nothing_until_a_domain_starts_or_stops(tmp_path: Path) -> None:
    """Lifecycle events, from libvirt's test driver (its ``default`` host is shared by the
    process's connections): the domains are listed again only after one."""
    import libvirt

    from gmd.agent.libvirt_conn import open_connection

    calls: list[str] = []

    class Counting:
        def __init__(self, conn: object) -> None:
            self._conn = conn

        def __getattr__(self, name: str) -> object:
            calls.append(name)
            return getattr(self._conn, name)

    collector = v1_tree(
        tmp_path, uri=TEST_URI, opener=lambda uri: Counting(open_connection(uri, read_only=True))
    )
    other = libvirt.open(TEST_URI)
    name = f"gmd-events-{os.getpid()}"
    dom = None
    try:
        collector.collect()
        calls.clear()
        for _ in range(5):
            assert {v.uuid for v in collector.collect().vms} == {TEST_UUID}
        # The default host's ``test`` has a host-cached disk: only its block stats are asked.
        assert set(calls) == {"domainListGetStats"}, calls
        dom = other.createXML(
            f"<domain type='test'><name>{name}</name><memory>65536</memory>"
            "<os><type>hvm</type></os></domain>"
        )
        started = _collect_until(collector, lambda r: dom.UUIDString() in r.listed)
        assert {v.uuid for v in started.vms} == {TEST_UUID, dom.UUIDString()}
        assert calls.count("listAllDomains") == 1, calls
        dom.destroy()
        stopped = _collect_until(collector, lambda r: dom.UUIDString() not in r.listed)
        dom = None
        assert {v.uuid for v in stopped.vms} == {TEST_UUID}
    finally:
        if dom is not None:
            dom.destroy()
        collector.close()
        other.close()


def test_a_domain_about_to_end_is_read_at_its_event_and_sent_once_it_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A domain paused (as at the end of an outgoing migration) is read at the event. A tick
    that reads it again supersedes that reading; once it is gone, the next tick sends the
    reading of its last moment, dated then, before any other."""
    import libvirt

    collector = v1_tree(tmp_path, uri=TEST_URI)
    other = libvirt.open(TEST_URI)
    name = f"gmd-last-{os.getpid()}"
    dom = other.createXML(
        f"<domain type='test'><name>{name}</name><memory>65536</memory>"
        "<os><type>hvm</type></os></domain>"
    )
    uuid = dom.UUIDString()
    usage = lay_out_domain(tmp_path, name, PID + 1, f"machine/qemu-{dom.ID()}-{name}", 10**9)
    caplog.set_level(logging.INFO, logger="gmd.agent.collect.kernel")

    def read_at_event(times: int) -> None:
        deadline = time.monotonic() + 10
        while (
            sum(f"{uuid} ({name}) SUSPENDED: its counters read" in m for m in caplog.messages)
            < times
        ):
            assert time.monotonic() < deadline, caplog.messages
            time.sleep(0.01)

    try:
        first = collector.collect()
        assert uuid in {v.uuid for v in first.vms} and uuid not in first.fallbacks
        fds = _open_fds()
        usage.write_text("2000000000\n")
        dom.suspend()
        read_at_event(1)
        # Still there, paused: read again by the tick, the event's reading is superseded.
        again = collector.collect()
        assert [v.cpu_time_ns for v in again.vms if v.uuid == uuid] == [2 * 10**9]
        dom.resume()
        usage.write_text("3000000000\n")
        dom.suspend()
        read_at_event(2)
        usage.write_text("9000000000\n")  # after its last moment: never read
        before_end = time.time()
        dom.destroy()
        gone = _collect_until(collector, lambda r: uuid not in r.listed)
        after = collector.collect()
        # Its CPU and statm files (without disks, it has no I/O file to read).
        assert _open_fds() == fds - 2, "the files of a VM gone were kept open"
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            dom.destroy()
        collector.close()
        other.close()
    last = gone.vms[0]
    assert (last.uuid, last.cpu_time_ns) == (uuid, 3 * 10**9)
    assert again.taken_s < last.taken_s < before_end < gone.taken_s
    assert [v.uuid for v in gone.vms] == [uuid, TEST_UUID]
    assert uuid not in {v.uuid for v in after.vms}


def _collect_until(collector: KernelCollector, done: Callable, timeout_s: float = 10.0) -> Any:
    """Ticks until ``done(reading)``: events reach the collector on the event loop's thread."""
    deadline = time.monotonic() + timeout_s
    while True:
        reading = collector.collect()
        if done(reading):
            return reading
        assert time.monotonic() < deadline, reading
        time.sleep(0.01)


def _domain(disks: str) -> str:
    return f"<domain type='kvm'><name>d</name><devices>{disks}</devices></domain>"


def _disk(kind: str, dev: str, cache: str | None = None, source: str = "file='/x'") -> str:
    driver = f"<driver name='qemu' cache='{cache}'/>" if cache else ""
    return f"<disk type='{kind}'>{driver}<source {source}/><target dev='{dev}'/></disk>"


@pytest.mark.parametrize(
    ("disks", "block_stats", "checked"),
    [
        # Nova's local disks: O_DIRECT, so the cgroup's bytes are checked against QEMU's.
        (
            _disk("file", "vda", "none") + _disk("block", "vdb", "directsync", "dev='/dev/b'"),
            ("vda", "vdb"),
            (LocalDisk("vda", "/x", False), LocalDisk("vdb", "/dev/b", True)),
        ),
        # One left to the host's page cache (libvirt's default) blurs the cgroup: no check.
        (_disk("file", "vda", "none") + _disk("file", "vdb"), ("vda", "vdb"), ()),
        (_disk("file", "vda", "writethrough"), ("vda",), ()),
        # Over the network (socket I/O): counted, never checked; the local disk still is.
        (
            _disk("file", "vda", "none")
            + _disk("network", "vdb", "writeback", "protocol='rbd' name='pool/img'"),
            ("vda", "vdb"),
            (LocalDisk("vda", "/x", False),),
        ),
        (_disk("volume", "vda", "none", "pool='p' volume='v'"), ("vda",), ()),
        # A block disk whose source names no device: it cannot be checked, nor the others.
        (_disk("file", "vda", "none") + _disk("block", "vdb", "none"), ("vda", "vdb"), ()),
        # An empty CD-ROM drive has no counters.
        ("<disk type='file' device='cdrom'><target dev='sda'/></disk>", (), ()),
    ],
)
def test_every_disk_is_counted_by_qemu_and_checked_where_the_cgroup_sees_it_all(
    disks: str, block_stats: tuple[str, ...], checked: tuple[LocalDisk, ...]
) -> None:
    assert plan_disks(_domain(disks)) == DiskPlan(block_stats, checked)


def test_auto_takes_the_kernel_collector_only_for_this_machines_qemu(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # This machine's /proc: its cgroups are mounted (the tests of this module read them).
    assert kernel_collector_fits("qemu:///system", run_dir=run) == ""
    for uri in ("qemu+ssh://other/system", "qemu:///session", "test:///default"):
        assert "is not this machine's system QEMU driver" in kernel_collector_fits(uri, run_dir=run)
    assert "does not run here" in kernel_collector_fits("qemu:///system", run_dir=tmp_path / "x")
    no_cgroups = tmp_path / "proc"
    (no_cgroups / "self").mkdir(parents=True)
    (no_cgroups / "self" / "mountinfo").write_text(MOUNTINFO_V2.replace("cgroup2", "tmpfs"))
    (no_cgroups / "net").mkdir()
    (no_cgroups / "net" / "dev").write_text(net_dev({"lo": (0, 0)}))
    assert "no cgroup hierarchy counts CPU" in kernel_collector_fits(
        "qemu:///system", proc=no_cgroups, run_dir=run
    )
