"""Where a VM's disks are on the host: their sources in its domain XML, and the host's whole
disk under each, for the cgroup applier's disk limits (cgroups throttle disks) and for the
knob probe (a disk weight does something only where a proportional scheduler runs the disk
under a VM's image)."""

from __future__ import annotations

import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

SYS_DEV_BLOCK = Path("/sys/dev/block")
"""the host's block devices by number (``MAJ:MIN``), each a link to its place in sysfs"""


def whole_disk(majmin: str, sys_dev_block: Path = SYS_DEV_BLOCK) -> str | None:
    """``MAJ:MIN`` of the whole disk a device is a partition of, or the device itself (what
    cgroups count and throttle, and whose scheduler runs it); None when a partition's disk
    cannot be read."""
    node = sys_dev_block / majmin
    try:
        if (node / "partition").exists():
            return (node.resolve().parent / "dev").read_text().strip()
    except OSError:
        return None
    return majmin


def block_device(path: str) -> str | None:
    """``MAJ:MIN`` of the whole disk holding ``path`` (a block device itself, or a file on a
    filesystem), since cgroups throttle disks, not partitions; ``None`` when there is none (a
    network disk, a missing file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:  # tmpfs, overlay, NFS...: no block device to throttle
        return None
    return whole_disk(f"{major}:{minor}") or f"{major}:{minor}"


def disk_sources(xml: str) -> list[str]:
    """Host paths of the domain's file and block disks: the only ones a cgroup can throttle."""
    root = ET.fromstring(xml)
    out = []
    for disk in root.iterfind("devices/disk"):
        source = disk.find("source")
        if disk.get("device", "disk") != "disk" or source is None:
            continue
        path = source.get("file") or source.get("dev")
        if path:
            out.append(path)
    return out
