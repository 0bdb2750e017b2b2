"""A small fake Keystone v3 + Nova v2.1 on 127.0.0.1, enough for the real openstacksdk.

It serves exactly what ``openstack.connect(cloud=…)`` and ``conn.compute.*_quota_set`` need:
identity and compute version documents, password authentication with a service catalog, and
``/os-quota-sets/{project_id}`` (GET, ``/detail``, ``/defaults``, PUT, DELETE). Behaviours the
enforcement code must survive are switchable at run time:

- ``unified_limits=True``: like Nova's unified-limits quota driver, a PUT or DELETE is accepted
  (200/202) and changes nothing;
- ``fail(status, times, path=…)``: the next ``times`` matching requests (``None``: all of them)
  are answered with ``status`` — 401/403/404/503, anything;
- ``slow(seconds, path=…)``: matching requests are answered only after ``seconds`` (longer than
  the client's timeout, to test that it gives up);
- ``roles=("member",)``: the user is not an admin, so Nova refuses quota writes with 403 as its
  default policy does;
- ``requests``: every request as it arrived, with the status it got, for assertions such as
  "the 401 was not retried".

``write_clouds_yaml`` writes a ``clouds.yaml`` that points a cloud name at the server.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_QUOTAS: dict[str, int] = {
    "cores": 20,
    "ram": 51200,
    "instances": 10,
    "key_pairs": 100,
    "metadata_items": 128,
    "server_groups": 10,
    "server_group_members": 10,
    "injected_files": 5,
    "injected_file_content_bytes": 10240,
    "injected_file_path_bytes": 255,
}
"""Nova's own defaults for the resources a 2.56 client sees."""

USERNAME = "gmd"
PASSWORD = "secret"
PROJECT_ID = "0a1b2c3d4e5f40718293a4b5c6d7e8f9"
"""The project the service user is scoped to (the customers' projects are others)."""

NEEDS_AUTH = "The request you have made requires authentication."

_ERROR_NAMES = {
    400: "badRequest",
    401: "unauthorized",
    403: "forbidden",
    404: "itemNotFound",
    409: "conflictingRequest",
    500: "computeFault",
    503: "serviceUnavailable",
}


_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}


@dataclass
class LoggedRequest:
    """One request, logged as it arrives (so a request still being delayed is in the log)."""

    method: str
    path: str
    body: Any = None
    """the parsed JSON body of a PUT/POST, if any"""
    status: int = 0
    """the status it was answered with (0 while it has not been answered)"""


@dataclass
class _Rule:
    path: str
    method: str | None
    remaining: int | None
    status: int = 0
    delay_s: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        return self.path in path and (self.method is None or self.method == method)


class FakeOpenStack:
    """Keystone + Nova in a thread on a random free port; use as a context manager."""

    def __init__(
        self,
        *,
        unified_limits: bool = False,
        roles: tuple[str, ...] = ("admin", "member", "reader"),
        defaults: dict[str, int] | None = None,
    ) -> None:
        self.unified_limits = unified_limits
        self.roles = roles
        self.defaults = dict(DEFAULT_QUOTAS, **(defaults or {}))
        self.quotas: dict[str, dict[str, int]] = {}
        """per project, the values written (a project never written has the defaults)"""
        self.requests: list[LoggedRequest] = []
        self._tokens: set[str] = set()
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> FakeOpenStack:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            # A short poll interval: shutdown() waits up to one interval (0.5 s by default).
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="fake-openstack",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # wakes handlers sleeping in slow(): the test is over
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        assert self._server is not None, "the fake is not started: use it in a with block"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- behaviours ----------------------------------------------------------------------

    def fail(
        self,
        status: int,
        times: int | None = 1,
        *,
        path: str = "/os-quota-sets",
        method: str | None = None,
    ) -> None:
        """Answer the next ``times`` requests whose path contains ``path`` with ``status``.

        ``times=None`` fails them forever; ``path=""`` matches every request (the whole cloud
        is down), ``path="/v3/auth/tokens"`` fails authentication only.
        """
        with self._lock:
            self._rules.append(_Rule(path, method, times, status=status))

    def slow(
        self,
        seconds: float,
        times: int | None = None,
        *,
        path: str = "/os-quota-sets",
        method: str | None = None,
    ) -> None:
        """Delay the answer to matching requests by ``seconds`` (then answer normally)."""
        with self._lock:
            self._rules.append(_Rule(path, method, times, delay_s=seconds))

    def heal(self) -> None:
        """Drop every failure and delay rule."""
        with self._lock:
            self._rules.clear()

    def quota(self, project_id: str) -> dict[str, int]:
        """The project's quota set as Nova would report it."""
        with self._lock:
            return dict(self.defaults, **self.quotas.get(project_id, {}))

    def count(self, method: str, path_contains: str) -> int:
        """How many requests with this method had ``path_contains`` in their path."""
        with self._lock:
            return sum(1 for r in self.requests if r.method == method and path_contains in r.path)

    # --- request handling (called from the handler threads) -----------------------------

    def _take_rule(self, method: str, path: str) -> tuple[int, float]:
        """The (status, delay) the matching rules impose on this request, consuming them."""
        status, delay = 0, 0.0
        with self._lock:
            for rule in self._rules:
                if not rule.matches(method, path):
                    continue
                if rule.status and not status:
                    status = rule.status
                elif rule.delay_s and not delay:
                    delay = rule.delay_s
                else:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
        return status, delay

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, dict[str, str], Any]:
        entry = LoggedRequest(method, path, body)
        with self._lock:
            self.requests.append(entry)
        status, extra, document = self._answer(method, path, headers, body)
        entry.status = status
        return status, extra, document

    def _answer(
        self, method: str, path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, dict[str, str], Any]:
        status, delay = self._take_rule(method, path)
        if delay and self._stop.wait(delay):
            return 503, {}, _error(503, "the fake is shutting down")
        route = path.rstrip("/")
        identity = route in ("", "/v3") or route.startswith("/v3/")
        if status:
            document = (_keystone_error if identity else _error)(status, f"injected {status}")
            return status, {}, document
        if identity:
            return self._identity(method, route, body)
        if route == "/compute" or route.startswith("/compute/"):
            if route not in ("/compute", "/compute/v2.1"):
                token = headers.get("x-auth-token", "")
                with self._lock:
                    known = token in self._tokens
                if not known:
                    return 401, {}, _error(401, NEEDS_AUTH)
            return self._compute(method, route, body)
        return 404, {}, _error(404, f"no such path {path}")

    def _identity(self, method: str, route: str, body: Any) -> tuple[int, dict[str, str], Any]:
        version = {
            "id": "v3.14",
            "status": "stable",
            "updated": "2020-04-07T00:00:00Z",
            "links": [{"rel": "self", "href": f"{self.base_url}/v3/"}],
            "media-types": [
                {"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}
            ],
        }
        if method == "GET" and route == "":
            return 300, {}, {"versions": {"values": [version]}}
        if method == "GET" and route == "/v3":
            return 200, {}, {"version": version}
        if method == "POST" and route == "/v3/auth/tokens":
            return self._issue_token(body)
        return 404, {}, _keystone_error(404, f"the fake Keystone has no {method} {route}")

    def _issue_token(self, body: Any) -> tuple[int, dict[str, str], Any]:
        try:
            user = body["auth"]["identity"]["password"]["user"]
            name, password = user["name"], user["password"]
        except (KeyError, TypeError):
            return 400, {}, _keystone_error(400, "expected password authentication")
        if name != USERNAME or password != PASSWORD:
            return 401, {}, _keystone_error(401, NEEDS_AUTH)
        token = uuid.uuid4().hex
        with self._lock:
            self._tokens.add(token)
        domain = {"id": "default", "name": "Default"}
        endpoints = {
            "compute": ("nova", f"{self.base_url}/compute/v2.1"),
            "identity": ("keystone", f"{self.base_url}/v3"),
        }
        catalog = [
            {
                "id": uuid.uuid4().hex,
                "type": kind,
                "name": name,
                "endpoints": [
                    {
                        "id": uuid.uuid4().hex,
                        "interface": interface,
                        "region": "RegionOne",
                        "region_id": "RegionOne",
                        "url": url,
                    }
                    for interface in ("public", "internal", "admin")
                ],
            }
            for kind, (name, url) in endpoints.items()
        ]
        document = {
            "token": {
                "methods": ["password"],
                "expires_at": "2099-01-01T00:00:00.000000Z",
                "issued_at": "2024-01-01T00:00:00.000000Z",
                "audit_ids": [uuid.uuid4().hex[:22]],
                "user": {"id": uuid.uuid4().hex, "name": USERNAME, "domain": domain},
                "project": {"id": PROJECT_ID, "name": "service", "domain": domain},
                "roles": [{"id": uuid.uuid4().hex, "name": role} for role in self.roles],
                "catalog": catalog,
                "is_domain": False,
            }
        }
        return 201, {"X-Subject-Token": token}, document

    def _compute(self, method: str, route: str, body: Any) -> tuple[int, dict[str, str], Any]:
        version = {
            "id": "v2.1",
            "status": "CURRENT",
            "version": "2.96",
            "min_version": "2.1",
            "updated": "2013-07-23T11:33:21Z",
            "links": [{"rel": "self", "href": f"{self.base_url}/compute/v2.1/"}],
            "media-types": [
                {
                    "base": "application/json",
                    "type": "application/vnd.openstack.compute+json;version=2.1",
                }
            ],
        }
        if route == "/compute":
            return 200, {}, {"versions": [version]}
        if route == "/compute/v2.1":
            return 200, {}, {"version": version}
        parts = route.split("/")  # "", "compute", "v2.1", "os-quota-sets", pid[, detail|defaults]
        if len(parts) < 5 or parts[3] != "os-quota-sets":
            return 404, {}, _error(404, f"the fake Nova has no {method} {route}")
        project_id, rest = parts[4], parts[5:]
        if method == "GET" and rest == []:
            return 200, {}, {"quota_set": {"id": project_id, **self.quota(project_id)}}
        if method == "GET" and rest == ["detail"]:
            detail = {
                k: {"limit": v, "in_use": 0, "reserved": 0}
                for k, v in self.quota(project_id).items()
            }
            return 200, {}, {"quota_set": {"id": project_id, **detail}}
        if method == "GET" and rest == ["defaults"]:
            return 200, {}, {"quota_set": {"id": project_id, **self.defaults}}
        if method in ("PUT", "DELETE") and rest == [] and "admin" not in self.roles:
            policy = "os_compute_api:os-quota-sets:" + ("update" if method == "PUT" else "delete")
            return 403, {}, _error(403, f"Policy doesn't allow {policy} to be performed.")
        if method == "PUT" and rest == []:
            return self._update(project_id, body)
        if method == "DELETE" and rest == []:
            if not self.unified_limits:
                with self._lock:
                    self.quotas.pop(project_id, None)
            return 202, {}, None
        return 404, {}, _error(404, f"the fake Nova has no {method} {route}")

    def _update(self, project_id: str, body: Any) -> tuple[int, dict[str, str], Any]:
        if not isinstance(body, dict) or not isinstance(body.get("quota_set"), dict):
            return 400, {}, _error(400, "Invalid input for field/attribute quota_set.")
        changes = {k: v for k, v in body["quota_set"].items() if k != "force"}
        for key, value in changes.items():
            if key not in self.defaults:
                return 400, {}, _error(400, f"Additional properties are not allowed ('{key}')")
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                return 400, {}, _error(400, f"Invalid input for field/attribute {key}: {value!r}")
        if not self.unified_limits:  # unified limits: accepted, and nothing changes
            with self._lock:
                self.quotas.setdefault(project_id, {}).update(changes)
        return 200, {}, {"quota_set": self.quota(project_id)}


def _error(status: int, message: str) -> dict[str, Any]:
    """Nova's error document: ``{"itemNotFound": {"code": 404, "message": …}}``."""
    return {_ERROR_NAMES.get(status, "error"): {"code": status, "message": message}}


def _keystone_error(status: int, message: str) -> dict[str, Any]:
    """Keystone's error document, which keystoneauth parses into its exception message."""
    return {"error": {"code": status, "message": message, "title": _TITLES.get(status, "Error")}}


def _handler_for(fake: FakeOpenStack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # 48 ms → 4 ms per request with keep-alive

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            path = urlsplit(self.path).path
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, extra, document = fake.handle(self.command, path, headers, body)
            payload = b"" if document is None else json.dumps(document).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the client gave up (timeout) and closed the connection

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the request log is fake.requests; stderr noise helps no one

    return Handler


def write_clouds_yaml(
    directory: Path,
    fake: FakeOpenStack,
    *,
    cloud: str = "fake",
    password: str = PASSWORD,
    **settings: Any,
) -> Path:
    """Write ``directory/clouds.yaml`` with one cloud ``cloud`` that points at ``fake``.

    ``settings`` are further keys of the cloud's entry (``api_timeout``,
    ``compute_status_code_retries``, …). JSON is valid YAML, so no YAML writer is needed.
    """
    doc = {
        "clouds": {
            cloud: {
                "auth": {
                    "auth_url": f"{fake.base_url}/v3",
                    "username": USERNAME,
                    "password": password,
                    "project_id": PROJECT_ID,
                    "user_domain_name": "Default",
                },
                "region_name": "RegionOne",
                "interface": "public",
                "identity_api_version": 3,
                **settings,
            }
        }
    }
    path = directory / "clouds.yaml"
    path.write_text(json.dumps(doc, indent=2))
    return path
