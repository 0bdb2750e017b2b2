"""``POST /v1/samples``: where agents' usage enters the ledger.

The body is parsed by hand rather than by FastAPI, which is several times faster on batches of
hundreds of VMs and lets a refusal name the exact spot. Nothing of a refused batch is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol, cast

import numpy as np
import orjson
from fastapi import APIRouter, Response
from pydantic import ValidationError

from gmd.daemon.api import fast_batch
from gmd.daemon.api.checks import (
    BatchProblem,
    ProblemCode,
    batch_problems,
    implausible,
)
from gmd.daemon.api.deps import Caller, ServicesDep
from gmd.daemon.api.errors import Refused, json_document, json_media, validation_problem
from gmd.daemon.api.limits import Claim
from gmd.daemon.api.metrics import DaemonMetrics, Rejection
from gmd.daemon.api.services import Services
from gmd.daemon.ledger.store import (
    DIGEST_PREFIX,
    BatchRecord,
    BeforeOrigin,
    CapacityConflict,
    IngestResult,
    KeyReused,
)
from gmd.daemon.placement.view import VERIFIED, Verdict
from gmd.wire import (
    CAPACITY_FIELDS,
    FLAVOR_FIELDS,
    USAGE_FIELDS,
    BatchReceipt,
    SampleBatch,
    canonical_customer,
)

log = logging.getLogger(__name__)

router = APIRouter()

# FastAPI does not see the body (the route reads it), so the spec is told what it holds.
_BATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SampleBatch"}}},
    }
}


SAMPLES_PATH = "/v1/samples"


@router.post(SAMPLES_PATH, response_model=BatchReceipt, openapi_extra=_BATCH_BODY)
async def post_samples(host: Caller, services: ServicesDep) -> Response:
    """Store one host's usage for one interval (a ``SampleBatch``). A retry with the same
    key is acknowledged again and counted once."""
    # The app's SampleIntake (gmd.daemon.api.intake) serves this route ahead of FastAPI's
    # routing; it is declared here for the API's description, with its token parameter.
    raise AssertionError(f"POST {SAMPLES_PATH} is served by gmd.daemon.api.intake")


def parse_and_store(
    services: Services, body: bytes, content_type: str | None, host: str | None, started: float
) -> BatchReceipt:
    """Parse, check and store a batch, in one hand-off to the ingest threads: parsing and
    validating 500 VMs takes ~0.3 ms, which on the event loop would hold up every other
    request."""
    try:
        return store_batch(services, parse_record(body, content_type), host, started)
    except Refused as exc:
        if exc.reason is not None:
            services.metrics.report_rejected(exc.reason)
        raise


def parse_record(body: bytes, content_type: str | None = "application/json") -> BatchRecord:
    """The batch in a request body, as the ledger stores it, or :class:`Refused` saying what
    is wrong and where. The common case is read by :mod:`~gmd.daemon.api.fast_batch`; anything
    else by pydantic, which accepts it or words the refusal."""
    json_media(content_type)
    fast = fast_batch.accept(body)
    if fast is None:
        return record_of(parse_batch(body, content_type))
    vms = fast.vms
    return record_from(
        fast,
        capacity=fast_batch.capacity(fast),
        uuids=[vm.uuid for vm in vms],
        customers=[vm.customer for vm in vms],
        use=fast_batch.use(fast),
        flavor=fast_batch.flavor(fast),
        created_s=[vm.created_s for vm in vms],
        names=dict(fast.customer_names),
        host_cpu_s=fast.host_cpu_s,
    )


def parse_batch(body: bytes, content_type: str | None = "application/json") -> SampleBatch:
    """The batch in a request body, or :class:`Refused` saying what is wrong and where.

    pydantic parses the JSON itself, a third faster than building the document first. A body
    it refuses is parsed again the slow way, so that every refusal reads as it always has:
    malformed JSON (NaN, Infinity) as a 400 naming the character, the rest as a 422 by field.
    The media type is the caller's to check (:func:`parse_record`).
    """
    try:
        return SampleBatch.model_validate_json(body)
    except ValidationError:
        pass
    document = json_document(content_type, body)
    try:
        return SampleBatch.model_validate(document)
    except ValidationError as exc:
        raise validation_problem(exc.errors()) from None


def store_batch(
    services: Services, batch: BatchRecord, host: str | None, started: float
) -> BatchReceipt:
    """Check ``batch`` against the caller and the daemon's settings, then store it."""
    services.auth.check_host(host, batch.host)
    check_batch(services, batch)
    refuse(batch, implausible(batch, services.plausible))
    verdict = vouched(services, batch)
    now_s = services.clock()
    kept, aside = batch, None
    if verdict.set_aside:
        kept, aside = split(batch, sorted(verdict.set_aside))
    try:
        result = ingest_within_limits(
            services, kept, now_s, verdict.unreachable is not None, verdict.departed
        )
        if aside is not None:
            set_aside(services, aside, verdict, now_s)
    except KeyReused as exc:
        raise Refused(409, str(exc), reason=Rejection.key_reused) from None
    except CapacityConflict as exc:
        raise Refused(409, str(exc), reason=Rejection.capacity_conflict) from None
    except BeforeOrigin as exc:
        raise Refused(
            422, f"batch {batch.key} from {batch.host}: {exc}", reason=Rejection.before_origin
        ) from None
    _count(services.metrics, kept, result)
    if verdict.unreachable is not None and result.status == "accepted":
        services.metrics.placement_unverified.inc()
    if result.status == "accepted":
        # A duplicate writes nothing: only a stored batch shows that the ledger writes again.
        services.write_health.succeeded(now_s)
        # The ledger's hosts.last_seen_s moved to the same second.
        services.metrics.report_seen({batch.host: int(now_s)})
    services.metrics.ingest_seconds.observe(time.perf_counter() - started)
    return BatchReceipt(
        status=result.status,
        key=batch.key,
        samples=result.samples,
        late=result.late,
        set_aside=[verdict.set_aside[i].message for i in sorted(verdict.set_aside)],
    )


def vouched(services: Services, batch: BatchRecord) -> Verdict:
    """Check ``batch`` against Placement, when it vouches for hosts' claims: raise
    :class:`Refused` (409) where it disagrees with the host's own claims (it is no compute
    host, or claims more than its inventory). The verdict says whether Placement could not be
    asked (the batch is stored unverified and checked later), which VMs it contradicts (set
    aside), and which it took because they left the host lately (their rows must not move)."""
    view = services.placement
    if view is None:
        return VERIFIED
    verdict = view.check(
        batch.host,
        batch.capacity,
        batch.vm_uuids,
        batch.customers,
        batch.flavor,
        batch.interval_start_s,
    )
    if verdict.refusal is not None:
        services.metrics.placement_refused.labels(verdict.refusal.reason.value).inc()
        log.warning("batch %s from %s refused: %s", batch.key, batch.host, verdict.refusal.message)
        raise Refused(
            409,
            f"batch {batch.key} from {batch.host}: {verdict.refusal.message}",
            reason=Rejection.placement,
        )
    if verdict.unreachable is not None:
        log.warning(
            "batch %s from %s stored unverified: %s", batch.key, batch.host, verdict.unreachable
        )
    return verdict


ASIDE_SUFFIX = "/set-aside"


def aside_key(key: str) -> str:
    """The key of the batch that holds the VMs set aside from batch ``key``: the same for a
    retry (a duplicate then), within the wire's 128 characters."""
    if len(key) + len(ASIDE_SUFFIX) <= 128:
        return key + ASIDE_SUFFIX
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return f"{key[: 128 - len(ASIDE_SUFFIX) - 25]}~{digest}{ASIDE_SUFFIX}"


def split(batch: BatchRecord, aside: list[int]) -> tuple[BatchRecord, BatchRecord]:
    """``batch`` without the VMs at positions ``aside``, and those VMs as a batch of their own
    (:func:`aside_key`). The first keeps the batch's key and digest: a retry of the whole
    batch is still its duplicate."""
    out = set(aside)
    keep = [i for i in range(len(batch.vm_uuids)) if i not in out]

    def part(rows: list[int]) -> dict[str, Any]:
        customers = [batch.customers[i] for i in rows]
        named = set(customers)
        return {
            "vm_uuids": [batch.vm_uuids[i] for i in rows],
            "customers": customers,
            "use": batch.use[rows],
            "flavor": batch.flavor[rows],
            "created_s": [batch.created_s[i] for i in rows],
            "customer_names": {c: n for c, n in batch.customer_names.items() if c in named},
        }

    kept = dataclasses.replace(batch, **part(keep))
    # The VMs set aside name no project: a host may name only the projects of the VMs
    # Placement puts on it (a name would rename a victim's project).
    held = dataclasses.replace(
        batch, key=aside_key(batch.key), host_cpu_s=None, **{**part(aside), "customer_names": {}}
    )
    return kept, dataclasses.replace(held, digest=content_digest(held))


def set_aside(services: Services, aside: BatchRecord, verdict: Verdict, now_s: float) -> None:
    """Store the VMs Placement contradicts, quarantined with why, under the host's bounds;
    count them, and log each host's VM once (it comes back every interval it runs)."""
    why = "; ".join(verdict.set_aside[i].message for i in sorted(verdict.set_aside))
    try:
        stored = ingest_within_limits(services, aside, now_s, aside=why)
    except KeyReused:
        # A retry of the batch that Placement now judges otherwise: what was set aside the
        # first time stays as it was.
        log.info("batch %s from %s: already set aside as before", aside.key, aside.host)
        return
    except Refused as exc:
        # Past the host's bounds ([daemon.limits]): the claims Placement contradicts are not
        # kept at all, and the rest of the batch, stored, stands.
        log.warning(
            "batch %s from %s: %d VM(s) Placement contradicts not kept: %s",
            aside.key,
            aside.host,
            len(aside.vm_uuids),
            exc.detail,
        )
        return
    if stored.status != "accepted":
        return  # a retry's: counted and said the first time
    for refusal in verdict.set_aside.values():
        services.metrics.placement_set_aside.labels(refusal.reason.value).inc()
    fresh = services.set_aside_said.first(aside.host, aside.vm_uuids)
    for i, uuid in zip(sorted(verdict.set_aside), aside.vm_uuids, strict=True):
        if uuid in fresh:
            log.warning(
                "batch %s from %s: %s; its samples are set aside (gmd-admin batches"
                " --quarantined; said once a day), the rest of the batch is stored",
                aside.key,
                aside.host,
                verdict.set_aside[i].message,
            )


def ingest_within_limits(
    services: Services,
    batch: BatchRecord,
    now_s: float,
    unverified: bool = False,
    hold: frozenset[str] = frozenset(),
    aside: str | None = None,
) -> IngestResult:
    """Store ``batch`` if its host's bounds (``[daemon.limits]``) let it in; what the bounds
    counted for a batch that is not stored after all (a database error, a store's retry) is
    given back, so that a full disk does not use up a host's room."""
    oldest_s = now_s - services.config.daemon.max_late_s - batch.interval_s
    claims: list[Claim] = []

    def release() -> None:
        while claims:
            services.limits.release(claims.pop())

    def admit(customers: int, vms: int) -> None:
        # Told again (the store's next attempt, or its general path after the one-statement
        # write stored nothing), the new count replaces the old: one batch, one claim.
        release()
        claims.append(
            services.limits.admit_batch(
                batch.host, batch.interval_start_s, now_s, customers, vms, oldest_s
            )
        )

    try:
        result = services.store.ingest(batch, now_s, admit, unverified, hold, aside)
    except BaseException:
        release()
        raise
    if result.status != "accepted":
        release()  # a retry stores nothing
    return result


def check_batch(services: Services, batch: BatchRecord) -> None:
    """Raise :class:`Refused` listing every problem of ``batch`` here: 413 when it holds too
    many VMs (the agent must split it), 425 when it is only early (its host's clock is
    ahead), else 422."""
    config = services.config
    problems = batch_problems(
        batch,
        interval_s=config.accounting.interval_s,
        now_s=services.clock(),
        clock_skew_s=config.daemon.clock_skew_s,
        max_vms=config.daemon.max_batch_vms,
        max_late_s=config.daemon.max_late_s,
    )
    refuse(batch, problems)


def refuse(batch: BatchRecord, problems: list[BatchProblem]) -> None:
    """Raise :class:`Refused` listing ``problems`` of ``batch``, if there are any."""
    if not problems:
        return
    messages = [p.message for p in problems]
    more = f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""
    too_many = any(p.code is ProblemCode.TOO_MANY_VMS for p in problems)
    # Only early (the host's clock is ahead): nothing is wrong with the batch but its time.
    # 425 tells the agent to keep it and send it again; dropped, a host whose clock ran
    # ahead of daemon.clock_skew_s would lose its use for as long.
    early = all(p.code in EARLY for p in problems)
    raise Refused(
        413 if too_many else 425 if early else 422,
        f"batch {batch.key} from {batch.host}: {messages[0]}{more}",
        messages,
        Rejection.too_large if too_many else REJECTION_OF[problems[0].code],
    )


EARLY = frozenset({ProblemCode.FUTURE})
"""Problems that time cures: a batch with these only is refused 425 (sent again later). A VM
created in the future is not one: its time is Nova's, not the host's clock."""

REJECTION_OF = {
    ProblemCode.INTERVAL_LENGTH: Rejection.interval_mismatch,
    ProblemCode.INTERVAL_ALIGNMENT: Rejection.interval_mismatch,
    ProblemCode.FUTURE: Rejection.future,
    ProblemCode.CREATED_IN_FUTURE: Rejection.future,
    ProblemCode.TOO_OLD: Rejection.too_old,
    ProblemCode.TOO_MANY_VMS: Rejection.too_large,
    ProblemCode.DUPLICATE_VM: Rejection.invalid_fields,
    ProblemCode.CAPACITY_BOUND: Rejection.implausible,
    ProblemCode.FLAVOR_BOUND: Rejection.implausible,
    ProblemCode.VM_USE: Rejection.implausible,
    ProblemCode.HOST_USE: Rejection.implausible,
}
"""How each problem a check finds counts among the refusals."""


_NO_FLAVOR: Mapping[str, float | None] = {}


class BatchHead(Protocol):
    """What a parsed batch says besides its VMs (a :class:`SampleBatch` or a fast one)."""

    @property
    def key(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def interval_start_s(self) -> int: ...
    @property
    def interval_s(self) -> int: ...


def record_of(batch: SampleBatch) -> BatchRecord:
    """The batch as the ledger store takes it: columns in the order of :data:`RESOURCES`."""
    vms = cast(list[Mapping[str, Any]], batch.vms)
    # Column by column: a list per field is cheaper than a tuple per VM.
    use = np.array([[v[f] for v in vms] for f in USAGE_FIELDS], dtype=np.float64).T.reshape(
        len(vms), len(USAGE_FIELDS)
    )
    flavors = [v.get("flavor", _NO_FLAVOR) for v in vms]
    # None (no amount) becomes NaN.
    flavor = np.array(
        [[f.get(k) for f in flavors] for k in FLAVOR_FIELDS], dtype=np.float64
    ).T.reshape(len(vms), len(FLAVOR_FIELDS))
    return record_from(
        batch,
        capacity=tuple(getattr(batch.capacity, f) for f in CAPACITY_FIELDS),
        uuids=[v["uuid"] for v in vms],
        customers=[v["customer"] for v in vms],
        use=use,
        flavor=flavor,
        created_s=[v.get("created_s") for v in vms],
        names=dict(batch.customer_names),
        host_cpu_s=batch.host_cpu_s,
    )


def record_from(
    head: BatchHead,
    *,
    capacity: tuple[float, ...],
    uuids: list[str],
    customers: list[str],
    use: np.ndarray,
    flavor: np.ndarray,
    created_s: list[int | None],
    names: dict[str, str],
    host_cpu_s: float | None = None,
) -> BatchRecord:
    # One spelling per project (canonical_customer), whatever the host wrote: a project's id
    # spelled otherwise would be another customer, one its members cannot read.
    spelled = {c: canonical_customer(c) for c in {*customers, *names}}
    if any(c != s for c, s in spelled.items()):
        customers = [spelled[c] for c in customers]
        names = {spelled[c]: n for c, n in names.items()}
    record = BatchRecord(
        key=head.key,
        digest="",
        host=head.host,
        interval_start_s=head.interval_start_s,
        interval_s=head.interval_s,
        capacity=capacity,
        vm_uuids=uuids,
        customers=customers,
        use=use,
        flavor=flavor,
        created_s=created_s,
        customer_names=names,
        host_cpu_s=None if host_cpu_s is None else float(host_cpu_s),
    )
    return dataclasses.replace(record, digest=content_digest(record))


def content_digest(record: BatchRecord) -> str:
    """A hash of what the batch says, to tell a retry (same content) from a reused key.

    Taken over the parsed values, not the body: a retry that spells the same batch otherwise
    (keys in another order, ``1`` for ``1.0``) is the same batch, and hashing the columns
    costs a tenth of serializing the document again. Prefixed with ``v2:``, which no digest of
    the first kind (64 hex digits of the document's SHA-256) has.
    """
    head = orjson.dumps(
        [
            record.key,
            record.host,
            record.interval_start_s,
            record.interval_s,
            record.capacity,
            record.created_s,
            sorted(record.customer_names.items()),
            # Only when given: a batch without it keeps the digest it had before the field.
            *([] if record.host_cpu_s is None else [record.host_cpu_s]),
        ]
    )
    h = hashlib.sha256(head)
    h.update("\0".join(record.vm_uuids).encode())
    h.update(b"\1")
    h.update("\0".join(record.customers).encode())
    h.update(record.use.tobytes())
    h.update(record.flavor.tobytes())
    return DIGEST_PREFIX + h.hexdigest()[: 64 - len(DIGEST_PREFIX)]


def _count(metrics: DaemonMetrics, batch: BatchRecord, result: IngestResult) -> None:
    metrics.batches.labels(result.status).inc()
    if result.status != "accepted":
        return
    metrics.samples.labels("on_time").inc(result.samples - result.late)
    metrics.samples.labels("late").inc(result.late)
    if result.late:
        log.warning(
            "batch %s from %s: %d samples for interval %d arrived after it closed;"
            " kept as late, the ledger is unchanged",
            batch.key,
            batch.host,
            result.late,
            batch.interval_start_s,
        )
