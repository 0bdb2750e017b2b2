"""What makes a well-formed batch unacceptable to this daemon.

Pydantic has already checked the batch's shape; these checks need the daemon's own settings
(interval length, clock, batch size), so they are the daemon's, not the wire contract's. Each
problem carries a code, so the route picks its status from what went wrong, not from words in
the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gmd.wire import SampleBatch


class ProblemCode(Enum):
    INTERVAL_LENGTH = "interval_length"
    INTERVAL_ALIGNMENT = "interval_alignment"
    FUTURE = "future"
    TOO_MANY_VMS = "too_many_vms"
    DUPLICATE_VM = "duplicate_vm"


@dataclass(frozen=True)
class BatchProblem:
    code: ProblemCode
    message: str


def batch_problems(
    batch: SampleBatch, *, interval_s: int, now_s: float, clock_skew_s: int, max_vms: int
) -> list[BatchProblem]:
    """Everything wrong with ``batch`` here, in order; empty when it is fine."""
    return [
        *_interval_problems(batch, interval_s, now_s, clock_skew_s),
        *_vm_problems(batch, max_vms),
    ]


def _interval_problems(
    batch: SampleBatch, interval_s: int, now_s: float, clock_skew_s: int
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
    return problems


def _vm_problems(batch: SampleBatch, max_vms: int) -> list[BatchProblem]:
    problems = []
    if len(batch.vms) > max_vms:
        problems.append(
            BatchProblem(
                ProblemCode.TOO_MANY_VMS, f"{len(batch.vms)} VMs in one batch; at most {max_vms}"
            )
        )
    seen: set[str] = set()
    for i, vm in enumerate(batch.vms):
        if vm["uuid"] in seen:
            problems.append(
                BatchProblem(
                    ProblemCode.DUPLICATE_VM,
                    f"vms[{i}]: VM {vm['uuid']} appears twice in the batch",
                )
            )
        seen.add(vm["uuid"])
    return problems
