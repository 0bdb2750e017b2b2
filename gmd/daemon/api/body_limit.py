"""A cap on request bodies, enforced while they stream in.

FastAPI reads a whole body before any route sees it, so a size check in a route comes too late
to protect memory; this guard sits in front of the app (it is what uvicorn serves) and answers
413 as soon as the declared or received length passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI


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


def with_body_limit(app: FastAPI, limit: int) -> BodyLimit:
    """The app behind the body-size guard (what uvicorn serves)."""
    return BodyLimit(app, limit)
