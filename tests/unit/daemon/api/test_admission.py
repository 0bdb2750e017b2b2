"""Reads wait their turn; the agents' routes and the probes never do (gmd.daemon.api.admission).

The app behind the admission is a small ASGI app of the test's whose read route holds until
the test lets it go: what a long plot or report does to the daemon, on demand."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gmd.daemon.api.admission import Admission, agents_route


class Held:
    """Answers every request 200, a read only once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.serving = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not agents_route(scope["method"], scope["path"]):
            self.serving += 1
            try:
                await self.release.wait()
            finally:
                self.serving -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(
    ("method", "path", "agents"),
    [
        ("POST", "/v1/samples", True),
        ("GET", "/v1/plan/cmp-1", True),
        ("POST", "/v1/plan/cmp-1/report", True),
        ("PUT", "/v1/hosts/cmp-1/capabilities", True),
        ("GET", "/healthz", True),
        ("GET", "/metrics", True),
        ("GET", "/v1/hosts/utilization", True),
        ("GET", "/v1/hosts/cmp-1", False),
        ("GET", "/v1/customers/p/plot.svg", False),
        ("GET", "/v1/whatif", False),
        ("GET", "/ui", False),
        ("GET", "/openapi.json", False),
    ],
)
def test_each_route_is_of_one_class(method: str, path: str, agents: bool) -> None:
    assert agents_route(method, path) is agents


def test_reads_past_the_bound_wait_then_get_503_and_agents_are_never_held() -> None:
    async def scenario() -> None:
        app = Held()
        busy: list[int] = []
        admission = Admission(app, most=2, wait_s=0.3, on_busy=lambda: busy.append(1))
        transport = httpx.ASGITransport(app=admission)
        async with httpx.AsyncClient(transport=transport, base_url="http://gmd") as client:
            reads = [
                asyncio.create_task(client.get(f"/v1/customers/p{i}/plot.svg")) for i in (1, 2)
            ]
            while app.serving < 2:
                await asyncio.sleep(0.01)
            # Both turns taken: a third read waits, then is told to come back.
            third = await client.get("/v1/standings")
            assert third.status_code == 503
            assert third.headers["retry-after"] == "5"
            assert "[read_api] concurrent" in json.loads(third.content)["detail"]
            assert busy == [1]
            # The agents' routes and the probes are answered while the reads still hold.
            for path in ("/v1/plan/cmp-1", "/healthz", "/metrics"):
                answer = await client.get(path)
                assert answer.status_code == 200, path
            assert app.serving == 2 and not any(r.done() for r in reads)
            # A read that comes while a turn frees within its wait is served.
            waiting = asyncio.create_task(client.get("/v1/standings"))
            while admission.waiting < 1:
                await asyncio.sleep(0.01)
            app.release.set()
            assert [r.status_code for r in await asyncio.gather(*reads)] == [200, 200]
            assert (await waiting).status_code == 200
            assert busy == [1]

    asyncio.run(scenario())
