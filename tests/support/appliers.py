"""What the host-side appliers' tests share: a test-driver host of three VMs and plans for them,
a connection keeping scheduler parameters as the QEMU driver does (the test driver refuses them
with the LIVE flag), a stand-in for the daemon's plan endpoints, and a cgroup v2 tree of regular
files with a stand-in for cgroupfs's per-line semantics (``io.max``, ``io.weight``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from gmd.agent.apply.cgroupfs import libvirt_machine_name, systemd_escape
from gmd.agent.apply.cgroupfs_writes import CgroupIO
from gmd.agent.apply.libvirt import LIVE
from gmd.agent.cgroups import CgroupLocator
from gmd.agent.client import PlanUnavailable
from gmd.wire import HostCapabilities, HostPlan, PlanReport
from tests.support.canned_proc import CannedHost

UUID_A = "a0000000-0000-4000-8000-00000000000a"
UUID_B = "b0000000-0000-4000-8000-00000000000b"
UUID_C = "c0000000-0000-4000-8000-00000000000c"
NODE = f"""<node>
  <cpu><nodes>1</nodes><sockets>1</sockets><cores>4</cores><threads>1</threads>
    <mhz>2000</mhz></cpu>
  <memory>16777216</memory>
  <domain type='test'>
    <name>vm-a</name><uuid>{UUID_A}</uuid><memory unit='MiB'>512</memory>
    <vcpu>2</vcpu><os><type>hvm</type></os>
    <devices><disk type='file' device='disk'><source file='/guest/a.img'/>
      <target dev='vda' bus='virtio'/></disk></devices>
  </domain>
  <domain type='test'>
    <name>vm-b</name><uuid>{UUID_B}</uuid><memory unit='MiB'>512</memory>
    <vcpu>1</vcpu><os><type>hvm</type></os>
    <devices><disk type='file' device='disk'><source file='/guest/b.img'/>
      <target dev='vda' bus='virtio'/></disk></devices>
  </domain>
  <domain type='test'>
    <name>vm-c</name><uuid>{UUID_C}</uuid><memory unit='MiB'>512</memory>
    <vcpu>1</vcpu><os><type>hvm</type></os>
  </domain>
</node>
"""


def item(uuid: str, **kw: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "customer": "greedy",
        "level": 1,
        "cpu_weight": 50,
        "io_weight": 50,
        "cpu_quota_cores": None,
        "disk_read_bytes_per_s": None,
        "disk_write_bytes_per_s": None,
        **kw,
    }


def plan(mode: str, *items: dict[str, Any], generated_s: int = 1_800_000_000) -> HostPlan:
    return HostPlan(host="cmp-1", generated_s=generated_s, mode=mode, vms=list(items))


def weight(conn: Any, uuid: str) -> int:
    return conn.lookupByUUIDString(uuid).blkioParameters(LIVE)["weight"]


def dump(results: list) -> list[tuple[str, str, bool]]:
    return [(r.uuid, r.action, r.ok) for r in results]


class SchedDomain:
    """A test-driver domain with scheduler parameters kept in memory, as the QEMU driver
    keeps them (the test driver refuses them with the LIVE flag)."""

    def __init__(self, real: Any, params: dict[str, int]) -> None:
        self._real, self.params = real, params
        self.fail_blkio_by_destroying = False
        self.no_proportional_scheduler = False
        """answer blkio calls as libvirt does on a host whose disks no BFQ or CFQ runs"""

    def blkioParameters(self, flags: int) -> dict[str, int]:
        if self.no_proportional_scheduler:
            raise no_bfq_error()
        return self._real.blkioParameters(flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def schedulerParametersFlags(self, flags: int) -> dict[str, int]:
        assert flags == LIVE, "only LIVE may be asked"
        return dict(self.params)

    def setSchedulerParametersFlags(self, params: dict[str, int], flags: int) -> None:
        assert flags == LIVE, "the persistent definition must never be touched"
        self.params.update(params)

    def setBlkioParameters(self, params: dict[str, int], flags: int) -> None:
        assert flags == LIVE
        if self.no_proportional_scheduler:
            raise no_bfq_error()
        if self.fail_blkio_by_destroying:
            self._real.destroy()  # the VM stops between the lookup and the change
        self._real.setBlkioParameters(params, flags)


NO_BFQ = (
    "Requested operation is not valid: blkio device weight is valid only for bfq or cfq scheduler"
)


def no_bfq_error() -> Any:
    """The error real libvirtd (9.0, QEMU driver) answers ``blkioParameters(LIVE)`` with for a
    running domain on a host whose disks run none/mq-deadline/kyber (seen on this project's
    machines, kernel 6.18): VIR_ERR_OPERATION_INVALID, the same code as for a domain that
    stopped. The test driver cannot be made to say it."""
    import libvirt

    error = libvirt.libvirtError(NO_BFQ)
    error.err = (
        libvirt.VIR_ERR_OPERATION_INVALID,
        libvirt.VIR_FROM_CGROUP,
        NO_BFQ,
        libvirt.VIR_ERR_ERROR,
        None,
        None,
        None,
        -1,
        -1,
    )
    return error


class SchedConn:
    def __init__(self, real: Any) -> None:
        self._real = real
        self.domains: dict[str, SchedDomain] = {}
        self.params: dict[str, dict[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def lookupByUUIDString(self, uuid: str) -> SchedDomain:
        real = self._real.lookupByUUIDString(uuid)
        params = self.params.setdefault(
            uuid, {"cpu_shares": 1024, "vcpu_quota": -1, "vcpu_period": 100000}
        )
        dom = self.domains.get(uuid)
        if dom is None:
            dom = self.domains[uuid] = SchedDomain(real, params)
        dom._real = real
        return dom


class Plans:
    """Stands in for the daemon's plan endpoints."""

    def __init__(self) -> None:
        self.plan: HostPlan | None = plan("on")
        self.reports: list[PlanReport] = []
        self.capabilities: list[HostCapabilities] = []
        self.fetches = 0
        self.report_outcome = "delivered"

    def get_plan(self, host: str) -> HostPlan:
        self.fetches += 1
        if self.plan is None:
            raise PlanUnavailable("ConnectError: connection refused")
        return self.plan

    def post_report(self, host: str, report: PlanReport) -> Any:
        from gmd.agent.client import PostOutcome

        if self.report_outcome != "delivered":
            return PostOutcome("unavailable", 503, "down")
        self.reports.append(report)
        return PostOutcome("delivered", 200, "recorded")

    def put_capabilities(self, host: str, caps: HostCapabilities) -> Any:
        from gmd.agent.client import PostOutcome

        if self.report_outcome != "delivered":
            return PostOutcome("unavailable", 503, "down")
        self.capabilities.append(caps)
        return PostOutcome("delivered", 200, "recorded")


# --- cgroup v2 on a temporary tree ----------------------------------------------------------------


class FakeCgroupfsIO(CgroupIO):
    """Regular files behaving like cgroupfs where it matters to the writer.

    - ``io.max`` / ``io.weight``: a write changes one device's line (or the default) and keeps
      the others, as the kernel does, instead of replacing the whole file.
    - a file without write permission refuses writes with EACCES even for root (kernfs does).
    - a device not in ``devices`` is refused with ENODEV, like a MAJ:MIN with no disk behind it.
    """

    def __init__(self, devices: set[str]) -> None:
        self.devices = devices
        self.writes: list[tuple[str, str]] = []

    def write(self, path: Path, line: str) -> None:
        if path.exists() and not os.stat(path).st_mode & 0o222:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        if path.name in ("io.max", "io.weight"):
            key, _, value = line.partition(" ")
            if key != "default" and key not in self.devices:
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), str(path))
            lines = {ln.split(" ", 1)[0]: ln for ln in path.read_text().splitlines() if ln}
            if path.name == "io.max":
                fields = dict.fromkeys(("rbps", "wbps", "riops", "wiops"), "max")
                if key in lines:
                    fields.update(kv.split("=") for kv in lines[key].split()[1:])
                fields.update(kv.split("=") for kv in value.split())
                if set(fields.values()) == {"max"}:
                    lines.pop(key, None)
                else:
                    lines[key] = key + " " + " ".join(f"{k}={v}" for k, v in fields.items())
            elif value == "default":
                lines.pop(key, None)
            else:
                lines[key] = f"{key} {value}"
            ordered = sorted(lines.values(), key=lambda ln: (not ln.startswith("default"), ln))
            line = "\n".join(ordered)
            if not line:  # the kernel's file is empty then, not a blank line
                path.write_text("")
                self.writes.append((path.name, line))
                return
        super().write(path, line)
        self.writes.append((path.name, line))


V2_DEFAULTS = {
    "cpu.weight": "100\n",
    "cpu.max": "max 100000\n",
    "io.weight": "default 100\n8:16 300\n",
    "io.max": "",
    "memory.high": "max\n",
}


def cgroup_tree(tmp_path: Path, conn: Any) -> tuple[Path, dict[str, Path], CgroupLocator]:
    """A v2 tree with the two domains' groups where recent libvirt puts them, files at the
    kernel's defaults, and a canned /proc saying their QEMUs sit there."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    host = CannedHost(tmp_path, root)
    dirs = {}
    for uuid in (UUID_A, UUID_B):
        dom = conn.lookupByUUIDString(uuid)
        machine = systemd_escape(libvirt_machine_name(dom.ID(), dom.name()))
        d = host.qemu(dom.name(), f"machine.slice/machine-{machine}.scope/libvirt")
        for name, text in V2_DEFAULTS.items():
            (d / name).write_text(text)
        dirs[uuid] = d
    return root, dirs, host.locator


def files(d: Path) -> dict[str, str]:
    return {name: (d / name).read_text() for name in V2_DEFAULTS}
