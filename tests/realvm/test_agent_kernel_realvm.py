"""The kernel collector and the libvirt collector agree on real QEMU guests (issue 19).

Both read the same two TCG guests of tests/support/realvm.py under the real libvirtd, back to back
with the guests paused (so that both see the same counters however busy the machine), at two
moments a few seconds apart. CPU comes from the same cgroup counter (libvirt reads it
for ``cpu.time``), memory from the same process counter (libvirt's ``balloon.rss``), network
from the same tap counters: they must agree. The guests' disks are opened O_DIRECT
(``cache='none'``, as Nova opens local disks), so every byte the guest reads or writes reaches
the host's block layer and the cgroup's count must equal QEMU's, byte for byte.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gmd.agent.collect.base import HostReading
    from tests.support.realvm import RealGuests

pytest_plugins = ("tests.support.realvm",)

SPAN_S = 4.0


def test_kernel_and_libvirt_collectors_agree_per_vm(real_guests: RealGuests) -> None:
    from gmd.agent.collect.kernel import KernelCollector
    from gmd.agent.collect.libvirt import LibvirtCollector

    kernel, bulk = KernelCollector(real_guests.uri), LibvirtCollector(real_guests.uri)
    conn = real_guests.connect()
    domains = [conn.lookupByUUIDString(g.uuid) for g in real_guests.guests]

    def at_one_moment() -> tuple[HostReading, HostReading]:
        """Both collectors' readings of the guests paused (virDomainSuspend stops their
        vCPUs): the spinner's CPU counter stands still between the two readings, however
        long the busy machine makes the gap between them (issue 27: 1.219 s against 1.182
        under a load average of 5, when the spinner kept running in between)."""
        for dom in domains:
            dom.suspend()
        try:
            return kernel.collect(), bulk.collect()
        finally:
            for dom in domains:
                dom.resume()

    try:
        k0, l0 = at_one_moment()
        time.sleep(SPAN_S)
        k1, l1 = at_one_moment()

        # Network: the same tap counters. A libvirt reading bracketed by two kernel readings
        # that agree (no packet in between) must equal them, byte for byte.
        exact = {}
        for _ in range(50):
            before, middle, after = kernel.collect(), bulk.collect(), kernel.collect()
            for g in real_guests.guests:
                a, m, b = (
                    {v.uuid: v for v in r.vms}[g.uuid].nics[g.tap] for r in (before, middle, after)
                )
                if a == b:
                    assert m == a, f"{g.name}: libvirt {m} != kernel {a} (guest rx, tx)"
                    exact[g.role] = a
            if len(exact) == 2:
                break
        assert set(exact) == {"spin", "idle"}, "the counters never held still for a reading"

        def quiet_disks() -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
            """Per guest: its disk bytes (read, written) by both collectors, at a moment when
            two kernel readings around the libvirt one agree (the guest did no I/O)."""
            out = {}
            for _ in range(100):
                before, middle, after = kernel.collect(), bulk.collect(), kernel.collect()
                for g in real_guests.guests:
                    a, m, b = (
                        {v.uuid: v for v in r.vms}[g.uuid].disks for r in (before, middle, after)
                    )
                    if a == b and g.role not in out:
                        total = tuple(sum(d[i] for d in a.values()) for i in (0, 1))
                        out[g.role] = (total, m[g.disk_target])
                if len(out) == 2:
                    return out
                time.sleep(0.05)
            raise AssertionError("the disks never held still for a reading")

        disks_before = quiet_disks()
        time.sleep(SPAN_S)
        disks_after = quiet_disks()

        times = {"kernel": [], "libvirt": []}
        for _ in range(10):
            for name, c in (("kernel", kernel), ("libvirt", bulk)):
                t0 = time.perf_counter()
                c.collect()
                times[name].append(time.perf_counter() - t0)
    finally:
        kernel.close()
        bulk.close()
        conn.close()

    for r in (k0, k1):
        assert r.ok and not r.errors and r.fallbacks == frozenset(), r
    for g in real_guests.guests:
        k = [{v.uuid: v for v in r.vms}[g.uuid] for r in (k0, k1)]
        lv = [{v.uuid: v for v in r.vms}[g.uuid] for r in (l0, l1)]
        assert k[0].owner == lv[0].owner and k[0].name == g.name
        k_cpu = k[1].cpu_time_ns - k[0].cpu_time_ns
        l_cpu = lv[1].cpu_time_ns - lv[0].cpu_time_ns
        # Within 2 % of the span's CPU (the idle guest's own use is too small for a ratio).
        span_ns = (k[1].taken_s - k[0].taken_s) * 1e9
        assert abs(k_cpu - l_cpu) <= 0.02 * max(l_cpu, span_ns if g.role == "idle" else 0), (
            g.name,
            k_cpu,
            l_cpu,
        )
        for a, b in zip(k, lv, strict=True):
            assert abs(a.memory_rss_bytes - b.memory_rss_bytes) <= 0.02 * b.memory_rss_bytes, (
                g.name,
                a.memory_rss_bytes,
                b.memory_rss_bytes,
            )
        (k0_disk, l0_disk), (k1_disk, l1_disk) = disks_before[g.role], disks_after[g.role]
        k_disk = [k1_disk[i] - k0_disk[i] for i in (0, 1)]
        l_disk = [l1_disk[i] - l0_disk[i] for i in (0, 1)]
        assert k_disk == l_disk, (g.name, g.disk_cache, k_disk, l_disk)
        print(
            f"{g.role}: cpu kernel {k_cpu / 1e9:.4f} s libvirt {l_cpu / 1e9:.4f} s;"
            f" rss kernel {k[1].memory_rss_bytes} libvirt {lv[1].memory_rss_bytes};"
            f" disk (read, written) over {SPAN_S:g}+ s kernel {k_disk} libvirt {l_disk};"
            f" nics {exact[g.role]}"
        )
        if g.role == "idle":
            assert k_disk == [0, 0]
        else:
            assert k_disk[0] > 0 and k_disk[1] > 0, k_disk
    print(
        "ms per collect (2 VMs, median of 10): "
        + ", ".join(f"{n} {statistics.median(t) * 1000:.2f}" for n, t in times.items())
    )


def test_a_stuck_domain_does_not_stall_the_libvirt_collectors_tick(
    real_guests: RealGuests,
) -> None:
    """A QEMU that stops answering its monitor, with another caller's job waiting on it: the
    bulk call skips that domain (NOWAIT) instead of waiting 30 s for its job, reads the
    others, and reads it again once it answers."""
    import contextlib
    import os
    import signal
    import subprocess
    import threading

    import libvirt

    from gmd.agent.collect.libvirt import LibvirtCollector

    spin, idle = real_guests.spin, real_guests.idle
    found = subprocess.run(
        ["pgrep", "-f", f"guest={spin.name},"], capture_output=True, text=True, check=True
    )
    (pid,) = (int(p) for p in found.stdout.split())
    holder = real_guests.connect()
    collector = LibvirtCollector(real_guests.uri)
    try:
        assert {v.uuid for v in collector.collect().vms} >= {spin.uuid, idle.uuid}
        domain = holder.lookupByUUIDString(spin.uuid)

        def wait_on_the_monitor() -> None:
            with contextlib.suppress(libvirt.libvirtError):
                domain.blockStats(spin.disk_target)

        os.kill(pid, signal.SIGSTOP)
        try:
            stuck = threading.Thread(target=wait_on_the_monitor, daemon=True)
            stuck.start()
            stuck.join(1.0)
            assert stuck.is_alive(), "the monitor call returned from a stopped QEMU"
            started = time.monotonic()
            reading = collector.collect()
            took = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        stuck.join(60)
        assert took < 10, f"the tick waited {took:.1f} s for the stuck domain's job"
        assert reading.ok
        assert idle.uuid in {v.uuid for v in reading.vms}
        assert spin.uuid not in {v.uuid for v in reading.vms}
        # busy, not an error: it is read again at a later tick, from its last counters
        assert spin.uuid in reading.busy and not reading.errors, (reading.busy, reading.errors)
        assert {v.uuid for v in collector.collect().vms} >= {spin.uuid, idle.uuid}
    finally:
        collector.close()
        holder.close()


def test_a_guest_started_during_a_tick_is_read_once_its_event_arrives(
    real_guests: RealGuests, tmp_path: Path
) -> None:
    """The kernel collector lists the domains again after a lifecycle event, so a guest that
    starts while a tick is being read is read, with its owner, at the first tick after
    libvirt's STARTED event reached the agent (it comes within milliseconds; a real agent's
    next tick is seconds away)."""
    import os
    import threading

    from gmd.agent.collect.kernel import KernelCollector
    from tests.support.guest_image import build_guest_image
    from tests.support.realvm import _new_guest, _remove_domain, domain_xml

    image = build_guest_image()
    guest = _new_guest("idle", os.getpid(), tmp_path, index=900)
    conn = real_guests.connect()
    collector = KernelCollector(real_guests.uri)
    try:
        collector.collect()
        starting = threading.Thread(
            target=lambda: conn.defineXML(domain_xml(guest, image.kernel, image.initrd)).create()
        )
        starting.start()
        during = collector.collect()
        starting.join(60)
        after = _collect_until(collector, lambda r: guest.uuid in {v.uuid for v in r.vms})
        read = {v.uuid: v for v in after.vms}
        assert read[guest.uuid].owner.customer == guest.project_uuid
        assert read[guest.uuid].cpu_time_ns > 0
        assert {real_guests.spin.uuid, real_guests.idle.uuid} <= {v.uuid for v in during.vms}
    finally:
        collector.close()
        _remove_domain(conn, guest.name, guest.tap)
        conn.close()


SHUTDOWN_ATTEMPTS = 3
"""Guests powered off in turn until the collector's read at SHUTDOWN beats libvirt's kill"""


def test_a_guest_that_shuts_down_between_ticks_keeps_its_last_seconds(
    real_guests: RealGuests, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A spinning guest powers itself off seconds after a tick. Its cgroup is gone before
    libvirt says it stopped, so without the reading taken at its SHUTDOWN event those seconds
    would be lost; with it, a later tick carries the guest's counters at its end: at least
    what the test itself last saw in the guest's cgroup before it vanished.

    Which tick carries it depends on when libvirt's events reach the collector (on a busy
    machine the tick that still lists the guest may already find it gone and send it), so the
    test folds every tick until the guest is no longer listed and looks in all of them.

    The read at SHUTDOWN races libvirt, which kills QEMU right after sending the event (and
    removes its cgroup): a collector whose event thread is late finds the files gone (CI saw
    it once in many runs, with this test's own thread reading the cgroup every millisecond
    beside it). What the product promises then is to say so ("too late to read", the tick's
    seconds lost as for a destroyed domain: gmd/agent/collect/kernel.py): a guest whose end
    was not read must have that line, and another guest is powered off, up to
    :data:`SHUTDOWN_ATTEMPTS`; one of them must be read at its end."""
    caplog.set_level(logging.INFO, logger="gmd.agent.collect.kernel")
    for attempt in range(SHUTDOWN_ATTEMPTS):
        caplog.clear()
        ended = _power_off_between_ticks(real_guests, tmp_path / f"try{attempt}", 901 + attempt)
        if ended is not None:
            break
        assert "too late to read" in caplog.text, (
            "no reading at the guest's end, and the collector did not say it came too late:\n"
            + caplog.text[-3000:]
        )
    else:
        pytest.fail(f"the read at SHUTDOWN lost the race with libvirt {SHUTDOWN_ATTEMPTS} times")
    print(f"read at its end on attempt {attempt + 1}: {ended}")


def _power_off_between_ticks(real_guests: RealGuests, tmp_path: Path, index: int) -> str | None:
    """One guest spins, is read at a tick, then powers itself off; every tick until it is no
    longer listed is folded. ``None`` when no tick carries a reading of its end (the event's
    read came too late); otherwise the checks of the reading at its end hold, and what was
    kept is said."""
    import os
    import threading

    from gmd.agent.cgroups import CgroupLocator
    from gmd.agent.collect.aggregate import AgentState, advance
    from gmd.agent.collect.kernel import KernelCollector
    from gmd.agent.collect.kernel_files import CpuFile, counter_files
    from gmd.agent.collect.kernel_parsers import parse_cpu_stat, parse_cpuacct_usage
    from tests.support.guest_image import build_guest_image
    from tests.support.realvm import _new_guest, _remove_domain, _wait_ready, domain_xml

    tmp_path.mkdir(parents=True, exist_ok=True)
    image = build_guest_image()
    guest = _new_guest("spin", os.getpid(), tmp_path, index=index)
    conn = real_guests.connect()
    collector = KernelCollector(real_guests.uri)
    seen: list[int] = []
    seen_s: list[float] = []
    try:
        xml = domain_xml(guest, image.kernel, image.initrd, cmdline="gmd.poweroff_after=5")
        dom = conn.defineXML(xml)
        dom.create()
        _wait_ready(conn, [guest])
        first = _collect_until(collector, lambda r: guest.uuid in {v.uuid for v in r.vms})
        state = advance(AgentState(), first, 60).state
        start = {v.uuid: v for v in first.vms}[guest.uuid]

        # What the test sees of the guest's CPU counter, as often as it can, until it is gone.
        cgroups = counter_files(CgroupLocator().of_domain(guest.name))
        kind, cpu_file = cgroups.cpu
        parse = parse_cpuacct_usage if kind is CpuFile.CPUACCT_USAGE else parse_cpu_stat

        def watch() -> None:
            while True:
                looked_s = time.time()
                try:
                    seen.append(parse(cpu_file.read_text()))
                except (OSError, ValueError):
                    return
                seen_s.append(looked_s)
                time.sleep(0.001)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + 60
        while dom.isActive():
            assert time.monotonic() < deadline, "the guest did not power itself off"
            time.sleep(0.05)
        watcher.join(10)

        ticks: list[HostReading] = []

        def stopped(reading: HostReading) -> bool:
            ticks.append(reading)
            return guest.uuid not in reading.listed

        _collect_until(collector, stopped, timeout_s=60)
        spans = []
        for tick in ticks:
            result = advance(state, tick, 60)
            state = result.state
            spans += [s for s in result.spans if s.uuid == guest.uuid]
    finally:
        collector.close()
        _remove_domain(conn, guest.name, guest.tap)
        conn.close()

    # The test read nothing between the guest's first tick and its end: every later reading
    # of it is the one taken at its SHUTDOWN event, sent once.
    ends = [v for tick in ticks for v in tick.vms if v.uuid == guest.uuid]
    if not ends:
        return None
    (end,) = ends
    carried = next(t for t in ticks if end in t.vms)
    assert start.taken_s < end.taken_s < carried.taken_s and end.run_id == start.run_id
    assert seen and seen[-1] - start.cpu_time_ns > 250_000_000, (len(seen), seen[-1:])
    # After SHUTDOWN the vCPUs are stopped: QEMU's own exit costs milliseconds, not more. The
    # event's reading holds at least what the test last saw, less that exit; and, when the
    # test's own last look came after the event's (a busy machine may starve its thread),
    # no more than it.
    assert end.cpu_time_ns >= seen[-1] - 50_000_000, (seen[-1], end)
    if seen_s[-1] > end.taken_s:
        assert end.cpu_time_ns <= seen[-1], (seen[-1], end)
    (span,) = spans
    assert span.usage.cpu_s == (end.cpu_time_ns - start.cpu_time_ns) / 1e9
    assert guest.uuid not in state.baselines
    last_seen_s = (seen[-1] - start.cpu_time_ns) / 1e9
    return (
        f"last seconds: {end.taken_s - start.taken_s:.2f} s after the tick, "
        f"{span.usage.cpu_s:.3f} s of CPU kept (the test last saw {last_seen_s:.3f})"
    )


def _collect_until(collector, done, timeout_s: float = 10.0):
    """Ticks until ``done(reading)``: lifecycle events reach the collector asynchronously."""
    deadline = time.monotonic() + timeout_s
    while True:
        reading = collector.collect()
        if done(reading):
            return reading
        assert time.monotonic() < deadline, (reading.errors, reading.fallbacks, reading.listed)
        time.sleep(0.05)


def test_a_network_disk_is_read_through_libvirt_the_rest_from_the_kernel(
    real_guests: RealGuests, tmp_path: Path
) -> None:
    """A guest whose disk QEMU reaches over the network (NBD here, as RBD or iSCSI in a
    cloud): no cgroup I/O file sees those bytes, so the kernel collector asks QEMU's block
    stats for that disk, and only for the domains that have one. A libvirt reading bracketed
    by two kernel readings that agree must equal them, byte for byte; and the disk has moved."""
    import os
    import socket
    import subprocess

    from gmd.agent.collect.kernel import KernelCollector
    from gmd.agent.collect.libvirt import LibvirtCollector
    from tests.support.guest_image import build_guest_image
    from tests.support.realvm import _new_guest, _remove_domain, _wait_ready, domain_xml

    image = build_guest_image()
    guest = _new_guest("spin", os.getpid(), tmp_path, index=902)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            "qemu-storage-daemon",
            "--blockdev",
            f"driver=file,node-name=file0,filename={guest.disk}",
            "--blockdev",
            "driver=raw,node-name=disk0,file=file0",
            "--nbd-server",
            f"addr.type=inet,addr.host=127.0.0.1,addr.port={port}",
            "--export",
            "type=nbd,id=export0,node-name=disk0,name=disk0,writable=on",
        ],
        stderr=subprocess.PIPE,
    )
    conn = real_guests.connect()
    kernel, bulk = KernelCollector(real_guests.uri), LibvirtCollector(real_guests.uri)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            assert server.poll() is None and time.monotonic() < deadline, server.stderr
            time.sleep(0.05)
        source = (
            f"<source protocol='nbd' name='disk0'><host name='127.0.0.1' port='{port}'/></source>"
        )
        conn.defineXML(domain_xml(guest, image.kernel, image.initrd, disk_source=source)).create()
        _wait_ready(conn, [guest])
        first = _collect_until(kernel, lambda r: guest.uuid in {v.uuid for v in r.vms})
        start = {v.uuid: v for v in first.vms}[guest.uuid].disks["vda"]
        exact = None
        for _ in range(100):
            before, middle, after = kernel.collect(), bulk.collect(), kernel.collect()
            a, m, b = (
                {v.uuid: v for v in r.vms}[guest.uuid].disks for r in (before, middle, after)
            )
            if a["vda"] == b["vda"] and a["vda"] != start:
                assert m["vda"] == a["vda"], f"libvirt {m['vda']} != kernel {a['vda']}"
                exact = a["vda"]
                break
            time.sleep(0.1)
        assert exact is not None, "the disk never held still after moving"
        # The other guests' disks are files: no network disk, nothing asked of their QEMU.
        idle = {v.uuid: v for v in after.vms}[real_guests.idle.uuid]
        assert "vda" not in idle.disks and all(d.startswith("host:") for d in idle.disks)
        assert not after.fallbacks and not after.errors
    finally:
        kernel.close()
        bulk.close()
        _remove_domain(conn, guest.name, guest.tap)
        conn.close()
        server.terminate()
        server.wait(30)
    moved = (exact[0] - start[0], exact[1] - start[1])
    print(f"network disk (read, written) since the first tick: {moved}")
