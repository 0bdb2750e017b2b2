"""What makes a well-formed batch unacceptable to this daemon.

The batch already keeps the wire format's rules; these checks need the daemon's own settings
(interval length, clock, batch size, what a host can plausibly do), so they are the daemon's,
not the wire contract's. Each problem carries a code, so the route picks its status from what
went wrong, not from words in the message.

Plausibility is checked at the door because one absurd number that gets in (1e308 bytes read,
100,000 core-seconds on a 4-core host in a minute) would dominate every balance it touches or
stop the engine: no VM can use more of a resource than its host has in the interval, nor all
the host's VMs together, and no host or flavor is larger than the configured sane bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from gmd.daemon.ingest.record import BatchRecord
from gmd.wire import CAPACITY_FIELDS, FLAVOR_FIELDS, RESOURCES, USAGE_FIELDS


class ProblemCode(Enum):
    INTERVAL_LENGTH = "interval_length"
    INTERVAL_ALIGNMENT = "interval_alignment"
    FUTURE = "future"
    TOO_OLD = "too_old"
    TOO_MANY_VMS = "too_many_vms"
    DUPLICATE_VM = "duplicate_vm"
    CREATED_IN_FUTURE = "created_in_future"
    CAPACITY_BOUND = "capacity_bound"
    FLAVOR_BOUND = "flavor_bound"
    VM_USE = "vm_use"
    HOST_USE = "host_use"


@dataclass(frozen=True)
class BatchProblem:
    code: ProblemCode
    message: str


def batch_problems(
    batch: BatchRecord,
    *,
    interval_s: int,
    now_s: float,
    clock_skew_s: int,
    max_vms: int,
    max_late_s: float | None = None,
) -> list[BatchProblem]:
    """Everything wrong with ``batch`` here, in order; empty when it is fine."""
    return [
        *_interval_problems(batch, interval_s, now_s, clock_skew_s, max_late_s),
        *_vm_problems(batch, max_vms, now_s + clock_skew_s),
    ]


def _interval_problems(
    batch: BatchRecord, interval_s: int, now_s: float, clock_skew_s: int, max_late_s: float | None
) -> list[BatchProblem]:
    problems = []
    if batch.interval_s != interval_s:
        problems.append(
            BatchProblem(
                ProblemCode.INTERVAL_LENGTH,
                f"interval_s = {batch.interval_s}, but this daemon accounts {interval_s} s"
                " intervals",
            )
        )
    elif batch.interval_start_s % interval_s:
        problems.append(
            BatchProblem(
                ProblemCode.INTERVAL_ALIGNMENT,
                f"interval_start_s = {batch.interval_start_s} is not a multiple of {interval_s}",
            )
        )
    end = batch.interval_start_s + batch.interval_s
    if end > now_s + clock_skew_s:
        problems.append(
            BatchProblem(
                ProblemCode.FUTURE,
                f"interval ends at {end}, {end - now_s:.0f} s in the future (allowed clock skew:"
                f" {clock_skew_s} s): is {batch.host}'s clock right?",
            )
        )
    elif max_late_s is not None and end < now_s - max_late_s:
        problems.append(
            BatchProblem(
                ProblemCode.TOO_OLD,
                f"interval ended at {end}, {now_s - end:.0f} s ago: this daemon takes batches at"
                f" most daemon.max_late_s = {max_late_s:.0f} s after their interval",
            )
        )
    return problems


def _vm_problems(batch: BatchRecord, max_vms: int, latest_s: float) -> list[BatchProblem]:
    problems = []
    uuids = batch.vm_uuids
    if len(uuids) > max_vms:
        problems.append(
            BatchProblem(
                ProblemCode.TOO_MANY_VMS,
                f"{len(uuids)} VMs in one batch; at most {max_vms} (daemon.max_batch_vms):"
                " split the batch",
            )
        )
    times = [t for t in batch.created_s if t is not None]
    if len(set(uuids)) == len(uuids) and max(times, default=0) <= latest_s:
        # The common case, told without a Python step per VM; the loop below names the VMs.
        return problems
    seen: set[str] = set()
    for i, (uuid, created) in enumerate(zip(uuids, batch.created_s, strict=True)):
        if uuid in seen:
            problems.append(
                BatchProblem(
                    ProblemCode.DUPLICATE_VM,
                    f"vms[{i}]: VM {uuid} appears twice in the batch",
                )
            )
        seen.add(uuid)
        if created is not None and created > latest_s:
            problems.append(
                BatchProblem(
                    ProblemCode.CREATED_IN_FUTURE,
                    f"vms[{i}]: VM {uuid} created_s = {created} is in the future",
                )
            )
    return problems


@dataclass(frozen=True)
class Plausible:
    """The bounds of the plausibility check: ``margin`` is the slack over what a host can do
    (counters read a little late or early), ``max_capacity`` the largest sane host, one per
    :data:`~gmd.wire.CAPACITY_FIELDS` (flavors are bounded by the same figures)."""

    margin: float
    max_capacity: tuple[float, ...]


# Per usage field, its resource's position in RESOURCES (disk reads and writes are each bounded
# by the disk bandwidth, received and sent bytes each by the link speed: full duplex).
_FIELD_RESOURCE = np.array([i for i, r in enumerate(RESOURCES) for _ in r.batch_fields])
_MAX_LISTED = 5
_CPU = USAGE_FIELDS.index("cpu_s")


def implausible(record: BatchRecord, bounds: Plausible) -> list[BatchProblem]:
    """What in ``record`` no host could have done: capacity or flavors beyond the sane bounds,
    a VM using more than its host has in the interval, or all of them together doing so."""
    problems = []
    capacity = np.asarray(record.capacity, dtype=np.float64)
    maxima = np.asarray(bounds.max_capacity, dtype=np.float64)
    for k in np.flatnonzero(capacity > maxima).tolist():
        problems.append(
            BatchProblem(
                ProblemCode.CAPACITY_BOUND,
                f"capacity.{CAPACITY_FIELDS[k]} = {capacity[k]:.6g} is beyond the largest sane"
                f" host (daemon.max_host_{_bound_key(k)} = {maxima[k]:.6g})",
            )
        )
    # A flavor figure not given is NaN, which is over no bound.
    over_flavor = np.argwhere(record.flavor > maxima[None, :])
    problems += _listed(
        ProblemCode.FLAVOR_BOUND,
        [
            f"vms[{i}] {record.vm_uuids[i]}: flavor.{FLAVOR_FIELDS[k]} ="
            f" {record.flavor[i, k]:.6g} is beyond the largest sane host"
            f" (daemon.max_host_{_bound_key(k)} = {maxima[k]:.6g})"
            for i, k in over_flavor.tolist()
        ],
    )
    if problems:
        return problems
    # What the host could give one VM, or all of them, in the interval, per usage field.
    limit = capacity[_FIELD_RESOURCE] * record.interval_s * (1 + bounds.margin)
    use = record.use
    over_vm = np.argwhere(use > limit[None, :])
    problems += _listed(
        ProblemCode.VM_USE,
        [
            f"vms[{i}] {record.vm_uuids[i]}: {USAGE_FIELDS[k]} = {use[i, k]:.6g}"
            f" {_unit(k)} is more than host {record.host} can give in {record.interval_s} s"
            f" ({_limit_text(capacity, k, record.interval_s, bounds.margin)})"
            for i, k in over_vm.tolist()
        ],
    )
    if problems:
        return problems
    if record.host_cpu_s is not None and record.host_cpu_s > limit[_CPU]:
        bound = _limit_text(capacity, _CPU, record.interval_s, bounds.margin)
        problems.append(
            BatchProblem(
                ProblemCode.HOST_USE,
                f"host_cpu_s = {record.host_cpu_s:.6g} core-s is more than host {record.host}"
                f" can give in {record.interval_s} s ({bound})",
            )
        )
    total = use.sum(axis=0)
    for k in np.flatnonzero(total > limit).tolist():
        bound = _limit_text(capacity, k, record.interval_s, bounds.margin)
        problems.append(
            BatchProblem(
                ProblemCode.HOST_USE,
                f"the VMs of host {record.host} together used {USAGE_FIELDS[k]} ="
                f" {total[k]:.6g} {_unit(k)}, more than the host can give in"
                f" {record.interval_s} s ({bound})",
            )
        )
    return problems


def _bound_key(k: int) -> str:
    """The configuration key's tail for capacity field ``k`` (cpu_cores → cores)."""
    return CAPACITY_FIELDS[k].removeprefix("cpu_")


def _unit(field: int) -> str:
    return RESOURCES[int(_FIELD_RESOURCE[field])].unit


def _limit_text(capacity: np.ndarray, field: int, interval_s: int, margin: float) -> str:
    r = int(_FIELD_RESOURCE[field])
    name = CAPACITY_FIELDS[r]
    bound = capacity[r] * interval_s * (1 + margin)
    return (
        f"capacity.{name} {capacity[r]:.6g} × {interval_s} s × (1 + daemon.plausibility_margin"
        f" {margin:g}) = {bound:.6g}"
    )


def _listed(code: ProblemCode, messages: list[str]) -> list[BatchProblem]:
    """The first few of ``messages`` as problems, and how many more there were."""
    shown = [BatchProblem(code, m) for m in messages[:_MAX_LISTED]]
    if len(messages) > _MAX_LISTED:
        shown.append(BatchProblem(code, f"... and {len(messages) - _MAX_LISTED} more like these"))
    return shown
