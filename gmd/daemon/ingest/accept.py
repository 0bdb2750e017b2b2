"""``POST /v1/samples`` past its transport: a parsed batch checked against its caller, the
daemon's settings, its host's bounds and Placement, then stored; nothing of a refused batch is
written. The one place a batch is let in (:func:`parse_and_store`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from typing import Any

from gmd.daemon.api.errors import Refused
from gmd.daemon.api.metrics import DaemonMetrics, Rejection
from gmd.daemon.api.services import Services
from gmd.daemon.ingest.checks import BatchProblem, ProblemCode, batch_problems, implausible
from gmd.daemon.ingest.limits import HostClaim
from gmd.daemon.ingest.parse import parse_record
from gmd.daemon.ingest.record import (
    BatchRecord,
    BeforeOrigin,
    CapacityConflict,
    IngestResult,
    KeyReused,
    content_digest,
)
from gmd.daemon.placement.view import VERIFIED, Verdict
from gmd.wire import BatchReceipt

log = logging.getLogger(__name__)


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
    claims: list[HostClaim] = []

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
