"""The agent's HTTP endpoints: ``/metrics`` for Prometheus and ``/healthz`` for whatever watches
the host, served on a thread of the agent (``agent.metrics_bind``, ``agent.metrics_port``).

``/healthz`` answers 200 when the agent's latest tick read the host and ended recently, else 503
with why, both as a short JSON object (``status`` ``ok`` or ``unavailable``, and a ``detail``
when unavailable, as the daemon's ``/healthz``). "Recently" is :data:`STALE_TICKS` ticks
(``agent.tick_s``) plus the time a tick may wait for the daemon (:data:`DAEMON_CALLS` ×
``agent.timeout_s``): a daemon that answers slowly delays the ticks but does not stop the
measuring. A tick that read the host has written the spool (the reading, its counters and any
closed interval are committed before anything is sent), and an agent whose spool cannot be
written stops (exit 1); a spool on a disk that hangs shows as ticks that stop ending. Every
other path is 404, every method but GET and HEAD 501.

The server is the standard library's (:class:`http.server.ThreadingHTTPServer`), one thread per
request, the page written by prometheus_client: no other dependency. A malformed request is
answered 400 by :mod:`http.server` and a client that sends nothing is dropped after
:data:`REQUEST_TIMEOUT_S`; neither, nor any failure inside a request, reaches the agent (they
are logged at debug level). :meth:`EndpointServer.stop` stops serving and closes the socket.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gmd import GmdError

if TYPE_CHECKING:
    from gmd.agent.loop import AgentLoop

log = logging.getLogger(__name__)

STALE_TICKS = 3
"""``/healthz`` is 503 when no tick ended in this many ticks (plus the daemon's time)"""
DAEMON_CALLS = 3
"""requests to the daemon one tick may wait on: a batch's post, the plan's fetch, its report"""
REQUEST_TIMEOUT_S = 10.0
"""a client that sends nothing (or too slowly) for this long is dropped"""


class EndpointError(GmdError, OSError):
    """The endpoints cannot listen (the port is taken, the address is not this host's)."""


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/healthz`` answers: 200 or 503, and its JSON body."""

    ok: bool
    body: dict[str, Any]


class TickHealth:
    """Whether an agent is healthy, from its latest tick
    (:attr:`gmd.agent.loop.AgentLoop.finished`).

    ``clock`` is the one the agent stamps its ticks with (``time.monotonic``)."""

    def __init__(self, agent: AgentLoop, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.agent, self.clock = agent, clock
        config = agent.config
        self.stale_s = STALE_TICKS * config.tick_s + DAEMON_CALLS * config.timeout_s
        self.started_s = clock()

    def __call__(self) -> Health:
        agent = self.agent
        host = agent.config.host
        finished = agent.finished
        now_s = self.clock()
        if finished is None:
            return self._unavailable(
                f"no tick has ended yet (started {now_s - self.started_s:.0f} s ago)"
            )
        ended_s, report = finished
        age_s = now_s - ended_s
        if age_s > self.stale_s:
            return self._unavailable(
                f"the latest tick ended {age_s:.0f} s ago, more than {self.stale_s:g} s"
                f" ({STALE_TICKS} ticks of {agent.config.tick_s:g} s and {DAEMON_CALLS}"
                f" requests of {agent.config.timeout_s:g} s to the daemon): the agent is stuck"
                " (libvirt or the spool's disk not answering?)"
            )
        reading = report.reading
        if not reading.ok:
            why = "; ".join(map(str, reading.errors)) or f"libvirt at {agent.config.libvirt_uri}"
            return self._unavailable(f"the latest tick could not read the host: {why}")
        return Health(
            True,
            {
                "status": "ok",
                "host": host,
                "last_tick_age_s": round(age_s, 3),
                "vms": len(reading.listed),
                "spool_batches": report.waiting,
            },
        )

    def _unavailable(self, detail: str) -> Health:
        return Health(
            False, {"status": "unavailable", "host": self.agent.config.host, "detail": detail}
        )


class _MetricsServer(ThreadingHTTPServer):
    daemon_threads = True  # a client that hangs does not keep the agent from exiting
    allow_reuse_port = False  # a second agent on the port is an error, not a shared port

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        registry: CollectorRegistry,
        health: Callable[[], Health],
    ) -> None:
        self.address_family = family
        self.registry, self.health = registry, health
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's asks the DNS for the address's name (socket.getfqdn), which a broken
        # resolver makes slow; the name is used for nothing here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _MetricsServer
    timeout = REQUEST_TIMEOUT_S
    server_version = "gmd-agent"
    # An error answers even a request that is not HTTP/1.x with a status line (http.server
    # takes those for HTTP/0.9, whose answers have none).
    default_request_version = "HTTP/1.0"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, *, with_body: bool) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, content_type, encoder(self.server.registry), with_body)
        elif path == "/healthz":
            try:
                health = self.server.health()
            except Exception:
                log.exception("/healthz failed")
                self._send(500, "text/plain; charset=utf-8", b"internal error\n", with_body)
                return
            body = json.dumps(health.body).encode() + b"\n"
            self._send(200 if health.ok else 503, "application/json", body, with_body)
        else:
            self._send(
                404,
                "text/plain; charset=utf-8",
                b"not found: gmd-agent serves /metrics and /healthz\n",
                with_body,
            )

    def _send(self, status: int, content_type: str, body: bytes, with_body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("HTTP %s: %s", self.address_string(), format % args)


class EndpointServer:
    """``/metrics`` and ``/healthz`` served on a thread until :meth:`stop`."""

    def __init__(
        self, bind: str, port: int, registry: CollectorRegistry, health: Callable[[], Health]
    ) -> None:
        try:
            family = socket.getaddrinfo(
                bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0][0]
            self._server = _MetricsServer((bind, port), family, registry, health)
        except OSError as exc:
            raise EndpointError(
                f"cannot serve /metrics and /healthz on {bind}:{port} (agent.metrics_bind,"
                f" agent.metrics_port): {exc.strerror or exc}"
            ) from None
        self.port: int = self._server.server_address[1]
        """the port listened on (the one asked for, or the one the system chose for 0)"""
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="gmd-agent-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket (requests in flight are not waited for)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
