"""A compute host's files as the knob probe reads them (:mod:`gmd.agent.capabilities`), laid
out under a temporary directory: its cgroup mounts in one of the layouts hosts run, a VM's QEMU
in its groups, the groups' control files, and its disks' schedulers."""

from __future__ import annotations

from pathlib import Path

from gmd.agent.apply.state import EnforceBackend
from gmd.agent.capabilities import HostProbe
from gmd.agent.cgroups import CgroupLocator

NO_BFQ = "[none] mq-deadline kyber"
BFQ_OFFERED = "[mq-deadline] kyber bfq none"
BFQ_ACTIVE = "mq-deadline kyber [bfq] none"

MACHINE = "machine/qemu-1-vm.libvirt-qemu"
V1_FILES = {
    "cpu": ["cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us"],
    "blkio": ["blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"],
    "memory": ["memory.soft_limit_in_bytes"],
}


def lay_out(
    tmp: Path,
    layout: str,
    schedulers: dict[str, str],
    *,
    extra: tuple[str, ...] = (),
    v2_files: tuple[str, ...] = ("cpu.weight", "cpu.max", "io.weight", "io.max"),
    io_cost: str = "",
    vm: bool = True,
) -> HostProbe:
    """A host under ``tmp``: its cgroup mounts (``layout``), a VM's QEMU in its groups
    (``vm``), control files (``extra`` added to v1's blkio group), and one disk per
    ``schedulers`` entry (``"[none] mq-deadline kyber"``)."""
    cg, proc, run = tmp / "cgroup", tmp / "proc", tmp / "run"
    (proc / "self").mkdir(parents=True)
    run.mkdir()
    mounts = []
    if layout in ("v1", "hybrid"):
        for n, controller in enumerate(V1_FILES):
            mounts.append(
                f"{30 + n} 25 0:{30 + n} / {cg / controller} rw - cgroup cgroup rw,{controller}"
            )
            files = [*V1_FILES[controller], *(extra if controller == "blkio" else ())]
            for base in (cg / controller, cg / controller / MACHINE):
                base.mkdir(parents=True, exist_ok=True)
                for f in files:
                    (base / f).write_text("")
        if layout == "hybrid":
            (cg / "unified").mkdir()
            mounts.append(f"26 25 0:23 / {cg / 'unified'} rw - cgroup2 cgroup2 rw")
        proc_cgroup = "".join(f"{n}:{c}:/{MACHINE}\n" for n, c in enumerate(V1_FILES, 1))
    else:
        mounts.append(f"24 1 0:22 / {cg} rw - cgroup2 cgroup2 rw")
        (cg / MACHINE).mkdir(parents=True)
        (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (cg / "io.cost.qos").write_text(io_cost)
        for f in v2_files:
            (cg / MACHINE / f).write_text("")
        proc_cgroup = f"0::/{MACHINE}/emulator\n"
    (proc / "self" / "mountinfo").write_text("\n".join(mounts) + "\n")
    if vm:
        (proc / "4242").mkdir()
        (proc / "4242" / "cgroup").write_text(proc_cgroup)
        (run / "vm.pid").write_text("4242\n")
    for name, text in schedulers.items():
        q = tmp / "sys" / "block" / name / "queue"
        q.mkdir(parents=True)
        (q / "scheduler").write_text(text + "\n")
    (tmp / "sys" / "block").mkdir(parents=True, exist_ok=True)
    return HostProbe(
        EnforceBackend.libvirt,
        locator=CgroupLocator(proc=proc, run_dir=run),
        sys_block=tmp / "sys" / "block",
        clock=lambda: 1_800_000_000,
        tc=lambda: False,
    )
