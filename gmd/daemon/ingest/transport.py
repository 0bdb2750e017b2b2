"""How a batch reaches the daemon: ``POST /v1/samples`` served by a route of its own, and
the cap on every request's body.

At the end of every interval every host posts its batch at once, and the daemon's interpreter
lock is what they queue for. FastAPI's own route took ~0.8 ms of it per batch before the batch
was even parsed: making a ``Request``, solving the route's dependencies, its endpoint wrapper.
The intake is a plain ASGI app on a Starlette route instead: the token checked before the body
is read, the body handed to the ingest threads (:func:`~gmd.daemon.ingest.accept.
parse_and_store`, the one place that parses, checks and stores a batch), the receipt sent. What
it raises (a refusal, a bad token, a database that cannot write) is answered by the app's own
handlers (:mod:`~gmd.daemon.api.handlers`) through FastAPI's exception middleware, as any
route's is. FastAPI does not describe a route it did not make: the app's description adds it
from the wire contract (:func:`gmd.daemon.api.app.describe_intake`).

The body cap (:class:`BodyLimit`) wraps the whole app: FastAPI reads a whole body before any
route sees it, so a size check in a route comes too late to protect memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Response
from starlette.routing import Route

from gmd import GmdError
from gmd.daemon.api.errors import send_problem
from gmd.daemon.api.metrics import DaemonMetrics, Rejection
from gmd.daemon.api.services import Services
from gmd.daemon.ingest.accept import parse_and_store
from gmd.wire import SAMPLES_PATH

log = logging.getLogger(__name__)


class SampleIntake:
    """The ASGI app of ``POST /v1/samples``."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = time.perf_counter()
        services = self.services
        authorization, content_type = _headers(scope)
        host = services.auth.host_of(authorization)
        try:
            body = await _body(receive)
        except _Disconnected:
            return  # the client went away before its body arrived: nothing to answer
        receipt = await asyncio.get_running_loop().run_in_executor(
            services.ingest_pool, parse_and_store, services, body, content_type, host, started
        )
        response = Response(receipt.model_dump_json(), media_type="application/json")
        await response(scope, receive, send)


def intake_route(services: Services) -> Route:
    """The route that serves ``POST`` :data:`~gmd.wire.SAMPLES_PATH` (another method is
    answered 405, as FastAPI answers it)."""
    return Route(SAMPLES_PATH, SampleIntake(services), methods=["POST"])


class _Disconnected(GmdError):
    """The client went away before its body arrived: nothing to answer."""


def _headers(scope: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The request's ``Authorization`` and ``Content-Type``, the first of each if repeated
    (as FastAPI's header parameters read them), decoded as Latin-1 like Starlette does."""
    authorization = content_type = None
    for name, value in scope["headers"]:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif name == b"content-type" and content_type is None:
            content_type = value.decode("latin-1")
    return authorization, content_type


async def _body(receive: Any) -> bytes:
    """The whole request body (the body-size guard around the app counts it as it comes)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 before they are read into memory.

    A declared length over the limit is refused before the app runs. A body sent without one
    (chunked) is counted as the app reads it: past the limit the read raises, and whatever
    the app then tries to answer (Starlette's error middleware answers 500 to an exception it
    does not know) is held back, so the client gets this 413 and nothing else.
    """

    def __init__(
        self, app: Any, limit: int, on_refused: Callable[[str], None] | None = None
    ) -> None:
        self.app, self.limit, self.on_refused = app, limit, on_refused

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, send, int(declared))
            return
        seen = 0
        over = False
        started = False

        async def counted() -> dict[str, Any]:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                over = True
                raise _TooLarge(seen)
            return message

        async def guarded(message: dict[str, Any]) -> None:
            nonlocal started
            if over:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except _TooLarge:
            pass
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(scope, send, seen)

    async def _refuse(self, scope: dict[str, Any], send: Any, size: int) -> None:
        if self.on_refused is not None:
            self.on_refused(scope.get("path", ""))
        log.warning(
            "%s %s refused (413): body of %d+ bytes exceeds daemon.max_body_bytes = %d",
            scope.get("method", "?"),
            scope.get("path", "?"),
            size,
            self.limit,
        )
        await send_problem(
            send,
            413,
            f"request body of {size}+ bytes exceeds the limit of {self.limit}"
            " (daemon.max_body_bytes)",
        )


class _TooLarge(GmdError):
    def __init__(self, size: int) -> None:
        self.size = size


def with_body_limit(app: FastAPI, limit: int) -> BodyLimit:
    """The app behind the body-size guard (what uvicorn serves); a batch it refuses is counted
    as one the app refused, since the app never sees it."""
    metrics: DaemonMetrics = app.state.metrics

    def refused(path: str) -> None:
        if path == SAMPLES_PATH:
            metrics.report_rejected(Rejection.too_large)

    return BodyLimit(app, limit, refused)
