"""Time one agent tick on libvirt's test driver: gmd's collector against per-domain polling.

    python bench/agent.py --domains 1,100,500 --ticks 20

Two ways to read every running domain's counters:

- **gmd** (``gmd.agent.collect.libvirt.LibvirtCollector``): one ``getAllDomainStats`` call,
  per-domain calls only for the counters it lacks, each domain's XML read once and cached;
- **per-domain**, the way Ceilometer's compute agent polls: list the domains, then for each one
  fetch and parse its XML (to find disks and interfaces) and call ``info``, ``memoryStats``,
  ``blockStats`` per disk and ``interfaceStats`` per interface, every poll.

On the test driver ``getAllDomainStats`` returns only the domains' state, so gmd's collector
also makes per-domain calls here; the difference measured is the XML it does not re-read.
``gmd_tick`` adds what the agent does with a reading (deltas, intervals, the spool commit with
fsync).

``--qemu N`` measures real QEMU guests instead (under the real libvirtd of tests/scripts/libvirt.sh,
as root), with the kernel collector and its floor (the ``pread`` of the same files, nothing
else) beside the two. There the bulk call does **not** win on time: libvirtd answers it by
asking each QEMU over its monitor, one domain after another, six commands per domain against
per-domain polling's four. On 100 idle TCG guests (2026-11-25): bulk 376.1 ms a tick, 600
monitor commands, 81.5 ms of libvirtd's and 395 ms of the QEMUs' CPU; per-domain 352.4 ms,
400 commands; the kernel collector 2.72 ms, no monitor command, no libvirtd CPU. The bulk
call's agent CPU (2.67 ms per 100 VMs) was then the kernel collector's (2.65; 1.13 back to
back), whose floor was 1.28 (0.60 back to back).

The kernel collector's figure is its whole ``collect()``: libvirt's lifecycle flag,
``/proc/stat``, ``/proc/net/dev``, every VM's files, the readings (not the spool's commit,
which the agent's loop makes after the tick). Its floor (:class:`KernelFloor`) is one
``pread`` of 4096 bytes at offset 0 of each guest's cgroup CPU file, ``/proc/<pid>/statm``
and cgroup I/O file, each kept open, and of ``/proc/net/dev`` page by page to its end, and
nothing else: no parsing, no Python object (nor ``/proc/stat``, which the collector reads
too). Issue 33 holds the collector's agent CPU per tick within 1.5 times its floor's:
``kernel_over_floor`` in the JSON line, of the alternated ticks' means (the figure the issue
named), with ``kernel_over_floor_back_to_back`` beside. The two take turns at reading first
after the libvirt collectors (whoever reads first pays the kernel's flush of the QEMUs'
statistics), and the guests are left ``--settle-s`` seconds after booting. On 100 idle TCG
guests (2026-11-27, on a machine busy with other work): the kernel collector 2.35 ms of agent
CPU per 100 VMs, its floor 1.77, 1.32 times (back to back 1.26 and 0.88, 1.44 times). The same
procedure run twice on one set of 100 settled guests gave 2.12 and 2.16 times (2.44 and 2.37
back to back) for the collector as it was before issue 33, 1.31 and 1.37 (1.38 and 1.35) for
this one.

Prints a line per size and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt
from procstat import cpu_s

from gmd.agent.collect.aggregate import AgentState, advance, dump_state
from gmd.agent.collect.libvirt import LibvirtCollector
from gmd.agent.spool import Spool

NOVA_11 = "http://openstack.org/xmlns/libvirt/nova/1.1"
TARGET_OVER_FLOOR = 1.5
"""issue 33: the kernel collector's agent CPU per tick at most this times its floor's"""


def node_xml(n: int) -> str:
    """A host with ``n`` running Nova domains, each with one disk and one interface."""
    domains = "".join(
        f"<domain type='test'><name>vm-{i}</name><uuid>00000000-0000-4000-8000-{i:012d}</uuid>"
        f"<memory unit='MiB'>{512 * (1 + i % 4)}</memory><vcpu>{1 + i % 4}</vcpu>"
        "<os><type>hvm</type></os>"
        f'<metadata><nova:instance xmlns:nova="{NOVA_11}"><nova:flavor name="f">'
        f"<nova:memory>{512 * (1 + i % 4)}</nova:memory><nova:vcpus>{1 + i % 4}</nova:vcpus>"
        f'</nova:flavor><nova:owner><nova:project uuid="proj-{i % 50}">p</nova:project>'
        "</nova:owner></nova:instance></metadata>"
        f"<devices><disk type='file' device='disk'><source file='/img/{i}'/>"
        f"<target dev='vda'/></disk><interface type='ethernet'><target dev='tap{i}'/>"
        "</interface></devices></domain>"
        for i in range(n)
    )
    return (
        "<node><cpu><nodes>1</nodes><sockets>2</sockets><cores>32</cores><threads>2</threads>"
        f"<mhz>2000</mhz></cpu><memory>536870912</memory>{domains}</node>"
    )


class PerDomainPoller:
    """Ceilometer-style polling: every poll re-lists, re-reads XML, and calls per device."""

    def __init__(self, uri: str) -> None:
        self.conn = libvirt.openReadOnly(uri)

    def collect(self) -> list[dict[str, Any]]:
        out = []
        for dom in self.conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            root = ET.fromstring(dom.XMLDesc(0))
            project = root.find(f"metadata/{{{NOVA_11}}}instance/{{{NOVA_11}}}owner")
            _state, _max, memory_kib, _vcpus, cpu_ns = dom.info()
            rss = dom.memoryStats().get("rss", memory_kib)
            disks = {
                t.get("dev"): dom.blockStats(t.get("dev"))
                for t in root.iterfind("devices/disk/target")
            }
            nics = {
                t.get("dev"): dom.interfaceStats(t.get("dev"))
                for t in root.iterfind("devices/interface/target")
            }
            out.append(
                {
                    "uuid": dom.UUIDString(),
                    "project": project,
                    "cpu_ns": cpu_ns,
                    "rss": rss,
                    "disks": disks,
                    "nics": nics,
                }
            )
        return out

    def close(self) -> None:
        self.conn.close()


class Counting:
    """A proxy that counts libvirt API calls on a connection and the domains it returns
    (for counting only, not timing)."""

    LOCAL = frozenset({"UUIDString", "ID", "name"})  # answered from the object, no call

    def __init__(self, real: Any, calls: list[int] | None = None) -> None:
        self.real, self.calls = real, calls if calls is not None else [0]

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr) or name in self.LOCAL:
            return attr

        def call(*args: Any) -> Any:
            self.calls[0] += 1
            result = attr(*args)
            if name == "getAllDomainStats":
                return [(Counting(d, self.calls), s) for d, s in result]
            if name == "listAllDomains":
                return [Counting(d, self.calls) for d in result]
            return result

        return call


def gmd_calls_per_tick(uri: str) -> int:
    holder: list[Counting] = []

    def opener(u: str) -> Counting:
        holder.append(Counting(libvirt.openReadOnly(u)))
        return holder[0]

    c = LibvirtCollector(uri, opener=opener)
    c.collect()  # first tick: XML and memoryStats probes
    before = holder[0].calls[0]
    c.collect()
    calls = holder[0].calls[0] - before
    c.close()
    return calls


def per_domain_calls_per_tick(uri: str) -> int:
    p = PerDomainPoller(uri)
    real, p.conn = p.conn, Counting(p.conn)
    p.collect()
    real.close()
    return p.conn.calls[0]


def timed(fn: Any, ticks: int) -> list[float]:
    fn()  # warm-up: first tick reads XML, opens the connection
    times = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure(n: int, ticks: int, workdir: Path) -> dict[str, Any]:
    node = workdir / f"node-{n}.xml"
    node.write_text(node_xml(n))
    uri = f"test://{node}"

    gmd = LibvirtCollector(uri)
    gmd_times = timed(gmd.collect, ticks)

    spool = Spool(workdir / f"spool-{n}.db", max_bytes=2**30, max_batches=10**6)
    state = [AgentState()]

    def tick() -> None:
        result = advance(state[0], gmd.collect(), 60)
        spool.commit(dump_state(result.state), [])
        state[0] = result.state

    tick_times = timed(tick, ticks)
    spool.close()
    gmd.close()

    poller = PerDomainPoller(uri)
    per_domain_times = timed(poller.collect, ticks)
    poller.close()

    g, p = statistics.median(gmd_times), statistics.median(per_domain_times)
    return {
        "domains": n,
        "gmd_collect_ms": round(g * 1000, 3),
        "gmd_tick_ms": round(statistics.median(tick_times) * 1000, 3),
        "per_domain_collect_ms": round(p * 1000, 3),
        "per_domain_over_gmd": round(p / g, 2),
        "gmd_libvirt_calls_test_driver": gmd_calls_per_tick(uri),
        "per_domain_libvirt_calls": per_domain_calls_per_tick(uri),
    }


REPO = Path(__file__).resolve().parents[1]
LIBVIRTD_PID = REPO / "var" / "libvirt" / "libvirtd.pid"
ADMIN_URI = "libvirtd:///system"


class MonitorLog:
    """Counts the QMP commands libvirtd sends to the QEMUs, by their replies: its monitor
    messages go to a file of ours (``virt-admin``) for the measurement, and its log outputs and
    filters are put back after."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filters = self._admin("daemon-log-filters").split(":", 1)[1].strip()
        self.outputs = self._admin("daemon-log-outputs").split(":", 1)[1].strip()

    @staticmethod
    def _admin(*args: str) -> str:
        done = subprocess.run(
            ["virt-admin", "-c", ADMIN_URI, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def __enter__(self) -> MonitorLog:
        self._admin("daemon-log-filters", "1:qemu.qemu_monitor_json")
        self._admin("daemon-log-outputs", f"1:file:{self.path}")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._admin("daemon-log-outputs", self.outputs)
        self._admin("daemon-log-filters", self.filters)

    def commands(self) -> int:
        try:
            return self.path.read_text(errors="replace").count("QEMU_MONITOR_RECV_REPLY")
        except FileNotFoundError:
            return 0


class KernelFloor:
    """The physical floor under the kernel collector's tick: ``pread`` of the same files (each
    guest's cgroup CPU and I/O files and ``/proc/<pid>/statm``, kept open) and of
    ``/proc/net/dev``, and nothing else: no parsing, no Python objects."""

    def __init__(self, guests: list[Any]) -> None:
        from gmd.agent.cgroups import CgroupLocator
        from gmd.agent.collect.kernel_files import counter_files

        locator = CgroupLocator()
        mounts = locator.mounts()
        paths = [Path("/proc/net/dev")]
        for g in guests:
            pid = locator.pid(g.name)
            files = counter_files(locator.of_process(pid, mounts))
            paths += [files.cpu[1], Path(f"/proc/{pid}/statm")]
            if files.io is not None:
                paths.append(files.io[1])
        self.fds = [os.open(path, os.O_RDONLY) for path in paths]

    def read(self) -> None:
        net, *counters = self.fds
        offset = 0
        while chunk := os.pread(net, 4096, offset):  # a page of lines at a time
            offset += len(chunk)
        for fd in counters:  # one record each, a few dozen bytes
            os.pread(fd, 4096, 0)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def back_to_back(reads: dict[str, Any], ticks: int, block: int = 10) -> dict[str, dict[str, float]]:
    """Median wall and CPU of ``ticks`` reads of each reader one after another (caches warm),
    in ms. The readers take turns by blocks of ``block`` reads, so that a change in the
    machine's load (other work on it) falls on each alike and not on one alone."""
    walls: dict[str, list[float]] = {name: [] for name in reads}
    cpus: dict[str, list[float]] = {name: [] for name in reads}
    for _ in range(0, ticks, block):
        for name, read in reads.items():
            for _ in range(block):
                w, c = time.perf_counter(), time.process_time()
                read()
                walls[name].append(time.perf_counter() - w)
                cpus[name].append(time.process_time() - c)
    return {
        name: {
            "wall": statistics.median(walls[name]) * 1e3,
            "cpu": statistics.median(cpus[name]) * 1e3,
        }
        for name in reads
    }


def measure_qemu(n: int, ticks: int, workdir: Path, settle_s: float = 0.0) -> dict[str, Any]:
    """Ticks of the kernel collector, the libvirt collector and per-domain polling over ``n``
    real QEMU guests, alternated: wall time, the agent's CPU, libvirtd's and the QEMUs' CPU
    during the tick, and the monitor commands sent. The guests are left ``settle_s`` seconds
    after the last of them booted: until then the last ones still move their counters."""
    sys.path.insert(0, str(REPO))
    from gmd.agent.collect.kernel import KernelCollector
    from tests.support.realvm import many_guests

    with many_guests(workdir, n) as (uri, guests):
        time.sleep(settle_s)
        libvirtd = int(LIBVIRTD_PID.read_text())
        qemus = [
            int(
                subprocess.run(
                    ["pgrep", "-f", f"guest={g.name},"], capture_output=True, text=True, check=True
                ).stdout.split()[0]
            )
            for g in guests
        ]
        poller = PerDomainPoller(uri)
        kernel, floor = KernelCollector(uri), KernelFloor(guests)
        sources: dict[str, Any] = {
            "kernel": kernel.collect,
            "kernel_floor": floor.read,
            "libvirt_bulk": LibvirtCollector(uri).collect,
            "per_domain": poller.collect,
        }
        figures: dict[str, dict[str, list[float]]] = {
            name: {k: [] for k in ("wall", "agent", "libvirtd", "qemu", "monitor")}
            for name in sources
        }
        with MonitorLog(workdir / "monitor.log") as monitor:
            for read in sources.values():
                read()  # the first tick reads every domain's XML
            for tick in range(ticks):
                # The kernel collector and its floor take turns at reading first after the
                # libvirt collectors. Whoever reads the cgroup files first after the QEMUs
                # have answered their monitors pays the kernel's flush of what they ran up
                # (cpu.stat's per-CPU statistics, blkio's): measured on 100 guests, the floor
                # took 1.58 ms reading first, 1.09 ms second, and the collector (which always
                # read first before) 2.15 ms against 1.39 ms. That cost is the files', which
                # the floor must bear as often as the collector.
                order = list(sources.items())
                if tick % 2:
                    order[0], order[1] = order[1], order[0]
                for name, read in order:
                    # The agent's clocks are read next to the tick, the other processes' and
                    # the monitor log (which grows by megabytes) outside it: reading them
                    # took ~8 ms, which earlier figures counted as the tick's.
                    others = (cpu_s(libvirtd), sum(cpu_s(p) for p in qemus), monitor.commands())
                    clocks = (time.perf_counter(), time.process_time())
                    reading = read()
                    clocks_after = (time.perf_counter(), time.process_time())
                    others_after = (
                        cpu_s(libvirtd),
                        sum(cpu_s(p) for p in qemus),
                        monitor.commands(),
                    )
                    before, after = clocks + others, clocks_after + others_after
                    count = n if reading is None else len(getattr(reading, "vms", reading))
                    if count != n:
                        raise RuntimeError(f"{name} read {count} of {n} guests")
                    for key, a, b in zip(figures[name], before, after, strict=True):
                        figures[name][key].append(b - a)
            warm = back_to_back({"kernel": kernel.collect, "kernel_floor": floor.read}, ticks * 5)
        poller.close()
        kernel.close()
        floor.close()
    out: dict[str, Any] = {"domains": n}
    for name, f in figures.items():
        wall, agent = statistics.median(f["wall"]), statistics.mean(f["agent"])
        out[name] = {
            "ms_per_tick": round(wall * 1e3, 2),
            "agent_cpu_ms_per_100_vms": round(agent * 1e3 * 100 / n, 2),
            # CPU seconds are counted in clock ticks (10 ms): means over the ticks.
            "libvirtd_cpu_ms_per_tick": round(statistics.mean(f["libvirtd"]) * 1e3, 1),
            "qemu_cpu_ms_per_tick": round(statistics.mean(f["qemu"]) * 1e3, 1),
            "monitor_commands_per_tick": round(statistics.mean(f["monitor"]), 1),
        }
    for name, w in warm.items():
        # Back to back, with the caches warm, unlike the alternated ticks above (and a real
        # agent's, ten seconds apart, in which other processes have run).
        out[name]["back_to_back_ms_per_100_vms"] = round(w["wall"] * 100 / n, 2)
        out[name]["back_to_back_cpu_ms_per_100_vms"] = round(w["cpu"] * 100 / n, 2)
    # Issue 33's target: the kernel collector's agent CPU per tick (its whole ``collect()``:
    # libvirt's lifecycle flag, /proc/stat, /proc/net/dev, every VM's files, the readings;
    # not the spool, which the agent's loop commits after it) within 1.5 times its floor's
    # (KernelFloor), both measured in the same run: the alternated ticks' means, and back to
    # back beside.
    kernel, floor_cpu = (
        statistics.mean(figures["kernel"]["agent"]),
        statistics.mean(figures["kernel_floor"]["agent"]),
    )
    out["kernel_over_floor"] = round(kernel / floor_cpu, 2)
    out["kernel_over_floor_back_to_back"] = round(
        warm["kernel"]["cpu"] / warm["kernel_floor"]["cpu"], 2
    )
    out["target_over_floor"] = TARGET_OVER_FLOOR
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domains", default="1,100,500", help="comma-separated sizes")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument(
        "--qemu",
        type=int,
        metavar="N",
        help="instead: N real QEMU guests under the real libvirtd (tests/scripts/libvirt.sh; root),"
        " read by the kernel collector, the libvirt collector and per-domain polling",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=30.0,
        help="with --qemu: seconds the guests are left idle after booting before the ticks"
        " (the last booted still move their counters for a while)",
    )
    args = parser.parse_args()
    if args.qemu:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure_qemu(args.qemu, args.ticks, Path(tmp), args.settle_s)
        for name in ("kernel", "kernel_floor", "libvirt_bulk", "per_domain"):
            print(f"{args.qemu} guests, {name}: {r[name]}")
        print(
            f"{args.qemu} guests, kernel collector's agent CPU over its floor's:"
            f" {r['kernel_over_floor']} ({r['kernel_over_floor_back_to_back']} back to back),"
            f" target {r['target_over_floor']}"
        )
        print(
            json.dumps(
                {
                    "benchmark": "agent_tick",
                    "driver": "qemu",
                    "ticks": args.ticks,
                    "settle_s": args.settle_s,
                    **r,
                }
            )
        )
        return
    sizes = [int(s) for s in args.domains.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            r = measure(n, args.ticks, Path(tmp))
            results.append(r)
            print(
                f"{n:4d} domains: gmd {r['gmd_collect_ms']:8.2f} ms"
                f" (tick {r['gmd_tick_ms']:8.2f} ms), per-domain {r['per_domain_collect_ms']:8.2f}"
                f" ms, ratio {r['per_domain_over_gmd']:.2f}; libvirt calls per tick: gmd"
                f" {r['gmd_libvirt_calls_test_driver']}, per-domain"
                f" {r['per_domain_libvirt_calls']}"
            )
    print(
        json.dumps(
            {
                "benchmark": "agent_tick",
                "driver": "test",
                "ticks": args.ticks,
                "sizes": results,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "libvirt": libvirt.getVersion(),
            }
        )
    )


if __name__ == "__main__":
    main()
