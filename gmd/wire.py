"""What an agent posts and what the daemon answers: the wire format of ``/v1``, in the one place
both sides import it from (gmd-agent never imports the daemon, nor the daemon the agent).

Pydantic checks shapes and types in strict mode (a number must be a JSON number: ``"5"``,
``true`` and ``5.0`` for a count are refused, not coerced), and rejects unknown fields,
negative or non-finite amounts, VM ids that are not canonical UUIDs and names holding control,
bidi or zero-width characters; the daemon's :mod:`gmd.daemon.ingest.checks` checks what needs its
configuration (interval length, clock, what a host can plausibly do). Amounts are what the
agent measured over the interval, in the resources' own units.
"""

from __future__ import annotations

import enum
import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
    with_config,
)
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import TypedDict

SAMPLES_PATH = "/v1/samples"
"""Where an agent posts its :class:`SampleBatch` (the daemon answers a :class:`BatchReceipt`)."""

# The largest integer a JSON reader in any language holds exactly (2^53 - 1): times beyond it
# are no time an agent can mean, and would overflow the ledger's 64-bit columns.
MAX_JSON_INT = 2**53 - 1

Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
UnixTime = Annotated[int, Field(ge=0, le=MAX_JSON_INT)]
# Unicode categories a name must not hold: control (Cc), format (Cf: bidi overrides, zero-width
# joiners and spaces), surrogates, private use and unassigned code points, and the line and
# paragraph separators. Such characters make two names look alike, or reorder a terminal line.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


@lru_cache(maxsize=65536)
def visible_name(name: str) -> str:
    """``name`` unchanged if every character shows as itself, else ValueError naming the first
    one that does not. Cached: a batch repeats a few customer names hundreds of times."""
    for i, ch in enumerate(name):
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            raise ValueError(
                f"character {i} is U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')}):"
                " names may not hold control, bidi or zero-width characters"
            )
    if name != name.strip():
        raise ValueError("names may not begin or end with white space")
    return name


_PROJECT_ID = re.compile(
    r"[0-9a-fA-F]{32}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


@lru_cache(maxsize=65536)
def canonical_customer(name: str) -> str:
    """A customer as the ledger stores it: a project id (32 hex digits, with or without the
    dashes of a UUID, in any case) as Keystone writes it, 32 lowercase hex digits; any other
    name as it is. One spelling per project: the ledger, Placement's comparison and the read
    API's access check all see the same customer however a host or a user spelled it."""
    if _PROJECT_ID.fullmatch(name):
        return name.replace("-", "").lower()
    return name


MAX_NAME = 255
"""The longest name (host, customer, project name) the ledger stores."""
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME), AfterValidator(visible_name)
]
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
UUID_RULE = "a VM id must be a UUID: 8-4-4-4-12 lowercase hex digits"
"""Why: one VM, one spelling (no upper case, braces or missing dashes), and no path or markup
in an id. Checked by pydantic's own pattern matching: a Python validator per VM cost a tenth
of a batch's parsing."""


VmId = Annotated[
    str,
    StringConstraints(pattern=UUID_PATTERN),
    Field(
        json_schema_extra={"format": "uuid", "pattern": UUID_PATTERN},
        description="the domain's UUID, lowercase, 8-4-4-4-12 hex digits",
    ),
]
Key = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[!-~]+$")]


@dataclass(frozen=True)
class Resource:
    """One resource gmd accounts, and where its numbers travel.

    ``batch_fields`` are the VM usage amounts an agent posts for it (in ``unit`` per interval;
    disk and network are posted as reads/writes and received/sent), which are also the
    ``samples`` columns; ``split_names`` are the resources it becomes with
    ``accounting.split_io``, one per batch field. ``capacity_field`` is what the host offers
    per second, ``flavor_field`` what a VM was configured with.
    """

    name: str
    unit: str
    batch_fields: tuple[str, ...]
    split_names: tuple[str, ...]
    capacity_field: str
    flavor_field: str


# The one list of resources: accounting, the store, the agent's aggregation and the API all
# read it, in this order, instead of repeating position lists.
RESOURCES: tuple[Resource, ...] = (
    Resource("cpu", "core-s", ("cpu_s",), ("cpu",), "cpu_cores", "vcpus"),
    Resource("memory", "byte-s", ("memory_byte_s",), ("memory",), "memory_bytes", "memory_bytes"),
    Resource(
        "disk",
        "bytes",
        ("disk_read_bytes", "disk_write_bytes"),
        ("disk_read", "disk_write"),
        "disk_bytes_per_s",
        "disk_bytes_per_s",
    ),
    Resource(
        "network",
        "bytes",
        ("network_rx_bytes", "network_tx_bytes"),
        ("network_rx", "network_tx"),
        "network_bytes_per_s",
        "network_bytes_per_s",
    ),
)
USAGE_FIELDS: tuple[str, ...] = tuple(f for r in RESOURCES for f in r.batch_fields)
CAPACITY_FIELDS: tuple[str, ...] = tuple(r.capacity_field for r in RESOURCES)
FLAVOR_FIELDS: tuple[str, ...] = tuple(r.flavor_field for r in RESOURCES)
RESOURCES_COMBINED: tuple[str, ...] = tuple(r.name for r in RESOURCES)
RESOURCES_SPLIT: tuple[str, ...] = tuple(n for r in RESOURCES for n in r.split_names)


def resource_names(split_io: bool) -> tuple[str, ...]:
    """The resources accounted: one per :data:`RESOURCES` entry, or one per batch field."""
    return RESOURCES_SPLIT if split_io else RESOURCES_COMBINED


class Strict(BaseModel):
    """Strict: unknown fields are refused and nothing is coerced (``"5"`` is not 5)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Capacity(Strict):
    """What the host offers per second: its supply in an interval is this × the length."""

    cpu_cores: Positive
    memory_bytes: Positive
    disk_bytes_per_s: Positive
    network_bytes_per_s: Positive


# The per-VM parts are TypedDicts, not models: a batch holds hundreds of them, and validating
# into dicts is about twice as fast as building model instances, with the same checks.


@with_config(ConfigDict(extra="forbid", strict=True))
class Flavor(TypedDict, total=False):
    """What the VM was configured with; a missing amount means "an equal split"."""

    vcpus: Positive | None
    memory_bytes: Positive | None
    disk_bytes_per_s: Positive | None
    network_bytes_per_s: Positive | None


@with_config(ConfigDict(extra="forbid", strict=True))
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
    created_s: NotRequired[UnixTime | None]


MAX_CUSTOMER_NAMES = 10_000
"""At most one name per VM; a host holds far fewer VMs than this."""


class SampleBatch(Strict):
    """One host's usage in one interval. ``key`` makes a retry count once."""

    key: Key
    host: Name
    interval_start_s: UnixTime
    interval_s: Annotated[int, Field(gt=0, le=MAX_JSON_INT)]
    capacity: Capacity
    vms: list[VmUsage]
    customer_names: Annotated[dict[Name, Name], Field(max_length=MAX_CUSTOMER_NAMES)] = {}
    """Customer → its project's name as Nova wrote it into the domains (for people; Keystone's
    name, where the daemon reads one, wins). Only customers of this batch's VMs."""
    host_cpu_s: Amount | None = None
    """The host's busy CPU core-seconds in the interval, all its work (its VMs, QEMU, the
    host's own processes; ``/proc/stat`` less idle and iowait): a host saturated by other
    work is contended though its VMs idle. Absent (an older agent, a remote hypervisor):
    contention is judged by the VMs' use alone. A host's batches for one interval add up."""

    @model_validator(mode="after")
    def _names_of_this_batch(self) -> SampleBatch:
        if self.customer_names:
            mine = {vm["customer"] for vm in self.vms}
            stray = sorted(set(self.customer_names) - mine)
            if stray:
                raise ValueError(
                    f"customer_names names {stray[0]!r}, which owns no VM of this batch"
                )
        return self


class PlanMode(enum.StrEnum):
    """How the daemon enforces (``[enforcement] mode``, and each host plan's ``mode``)."""

    off = "off"
    """nothing decided, nothing applied"""
    dry_run = "dry-run"
    """levels decided and recorded with what they would do; nothing applied"""
    on = "on"
    """decided, recorded and applied"""

    @property
    def words(self) -> str:
        """The mode and what it means, as every report and page says it (``dry-run: levels
        decided and recorded, not applied``)."""
        return f"{self.value}: {_MODE_MEANING[self]}"


_MODE_MEANING = {
    PlanMode.off: "nothing is decided or applied",
    PlanMode.dry_run: "levels decided and recorded, not applied",
    PlanMode.on: "levels decided and applied by the agents and the quota job",
}

PLAN_MODES: tuple[PlanMode, ...] = tuple(PlanMode)


ApplyAction = Literal["apply", "restore", "would_apply", "would_restore"]
"""What an agent did to a VM (``would_``: what it would have done, in dry-run)."""


# What a VM's settings were or became (cpu_shares, vcpu_quota, a cgroup file…): a few named
# values, bounded so that a report cannot bloat the enforcement log.
Settings = Annotated[
    dict[
        Annotated[str, StringConstraints(min_length=1, max_length=64)],
        float | int | Annotated[str, StringConstraints(max_length=256)] | None,
    ],
    Field(max_length=32),
]


class Knob(enum.StrEnum):
    """One thing a host can hold a VM to. The plan's item asks for some of them; a host has
    some of them (its :class:`HostCapabilities`); an apply reports on each it was asked for
    (:class:`KnobResult`). The names are the operator's, whatever file or call sets them."""

    cpu_weight = "cpu_weight"
    """the VM's share of contended CPUs (v1 ``cpu.shares``, v2 ``cpu.weight``, libvirt
    ``cpu_shares``)"""
    cpu_cap = "cpu_cap"
    """a hard CPU cap (v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``, libvirt ``vcpu_quota``)"""
    disk_weight = "disk_weight"
    """the VM's share of a contended disk: a proportional I/O scheduler's weight (BFQ's
    ``blkio.bfq.weight`` / ``io.bfq.weight``, or v2 ``io.weight`` where the io cost model is
    on); nothing on a disk run by ``none``, ``mq-deadline`` or ``kyber``"""
    disk_limit = "disk_limit"
    """bytes/s caps on the VM's disks (libvirt ``blockIoTune``: QEMU's own throttling; v1
    ``blkio.throttle.*``, v2 ``io.max``): any disk scheduler"""
    network_limit = "network_limit"
    """bandwidth caps on the VM's interfaces (libvirt's ``<bandwidth>``, which needs ``tc``);
    no plan asks for one today"""

    @property
    def words(self) -> str:
        """How reports name the knob: "CPU cap", "disk weight"."""
        return _KNOB_WORDS[self]


_KNOB_WORDS = {
    Knob.cpu_weight: "CPU weight",
    Knob.cpu_cap: "CPU cap",
    Knob.disk_weight: "disk weight",
    Knob.disk_limit: "disk limit",
    Knob.network_limit: "network limit",
}


def knob_words(name: str) -> str:
    """A knob as reports name it, from its name as a report or the log holds it; a name this
    side does not know (a newer agent's) as it is."""
    try:
        return Knob(name).words
    except ValueError:
        return name


class KnobOutcome(enum.StrEnum):
    """What became of one knob of one VM in an apply or restore."""

    applied = "applied"
    """it holds the plan's value (written now, or already there)"""
    restored = "restored"
    """it holds the VM's original value again"""
    unsupported = "unsupported"
    """this host cannot set it (the detail says why); not a failure: the rest was applied"""
    failed = "failed"
    """setting it failed (the detail holds the error)"""


# Enums in the strict models below are read from their values: the daemon validates parsed
# JSON, in which an enum can only be its string.
_ByValue = Field(strict=False)
Detail = Annotated[str, StringConstraints(max_length=500, pattern=r"^[^\x00]*$")]


class KnobResult(Strict):
    """One knob of one VM's apply or restore, and why it is not applied where it is not."""

    knob: Annotated[Knob, _ByValue]
    outcome: Annotated[KnobOutcome, _ByValue]
    detail: Detail = ""


class KnobSupport(enum.StrEnum):
    """Whether a host can set a knob (:class:`HostCapabilities`)."""

    supported = "supported"
    unsupported = "unsupported"
    unknown = "unknown"
    """not known yet: what would tell is not there (no VM runs to ask libvirt about)"""


class KnobCapability(Strict):
    """One knob on one host: whether it can be set, through what, and if not why."""

    knob: Annotated[Knob, _ByValue]
    support: Annotated[KnobSupport, _ByValue]
    via: Detail = ""
    """what sets it here: "cpu.cfs_quota_us (cgroup v1)", "libvirt blockIoTune (QEMU)" """
    reason: Detail = ""
    """why not (unsupported, unknown), or a caveat"""


MAX_DEVICES = 256


class HostCapabilities(Strict):
    """What one host's agent found it can do (``gmd-agent --check`` prints it;
    ``PUT /v1/hosts/{host}/capabilities`` tells the daemon, which plans with it)."""

    backend: Annotated[str, StringConstraints(max_length=32)]
    """``agent.enforce_backend``: "libvirt", "cgroup" or "none" """
    cgroup: Annotated[str, StringConstraints(max_length=32)]
    """the VMs' cgroup layout: "v1", "v2", "hybrid" (v1 controllers beside an empty v2) or
    "none" (no cgroup found: a remote hypervisor, a container without /sys/fs/cgroup)"""
    schedulers: Annotated[
        dict[Annotated[str, StringConstraints(min_length=1, max_length=64)], Detail],
        Field(max_length=MAX_DEVICES),
    ] = {}
    """block device → its active I/O scheduler (the one in brackets in
    ``/sys/block/DEV/queue/scheduler``), for the disks the VMs' I/O reaches"""
    knobs: Annotated[list[KnobCapability], Field(max_length=len(Knob))]
    probed_s: UnixTime

    def support(self, knob: Knob) -> KnobCapability:
        """The host's word on ``knob`` (unknown when it said nothing of it)."""
        for k in self.knobs:
            if k.knob == knob:
                return k
        return KnobCapability(knob=knob, support=KnobSupport.unknown, reason="not reported")

    def unsupported(self) -> dict[Knob, str]:
        """The knobs this host cannot set, with why."""
        return {k.knob: k.reason for k in self.knobs if k.support == KnobSupport.unsupported}


class HostCapabilitiesReceipt(BaseModel):
    host: str
    changed: bool = Field(description="whether this differs from what the host said before")


class VmApplyResult(Strict):
    """What an agent did (or, in dry-run, would have done) to one VM, and whether it worked.

    ``error`` may not hold NUL: PostgreSQL's text columns cannot store it, so the report would
    fail as a database error (a 503, which agents retry for ever). No OS or libvirt message
    holds one: they are C strings.
    """

    uuid: VmId
    action: ApplyAction
    ok: bool
    error: Annotated[str, StringConstraints(max_length=2000, pattern=r"^[^\x00]*$")] | None = None
    before: Settings = {}
    after: Settings = {}
    knobs: Annotated[list[KnobResult], Field(max_length=len(Knob))] = []
    """per knob the plan asked of the VM (or gmd put back): applied, restored, unsupported
    here (why) or failed (the error). Empty from an agent older than knobs: ``ok`` and
    ``error`` then speak for the VM as a whole."""


MAX_REPORT_RESULTS = 10_000
"""The most VM results one report holds (a host holds far fewer VMs)."""


class PlanReport(Strict):
    """An agent's account of applying the plan it fetched (only the VMs it changed or failed).

    ``restore_all``: the report of ``gmd-agent --restore-all``, not of a plan (``generated_s``
    is then when it ran): every VM gmd had changed on the host is back as it was, those listed
    and any other."""

    generated_s: UnixTime
    results: Annotated[list[VmApplyResult], Field(max_length=MAX_REPORT_RESULTS)]
    restore_all: bool = False


class PlanReportReceipt(BaseModel):
    recorded: int = Field(description="rows written to the enforcement log")
    ignored: list[str] = Field(
        [],
        description="VMs of the report that do not run on the host as far as the ledger knows"
        " (not in its latest accounted interval, nor last reported by it): not recorded",
    )


BatchStatus = Literal["accepted", "duplicate"]


class BatchReceipt(BaseModel):
    status: BatchStatus
    key: str
    samples: int = Field(description="VMs in the batch")
    late: int = Field(0, description="of which arrived after their interval closed")
    set_aside: list[str] = Field(
        [],
        description="VMs of the batch Placement contradicts, each with why: their samples are"
        " kept aside (quarantined), not in ``samples``",
    )


class Problem(BaseModel):
    """Every 4xx and 5xx body: what is wrong, in one sentence, and where."""

    detail: str
    errors: list[str] = []


# What a plan item may ask, checked by the agent per item when a plan arrives (one bad item is
# refused and reported, the rest applied) and respected by the daemon's plan builder. Weights
# are on the cgroup v2 / libvirt ``cpu_shares`` scale; a cap is a finite amount within its
# range, and no cap is ``null``, never 0 or a negative number (those once meant "1 %" to the
# libvirt applier and "no cap" to the cgroup one). The CPU floor is the kernel's smallest
# quota (1 ms per 100 ms period); the ceilings are far above any host (a VM capped at 65536
# cores, or at 2^50 bytes/s ≈ 1 PB/s, is not capped) and keep the kernel's and libvirt's
# integer fields from overflowing.
WEIGHT_MIN = 1
WEIGHT_MAX = 10_000
WEIGHT_DEFAULT = 100
CPU_CAP_MIN_CORES = 0.01
CPU_CAP_MAX_CORES = 65_536.0
DISK_CAP_MIN_BYTES_PER_S = 1.0
DISK_CAP_MAX_BYTES_PER_S = float(2**50)

Weight = Annotated[int, Field(ge=WEIGHT_MIN, le=WEIGHT_MAX)]
CpuCapCores = Annotated[
    float, Field(ge=CPU_CAP_MIN_CORES, le=CPU_CAP_MAX_CORES, allow_inf_nan=False)
]
DiskCapBytesPerS = Annotated[
    float, Field(ge=DISK_CAP_MIN_BYTES_PER_S, le=DISK_CAP_MAX_BYTES_PER_S, allow_inf_nan=False)
]


class VmPlanItem(BaseModel):
    """What the agent sets on one VM; VMs not listed are left, or put back, as they were."""

    uuid: VmId
    customer: str
    level: Annotated[int, Field(ge=0)]
    cpu_weight: Weight = Field(description="cgroup v2 / libvirt cpu_shares scale, 100 = normal")
    io_weight: Weight = Field(description="blkio / io.weight scale, 100 = normal")
    cpu_quota_cores: CpuCapCores | None = Field(
        description="hard CPU cap in cores for the whole VM; null: none"
    )
    disk_read_bytes_per_s: DiskCapBytesPerS | None
    disk_write_bytes_per_s: DiskCapBytesPerS | None

    def asks(self) -> tuple[Knob, ...]:
        """The knobs this item moves from normal (a weight of 100 and no cap ask nothing)."""
        asked = []
        if self.cpu_weight != WEIGHT_DEFAULT:
            asked.append(Knob.cpu_weight)
        if self.cpu_quota_cores is not None:
            asked.append(Knob.cpu_cap)
        if self.io_weight != WEIGHT_DEFAULT:
            asked.append(Knob.disk_weight)
        if self.disk_read_bytes_per_s is not None or self.disk_write_bytes_per_s is not None:
            asked.append(Knob.disk_limit)
        return tuple(asked)


class RefusedPlanItem(BaseModel):
    """A plan item the agent would not apply, and why (``uuid``: ``None`` when the item does
    not even name a VM). Not on the wire: the agent reports it as a failed ``apply``."""

    uuid: str | None
    reason: str


def within(value: float | None, low: float, high: float) -> float | None:
    """A cap brought into ``[low, high]`` (the plan's ranges above); ``None`` (no cap) and NaN
    give ``None``. For the daemon's plan builder: a flavor or setting outside the range still
    gives a valid item."""
    if value is None or math.isnan(value):
        return None
    return min(max(value, low), high)


def check_plan_items(items: object) -> tuple[object, list[RefusedPlanItem]]:
    """``items`` (a plan's ``vms`` as received) split into the valid items and the refused
    ones, so that one bad item cannot keep a host's other VMs from their plan. Anything but a
    list is returned as it is, for the plan's own validation to refuse."""
    if not isinstance(items, list):
        return items, []
    kept: list[object] = []
    refused: list[RefusedPlanItem] = []
    for i, raw in enumerate(items):
        try:
            kept.append(raw if isinstance(raw, VmPlanItem) else VmPlanItem.model_validate(raw))
        except ValidationError as exc:
            uuid = raw.get("uuid") if isinstance(raw, dict) else None
            named = isinstance(uuid, str) and re.fullmatch(UUID_PATTERN, uuid) is not None
            refused.append(
                RefusedPlanItem(uuid=uuid if named else None, reason=item_problems(i, exc))
            )
    return kept, refused


def item_problems(index: int, exc: ValidationError) -> str:
    """A refused item's problems in one line: ``vms[3].cpu_quota_cores=nan: Input should be a
    finite number``."""
    parts = []
    for e in exc.errors()[:3]:
        where = "".join(f".{x}" for x in e["loc"])
        value = e.get("input")
        shown = repr(value)[:40] if not isinstance(value, dict) else "{…}"
        parts.append(f"vms[{index}]{where}={shown}: {e['msg']}")
    return "; ".join(parts)


class HostCaps(BaseModel):
    """Whether the hard caps of one resource are in this host's plan, and why: a level's caps
    apply only where the host is contended for that resource (weights apply everywhere).

    For people and logs: an agent applies the items as they are and need not read this (a
    VM whose cap was withheld has none in its item, and the applier puts a cap it set
    earlier back to the VM's original). Plain strings and optional figures rather than enums,
    so that a reason added later cannot make an older agent refuse its whole plan."""

    resource: str = Field(description='"cpu" (the CPU cap) or "disk" (the disk caps)')
    applied: bool
    reason: str = Field(description='"contended", "idle", "unmeasured" or "always"')
    utilisation: float | None = Field(
        None, description="the host's use ÷ capacity over the intervals measured; null: none"
    )
    threshold: float = Field(description="[enforcement] contended_above for the resource")
    intervals: int = Field(0, description="intervals of the host measured")
    window: int = Field(0, description="intervals looked at ([enforcement] contention_intervals)")
    why: str = Field("", description='in words: "applied: cpu 91 % ≥ 80 %"')


class HostPlan(BaseModel):
    """Unknown fields are ignored (not refused, unlike what agents post): a daemon newer than
    its agents may tell them more than they know how to read."""

    host: str
    generated_s: int
    mode: PlanMode = Field(description='"dry-run": log what would be done, change nothing')
    vms: list[VmPlanItem] = []
    caps: list[HostCaps] = Field(
        default=[], description="per capped resource, whether its caps apply here and why"
    )
    refused: SkipJsonSchema[list[RefusedPlanItem]] = Field(default=[], exclude=True)
    """The items of ``vms`` as received that were not valid (:func:`check_plan_items`), set
    here and never read from the wire."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_bad_items(cls, data: Any) -> Any:
        if isinstance(data, dict):
            vms, refused = check_plan_items(data.get("vms", []))
            data = {**data, "vms": vms, "refused": refused}
        return data
