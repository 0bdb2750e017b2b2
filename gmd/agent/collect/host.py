"""The host's own busy CPU time, from ``/proc/stat``: what contention is judged by (issue 27).

The VMs' CPU seconds say what the VMs used; a host can be saturated by other work (QEMU's
emulator threads outside the VMs' cgroups, an OSD, a backup, a tenant of the operator) while
its VMs idle. The daemon calls a host contended when its VMs' use or its own busy time reaches
the threshold (:mod:`gmd.daemon.enforce.plans`), so the agent reports the host's busy CPU
seconds per interval beside its VMs' use.

Busy is every state but idle and iowait: ``user + nice + system + irq + softirq + steal`` of
the first (``cpu``) line, in ``USER_HZ`` ticks. The time a CPU spends running guests
(``guest``, ``guest_nice``) is already inside ``user`` and ``nice``: it is not added again.
Steal is time a hypervisor below this host gave to others: the host wanted it, so it counts
as busy. Iowait is idle time with I/O outstanding, not work.

What a host cannot do: the busy columns are sampled by the scheduler tick. A host that is
itself a VM, descheduled by a hypervisor that does not report steal (seen on a Firecracker
machine: 1.72 core-s busy beside 2.04 core-s its guests' QEMUs were charged over the same two
seconds), misses ticks that land in no column, while the VMs' CPU time comes from the
scheduler's clock and includes them. Busy time may then read low, never high; the daemon takes
the larger of it and the VMs' own use, so a low reading hides no contention the VMs caused.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
"""The states of ``/proc/stat``'s ``cpu`` line that count as busy (see the module docstring)."""
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_proc_stat_ticks(text: str) -> dict[str, int]:
    """The ticks since boot in each state of ``/proc/stat``'s ``cpu`` line (every CPU summed),
    by name (``user`` … ``steal``; ``guest`` and ``guest_nice`` are inside ``user`` and ``nice``
    already). A kernel older than the ``steal`` column (2.6.11) lacks it: the states it has.
    ``ValueError`` when there is no ``cpu`` line of numbers."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1 : 1 + len(_FIELDS)]]
            if len(values) < 4:
                raise ValueError(f"the cpu line has {len(values)} fields, at least 4 expected")
            return dict(zip(_FIELDS, values, strict=False))
    raise ValueError("no cpu line")


def parse_proc_stat_busy(text: str, ticks_per_s: float) -> float:
    """The busy CPU seconds since boot (:data:`BUSY_FIELDS`), summed over every CPU, from
    ``/proc/stat``'s text; ``ValueError`` as :func:`parse_proc_stat_ticks`."""
    ticks = parse_proc_stat_ticks(text)
    return sum(ticks.get(f, 0) for f in BUSY_FIELDS) / ticks_per_s


def local_hypervisor(uri: str) -> bool:
    """Whether the VMs of libvirt ``uri`` run on this machine, so that its ``/proc/stat`` is
    their host's: a URI without a host part, of a driver other than the test driver (whose
    VMs run nowhere)."""
    parts = urlsplit(uri)
    return not parts.netloc and parts.scheme.split("+", 1)[0] != "test"


class HostCpu:
    """Reads the host's busy CPU seconds (``/proc/stat``), kept open between ticks.

    ``read`` gives ``None`` when the file cannot be read or parsed, logged once until it can
    again: the batch then says nothing about the host's own time, and the daemon judges
    contention by the VMs' use alone, as for an agent that never reported it.
    """

    def __init__(self, path: Path = PROC_STAT) -> None:
        self.path = path
        self._ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        self._fd = -1
        self._failing = False

    def read(self) -> float | None:
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            # The cpu line comes first: one page holds it on any host. Only that line is
            # decoded and parsed (the page also holds a line per CPU and the interrupts').
            data = os.pread(self._fd, 4096, 0)
            end = data.find(b"\n") if data.startswith(b"cpu ") else -1
            first = data[:end] if end > 0 else data
            busy = parse_proc_stat_busy(first.decode(), self._ticks_per_s)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            self.close()
            if not self._failing:
                log.warning("cannot read the host's busy CPU time from %s: %s", self.path, exc)
                self._failing = True
            return None
        if self._failing:
            log.info("the host's busy CPU time is read from %s again", self.path)
            self._failing = False
        return busy

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
