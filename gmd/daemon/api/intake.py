"""``POST /v1/samples`` served ahead of FastAPI's routing.

At the end of every interval every host posts its batch at once, and the daemon's interpreter
lock is what they queue for. FastAPI's route took ~0.8 ms of it per batch before the batch was
even parsed: its exception and exit-stack middleware, the router's matching, a ``Request``,
solving the route's dependencies, its endpoint wrapper. This middleware, which the app installs
inside its security headers, answers that one route itself: the token checked before the body
is read, the body handed to the ingest threads (:func:`~gmd.daemon.api.samples.
parse_and_store`, the one place that parses, checks and stores a batch), the receipt sent.

A refusal is answered by the app's own handlers (:mod:`~gmd.daemon.api.handlers`), looked up as
FastAPI's exception middleware looks them up, so every answer reads and counts as it did. The
route stays declared in :mod:`~gmd.daemon.api.samples` so that the API's description (and the
fuzzing that reads it) has it; it is never reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from fastapi import Request, Response

from gmd import GmdError
from gmd.daemon.api.samples import SAMPLES_PATH, parse_and_store
from gmd.daemon.api.services import Services

Handler = Any
"""An exception handler of the app: ``async (Request, Exception) -> Response``."""


class _Disconnected(GmdError):
    """The client went away before its body arrived: nothing to answer."""


class SampleIntake:
    """Serve ``POST /v1/samples``; pass every other request to ``app``. ``handlers``: the
    app's exception handlers by exception type."""

    def __init__(self, app: Any, services: Services, handlers: Mapping[Any, Handler]) -> None:
        self.app, self.services, self.handlers = app, services, handlers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != SAMPLES_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        services = self.services
        try:
            authorization, content_type = _headers(scope)
            host = services.auth.host_of(authorization)
            body = await _body(receive)
            receipt = await asyncio.get_running_loop().run_in_executor(
                services.ingest_pool,
                parse_and_store,
                services,
                body,
                content_type,
                host,
                started,
            )
        except _Disconnected:
            return
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
        else:
            response = Response(receipt.model_dump_json(), media_type="application/json")
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler | None:
        """The app's handler of ``exc``: the one registered for its class or the nearest
        base, as FastAPI's exception middleware chooses."""
        for kind in type(exc).__mro__:
            handler = self.handlers.get(kind)
            if handler is not None:
                return handler
        return None


def _headers(scope: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The request's ``Authorization`` and ``Content-Type``, the first of each if repeated
    (as the route's header parameters read them), decoded as Latin-1 like Starlette does."""
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
