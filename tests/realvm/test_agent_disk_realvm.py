"""A guest that reads its disk is measured with the I/O that reached the host's disk, by the
collector the agent chooses on this host (issue 42).

On kernel 6.18 with cgroup v1, ``blkio.throttle.io_service_bytes`` stayed at 0 while a guest
read ~6.7 MB/s: Linux 6.10 and later count a device's I/O there only once a throttle limit has
been set on the device. The kernel collector now sets that up itself (a limit no disk reaches,
set and lifted at once in a group of its own: :func:`gmd.agent.collect.kernel_disks.
enable_io_accounting`). Whether a host's devices counted before depends on its kernel, its
cgroup version and on whether anyone ever set a limit on them, so the tests do not assume it:
each first probes, by the guest's cgroup and QEMU's block stats, what this host did, and then
checks that the collector measures the guest's disk all the same, within the check's factor
of QEMU's figures (the guest's disk is opened ``O_DIRECT``: every request reaches the disk).

The second test puts the guest's disk on a loop device made for it (``LOOP_CTL_ADD``): a new
queue, on which no throttle limit was ever set, which the kernel of this issue does not count
until the collector sets it up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gmd.agent.collect.base import Collector, HostReading
    from tests.support.realvm import Guest, RealGuests

pytest_plugins = ("tests.support.realvm",)

MIB = 1 << 20
MOVED = 8 * MIB
"""what the guest must have read between two looks (its loop reads its 8 MiB disk each pass)"""
TIMEOUT_S = 120.0


def _poll(what: str, done: Callable[[], Any], timeout_s: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = done()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.2)


def _whole_disk(dev: int) -> str:
    """``MAJ:MIN`` of the whole disk under device ``dev`` (a partition's disk), as sysfs says."""
    name = f"{os.major(dev)}:{os.minor(dev)}"
    node = Path("/sys/dev/block") / name
    if (node / "partition").exists():
        return (node.resolve().parent / "dev").read_text().strip()
    return name


def _disk_device(source: Path) -> str | None:
    """The host block device the kernel counts the guest's disk on, or ``None`` (no block
    device under it: tmpfs, NFS, overlay, btrfs)."""
    st = source.stat()
    dev = st.st_rdev if source.is_block_device() else st.st_dev
    if not (Path("/sys/dev/block") / f"{os.major(dev)}:{os.minor(dev)}").exists():
        return None
    return _whole_disk(dev)


def _probe(guest: Guest, source: Path, dom: Any) -> str:
    """The path this host takes for ``guest``'s disk: ``"counts"`` when its cgroup's I/O file
    moved with QEMU's bytes on the disk's device, ``"counts nothing"`` when it did not move at
    all while the guest read, ``"unchecked"`` when the collector does not check this disk (left
    to the host's page cache, or on no block device)."""
    from gmd.agent.cgroups import CgroupLocator
    from gmd.agent.collect.kernel_files import IoFile, counter_files
    from gmd.agent.collect.kernel_parsers import parse_blkio_service_bytes, parse_io_stat

    device = _disk_device(source)
    if guest.disk_cache not in ("none", "directsync") or device is None:
        return "unchecked"
    io = counter_files(CgroupLocator().of_domain(guest.name)).io
    assert io is not None, f"{guest.name}: QEMU in no blkio (v1) or v2 cgroup"
    kind, path = io
    parse = parse_blkio_service_bytes if kind is IoFile.BLKIO_SERVICE_BYTES else parse_io_stat

    def both() -> tuple[int, int]:
        host = sum(parse(path.read_text()).get(f"host:{device}", (0, 0)))
        _reqs, read, _wreqs, written, _errs = dom.blockStats(guest.disk_target)
        return host, read + written

    host0, guest0 = both()

    def moved() -> tuple[int, int] | None:
        now = both()
        return now if now[1] >= guest0 + MOVED else None

    host1, guest1 = _poll("the guest reading its disk", moved)
    if host1 == host0:
        return "counts nothing"
    # The kernel counts this device (O_DIRECT: every byte the guest asks reaches it).
    assert host1 - host0 >= (guest1 - guest0) // 2, (host1 - host0, guest1 - guest0)
    return "counts"


def _measure(collector: Collector, guest: Guest, others: list[Guest], conn: Any) -> dict[str, Any]:
    """Ticks until the guest's disk use has grown by 4 × :data:`MOVED` in the readings;
    checks every reading on the way and what the readings become (the aggregate's spans),
    against QEMU's block stats over the same ticks; returns the figures."""
    from gmd.agent.collect.aggregate import AgentState, advance

    dom = conn.lookupByUUIDString(guest.uuid)
    first = _poll("the guest read", lambda: _read(collector, guest))
    qemu_first = _qemu(dom, guest)
    state = advance(AgentState(), first, 60).state
    ticks = [first]

    def enough() -> bool:
        reading = collector.collect()
        ticks.append(reading)
        return sum(_disk(reading, guest)) - sum(_disk(first, guest)) >= 4 * MOVED

    _poll("the guest measured", enough)
    qemu_last = _qemu(dom, guest)
    used = [0.0, 0.0]
    for reading in ticks:
        assert reading.ok and not reading.errors and not reading.fallbacks, reading
        assert not {g.uuid for g in others} & reading.disk_disagreements
    for reading in ticks[1:]:
        result = advance(state, reading, 60)
        state = result.state
        for span in result.spans:
            if span.uuid == guest.uuid:
                used[0] += span.usage.disk_read_bytes
                used[1] += span.usage.disk_write_bytes
    asked = (qemu_last[0] - qemu_first[0], qemu_last[1] - qemu_first[1])
    return {
        "used": used,
        "asked": asked,
        "names": sorted({d for r in ticks for v in r.vms if v.uuid == guest.uuid for d in v.disks}),
        "named": [guest.uuid in r.disk_disagreements for r in ticks],
    }


def _qemu(dom: Any, guest: Guest) -> tuple[int, int]:
    _reqs, read, _wreqs, written, _errs = dom.blockStats(guest.disk_target)
    return read, written


def _read(collector: Collector, guest: Guest) -> HostReading | None:
    reading = collector.collect()
    vm = next((v for v in reading.vms if v.uuid == guest.uuid), None)
    return reading if vm is not None and vm.disks else None


def _disk(reading: HostReading, guest: Guest) -> tuple[int, int]:
    """The guest's disk counters in a reading, over its devices (whatever their names)."""
    (vm,) = (v for v in reading.vms if v.uuid == guest.uuid)
    return sum(r for r, _w in vm.disks.values()), sum(w for _r, w in vm.disks.values())


def _default_collector(uri: str, tmp_path: Path) -> tuple[Collector, str]:
    from gmd.agent.collectors import host_collector
    from gmd.agent.config import parse_agent

    config = parse_agent(
        {"agent": {"libvirt_uri": uri, "host": "realvm", "spool_path": str(tmp_path / "s.db")}}
    )
    return host_collector(config)


def _check_path(path: str, figures: dict[str, Any], collector: Collector, guest: Guest) -> None:
    """What the collector measured of ``guest``, whose disk took ``path`` on this host before
    the collector started."""
    from gmd.agent.collect.kernel import KernelCollector

    read, written = figures["used"]
    assert read >= 4 * MOVED // 2 and written > 0, figures  # the guest's disk use, not 0 B
    if isinstance(collector, KernelCollector) and path != "unchecked":
        # What reached the host's disk, by its cgroup, which the collector made count: the
        # guest's requests, O_DIRECT, within the check's factor of QEMU's over the same ticks.
        assert all(name.startswith("host:") for name in figures["names"]), figures
        asked_read = figures["asked"][0]
        assert asked_read / 2 <= read <= 2 * asked_read, figures
        assert not figures["named"][-1], figures["named"]
    else:
        assert figures["names"] == [guest.disk_target], figures


def test_a_guest_reading_its_disk_is_measured_by_the_default_collector(
    real_guests: RealGuests, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spin, idle = real_guests.spin, real_guests.idle
    conn = real_guests.connect()
    collector, why = _default_collector(real_guests.uri, tmp_path)
    caplog.set_level(logging.INFO, logger="gmd.agent.collect.kernel")
    try:
        path = _probe(spin, spin.disk, conn.lookupByUUIDString(spin.uuid))
        figures = _measure(collector, spin, [idle], conn)
    finally:
        collector.close()
        conn.close()
    _check_path(path, figures, collector, spin)
    print(f"{why}; the spin guest's disk ({spin.disk_cache}): the cgroup {path};", figures)


LOOP_CTL_ADD, LOOP_CTL_REMOVE = 0x4C80, 0x4C81


@contextlib.contextmanager
def _new_loop_device(image: Path) -> Iterator[Path]:
    """A loop device made for this test (a new queue: no throttle limit was ever set on it),
    attached to ``image``; detached and removed afterwards."""
    try:
        control = os.open("/dev/loop-control", os.O_RDWR)
    except OSError as exc:
        pytest.fail(f"no loop devices here ({exc.strerror}): this test needs root and loop")
    try:
        index = next(i for i in range(200, 1000) if not Path(f"/sys/block/loop{i}").exists())
        fcntl.ioctl(control, LOOP_CTL_ADD, index)
        device = Path(f"/dev/loop{index}")
        try:
            _poll("the loop device's node", device.is_block_device, timeout_s=10)
            subprocess.run(["losetup", str(device), str(image)], check=True, timeout=30)
            try:
                yield device
            finally:
                subprocess.run(["losetup", "-d", str(device)], check=True, timeout=30)
        finally:
            _poll("the loop device removed", lambda: _remove_loop(control, index), timeout_s=30)
    finally:
        os.close(control)


def _remove_loop(control: int, index: int) -> bool:
    try:
        fcntl.ioctl(control, LOOP_CTL_REMOVE, index)
    except OSError:
        return False  # busy for a moment after its detach
    return True


def test_a_guest_on_a_device_never_throttled_is_measured_once_the_collector_sets_up_counting(
    real_guests: RealGuests, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.guest_image import build_guest_image
    from tests.support.realvm import _new_guest, _remove_domain, _wait_ready, domain_xml

    image = build_guest_image()
    guest = _new_guest("spin", os.getpid(), tmp_path, index=904)
    conn = real_guests.connect()
    collector, why = _default_collector(real_guests.uri, tmp_path)
    caplog.set_level(logging.INFO, logger="gmd.agent.collect.kernel")
    try:
        with _new_loop_device(guest.disk) as device:
            # A raw block device, opened O_DIRECT as Nova opens local disks.
            guest = dataclasses.replace(guest, disk_cache="none")
            xml = domain_xml(guest, image.kernel, image.initrd)
            xml = xml.replace("<disk type='file'", "<disk type='block'").replace(
                f'<source file="{guest.disk}"/>', f'<source dev="{device}"/>'
            )
            assert f'<source dev="{device}"/>' in xml
            try:
                conn.defineXML(xml).create()
                _wait_ready(conn, [guest])
                path = _probe(guest, device, conn.lookupByUUIDString(guest.uuid))
                figures = _measure(collector, guest, [real_guests.idle], conn)
            finally:
                _remove_domain(conn, guest.name, guest.tap)
    finally:
        collector.close()
        conn.close()
    # A device no limit was ever set on: this kernel's cgroup counted nothing of it until the
    # collector set its accounting up; the guest is measured all the same.
    _check_path(path, figures, collector, guest)
    print(f"{why}; a guest on {device} (new): the cgroup {path} before;", figures)
