"""The agent's HTTP endpoints over a real socket: /metrics, /healthz turning 200 as ticks end
and 503 when the host cannot be read or the ticks stop, 404 elsewhere, requests no HTTP server
should choke on, and a stop that frees the port.

The agent is a real :class:`~gmd.agent.loop.AgentLoop` on a scripted collector, ticked by the test;
the server is the one gmd-agent runs (:class:`~gmd.agent.endpoints.EndpointServer`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gmd.agent.config import parse_agent
from gmd.agent.endpoints import EndpointError, EndpointServer, Health, TickHealth
from gmd.agent.loop import AgentLoop
from gmd.agent.spool import Spool
from tests.support.agent_fixtures import ScriptedCollector, ScriptedVm

T0 = 1_800_000_000.0


class Host:
    """A scripted host of two VMs whose clock the test moves, and the agent reading it."""

    def __init__(self, tmp_path: Path, **agent: object) -> None:
        self.now = T0
        self.collector = ScriptedCollector(
            lambda: self.now, [ScriptedVm("vm-1", "acme"), ScriptedVm("vm-2", "initech")]
        )
        config = parse_agent(
            {"agent": {"host": "cmp-1", "tick_s": 10, "libvirt_uri": "test:///x", **agent}}
        )
        spool = Spool(tmp_path / "spool.db", max_bytes=2**20, max_batches=100)
        self.agent = AgentLoop(config, self.collector, spool, None)

    def tick(self) -> None:
        self.now += self.agent.config.tick_s
        self.agent.tick(self.now)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(tmp_path)
    yield h
    h.agent.spool.close()


@pytest.fixture
def served(host: Host) -> Iterator[str]:
    server = EndpointServer("127.0.0.1", 0, host.agent.metrics.registry, TickHealth(host.agent))
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def get(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.get(url, headers=headers, timeout=10)


def test_healthz_is_503_until_a_tick_reads_the_host_then_200(host: Host, served: str) -> None:
    first = get(f"{served}/healthz")
    assert first.status_code == 503
    assert first.headers["content-type"] == "application/json"
    assert first.json()["status"] == "unavailable"
    assert first.json()["detail"].startswith("no tick has ended yet")

    host.tick()
    ok = get(f"{served}/healthz")
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert (body["status"], body["host"], body["vms"], body["spool_batches"]) == (
        "ok",
        "cmp-1",
        2,
        0,
    )
    assert 0 <= body["last_tick_age_s"] < 60

    # libvirt goes away: the next tick cannot read the host, and says so.
    host.collector.down = True
    host.tick()
    down = get(f"{served}/healthz")
    assert down.status_code == 503
    assert down.json()["detail"].startswith("the latest tick could not read the host: ")
    assert "libvirt" in down.json()["detail"]

    host.collector.down = False
    host.tick()
    assert get(f"{served}/healthz").status_code == 200


def test_healthz_is_503_when_the_ticks_stop(host: Host) -> None:
    """A tick that never ends (libvirt or the spool's disk hanging) leaves the latest report
    as it was: it ages past three ticks and the daemon's time, and health turns."""
    late = [0.0]
    health = TickHealth(host.agent, clock=lambda: time.monotonic() + late[0])
    host.tick()
    assert health().ok
    # agent.tick_s = 10, agent.timeout_s = 10: 3 ticks and 3 requests to the daemon.
    assert health.stale_s == 60
    late[0] = 55
    assert health().ok
    late[0] = 75
    stale = health()
    assert not stale.ok
    assert stale.body["detail"].startswith("the latest tick ended 75 s ago, more than 60 s")
    host.tick()
    late[0] = 0
    assert health().ok


def test_metrics_paths_and_methods(host: Host, served: str) -> None:
    host.tick()
    page = get(f"{served}/metrics")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = {
        s.name: s.value
        for f in text_string_to_metric_families(page.text)
        for s in f.samples
        if not s.labels
    }
    assert got["gmd_agent_vms"] == 2
    assert got["gmd_agent_samples_total"] == 2
    # A query string is not part of the path; Prometheus may ask for OpenMetrics.
    assert get(f"{served}/metrics?name[]=gmd_agent_vms").status_code == 200
    om = get(f"{served}/metrics", headers={"Accept": "application/openmetrics-text"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")

    for path in ("/", "/metrics/x", "/metricsx", "/healthz/", "/favicon.ico", "/%00"):
        response = get(f"{served}{path}")
        assert response.status_code == 404, path
        assert "/metrics and /healthz" in response.text

    head = httpx.head(f"{served}/healthz", timeout=10)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) > 0
    assert httpx.post(f"{served}/metrics", timeout=10).status_code == 501


def raw(url: str, data: bytes, *, read: bool = True) -> bytes:
    """Send ``data`` on a fresh connection and read what comes back until the server closes."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        if data:
            s.sendall(data)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


def test_a_garbage_request_does_not_kill_it(host: Host, served: str) -> None:
    host.tick()
    # A client that connects and says nothing holds one thread, not the server.
    with socket.create_connection(("127.0.0.1", int(served.rsplit(":", 1)[1])), timeout=10):
        assert get(f"{served}/healthz").status_code == 200

    answers = [
        raw(served, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256))),  # TLS
        raw(served, b"GARBAGE\r\n\r\n"),
        raw(served, b"GET /healthz HTTP/9.9\r\n\r\n"),
        raw(served, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"),
        raw(served, b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n"),
        raw(served, b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n"),
        raw(served, b"\xff\xfe\x00\x00\r\n\r\n"),
        raw(served, b""),
        raw(served, b"GET /metr", read=False),  # closes in the middle of the request line
    ]
    statuses = [a.split(b" ", 2)[1] if a.startswith(b"HTTP/") else a[:20] for a in answers]
    assert statuses[:7] == [b"400", b"400", b"505", b"414", b"200", b"431", b"400"], statuses
    assert statuses[7:] == [b"", b""]
    assert get(f"{served}/healthz").status_code == 200
    assert get(f"{served}/metrics").status_code == 200


def test_a_health_check_that_fails_is_a_500_and_the_server_goes_on(host: Host) -> None:
    calls = [0]

    def broken() -> Health:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("a bug")
        return Health(True, {"status": "ok"})

    server = EndpointServer("127.0.0.1", 0, host.agent.metrics.registry, broken)
    try:
        url = f"http://127.0.0.1:{server.port}/healthz"
        assert get(url).status_code == 500
        assert get(url).json() == {"status": "ok"}
    finally:
        server.stop()


def test_stop_frees_the_port_even_with_a_client_connected(host: Host) -> None:
    server = EndpointServer("127.0.0.1", 0, host.agent.metrics.registry, TickHealth(host.agent))
    port = server.port
    # A second server on the same port is refused, not sharing it.
    with pytest.raises(EndpointError, match=rf"127\.0\.0\.1:{port} \(agent\.metrics_bind"):
        EndpointServer("127.0.0.1", port, host.agent.metrics.registry, TickHealth(host.agent))
    silent = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        server.stop()
    finally:
        silent.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    # The port is free again: a new server takes it.
    again = EndpointServer("127.0.0.1", port, host.agent.metrics.registry, TickHealth(host.agent))
    again.stop()


def test_an_address_that_is_not_this_hosts_is_one_error(host: Host) -> None:
    with pytest.raises(EndpointError, match=r"cannot serve /metrics and /healthz on 192\.0\.2\.1"):
        EndpointServer("192.0.2.1", 0, host.agent.metrics.registry, TickHealth(host.agent))


def test_ipv6_loopback(host: Host) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        server = EndpointServer("::1", 0, host.agent.metrics.registry, TickHealth(host.agent))
    except EndpointError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert get(f"http://[::1]:{server.port}/healthz").status_code == 503
    finally:
        server.stop()
