"""The real OpenStack of tests/scripts/openstack.sh, as the tests use it.

``make test`` starts the services once (``GMD_TEST_OPENSTACK`` is the path of their
``cloud.json``); run alone, the session fixture starts them itself. A test that cannot have
them fails: it is never skipped. Each test makes its own projects in the real Keystone, so
tests do not see each other's quotas or limits.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

LEGACY = "legacy"
"""clouds.yaml entry: gmd's admin account on the Nova with the legacy quota driver"""
UNIFIED = "unified"
"""… on the Nova with unified limits (RegionTwo)"""
UNIFIED_SYSTEM = "unified-system"
"""gmd's account, system-scoped: writes Keystone limits"""
MEMBER = "member"
"""acme's member: may read its own project's quota, not write it"""


def limits_of(conn: Any, project_id: str) -> dict[str, int]:
    """A project's own limits in Keystone, by resource name (``conn``: a system-scoped
    admin's openstacksdk connection)."""
    return {
        limit.resource_name: limit.resource_limit
        for limit in conn.identity.limits(project_id=project_id)
    }


@dataclass(frozen=True)
class RealCloud:
    info: dict[str, Any]

    @property
    def clouds_yaml(self) -> Path:
        return Path(self.info["clouds_yaml"])

    @property
    def acme(self) -> str:
        return str(self.info["projects"]["acme"])

    def connect(self, cloud: str = "keystone-admin") -> Any:
        import openstack

        return openstack.connect(cloud=cloud, api_timeout=30)

    def new_project(self, prefix: str = "customer") -> str:
        """A new project in Keystone (its own quotas and limits), its id."""
        conn = self.connect()
        try:
            project = conn.identity.create_project(
                name=f"{prefix}-{uuid.uuid4().hex[:8]}", domain_id="default"
            )
            return str(project.id)
        finally:
            conn.close()

    def add_servers(self, nova: str, project_id: str, count: int, vcpus: int, ram_mb: int) -> None:
        """Servers Nova counts as the project's usage, as a compute service would record them.

        This cloud has no compute service to boot them (the full boot path needs RabbitMQ,
        conductor, scheduler and PostgreSQL), so they go straight into the cell database that
        the real Nova API counts usage from.
        """
        with sqlite3.connect(self.info["nova"][nova]["cell_db"]) as db:
            db.executemany(
                "INSERT INTO instances (uuid, project_id, user_id, vcpus, memory_mb, deleted,"
                " vm_state, hidden) VALUES (?, ?, 'gmd-test', ?, ?, 0, 'active', 0)",
                [(str(uuid.uuid4()), project_id, vcpus, ram_mb) for _ in range(count)],
            )

    def project_limits(self, project_id: str) -> dict[str, int]:
        """The project's own limits in Keystone, by resource name."""
        conn = self.connect()
        try:
            return limits_of(conn, project_id)
        finally:
            conn.close()

    def set_project_limit(self, project_id: str, resource: str, value: int) -> None:
        conn = self.connect()
        try:
            conn.identity.create_limit(
                service_id=self.info["compute_service_id"],
                project_id=project_id,
                region_id="RegionTwo",
                resource_name=resource,
                resource_limit=value,
            )
        finally:
            conn.close()


def start() -> dict[str, Any]:
    path = os.environ.get("GMD_TEST_OPENSTACK")
    if not path:
        done = subprocess.run(
            ["bash", str(REPO / "tests" / "scripts" / "openstack.sh")],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.fail(
                f"tests/scripts/openstack.sh could not start the cloud:\n{done.stderr[-3000:]}"
            )
        path = done.stdout.strip().splitlines()[-1]
        os.environ["GMD_TEST_OPENSTACK"] = path
    info = json.loads(Path(path).read_text())
    info["clouds_yaml"] = str(Path(path).parent / "clouds.yaml")
    return dict(info)


@pytest.fixture(scope="session")
def openstack_info() -> dict[str, Any]:
    return start()


class ServiceLogs:
    """What the services logged from now on: a failing test's report shows it (tests/conftest.py),
    so a 500 from a service in CI comes with the service's own traceback."""

    def __init__(self, run: Path) -> None:
        self.offsets = {log: log.stat().st_size for log in sorted(run.glob("*.log"))}

    def __call__(self) -> list[tuple[str, str]]:
        sections = []
        for log, offset in self.offsets.items():
            with log.open("rb") as stream:
                stream.seek(offset)
                text = stream.read()[-LOG_TAIL_BYTES:].decode(errors="replace")
            if text.strip():
                sections.append((f"{log.name} during the test", text))
        return sections


LOG_TAIL_BYTES = 20_000


@pytest.fixture
def real_cloud(
    openstack_info: dict[str, Any], monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[RealCloud]:
    """The real cloud, with its clouds.yaml the one every OpenStack client here reads."""
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", openstack_info["clouds_yaml"])
    request.node.service_logs = ServiceLogs(Path(openstack_info["clouds_yaml"]).parent)
    yield RealCloud(openstack_info)
