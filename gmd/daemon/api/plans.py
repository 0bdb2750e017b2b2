"""``/v1/plan/{host}``: what each host's agent should set on its VMs, and what it did.

The plan is computed from the ledger on every request, so an agent always gets the levels of
the latest accounted interval; a host may only read and report on its own plan.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ValidationError

from gmd.daemon.api.deps import Caller, ServicesDep
from gmd.daemon.api.errors import Refused, json_document, validation_problem
from gmd.daemon.api.services import Services
from gmd.daemon.enforce.audit import record_host_report
from gmd.daemon.enforce.plans import host_plan, wire_caps
from gmd.daemon.ledger import capabilities
from gmd.wire import (
    HostCapabilities,
    HostCapabilitiesReceipt,
    HostPlan,
    PlanReport,
    PlanReportReceipt,
    visible_name,
)

router = APIRouter()
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


# The route reads its body itself (so that any body gets a 4xx, never FastAPI's form parsing
# or a 500), so the spec is told what it holds.
def _body(model: str) -> dict[str, object]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
        }
    }


_REPORT_BODY = _body("PlanReport")
_CAPABILITIES_BODY = _body("HostCapabilities")


@router.get("/v1/plan/{host}", response_model=HostPlan)
def get_plan(host: str, caller_host: Caller, services: ServicesDep) -> HostPlan:
    """The throttling plan for the VMs on ``host``: what to set on each throttled VM, and
    whether the levels' hard caps apply on this host and why."""
    services.auth.check_host(caller_host, host)
    check_host_name(host)
    enforcement = services.config.enforcement
    with services.engine.connect() as conn:
        plan = host_plan(conn, host, enforcement)
    return HostPlan(
        host=host,
        generated_s=int(services.clock()),
        mode=enforcement.mode,
        vms=plan.vms,
        caps=wire_caps(plan.caps, plan.disk_weight),
    )


@router.post("/v1/plan/{host}/report", response_model=PlanReportReceipt, openapi_extra=_REPORT_BODY)
async def post_plan_report(
    host: str, request: Request, caller_host: Caller, services: ServicesDep
) -> PlanReportReceipt:
    """Record, in the enforcement log, what the host's agent did with its plan
    (a ``PlanReport``): at most ``daemon.limits.report_rows_per_interval`` results a host an
    interval, each error text cut to ``max_error_chars``. Results about VMs that do not run on
    the host as far as the ledger knows are not recorded: the receipt names them in
    ``ignored``."""
    report = await _own(host, request, caller_host, services, PlanReport, "invalid report")
    limits, now_s = services.limits, services.clock()
    limits.admit_rows(host, now_s, len(report.results))
    try:
        done = await run_in_threadpool(
            partial(
                record_host_report,
                services.engine,
                host,
                report.generated_s,
                [{**r.model_dump(), "error": limits.clip_error(r.error)} for r in report.results],
                at_s=services.clock(),
                contention_intervals=services.config.enforcement.contention.intervals,
                restore_all=report.restore_all,
            )
        )
    except BaseException:
        limits.release_rows(host, now_s, len(report.results))
        raise
    ignored = set(done.ignored)
    for result in report.results:
        # A failure on a VM that is not the host's is not recorded, nor counted.
        if result.uuid in ignored:
            continue
        if not result.ok:
            services.metrics.report_host_failure(result.action)
        for knob in result.knobs:
            services.metrics.report_knob(knob.knob.value, knob.outcome.value)
    return PlanReportReceipt(recorded=done.rows, ignored=done.ignored)


@router.put(
    "/v1/hosts/{host}/capabilities",
    response_model=HostCapabilitiesReceipt,
    openapi_extra=_CAPABILITIES_BODY,
)
async def put_capabilities(
    host: str, request: Request, caller_host: Caller, services: ServicesDep
) -> HostCapabilitiesReceipt:
    """What the host's agent found it can set (a ``HostCapabilities``: per knob supported,
    unsupported and why, or unknown), replacing what it said before. Plans are made with it:
    a knob the host lacks is not asked of it (``[enforcement] disk_weight_fallback``)."""
    caps = await _own(
        host, request, caller_host, services, HostCapabilities, "invalid capabilities"
    )
    changed = await run_in_threadpool(
        capabilities.record, services.engine, host, caps, services.clock()
    )
    if changed:
        lacking = caps.unsupported()
        log.info(
            "host %s can set: %s",
            host,
            "every knob" if not lacking else "all but " + ", ".join(k.words for k in lacking),
        )
    return HostCapabilitiesReceipt(host=host, changed=changed)


async def _own(
    host: str,
    request: Request,
    caller_host: str | None,
    services: Services,
    model: type[M],
    what: str,
) -> M:
    """What ``host`` posts about itself, as ``model``: the caller must be that host, the name
    a host's, the body JSON of that model (a 4xx saying ``what`` and where otherwise)."""
    services.auth.check_host(caller_host, host)
    check_host_name(host)
    document = json_document(request.headers.get("content-type"), await request.body())
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise validation_problem(exc.errors(), what) from None


def check_host_name(host: str) -> None:
    """A host name from the path, held to the rules of a batch's ``host`` (with ``auth =
    "none"`` nothing else checks it, and PostgreSQL cannot even compare a NUL)."""
    try:
        visible_name(host)
    except ValueError as exc:
        raise Refused(422, f"host {host!r}: {exc}") from None
    if len(host) > 255:
        raise Refused(422, "host: names are at most 255 characters")
