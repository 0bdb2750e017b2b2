"""The kernel collector's tick held close to the ``pread`` of its files (issue 33), and what it
must not lose for it: files that fail are opened again only by the paths of the VM's process
of the moment; what an idle VM's files repeat is not parsed again, and anything they change is.

Real files throughout: the laid-out trees of tests/support/kernel_host.py, real ``/proc``
files of processes started here (a dead process's gives ESRCH), and, where the test may make
one, a real cgroup (a removed cgroup's open file gives ENODEV; one made again by the same path
counts from zero)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmd.agent.collect.base import Ownership, VmReading, vm_reading
from gmd.agent.collect.kernel import KernelCollector
from gmd.agent.collect.kernel_files import CgroupFiles, CounterFiles, CpuFile, IoFile, KernelSources
from gmd.agent.collect.kernel_parsers import (
    NetDevParser,
    parse_cpu_stat,
    parse_cpuacct_usage,
    parse_net_dev,
)
from tests.support.kernel_host import PID, TEST_UUID, net_dev, v1_tree

PAGE = os.sysconf("SC_PAGE_SIZE")
CGROUP2 = Path("/sys/fs/cgroup/unified")
"""this machine's cgroup2 mount (a hybrid host: v1 controllers beside it, none in it)"""


def _resident(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _sleeper(processes: list[subprocess.Popen[bytes]], touch_mib: int = 0) -> int:
    """A process that sleeps, ``touch_mib`` MiB resident; its pid once it is so."""
    code = (
        f"b = bytearray({touch_mib} << 20)\n"
        "b[::4096] = b'1' * len(b[::4096])\n"
        "print(flush=True)\n"
        "import time; time.sleep(120)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    processes.append(p)
    assert p.stdout is not None and p.stdout.readline() == b"\n"
    return p.pid


def test_files_that_failed_are_opened_again_only_by_the_paths_of_the_vms_process_now(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """The VM's QEMU dies: its open ``/proc/<pid>/statm`` gives ESRCH and the VM is read
    through libvirt. Its pid, recycled, now names another process (here: the tree's
    ``/proc/<pid>`` entry made a link to a live process's). The VM's files are not opened
    again by the old paths, which would read that process as the VM: it is described again,
    and with no pid file (libvirt removes it with the process) it stays read through libvirt.
    Once its new QEMU runs (a new pid file), its files are that process's."""
    qemu, impostor = _sleeper(processes), _sleeper(processes, touch_mib=48)
    collector = v1_tree(tmp_path)
    statm = tmp_path / "proc" / str(PID) / "statm"
    pid_file = tmp_path / "run" / "test.pid"
    statm.unlink()
    statm.symlink_to(f"/proc/{qemu}/statm")
    try:
        first, qemu_rss = collector.collect(), _resident(qemu)
        os.kill(qemu, 9)
        processes[0].wait()
        pid_file.unlink()
        statm.unlink()
        statm.symlink_to(f"/proc/{impostor}/statm")
        died = collector.collect()
        after = [collector.collect() for _ in range(2)]
        # Its new process: libvirt's pid file names it (the tree lays its /proc entry out).
        restarted = _sleeper(processes, touch_mib=8)
        new_proc = tmp_path / "proc" / str(restarted)
        new_proc.mkdir()
        (new_proc / "cgroup").write_text((statm.parent / "cgroup").read_text())
        (new_proc / "statm").symlink_to(f"/proc/{restarted}/statm")
        pid_file.write_text(f"{restarted}")
        collector.describe_every_s = 0.0  # a restart brings a new domain id, and so this
        back = collector.collect()
        impostor_rss, restarted_rss = _resident(impostor), _resident(restarted)
    finally:
        collector.close()
    assert first.fallbacks == frozenset() and first.vms[0].memory_rss_bytes == qemu_rss
    for reading in (died, *after):
        assert reading.fallbacks == {TEST_UUID}, reading
        assert all(v.memory_rss_bytes != impostor_rss for v in reading.vms)
    assert back.fallbacks == frozenset() and back.vms[0].memory_rss_bytes == restarted_rss


def _own_cgroup(name: str) -> Path:
    """A cgroup of this test's in the cgroup2 hierarchy, or a skip where none can be made."""
    path = CGROUP2 / name
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup in {CGROUP2}: {exc.strerror}")
    return path


def test_a_cgroup_removed_and_made_again_is_read_anew_not_through_the_old_descriptor(
    tmp_path: Path,
) -> None:
    """The cgroup the VM's CPU is read in is removed and made again by the same path (libvirt
    does so when the VM's process restarts under the same name and id): its open file gives
    ENODEV, the VM is read through libvirt for that tick, and the tick after reads the new
    cgroup from its own zero, not the old one's count."""
    group = _own_cgroup(f"gmd-test-{os.getpid()}")
    try:
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.05: pass\n"
        p = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()\n" + burn], stdin=subprocess.PIPE
        )
        (group / "cgroup.procs").write_text(f"{p.pid}")
        p.communicate(b"")
        used_ns = parse_cpu_stat((group / "cpu.stat").read_text())
        assert used_ns >= 50_000_000
        mountinfo = next(
            line
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if " - cgroup2 " in line
        )
        (tmp_path / "mountinfo").write_text(mountinfo + "\n")
        proc = tmp_path / "proc"
        (proc / str(PID)).mkdir(parents=True)
        (proc / str(PID) / "cgroup").write_text(f"0::/{group.name}/emulator\n")
        (proc / str(PID) / "statm").write_text("100000 25000 3000 1 0 20000 0\n")
        (proc / "net").mkdir()
        (proc / "net" / "dev").write_text(net_dev({"testnet0": (111, 999)}))
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "test.pid").write_text(f"{PID}")
        # No disk: its I/O (no io.stat in this cgroup2, which has no io controller) is not read.
        (tmp_path / "node.xml").write_text(
            f"<node><domain type='test'><name>test</name><uuid>{TEST_UUID}</uuid>"
            "<memory unit='KiB'>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os>"
            "<devices><interface type='ethernet'><target dev='testnet0'/></interface>"
            "</devices></domain></node>"
        )
        collector = KernelCollector(
            f"test://{tmp_path / 'node.xml'}",
            proc=proc,
            run_dir=tmp_path / "run",
            mountinfo=tmp_path / "mountinfo",
        )
        try:
            first = collector.collect()
            group.rmdir()
            group.mkdir()
            removed = collector.collect()
            again = collector.collect()
        finally:
            collector.close()
    finally:
        group.rmdir()
    assert first.fallbacks == frozenset() and first.vms[0].cpu_time_ns == used_ns
    assert removed.fallbacks == {TEST_UUID}
    assert again.fallbacks == frozenset() and again.vms[0].cpu_time_ns == 0


def test_an_idle_vms_figures_are_not_parsed_again_and_any_change_is_read(tmp_path: Path) -> None:
    """Files whose bytes are the last reading's give the last reading's figures (the same
    mappings: readings never change theirs); the tick after a file changes reads the change,
    and a file changed back to earlier bytes reads as those again."""
    collector = v1_tree(tmp_path)
    cg = tmp_path / "sys/fs/cgroup"
    blkio = next(cg.glob("blkio/**/blkio.throttle.io_service_bytes"))
    usage = next(cg.glob("cpuacct/**/cpuacct.usage"))
    statm = tmp_path / "proc" / str(PID) / "statm"
    dev = tmp_path / "proc" / "net" / "dev"
    # The cgroup's disk bytes, which the collector reads to check QEMU's (with the image of a
    # checked disk), through the same files as it.
    files = CounterFiles(
        KernelSources(
            CgroupFiles((CpuFile.CPUACCT_USAGE, usage), (IoFile.BLKIO_SERVICE_BYTES, blkio)),
            statm,
            ("testnet0",),
        )
    )
    net = {b"testnet0": (999, 111)}
    try:
        first, idle = collector.collect(), collector.collect()
        io_first, io_idle = files.read(net, PAGE), files.read(net, PAGE)
        usage.write_text("7000000999\n")
        blkio.write_text("254:0 Read 9000\n254:0 Write 5000\nTotal 14000\n")
        statm.write_text("100000 26000 3000 1 0 20000 0\n")
        dev.write_text(net_dev({"lo": (5, 5), "testnet0": (222, 1999)}))
        changed, io_changed = collector.collect(), files.read(net, PAGE)
        blkio.write_text("254:0 Read 8192\n254:0 Write 4096\nTotal 12288\n")
        back, io_back = collector.collect(), files.read(net, PAGE)
    finally:
        collector.close()
        files.close()
    (a,), (b,), (c,), (d,) = first.vms, idle.vms, changed.vms, back.vms
    assert b.nics is a.nics and io_idle.disks is io_first.disks
    assert (b.memory_rss_bytes, io_idle.disks, b.nics) == (
        25000 * PAGE,
        {"host:254:0": (8192, 4096)},
        {"testnet0": (999, 111)},
    )
    assert c.cpu_time_ns == 7_000_000_999 and c.memory_rss_bytes == 26000 * PAGE
    assert io_changed.disks == {"host:254:0": (9000, 5000)}
    assert c.nics == {"testnet0": (1999, 222)}
    assert io_back.disks == {"host:254:0": (8192, 4096)} and d.nics is c.nics


def test_a_reading_made_for_the_tick_is_an_ordinary_frozen_reading() -> None:
    args = ("u", 3, 1.5, 10, 20, {"vda": (1, 2)}, {"tap0": (3, 4)}, Ownership("p"), "vm")
    fast, made = vm_reading(*args), VmReading(*args)
    assert type(fast) is VmReading and fast == made and repr(fast) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.cpu_time_ns = 11  # type: ignore[misc]
    assert dataclasses.replace(fast, cpu_time_ns=11) == dataclasses.replace(made, cpu_time_ns=11)


def _reference_cpu_stat(text: str) -> int:
    """The text parse the bytes parse replaced."""
    fields = text.split()
    try:
        return int(fields[fields.index("usage_usec") + 1]) * 1000
    except ValueError:
        raise ValueError("no usage_usec") from None


@pytest.mark.parametrize(
    "text",
    [
        "usage_usec 4321\nuser_usec 4000\nsystem_usec 321\n",
        "usage_usec 5",
        "user_usec 1\nusage_usec 7\n",
        "usage_usec x\nuser_usec 1\n",
        "usage_usec \nusage_usec 3\n",
        "usage_usec",
        "",
    ],
)
def test_the_cpu_stat_parse_answers_as_the_text_parse(text: str) -> None:
    try:
        expected: int | type[Exception] = _reference_cpu_stat(text)
    except (ValueError, IndexError) as exc:
        expected = type(exc)
    if isinstance(expected, int):
        assert parse_cpu_stat(text) == expected
    else:
        with pytest.raises(expected):
            parse_cpu_stat(text)
    assert parse_cpuacct_usage(" 12\n") == 12


def test_net_dev_lines_seen_before_give_the_same_counters_and_changed_ones_new() -> None:
    parse = NetDevParser()
    text = net_dev({"lo": (1, 2), "tap-a": (30, 40), "tap-b": (50, 60)})
    first = parse(text.encode())
    assert first == {b"lo": (2, 1), b"tap-a": (40, 30), b"tap-b": (60, 50)}  # the guest's view
    again = parse(text.encode())
    assert again == first and again[b"tap-a"] is first[b"tap-a"]
    moved = parse(net_dev({"tap-b": (51, 60), "lo": (1, 2), "tap-a": (30, 40)}).encode())
    assert moved == {b"lo": (2, 1), b"tap-a": (40, 30), b"tap-b": (60, 51)}
    assert parse_net_dev(text) == {"lo": (1, 2), "tap-a": (30, 40), "tap-b": (50, 60)}


def test_a_steady_tick_reads_every_vm_anew(tmp_path: Path) -> None:
    """Ticks that re-use their plan still read each file every time."""
    collector = v1_tree(tmp_path)
    usage = next((tmp_path / "sys/fs/cgroup").glob("cpuacct/**/cpuacct.usage"))
    try:
        seen = []
        for i in range(5):
            usage.write_text(f"{7_000_000_000 + i}\n")
            seen.append(collector.collect().vms[0].cpu_time_ns)
    finally:
        collector.close()
    assert seen == [7_000_000_000 + i for i in range(5)]
