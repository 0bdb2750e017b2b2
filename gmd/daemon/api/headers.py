"""Security headers on every answer of the daemon, errors included.

The read API and its web page answer with a customer's figures to whoever holds a token (a
header or the ``gmd_token`` cookie), so a browser must neither keep them (a shared computer's
cache), nor let another site frame the page (clickjacking), nor guess a type the answer does
not declare (a name in a JSON error read as HTML). The page needs nothing but itself: its
inline style and its plot from the same origin; no script, no form, no other origin. The
agents' routes carry tokens too, so the same headers go on every answer: one rule, no list of
routes to keep up to date. Only FastAPI's own API browser (``/docs``, ``/redoc``), which loads
its script from a CDN, keeps its page working without the content policy.

A plain ASGI wrapper, not Starlette's ``BaseHTTPMiddleware``: it touches only the start of
each answer, so ingest pays one list extension per request.
"""

from __future__ import annotations

from typing import Any

CONTENT_POLICY = (
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none';"
    " base-uri 'none'; form-action 'none'"
)
"""Nothing but the page's own inline style and same-origin images (the plot); never framed"""

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers without CSP level 2
    (b"referrer-policy", b"no-referrer"),  # a customer's name is in its page's address
    (b"cache-control", b"no-store"),
)
"""On every answer, unless a route set its own"""

API_BROWSER = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
"""FastAPI's pages that run a CDN's script: no content policy there"""


class SecurityHeaders:
    """Add :data:`HEADERS` and :data:`CONTENT_POLICY` to every HTTP answer of ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = scope.get("path") not in API_BROWSER

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in HEADERS if h[0] not in present)
                if policy and b"content-security-policy" not in present:
                    headers.append((b"content-security-policy", CONTENT_POLICY.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
