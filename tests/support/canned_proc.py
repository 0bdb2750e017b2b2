"""A canned ``/proc`` and libvirt run directory for tests on a laid-out cgroup tree, in the
manner of node_exporter's fixture trees: which QEMU process runs each domain and which cgroups
it sits in, read by the same :class:`gmd.agent.cgroups.CgroupLocator` as on a real host."""

from __future__ import annotations

from pathlib import Path

from gmd.agent.cgroups import CgroupLocator


class CannedHost:
    """``proc/`` and ``run/`` under ``base``; cgroup v2 mounted at ``cgroup_root``."""

    def __init__(self, base: Path, cgroup_root: Path) -> None:
        self.proc, self.run = base / "proc", base / "run"
        (self.proc / "self").mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        (self.proc / "self" / "mountinfo").write_text(
            f"24 30 0:22 / {cgroup_root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        )
        self.root = cgroup_root
        self.locator = CgroupLocator(proc=self.proc, run_dir=self.run)
        self._next_pid = 4000

    def qemu(self, name: str, group: str) -> Path:
        """Domain ``name``'s QEMU, in ``group/emulator`` as libvirt places it; the domain's
        cgroup directory (``group``), created."""
        self._next_pid += 1
        pid = self._next_pid
        (self.proc / str(pid)).mkdir()
        (self.proc / str(pid) / "cgroup").write_text(f"0::/{group}/emulator\n")
        (self.run / f"{name}.pid").write_text(f"{pid}\n")
        directory = self.root / group
        directory.mkdir(parents=True)
        return directory
