"""Placement written to as Nova writes it: the real one of tests/scripts/openstack.sh, or a
stub of our own where that cloud is not started (the soak run by ``make soak`` on a fresh
clone).

Both take the same two writes, which are all the daemon's verification reads back: a compute
host's resource provider with its inventory (:meth:`host`), and a server's allocations on it
with its project (:meth:`server`). The stub answers the four reads of
:class:`gmd.openstack.placement.PlacementReader` and Placement's version document (which
keystoneauth discovers first), and is reached through a ``clouds.yaml`` entry with
``auth_type: none`` and ``placement_endpoint_override``: no Keystone is involved. It vouches for
exactly what was written to it, as Placement does; what it does not model (generations,
microversion checks, traits, nested providers) the daemon does not read.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

VERSION = "1.12"
"""the microversion the writes are made at (the reads' own, gmd.openstack.placement)"""


class PlacementWriteError(RuntimeError):
    """Placement refused a write: the method, the path and its answer."""


class PlacementWriter(Protocol):
    def host(self, name: str, vcpus: int = 16, ram_mb: int = 65536, ratio: float = 1.0) -> str:
        """A compute host's provider with its inventory; its uuid."""
        ...

    def server(
        self,
        provider: str,
        project: str,
        vm: str | None = None,
        ram_mb: int = 1024,
        vcpus: int = 1,
    ) -> str:
        """A server of ``vcpus`` and ``ram_mb`` allocated on ``provider``, owned by
        ``project``; its uuid."""
        ...

    def close(self) -> None: ...


class RealPlacement:
    """The real Placement, written to as Nova would: providers with inventories, and
    allocations of consumers (servers) with their project and user. ``conn`` is an
    openstacksdk connection of an account that may write them (an admin's)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.providers: list[str] = []
        self.consumers: list[str] = []
        self._authorized()

    def _authorized(self, tries: int = 20) -> None:
        """A token, asked again while Keystone answers 5xx: the tests' Keystone keeps its
        data in SQLite, which answers a login beside another's writes with 500 ("database is
        locked")."""
        from keystoneauth1.exceptions.http import HttpError

        for attempt in range(tries):
            try:
                self.conn.authorize()
                return
            except HttpError as exc:
                if (exc.http_status or 0) < 500 or attempt == tries - 1:
                    raise
                time.sleep(0.5)

    @property
    def endpoint(self) -> str:
        return str(self.conn.placement.get_endpoint()).rstrip("/")

    def _call(self, method: str, path: str, body: Any = None, version: str = VERSION) -> Any:
        for _ in range(20):
            response = self.conn.placement.request(
                path, method, json=body, microversion=version, raise_exc=False
            )
            # This Placement keeps its data in SQLite (tests/scripts/openstack.sh), which answers a
            # write beside the daemon's reads with 500 "database is locked": asked again.
            if response.status_code != 500 or "database is locked" not in response.text:
                break
            time.sleep(0.2)
        if response.status_code >= 300:
            raise PlacementWriteError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def host(self, name: str, vcpus: int = 16, ram_mb: int = 65536, ratio: float = 1.0) -> str:
        rp = self._call("POST", "/resource_providers", {"name": name}, "1.20")
        self.providers.append(rp["uuid"])
        self._call(
            "PUT",
            f"/resource_providers/{rp['uuid']}/inventories",
            {
                "resource_provider_generation": rp["generation"],
                "inventories": {
                    "VCPU": {"total": vcpus, "allocation_ratio": ratio, "reserved": 0},
                    "MEMORY_MB": {"total": ram_mb, "reserved": 512},
                    "DISK_GB": {"total": 1000},
                },
            },
        )
        return str(rp["uuid"])

    def server(
        self,
        provider: str,
        project: str,
        vm: str | None = None,
        ram_mb: int = 1024,
        vcpus: int = 1,
    ) -> str:
        """(placed anew if it exists: a migration)"""
        vm = vm or str(uuid.uuid4())
        self._call(
            "PUT",
            f"/allocations/{vm}",
            {
                "allocations": {provider: {"resources": {"VCPU": vcpus, "MEMORY_MB": ram_mb}}},
                "project_id": project,
                "user_id": uuid.uuid4().hex,
            },
        )
        self.consumers.append(vm)
        return vm

    def close(self) -> None:
        for vm in self.consumers:
            self.conn.placement.request(f"/allocations/{vm}", "DELETE", raise_exc=False)
        for rp in self.providers:
            self.conn.placement.request(f"/resource_providers/{rp}", "DELETE", raise_exc=False)
        self.conn.close()


class StubPlacement:
    """Placement's reads over what was written to it, on 127.0.0.1 (see the module
    docstring). ``requests`` counts the reads it answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.names: dict[str, str] = {}
        """provider name → uuid"""
        self.inventories: dict[str, dict[str, dict[str, float]]] = {}
        self.allocations: dict[str, tuple[str, str, dict[str, int]]] = {}
        """consumer → (provider uuid, project, resources)"""
        self.requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="stub-placement"
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def host(self, name: str, vcpus: int = 16, ram_mb: int = 65536, ratio: float = 1.0) -> str:
        rp = str(uuid.uuid4())
        with self._lock:
            self.names[name] = rp
            self.inventories[rp] = {
                "VCPU": {"total": vcpus, "allocation_ratio": ratio, "reserved": 0},
                "MEMORY_MB": {"total": ram_mb, "allocation_ratio": 1.0, "reserved": 512},
            }
        return rp

    def server(
        self,
        provider: str,
        project: str,
        vm: str | None = None,
        ram_mb: int = 1024,
        vcpus: int = 1,
    ) -> str:
        vm = vm or str(uuid.uuid4())
        with self._lock:
            self.allocations[vm] = (provider, project, {"VCPU": vcpus, "MEMORY_MB": ram_mb})
        return vm

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str) -> tuple[int, Any]:
        """The status and body Placement gives a GET of ``path`` (with its query)."""
        parts = urlsplit(path)
        segments = [s for s in parts.path.split("/") if s]
        with self._lock:
            self.requests += 1
            if not segments:
                # keystoneauth takes no version without a link; Placement's own is this one.
                version = {"id": "v1.0", "min_version": "1.0", "max_version": "1.39"}
                links = [{"rel": "self", "href": ""}]
                return 200, {"versions": [{**version, "status": "CURRENT", "links": links}]}
            if segments == ["resource_providers"]:
                name = parse_qs(parts.query).get("name", [""])[0]
                rp = self.names.get(name)
                found = [] if rp is None else [{"uuid": rp, "name": name, "generation": 1}]
                return 200, {"resource_providers": found}
            if len(segments) == 3 and segments[0] == "resource_providers":
                rp, what = segments[1], segments[2]
                if rp not in self.inventories:
                    return 404, {"errors": [{"status": 404, "title": "Not Found"}]}
                if what == "inventories":
                    return 200, {"inventories": self.inventories[rp]}
                if what == "allocations":
                    on: dict[str, Any] = {
                        c: {"resources": held}
                        for c, (p, _, held) in self.allocations.items()
                        if p == rp
                    }
                    return 200, {"allocations": on}
            if len(segments) == 2 and segments[0] == "allocations":
                placed = self.allocations.get(segments[1])
                if placed is None:
                    return 200, {"allocations": {}}
                provider, project, held = placed
                return 200, {
                    "allocations": {provider: {"resources": held}},
                    "project_id": project,
                    "user_id": "stub-user",
                }
        return 404, {"errors": [{"status": 404, "title": "Not Found"}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status, body = stub.answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


def stub_clouds_entry(endpoint: str) -> dict[str, Any]:
    """A ``clouds.yaml`` entry that reaches a Placement at ``endpoint`` without Keystone."""
    return {"auth_type": "none", "placement_endpoint_override": endpoint + "/"}
