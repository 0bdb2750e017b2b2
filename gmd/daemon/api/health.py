"""``/healthz`` and ``/metrics``: what a load balancer and Prometheus ask of the daemon.

Health means the ledger database answers, its schema is the one this code expects (a daemon
started before a migration reports itself degraded instead of failing on writes), and its
latest write did not fail (a full disk answers reads but no batch).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gmd.daemon.api.deps import ServicesDep
from gmd.ledger_schema import migrate

router = APIRouter()


@router.get("/healthz")
def healthz(services: ServicesDep) -> JSONResponse:
    """200 when the ledger database answers, its schema is current and it writes, else 503."""
    engine = services.engine
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        revision = migrate.current(engine)
    except SQLAlchemyError as exc:
        return JSONResponse(
            {"status": "unavailable", "detail": f"database: {type(exc).__name__}"}, 503
        )
    head = migrate.SCHEMA
    ok = revision == head
    cannot_write = services.write_health.failing()
    answer = {"status": "ok" if ok else "degraded", "schema": revision, "expected_schema": head}
    if cannot_write is not None:
        answer.update(status="unavailable", detail=cannot_write)
    return JSONResponse(answer, 200 if ok and cannot_write is None else 503)


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus_metrics(services: ServicesDep) -> PlainTextResponse:
    return PlainTextResponse(
        generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
