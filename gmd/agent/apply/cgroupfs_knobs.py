"""What each knob of a :class:`~gmd.agent.apply.limits.VmLimits` asks of a VM's cgroup
control files, per cgroup version (pure): one :data:`Transform` per file, from the file's
state to the state wanted. A knob the limits leave at ``None`` asks nothing of its files;
:mod:`gmd.agent.apply.cgroupfs_writes` then puts them back to their original state.
"""

from __future__ import annotations

from collections.abc import Callable

from gmd.agent.apply.cgroupfs_formats import State, io_max_fields, io_max_value
from gmd.agent.apply.limits import (
    BLKIO_WEIGHT_DEFAULT_BFQ,
    BLKIO_WEIGHT_DEFAULT_CFQ,
    CFS_PERIOD_DEFAULT_US,
    VmLimits,
    cpu_quota_to_us,
    cpu_weight_to_shares,
    io_weight_to_blkio,
    round_down_to_page,
)

# The disk weight files: which of them exists depends on the I/O schedulers the kernel has
# (CFQ was removed in Linux 5.0, BFQ is often not built: then neither); a missing one is not a
# failure. Whether a weight written does anything depends on each disk's scheduler:
# gmd.agent.capabilities decides, and the applier then does not ask for a weight at all.
V1_WEIGHT_FILES = ("blkio.weight", "blkio.bfq.weight")
WEIGHT_FILES = (*V1_WEIGHT_FILES, "io.bfq.weight")

Transform = Callable[[State], State]
"""a file's state → the state the limits want of it (per device where the file has lines per
device: the other devices' lines stay)"""


def v2_transforms(limits: VmLimits, page_size: int) -> dict[str, Transform]:
    """What ``limits`` ask of a v2 cgroup's files."""
    out: dict[str, Transform] = {}
    if limits.cpu_weight is not None:
        weight = str(limits.cpu_weight)
        out["cpu.weight"] = lambda _s: {"": weight}
    if limits.cpu_quota is not None:
        cores = limits.cpu_quota

        def cpu_max(state: State) -> State:
            parts = state.get("", "").split()
            period = int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else None
            period = period or CFS_PERIOD_DEFAULT_US
            return {"": f"{cpu_quota_to_us(cores, period)} {period}"}

        out["cpu.max"] = cpu_max
    if limits.io_weight is not None:
        io_weight = str(limits.io_weight)
        bfq_weight = str(io_weight_to_blkio(limits.io_weight, BLKIO_WEIGHT_DEFAULT_BFQ))
        out["io.weight"] = lambda s: {**s, "default": io_weight}
        out["io.bfq.weight"] = lambda s: {**s, "default": bfq_weight}
    if limits.io_bytes_per_s:
        caps = limits.io_bytes_per_s

        def io_max(state: State) -> State:
            new = dict(state)
            for device, (read, write) in caps.items():
                fields = io_max_fields(new.get(device, ""))
                if read is not None:
                    fields["rbps"] = str(read)
                if write is not None:
                    fields["wbps"] = str(write)
                if any(v != "max" for v in fields.values()):
                    new[device] = io_max_value(fields)
                else:
                    new.pop(device, None)
            return new

        out["io.max"] = io_max
    if limits.memory_high_bytes is not None:
        high = str(round_down_to_page(limits.memory_high_bytes, page_size))
        out["memory.high"] = lambda _s: {"": high}
    return out


def v1_transforms(limits: VmLimits, page_size: int, cfs_period_us: int) -> dict[str, Transform]:
    """What ``limits`` ask of a v1 cgroup's files (``cfs_period_us``: its CPU period, which
    the quota is a share of)."""
    out: dict[str, Transform] = {}
    if limits.cpu_weight is not None:
        shares = str(cpu_weight_to_shares(limits.cpu_weight))
        out["cpu.shares"] = lambda _s: {"": shares}
    if limits.cpu_quota is not None:
        period = cfs_period_us
        quota = str(cpu_quota_to_us(limits.cpu_quota, period))
        out["cpu.cfs_quota_us"] = lambda _s: {"": quota}
    if limits.io_weight is not None:
        cfq = str(io_weight_to_blkio(limits.io_weight, BLKIO_WEIGHT_DEFAULT_CFQ))
        bfq = str(io_weight_to_blkio(limits.io_weight, BLKIO_WEIGHT_DEFAULT_BFQ))
        out["blkio.weight"] = lambda _s: {"": cfq}
        out["blkio.bfq.weight"] = lambda _s: {"": bfq}
    if limits.io_bytes_per_s:
        reads = {d: str(r) for d, (r, _w) in limits.io_bytes_per_s.items() if r is not None}
        writes = {d: str(w) for d, (_r, w) in limits.io_bytes_per_s.items() if w is not None}
        if reads:
            out["blkio.throttle.read_bps_device"] = lambda s: {**s, **reads}
        if writes:
            out["blkio.throttle.write_bps_device"] = lambda s: {**s, **writes}
    if limits.memory_high_bytes is not None:
        soft = str(round_down_to_page(limits.memory_high_bytes, page_size))
        out["memory.soft_limit_in_bytes"] = lambda _s: {"": soft}
    return out
