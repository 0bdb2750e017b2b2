"""A cap on request bodies, enforced while they stream in.

FastAPI reads a whole body before any route sees it, so a size check in a route comes too late
to protect memory; this guard sits in front of the app (it is what uvicorn serves) and answers
413 as soon as the declared or received length passes the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from gmd import GmdError
from gmd.daemon.api.errors import send_problem
from gmd.daemon.api.metrics import DaemonMetrics, Rejection

log = logging.getLogger(__name__)


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
        if path.startswith("/v1/samples"):
            metrics.report_rejected(Rejection.too_large)

    return BodyLimit(app, limit, refused)
