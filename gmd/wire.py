"""What an agent posts and what the daemon answers: the wire format of ``/v1``.

Pydantic checks shapes and types, and rejects unknown fields, negative or non-finite amounts;
:func:`batch_problems` checks what needs the daemon's configuration (interval length, clock).
Amounts are what the agent measured over the interval, in the resources' own units.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal, NotRequired

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, with_config
from typing_extensions import TypedDict

Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f]+$")]
VmId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[!-~]+$")]
Key = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[!-~]+$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capacity(Strict):
    """What the host offers per second: its supply in an interval is this × the length."""

    cpu_cores: Positive
    memory_bytes: Positive
    disk_bytes_per_s: Positive
    network_bytes_per_s: Positive


# The per-VM parts are TypedDicts, not models: a batch holds hundreds of them, and validating
# into dicts is about twice as fast as building model instances, with the same checks.


@with_config(ConfigDict(extra="forbid"))
class Flavor(TypedDict, total=False):
    """What the VM was configured with; a missing amount means "an equal split"."""

    vcpus: Positive | None
    memory_bytes: Positive | None
    disk_bytes_per_s: Positive | None
    network_bytes_per_s: Positive | None


@with_config(ConfigDict(extra="forbid"))
class VmUsage(TypedDict):
    """One VM's use in the interval, in the resources' own units, and who owns it."""

    uuid: VmId
    customer: Name
    cpu_s: Amount
    memory_byte_s: Amount
    disk_read_bytes: Amount
    disk_write_bytes: Amount
    network_rx_bytes: Amount
    network_tx_bytes: Amount
    flavor: NotRequired[Flavor]
    created_s: NotRequired[Annotated[int, Field(ge=0)] | None]


class SampleBatch(Strict):
    """One host's usage in one interval. ``key`` makes a retry count once."""

    key: Key
    host: Name
    interval_start_s: Annotated[int, Field(ge=0)]
    interval_s: Annotated[int, Field(gt=0)]
    capacity: Capacity
    vms: list[VmUsage]


class VmApplyResult(Strict):
    """What an agent did (or, in dry-run, would have done) to one VM, and whether it worked."""

    uuid: VmId
    action: Literal["apply", "restore", "would_apply", "would_restore"]
    ok: bool
    error: Annotated[str, StringConstraints(max_length=2000)] | None = None
    before: dict[str, float | int | str | None] = {}
    after: dict[str, float | int | str | None] = {}


class PlanReport(Strict):
    """An agent's account of applying the plan it fetched (only the VMs it changed or failed)."""

    generated_s: Annotated[int, Field(ge=0)]
    results: Annotated[list[VmApplyResult], Field(max_length=10000)]


class PlanReportReceipt(BaseModel):
    recorded: int


def digest_of(document: object) -> str:
    """A hash of a batch's content, to tell a retry (same content) from a reused key.

    Taken over the parsed document with keys sorted, so a retry that serializes the same batch
    in another order (a spool written by another JSON library) is still the same batch.
    """
    return hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()


class BatchReceipt(BaseModel):
    status: Literal["accepted", "duplicate"]
    key: str
    samples: int = Field(description="VMs in the batch")
    late: int = Field(0, description="of which arrived after their interval closed")


class Problem(BaseModel):
    """Every 4xx and 5xx body: what is wrong, in one sentence, and where."""

    detail: str
    errors: list[str] = []


class VmPlanItem(BaseModel):
    """What the agent sets on one VM; VMs not listed are left, or put back, as they were."""

    uuid: str
    customer: str
    level: int
    cpu_weight: int = Field(description="cgroup v2 / libvirt cpu_shares scale, 100 = normal")
    io_weight: int = Field(description="blkio / io.weight scale, 100 = normal")
    cpu_quota_cores: float | None = Field(description="hard CPU cap in cores; null: none")
    disk_read_bytes_per_s: float | None
    disk_write_bytes_per_s: float | None


class HostPlan(BaseModel):
    host: str
    generated_s: int
    mode: Literal["off", "dry-run", "on"] = Field(
        description='"dry-run": log what would be done, change nothing'
    )
    vms: list[VmPlanItem] = []


def batch_problems(
    batch: SampleBatch, *, interval_s: int, now_s: float, clock_skew_s: int, max_vms: int
) -> list[str]:
    """What makes a well-formed batch unacceptable here; empty when it is fine."""
    problems = []
    if batch.interval_s != interval_s:
        problems.append(
            f"interval_s = {batch.interval_s}, but this daemon accounts {interval_s} s intervals"
        )
    elif batch.interval_start_s % interval_s:
        problems.append(
            f"interval_start_s = {batch.interval_start_s} is not a multiple of {interval_s}"
        )
    end = batch.interval_start_s + batch.interval_s
    if end > now_s + clock_skew_s:
        problems.append(
            f"interval ends at {end}, {end - now_s:.0f} s in the future (allowed clock skew:"
            f" {clock_skew_s} s): is {batch.host}'s clock right?"
        )
    if len(batch.vms) > max_vms:
        problems.append(f"{len(batch.vms)} VMs in one batch; at most {max_vms}")
    seen: set[str] = set()
    for i, vm in enumerate(batch.vms):
        if vm["uuid"] in seen:
            problems.append(f"vms[{i}]: VM {vm['uuid']} appears twice in the batch")
        seen.add(vm["uuid"])
    return problems
