"""The daemon's HTTP API as one ASGI app, assembled from a router per resource.

Each resource's routes live in their own module and reach the daemon's parts through
:class:`~.services.Services`, so this module only wires: services, lifespan, error handlers,
routers, and the OpenAPI description of the bodies that FastAPI cannot see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import Engine

from gmd.daemon.api import health, hosts, plans, read, web
from gmd.daemon.api.admission import Admission
from gmd.daemon.api.handlers import install_handlers
from gmd.daemon.api.headers import SecurityHeaders
from gmd.daemon.api.services import Services
from gmd.daemon.config import Config
from gmd.daemon.ingest.transport import intake_route
from gmd.wire import (
    SAMPLES_PATH,
    BatchReceipt,
    HostCapabilities,
    PlanReport,
    Problem,
    SampleBatch,
)

ROUTERS = (plans.router, health.router)
# Every route may answer with these; the bodies are all a Problem.
PROBLEM_STATUSES = (400, 401, 403, 409, 413, 415, 422, 425, 429, 503)
# Request bodies the routes read and validate themselves, and the intake's answer (see
# describe_bodies).
BODIES = (SampleBatch, PlanReport, HostCapabilities, BatchReceipt)


def create_app(
    config: Config,
    engine: Engine,
    *,
    clock: Callable[[], float] = time.time,
    accountant: bool | None = None,
) -> FastAPI:
    """The daemon as an ASGI app. The accountant runs in its lifespan unless disabled."""
    services = Services(config, engine, clock=clock, run_accountant=accountant)
    app = FastAPI(
        title="gmd-daemon",
        summary="Greediness Metric daemon: agents post VM usage, fetch throttling plans.",
        version="1",
        lifespan=services.lifespan,
        responses={status: {"model": Problem} for status in PROBLEM_STATUSES},
    )
    app.state.services = services
    app.state.metrics = services.metrics
    app.state.store = services.store
    app.state.accountant = services.accountant
    install_handlers(app)
    app.add_middleware(
        Admission,
        most=config.read_api.concurrent,
        wait_s=config.read_api.queue_s,
        on_busy=services.metrics.read_busy.inc,
    )
    app.add_middleware(SecurityHeaders)
    # Before the app's own routers (after only FastAPI's /openapi.json and /docs, whose four
    # patterns cost nothing measurable: 41 µs per request either way).
    app.router.routes.append(intake_route(services))
    for router in ROUTERS:
        app.include_router(router)
    if services.read_access is not None:
        app.include_router(read.router)
        app.include_router(hosts.router)
        app.include_router(web.router)
    describe_bodies(app)
    return app


def describe_bodies(app: FastAPI) -> None:
    """Make ``app``'s spec FastAPI's plus the schemas of the bodies that routes parse
    themselves (the batch and the plan report), which FastAPI therefore does not describe, and
    the intake's route, which FastAPI did not make (:func:`describe_intake`)."""
    components: dict[str, Any] = {}
    for model in BODIES:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            spec.setdefault("components", {}).setdefault("schemas", {}).update(components)
            spec["paths"] = {SAMPLES_PATH: describe_intake(), **spec["paths"]}
            app.openapi_schema = spec
        return app.openapi_schema

    # FastAPI's documented way to extend its spec is to replace this method; mypy forbids it.
    app.openapi = openapi  # type: ignore[method-assign]


def describe_intake() -> dict[str, Any]:
    """The OpenAPI path item of ``POST`` :data:`~gmd.wire.SAMPLES_PATH`
    (:mod:`gmd.daemon.ingest.transport`): a :class:`~gmd.wire.SampleBatch` in, a
    :class:`~gmd.wire.BatchReceipt` or a :class:`~gmd.wire.Problem` out, the host's bearer
    token in ``Authorization``, as FastAPI describes its own routes."""

    def schema(model: type) -> dict[str, Any]:
        return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}

    problems = {
        str(status): {"description": HTTPStatus(status).phrase, "content": schema(Problem)}
        for status in PROBLEM_STATUSES
    }
    token = {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Authorization"}
    return {
        "post": {
            "summary": "Post Samples",
            "description": "Store one host's usage for one interval (a ``SampleBatch``). A"
            " retry with the same key is acknowledged again and counted once.",
            "operationId": "post_samples_v1_samples_post",
            "parameters": [
                {"name": "authorization", "in": "header", "required": False, "schema": token}
            ],
            "requestBody": {"required": True, "content": schema(SampleBatch)},
            "responses": {
                "200": {"description": "Successful Response", "content": schema(BatchReceipt)},
                **problems,
            },
        }
    }
