"""A compute host's kernel files laid out under a temporary directory, as the kernel collector
reads them on a host with cgroup v1 controllers (this machine's layout): the mount table, each
QEMU's ``/proc/PID`` files and pid file, its cgroups' counter files and ``/proc/net/dev``; the
domain list and XML from libvirt's test driver (domain ``test``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gmd.agent.collect.kernel import KernelCollector

TEST_UUID = "6695eb01-f6a4-8304-79aa-97f2502e193f"
PID = 4242
MACHINE = "machine/qemu-1-test.libvirt-qemu"

# This machine's layout: v1 controllers under a tmpfs, cgroup2 under unified/ (hugetlb only).
MOUNTINFO_V1 = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
29 25 0:26 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu
30 25 0:27 / /sys/fs/cgroup/cpuacct rw,nosuid - cgroup cgroup rw,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/blkio rw,nosuid - cgroup cgroup rw,blkio
"""
PROC_CGROUP_V1 = f"""\
7:blkio:/{MACHINE}
4:memory:/{MACHINE}
2:cpuacct:/{MACHINE}/emulator
1:cpu:/{MACHINE}/emulator
0::/{MACHINE}/emulator
"""
# Domain ``test`` of the test driver's default host, its disk opened O_DIRECT (cache='none',
# as Nova opens local disks): its cgroup's bytes are checked against QEMU's where its image
# is there (``v1_tree(checked=True)``). The default host's own ``test`` leaves the cache to
# the host: its cgroup is never checked.
NODE_XML = f"""<node><domain type='test'>
  <name>test</name><uuid>{TEST_UUID}</uuid>
  <memory unit='KiB'>8388608</memory><currentMemory unit='KiB'>2097152</currentMemory>
  <vcpu>2</vcpu><os><type arch='i686'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' cache='none'/>
      <source file='/guest/diskimage1'/><target dev='vda' bus='virtio'/></disk>
    <interface type='ethernet'><mac address='aa:bb:cc:dd:ee:ff'/>
      <target dev='testnet0'/></interface>
  </devices>
</domain></node>"""


def v1_tree(
    root: Path,
    *,
    cpu_ns: int = 7_000_000_123,
    tap: str = "testnet0",
    uri: str | None = None,
    opener: Callable[[str], Any] | None = None,
    checked: bool = False,
    check_every_s: float = 0.0,
) -> KernelCollector:
    """A v1 host with domain ``test`` (QEMU pid PID) laid out under ``root``, read from
    ``uri`` (default: a test driver host of its own, :data:`NODE_XML`). ``checked``: its disk
    image is there (:func:`lay_out_image`), so its cgroup's bytes are checked against QEMU's;
    its ``blkio.throttle.io_service_bytes`` then counts nothing yet (``Total 0``). QEMU's block
    stats are asked every tick unless ``check_every_s`` says otherwise."""
    cg = root / "sys/fs/cgroup"
    mountinfo = root / "mountinfo"
    mountinfo.write_text(MOUNTINFO_V1.replace("/sys/fs/cgroup", str(cg)))
    proc, run = root / "proc", root / "run"
    lay_out_domain(root, "test", PID, MACHINE, cpu_ns)
    (proc / "net").mkdir()
    (proc / "net" / "dev").write_text(net_dev({"lo": (5, 5), tap: (111, 999)}))
    xml = NODE_XML
    if checked:
        xml = xml.replace("/guest/diskimage1", str(lay_out_image(root)[0]))
        (cg / "blkio" / MACHINE / "blkio.throttle.io_service_bytes").write_text("Total 0\n")
    if uri is None:
        (root / "node.xml").write_text(xml)
        uri = f"test://{root / 'node.xml'}"
    return KernelCollector(
        uri,
        proc=proc,
        run_dir=run,
        mountinfo=mountinfo,
        sys_dev_block=root / "sys/dev/block",
        opener=opener,
        check_every_s=check_every_s,
    )


def lay_out_image(root: Path) -> tuple[Path, str]:
    """A disk image under ``root``, and in ``root/sys/dev/block`` the block device of the
    filesystem that holds it (this machine's, whichever it is), where the collector looks a
    checked disk's device up. Returns the image and its device as the cgroup's I/O file names
    it (``MAJ:MIN``)."""
    image = root / "guest" / "disk.img"
    image.parent.mkdir(parents=True, exist_ok=True)
    image.write_bytes(bytes(4096))
    dev = image.stat().st_dev
    name = f"{os.major(dev)}:{os.minor(dev)}"
    node = root / "sys/dev/block" / name
    node.mkdir(parents=True, exist_ok=True)
    (node / "dev").write_text(f"{name}\n")
    return image, name


def blkio_service_bytes(counted: dict[str, tuple[int, int]]) -> str:
    """A v1 ``blkio.throttle.io_service_bytes`` with these devices' (read, written) bytes."""
    lines = []
    for dev, (read, written) in counted.items():
        lines += [f"{dev} Read {read}", f"{dev} Write {written}", f"{dev} Sync {read + written}"]
        lines += [f"{dev} Async 0", f"{dev} Discard 0", f"{dev} Total {read + written}"]
    total = sum(r + w for r, w in counted.values())
    return "\n".join([*lines, f"Total {total}"]) + "\n"


def lay_out_domain(root: Path, name: str, pid: int, machine: str, cpu_ns: int) -> Path:
    """Domain ``name``'s QEMU (``pid``) in the v1 groups ``machine``: its pid file, its
    ``/proc`` files and its counter files. Returns its ``cpuacct.usage``."""
    cg = root / "sys/fs/cgroup"
    for controller, files in {
        "cpuacct": {"cpuacct.usage": f"{cpu_ns}\n"},
        "blkio": {
            "blkio.throttle.io_service_bytes": "254:0 Read 8192\n254:0 Write 4096\nTotal 12288\n"
        },
        "memory": {"memory.stat": "total_rss 1\n"},
    }.items():
        d = cg / controller / machine
        d.mkdir(parents=True)
        for file, text in files.items():
            (d / file).write_text(text)
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(PROC_CGROUP_V1.replace(MACHINE, machine))
    (proc / "statm").write_text("100000 25000 3000 1 0 20000 0\n")
    (root / "run").mkdir(exist_ok=True)
    (root / "run" / f"{name}.pid").write_text(f"{pid}")
    return cg / "cpuacct" / machine / "cpuacct.usage"


def net_dev(counters: dict[str, tuple[int, int]]) -> str:
    """A ``/proc/net/dev`` with these interfaces' (received, transmitted) bytes."""
    head = (
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets"
        " errs drop fifo colls carrier compressed\n"
    )
    return head + "".join(
        f"{name:>6}: {rx:>8} 7 0 0 0 0 0 0 {tx:>8} 9 0 0 0 0 0 0\n"
        for name, (rx, tx) in counters.items()
    )
