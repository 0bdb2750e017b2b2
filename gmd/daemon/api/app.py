"""The daemon's HTTP API (FastAPI): routes, error bodies, body-size limit, lifespan.

Every refusal is a 4xx whose JSON body says what is wrong and where (``detail``, and for
validation failures one line per problem in ``errors``), and nothing of a refused batch is
written. A database that cannot be reached is a 503, which tells agents to spool and retry.
"""

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import Depends, FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from gmd.daemon.api.auth import AuthError, TokenAuth
from gmd.daemon.api.metrics import DaemonMetrics
from gmd.daemon.config import Config
from gmd.daemon.enforce.audit import record_host_report
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.enforce.plans import as_documents, host_plan
from gmd.daemon.enforce.quota_job import QuotaReconciler
from gmd.daemon.ledger import migrate
from gmd.daemon.ledger.accounting import RunReport
from gmd.daemon.ledger.schedule import Accountant
from gmd.daemon.ledger.store import USE_COLUMNS, BatchRecord, KeyReused, LedgerStore
from gmd.wire import (
    BatchReceipt,
    HostPlan,
    PlanReport,
    PlanReportReceipt,
    Problem,
    SampleBatch,
    VmPlanItem,
    batch_problems,
    digest_of,
)

FLAVOR_KEYS = ("vcpus", "memory_bytes", "disk_bytes_per_s", "network_bytes_per_s")

log = logging.getLogger(__name__)


class Refused(Exception):
    def __init__(self, status: int, detail: str, errors: list[str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []


def _record(batch: SampleBatch, digest: str) -> BatchRecord:
    nan = float("nan")
    vms = batch.vms
    no_flavor: dict[str, float | None] = {}
    flavors = [v.get("flavor") or no_flavor for v in vms]
    return BatchRecord(
        key=batch.key,
        digest=digest,
        host=batch.host,
        interval_start_s=batch.interval_start_s,
        interval_s=batch.interval_s,
        capacity=(
            batch.capacity.cpu_cores,
            batch.capacity.memory_bytes,
            batch.capacity.disk_bytes_per_s,
            batch.capacity.network_bytes_per_s,
        ),
        vm_uuids=[v["uuid"] for v in vms],
        customers=[v["customer"] for v in vms],
        use=np.array([[v[c] for c in USE_COLUMNS] for v in vms], dtype=np.float64).reshape(
            len(vms), len(USE_COLUMNS)
        ),
        flavor=np.array(
            [[nan if f.get(k) is None else f[k] for k in FLAVOR_KEYS] for f in flavors],
            dtype=np.float64,
        ).reshape(len(vms), len(FLAVOR_KEYS)),
        created_s=[v.get("created_s") for v in vms],
    )


def _where(loc: tuple[Any, ...]) -> str:
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def _validation_problem(errors: list[Any]) -> Refused:
    lines = []
    for e in errors:
        where = _where(tuple(e.get("loc", ())))
        given = e.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {json.dumps(given)[:60]})"
        if e.get("type") == "extra_forbidden":
            lines.append(f"{where}: unknown field")
        else:
            lines.append(f"{where}: {e.get('msg')}{shown}")
    first = lines[0] if lines else "invalid request"
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return Refused(422, f"invalid batch: {first}{more}", lines)


def parse_batch(body: bytes) -> tuple[SampleBatch, str]:
    """The batch in a request body and its digest, or :class:`Refused` saying what is wrong
    and where.

    orjson parses a 500-VM batch four times faster than the standard library, and is strict:
    NaN and Infinity, which some JSON writers emit for non-finite floats, are not JSON.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        snippet = body[max(exc.pos - 30, 0) : exc.pos + 30].decode("utf-8", "replace")
        hint = ""
        if any(word in snippet for word in ("NaN", "Infinity")):
            hint = " (NaN and Infinity are not JSON: usage must be finite numbers)"
        raise Refused(
            400, f"malformed JSON at char {exc.pos}: {exc.msg}: …{snippet}…{hint}"
        ) from None
    try:
        return SampleBatch.model_validate(document), digest_of(document)
    except ValidationError as exc:
        raise _validation_problem(exc.errors()) from None


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 before they are read into memory."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, int(declared))
            return
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge(seen)
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge as exc:
            await self._refuse(send, exc.size)

    async def _refuse(self, send: Any, size: int) -> None:
        body = json.dumps(
            {"detail": f"request body of {size}+ bytes exceeds the limit of {self.limit}"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


def create_app(
    config: Config,
    engine: Engine,
    *,
    clock: Callable[[], float] = time.time,
    accountant: bool | None = None,
) -> FastAPI:
    """The daemon as an ASGI app. The accountant runs in its lifespan unless disabled."""
    metrics = DaemonMetrics()
    store = LedgerStore(engine, config.owner_of, config.organization_customers)
    auth = TokenAuth(
        {h.name: h.token_sha256 for h in config.hosts.values() if h.token_sha256},
        required=config.daemon.auth == "token",
    )
    run_accountant = config.daemon.accounting if accountant is None else accountant

    def counted(report: RunReport) -> None:
        for seconds in report.seconds:
            metrics.intervals.inc()
            metrics.accounting_seconds.observe(seconds)
        if report.accounted:
            metrics.last_accounted.set(report.accounted[-1])

    scheduler = Accountant(
        engine,
        config.accounting,
        config.daemon.account_every_s,
        on_run=counted,
        on_error=lambda _exc: metrics.accounting_errors.inc(),
        after=after_interval(config.enforcement),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        store.sync_organizations({config.default_owner} | {h.owner for h in config.hosts.values()})
        quotas = None
        if run_accountant:
            if config.enforcement.quota.cloud and config.enforcement.mode != "off":
                quotas = QuotaReconciler(engine, config.enforcement)
                scheduler.every(config.enforcement.quota.every_s, quotas.run, "quotas")
            scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()
            if quotas is not None:
                quotas.close()

    app = FastAPI(
        title="gmd-daemon",
        summary="Greediness Metric daemon: agents post VM usage, fetch throttling plans.",
        version="1",
        lifespan=lifespan,
        responses={
            400: {"model": Problem},
            401: {"model": Problem},
            403: {"model": Problem},
            409: {"model": Problem},
            413: {"model": Problem},
            422: {"model": Problem},
            503: {"model": Problem},
        },
    )
    app.state.metrics = metrics
    app.state.store = store
    app.state.accountant = scheduler

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        if exc.status < 500:
            log.warning(
                "%s %s refused (%d): %s", request.method, request.url.path, exc.status, exc.detail
            )
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            Problem(detail=exc.detail, errors=exc.errors).model_dump(),
            status_code=exc.status,
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await _refused(request, _validation_problem(list(exc.errors())))

    @app.exception_handler(AuthError)
    async def _unauthorized(request: Request, exc: AuthError) -> JSONResponse:
        if request.url.path.startswith("/v1/samples"):
            metrics.batches.labels("rejected").inc()
        return await _refused(request, Refused(exc.status, str(exc)))

    @app.exception_handler(SQLAlchemyError)
    async def _database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        log.error("%s %s: ledger database error: %s", request.method, request.url.path, exc)
        return await _refused(
            request, Refused(503, f"ledger database unavailable: {type(exc).__name__}")
        )

    def caller(authorization: Annotated[str | None, Header()] = None) -> str | None:
        """The host the bearer token belongs to, checked before the body is validated."""
        return auth.host_of(authorization)

    Caller = Annotated[str | None, Depends(caller)]

    @app.post(
        "/v1/samples",
        response_model=BatchReceipt,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/SampleBatch"}}
                },
            }
        },
    )
    async def post_samples(request: Request, host: Caller) -> BatchReceipt:
        """Store one host's usage for one interval (a ``SampleBatch``). A retry with the same
        key is acknowledged again and counted once."""
        started = time.perf_counter()
        try:
            batch, digest = parse_batch(await request.body())
        except Refused:
            metrics.batches.labels("rejected").inc()
            raise
        return await run_in_threadpool(store_batch, batch, digest, host, started)

    def store_batch(
        batch: SampleBatch, digest: str, host: str | None, started: float
    ) -> BatchReceipt:
        auth.check_host(host, batch.host)
        problems = batch_problems(
            batch,
            interval_s=config.accounting.interval_s,
            now_s=clock(),
            clock_skew_s=config.daemon.clock_skew_s,
            max_vms=config.daemon.max_batch_vms,
        )
        if problems:
            metrics.batches.labels("rejected").inc()
            status = 413 if any(" VMs in one batch" in p for p in problems) else 422
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise Refused(
                status, f"batch {batch.key} from {batch.host}: {problems[0]}{more}", problems
            )
        try:
            result = store.ingest(_record(batch, digest), clock())
        except KeyReused as exc:
            metrics.batches.labels("rejected").inc()
            raise Refused(409, str(exc)) from None
        metrics.batches.labels(result.status).inc()
        if result.status == "accepted":
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
        metrics.ingest_seconds.observe(time.perf_counter() - started)
        return BatchReceipt(
            status=result.status, key=batch.key, samples=result.samples, late=result.late
        )

    @app.get("/v1/plan/{host}", response_model=HostPlan)
    def get_plan(host: str, caller_host: Caller) -> HostPlan:
        """The throttling plan for the VMs on ``host``: what to set on each throttled VM."""
        auth.check_host(caller_host, host)
        with engine.connect() as conn:
            plans = host_plan(conn, host, config.enforcement)
        return HostPlan(
            host=host,
            generated_s=int(clock()),
            mode=config.enforcement.mode,  # type: ignore[arg-type]
            vms=[VmPlanItem(**p) for p in as_documents(plans)],
        )

    @app.post("/v1/plan/{host}/report", response_model=PlanReportReceipt)
    def post_plan_report(host: str, report: PlanReport, caller_host: Caller) -> PlanReportReceipt:
        """Record, in the enforcement log, what the host's agent did with its plan."""
        auth.check_host(caller_host, host)
        recorded = record_host_report(
            engine, host, report.generated_s, [r.model_dump() for r in report.results]
        )
        return PlanReportReceipt(recorded=recorded)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """200 when the ledger database answers and its schema is current, else 503."""
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            revision = migrate.current(engine)
        except SQLAlchemyError as exc:
            return JSONResponse(
                {"status": "unavailable", "detail": f"database: {type(exc).__name__}"}, 503
            )
        head = migrate.head()
        ok = revision == head
        return JSONResponse(
            {"status": "ok" if ok else "degraded", "schema": revision, "expected_schema": head},
            200 if ok else 503,
        )

    batch_schema = SampleBatch.model_json_schema(ref_template="#/components/schemas/{model}")
    batch_defs = batch_schema.pop("$defs", {})

    def openapi() -> dict[str, Any]:
        """FastAPI's spec plus the batch schema, which the route parses itself (with orjson)."""
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(batch_defs)
            schemas["SampleBatch"] = batch_schema
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus_metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def with_body_limit(app: FastAPI, limit: int) -> BodyLimit:
    """The app behind the body-size guard (what uvicorn serves)."""
    return BodyLimit(app, limit)
