"""The daemon's answers to every kind of refusal, installed on its app: a
:class:`~gmd.daemon.api.errors.Refused` as it is, a request FastAPI could not read, a failed
authentication and a ledger database that cannot be reached (counted and held by the services,
so these two live apart from :mod:`gmd.daemon.api.errors`, which the services import).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from gmd.daemon.api.auth import AuthError
from gmd.daemon.api.errors import Refused, invalid, refused
from gmd.daemon.api.metrics import Rejection
from gmd.daemon.api.services import Services
from gmd.daemon.ledger.write_health import first_line
from gmd.wire import SAMPLES_PATH

log = logging.getLogger(__name__)


async def unauthorized(request: Request, exc: AuthError) -> JSONResponse:
    if request.url.path == SAMPLES_PATH:
        services: Services = request.app.state.services
        services.metrics.report_rejected(
            Rejection.unauthorized if exc.status == 401 else Rejection.wrong_host
        )
    return await refused(request, Refused(exc.status, str(exc)))


async def database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
    said = f"{request.method} {request.url.path}: ledger database error: {first_line(exc)}"
    if request.method == "POST":
        # Every POST writes to the ledger: a failure holds the accountant (see
        # gmd.daemon.ledger.write_health) and turns /healthz 503. An outage is said once as
        # it begins (and the accountant says when it ends), not at every agent's retry.
        services: Services = request.app.state.services
        if services.ledger_write_failed(exc):
            log.error("%s (answering 503 until it writes again)", said)
        else:
            log.debug("%s", said)
    else:
        log.error("%s", said)
    return await refused(
        request, Refused(503, f"ledger database unavailable: {type(exc).__name__}")
    )


def install_handlers(app: FastAPI) -> None:
    """Answer each kind of refusal on ``app`` with a :class:`~gmd.wire.Problem`."""
    app.exception_handler(Refused)(refused)
    app.exception_handler(RequestValidationError)(invalid)
    app.exception_handler(AuthError)(unauthorized)
    app.exception_handler(SQLAlchemyError)(database)
