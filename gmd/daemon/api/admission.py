"""Admission of the read API: reports, plots and what-ifs never hold up the agents.

Every request is of one of two classes. The services' routes go straight through: the agents'
(``POST /v1/samples``, their plans and reports, their capabilities), the Nova scheduler's
(``/v1/hosts/utilization``, operators' only), ``/healthz`` and ``/metrics``: a compute host
fetching its plan, a scheduler placing a server, or a probe asking whether the daemon is
alive, must be answered at once whatever members and operators ask. Every other request (the
read API, the web pages, the API's description) is a *read*: at most ``[read_api] concurrent``
are served at once, the next wait their turn up to ``[read_api] queue_s`` in the event loop
(holding no thread), and past that are answered 503 with ``Retry-After``. Served reads hold at
most as many of the worker threads, and at most as much of the interpreter, as that bound: 60
members asking for their plot at once made an agent's plan fetch wait 28 s before this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gmd.daemon.api.errors import send_problem
from gmd.wire import SAMPLES_PATH

log = logging.getLogger(__name__)

AGENT_PATHS = frozenset({SAMPLES_PATH, "/v1/hosts/utilization", "/healthz", "/metrics"})
AGENT_PREFIXES = ("/v1/plan/",)


def agents_route(method: str, path: str) -> bool:
    """Whether a request is a service's (an agent's, the scheduler's, a probe's): never made to
    wait for reads."""
    if path in AGENT_PATHS or path.startswith(AGENT_PREFIXES):
        return True
    return method == "PUT" and path.startswith("/v1/hosts/") and path.endswith("/capabilities")


class Admission:
    """Pure ASGI: reads served ``most`` at a time, waiting up to ``wait_s`` for their turn."""

    def __init__(
        self,
        app: Any,
        *,
        most: int,
        wait_s: float,
        on_busy: Callable[[], object] | None = None,
    ) -> None:
        self.app, self.most, self.wait_s, self.on_busy = app, most, wait_s, on_busy
        self._turns: asyncio.Semaphore | None = None
        self.waiting = 0
        """reads waiting for their turn now"""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or agents_route(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        if self._turns is None:
            # Made in the server's event loop, on its first read.
            self._turns = asyncio.Semaphore(self.most)
        turns = self._turns
        self.waiting += 1
        try:
            async with asyncio.timeout(self.wait_s):
                await turns.acquire()
        except TimeoutError:
            await self._busy(scope, send)
            return
        finally:
            self.waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            turns.release()

    async def _busy(self, scope: dict[str, Any], send: Any) -> None:
        if self.on_busy is not None:
            self.on_busy()
        log.warning(
            "%s %s answered 503: %d read requests served at once ([read_api] concurrent) and"
            " this one waited %g s ([read_api] queue_s)",
            scope.get("method", "?"),
            scope.get("path", "?"),
            self.most,
            self.wait_s,
        )
        await send_problem(
            send,
            503,
            f"the daemon is serving {self.most} read requests at once"
            f" ([read_api] concurrent) and this one waited {self.wait_s:g} s for its turn"
            " ([read_api] queue_s): ask again in a few seconds",
            ((b"retry-after", b"5"),),
        )
