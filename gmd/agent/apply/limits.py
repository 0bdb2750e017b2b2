"""What gmd wants a VM held to, independent of how a host applies it.

The daemon's plan names, per VM, a :class:`VmLimits`; the cgroup backend
(:mod:`gmd.agent.apply.cgroupfs_knobs`) and the libvirt applier both translate it into their own
knobs.
Weights are expressed on the cgroup v2 scale because that is what production hosts run and
what libvirt's ``cpu_shares`` means there; the pure conversions below map them onto the
cgroup v1 files for the hosts that still have those. Keeping the conversions free of file I/O
lets them be tested (and reused by the libvirt applier) on their own.

``None`` in a field always means "gmd asks nothing of this knob": an applier leaves the knob
at the VM's original value (see :func:`gmd.agent.apply.cgroupfs_writes.apply`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gmd import GmdError

# cgroup v2 weights (cpu.weight, io.weight): 1..10000, 100 is what every group gets by default;
# the plan's weights are on this scale, so the range is the wire contract's.
from gmd.wire import WEIGHT_DEFAULT, WEIGHT_MAX, WEIGHT_MIN

# cgroup v1 cpu.shares: the kernel clamps to 2..262144 silently; 1024 is the default.
SHARES_MIN = 2
SHARES_MAX = 262_144
SHARES_DEFAULT = 1024

# cgroup v1 blkio weights: 10..1000 accepted by both blkio.weight (CFQ, gone since Linux 5.0,
# default 500) and blkio.bfq.weight (BFQ, default 100).
BLKIO_WEIGHT_MIN = 10
BLKIO_WEIGHT_MAX = 1000
BLKIO_WEIGHT_DEFAULT_CFQ = 500
BLKIO_WEIGHT_DEFAULT_BFQ = 100

# CFS bandwidth: the kernel rejects a quota below 1 ms (EINVAL); 100 ms is the default period.
CFS_QUOTA_MIN_US = 1000
CFS_PERIOD_DEFAULT_US = 100_000

# A memory.high / soft limit below this would starve a VM of page cache to the point of
# thrashing; a plan asking for less is a bug upstream, not a throttle.
MEMORY_HIGH_MIN_BYTES = 1 << 20

_DEVICE = re.compile(r"^[0-9]+:[0-9]+$")


class LimitsError(GmdError, ValueError):
    """A limit outside what any backend can apply; the message names the field and value."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def round_half_up(x: float) -> int:
    """Round to the nearest integer, halves upwards (Python's round() rounds halves to even,
    which would make the mapping of neighbouring values depend on parity)."""
    return math.floor(x + 0.5)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass(frozen=True)
class VmLimits:
    """The limits one VM should run under; ``VmLimits()`` asks nothing at all.

    - ``cpu_weight``: cgroup v2 scale 1..10000, 100 = a normal VM (work-conserving: only bites
      when the host's CPUs are contended).
    - ``cpu_quota``: hard cap in cores for the whole VM (0.5 = half of one core).
    - ``io_weight``: cgroup v2 scale 1..10000, 100 = normal.
    - ``io_bytes_per_s``: block device ``"MAJ:MIN"`` -> (read, write) bytes/s caps; ``None`` in
      either position asks nothing of that direction.
    - ``memory_high_bytes``: memory the VM may use before the kernel reclaims from it hard
      (``memory.high`` on v2, ``memory.soft_limit_in_bytes`` on v1).
    """

    cpu_weight: int | None = None
    cpu_quota: float | None = None
    io_weight: int | None = None
    io_bytes_per_s: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    memory_high_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_weight", "io_weight"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and WEIGHT_MIN <= value <= WEIGHT_MAX):
                raise LimitsError(
                    f"{name}={value!r}: must be an integer in {WEIGHT_MIN}..{WEIGHT_MAX} or None"
                )
        quota = self.cpu_quota
        if quota is not None and not (
            isinstance(quota, int | float)
            and not isinstance(quota, bool)
            and math.isfinite(quota)
            and quota > 0
        ):
            raise LimitsError(f"cpu_quota={quota!r}: must be a positive number of cores or None")
        memory = self.memory_high_bytes
        if memory is not None and not (_is_int(memory) and memory >= MEMORY_HIGH_MIN_BYTES):
            raise LimitsError(
                f"memory_high_bytes={memory!r}: must be an integer >= {MEMORY_HIGH_MIN_BYTES} "
                "or None"
            )
        if not isinstance(self.io_bytes_per_s, dict):
            raise LimitsError(f"io_bytes_per_s={self.io_bytes_per_s!r}: must be a dict")
        checked: dict[str, tuple[int | None, int | None]] = {}
        for device, caps in self.io_bytes_per_s.items():
            if not isinstance(device, str) or not _DEVICE.match(device):
                raise LimitsError(f"io_bytes_per_s device {device!r}: must be 'MAJ:MIN'")
            if not isinstance(caps, tuple | list) or len(caps) != 2:
                raise LimitsError(
                    f"io_bytes_per_s[{device!r}]={caps!r}: must be a (read, write) pair"
                )
            for direction, cap in zip(("read", "write"), caps, strict=True):
                if cap is not None and not (_is_int(cap) and cap >= 1):
                    raise LimitsError(
                        f"io_bytes_per_s[{device!r}] {direction}={cap!r}: must be an integer "
                        ">= 1 byte/s or None (0 would mean 'no limit' on cgroup v1)"
                    )
            checked[device] = (caps[0], caps[1])
        # A private copy: the caller's dict must not change a frozen value behind its back.
        object.__setattr__(self, "io_bytes_per_s", checked)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (plans travel over HTTP and are kept on disk)."""
        return {
            "cpu_weight": self.cpu_weight,
            "cpu_quota": self.cpu_quota,
            "io_weight": self.io_weight,
            "io_bytes_per_s": {dev: list(caps) for dev, caps in self.io_bytes_per_s.items()},
            "memory_high_bytes": self.memory_high_bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VmLimits:
        """Inverse of :meth:`to_dict`; unknown keys are an error so typos do not go unnoticed."""
        known = {"cpu_weight", "cpu_quota", "io_weight", "io_bytes_per_s", "memory_high_bytes"}
        unknown = set(data) - known
        if unknown:
            raise LimitsError(f"unknown VmLimits fields: {sorted(unknown)}")
        io = data.get("io_bytes_per_s") or {}
        if not isinstance(io, dict):
            raise LimitsError(f"io_bytes_per_s={io!r}: must be an object")
        return cls(
            cpu_weight=data.get("cpu_weight"),
            cpu_quota=data.get("cpu_quota"),
            io_weight=data.get("io_weight"),
            io_bytes_per_s={
                dev: tuple(caps) if isinstance(caps, list) else caps for dev, caps in io.items()
            },
            memory_high_bytes=data.get("memory_high_bytes"),
        )


# --- pure conversions -------------------------------------------------------------------------


def cpu_weight_to_shares(weight: int) -> int:
    """cgroup v2 ``cpu.weight`` -> v1 ``cpu.shares``: linear, 100 <-> 1024, clamped to 2..262144
    (the same mapping systemd and the kernel use, so a weight means the same on both)."""
    return _clamp(round_half_up(weight * SHARES_DEFAULT / WEIGHT_DEFAULT), SHARES_MIN, SHARES_MAX)


def shares_to_cpu_weight(shares: int) -> int:
    """v1 ``cpu.shares`` -> v2 ``cpu.weight``: inverse of :func:`cpu_weight_to_shares`,
    clamped to 1..10000."""
    return _clamp(round_half_up(shares * WEIGHT_DEFAULT / SHARES_DEFAULT), WEIGHT_MIN, WEIGHT_MAX)


def io_weight_to_blkio(weight: int, blkio_default: int = BLKIO_WEIGHT_DEFAULT_BFQ) -> int:
    """cgroup v2 ``io.weight`` -> v1 blkio weight, clamped to 10..1000.

    Linear and anchored at the defaults (v2 100 <-> the blkio file's own default), like the CPU
    mapping, so an unthrottled VM keeps the weight its neighbours have: 100 for
    ``blkio.bfq.weight``, 500 for the old CFQ ``blkio.weight``.
    """
    return _clamp(
        round_half_up(weight * blkio_default / WEIGHT_DEFAULT), BLKIO_WEIGHT_MIN, BLKIO_WEIGHT_MAX
    )


def blkio_to_io_weight(blkio: int, blkio_default: int = BLKIO_WEIGHT_DEFAULT_BFQ) -> int:
    """v1 blkio weight -> cgroup v2 ``io.weight``: inverse of :func:`io_weight_to_blkio`."""
    return _clamp(round_half_up(blkio * WEIGHT_DEFAULT / blkio_default), WEIGHT_MIN, WEIGHT_MAX)


def cpu_quota_to_us(cores: float, period_us: int) -> int:
    """Cores -> CFS quota in microseconds per ``period_us``; never below the kernel's 1 ms
    minimum (a smaller quota is refused with EINVAL, so it is raised to the smallest cap)."""
    if period_us <= 0:
        raise LimitsError(f"CFS period {period_us!r} us: must be positive")
    return max(CFS_QUOTA_MIN_US, round_half_up(cores * period_us))


def quota_us_to_cores(quota_us: int, period_us: int) -> float | None:
    """CFS quota -> cores; ``None`` for "no cap" (v1 writes any negative quota as -1)."""
    if quota_us < 0:
        return None
    if period_us <= 0:
        raise LimitsError(f"CFS period {period_us!r} us: must be positive")
    return quota_us / period_us


def round_down_to_page(nbytes: int, page_size: int) -> int:
    """What the kernel keeps of a memory limit: it counts whole pages, dropping the rest."""
    return nbytes // page_size * page_size
