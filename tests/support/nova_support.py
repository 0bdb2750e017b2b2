"""The whole small cloud of tests/scripts/nova_cloud.sh (real Nova, real QEMU guests), as tests
use it.

``nova_cloud`` (session) starts it through the script, uses the one ``GMD_TEST_NOVA`` names (the
path of its ``cloud.json``), or waits for the one make test is starting
(``GMD_TEST_NOVA_STARTING``); a cloud it started itself it stops at the session's end, so a run
leaves no process and no guest behind. ``nova`` (per test) is the same cloud, with the services'
logs attached to a failing test's report. A test that cannot have the cloud fails: it is never
skipped. Tests boot servers as a project's member through the Nova API and delete them through
it, as a tenant would; the domain Nova defines for a server is found by its uuid.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.openstack_support import ServiceLogs, limits_of

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "nova_cloud.sh"
ENV = "GMD_TEST_NOVA"
STARTING = "GMD_TEST_NOVA_STARTING"
"""Set by make test, which starts the cloud beside the suite's first tests rather than before
them (about a minute of its start is waiting on its own services): the directory where
tests/scripts/test.sh puts the script's ``nova.out`` and ``nova.err`` and, once it ended, its
exit status in ``nova.rc``."""
STARTING_TIMEOUT_S = 900.0
"""The longest the script may take (its lock waits as long for another run)."""
LOCK = REPO / "var" / "nova" / "session.lock"
"""Held by the test session that started the cloud, until it has stopped it
(tests/scripts/nova_cloud.sh waits for it too, except when called by that session:
:func:`session_env`)."""
BOOT_TIMEOUT_S = 180.0
"""Create → ACTIVE took 3.5-12.5 s measured on a loaded 2-core host; this is the give-up."""
DELETE_TIMEOUT_S = 120.0
COMPUTE_MICROVERSION = "2.96"
"""``networks: "none"`` needs 2.37; 2.96 is what the boot path was measured with."""


@dataclass(frozen=True)
class Server:
    """A server a member booted: its Nova id (the domain's uuid), name, project and domain name."""

    id: str
    name: str
    project: str
    domain: str


class NovaCloud:
    """The cloud's description (``info``, from cloud.json) and what a test does with it."""

    def __init__(self, info: dict[str, Any], clouds_yaml: Path) -> None:
        self.info = info
        self.clouds_yaml = clouds_yaml
        self.run = clouds_yaml.parent

    @property
    def projects(self) -> dict[str, str]:
        """Project name → Keystone project id (hex, no dashes: what Nova writes to a domain)."""
        return dict(self.info["projects"])

    @property
    def domain_prefix(self) -> str:
        return str(self.info["domain_prefix"])

    def member_cloud(self, project: str) -> str:
        """The clouds.yaml entry of ``project``'s member (role ``member`` in that project);
        ``admin`` is the operator's own project, whose entry has that name."""
        return str(self.info["member_clouds"].get(project, project))

    def connect(self, cloud: str = "admin") -> Any:
        """An openstacksdk connection for a clouds.yaml entry of this cloud (not the user's)."""
        import openstack
        import openstack.config

        config = openstack.config.OpenStackConfig(
            config_files=[str(self.clouds_yaml)], load_envvars=False
        )
        return openstack.connection.Connection(config=config.get_one(cloud=cloud), api_timeout=60)

    def unified_member_cloud(self, project: str) -> str:
        """``project``'s member's entry for ``RegionTwo``, the Nova API on unified limits."""
        return str(self.info["unified"]["member_clouds"][project])

    def boot(
        self, project: str, role: str, name: str | None = None, *, cloud: str | None = None
    ) -> Server:
        """Boots a server of the tiny guest in ``role`` (spin or idle) as ``project``'s member
        (through ``cloud``'s Nova API: the member's RegionOne entry by default), without a
        network, and waits until it is ACTIVE."""
        name = name or f"{project}-{role}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        conn = self.connect(cloud or self.member_cloud(project))
        try:
            response = self._create(conn, name, role)
            if response.status_code != 202:
                raise AssertionError(
                    f"boot of {name} refused: {response.status_code} {response.text}"
                )
            server_id = response.json()["server"]["id"]
            deadline = time.monotonic() + BOOT_TIMEOUT_S
            while True:
                server = self._show(conn, server_id)
                if server["status"] == "ACTIVE":
                    break
                if server["status"] == "ERROR" or time.monotonic() > deadline:
                    raise AssertionError(
                        f"server {name} ({server_id}) is {server['status']}, not ACTIVE: "
                        f"{server.get('fault', {}).get('message', 'no fault recorded')}"
                    )
                time.sleep(0.5)
        finally:
            conn.close()
        return Server(server_id, name, project, self.domain_name(server_id))

    def ask_to_boot(self, project: str, role: str, *, cloud: str | None = None) -> Any:
        """What Nova answers ``project``'s member who asks for one more server (not waited
        for: a test of a refusal). A server it accepted is deleted at the cloud's stop."""
        conn = self.connect(cloud or self.member_cloud(project))
        try:
            return self._create(conn, f"{project}-one-more-{os.getpid()}", role)
        finally:
            conn.close()

    def _create(self, conn: Any, name: str, role: str) -> Any:
        return conn.compute.post(
            "/servers",
            json={
                "server": {
                    "name": name,
                    "imageRef": self.info["images"][role],
                    "flavorRef": self.info["flavor"]["id"],
                    "networks": "none",
                }
            },
            microversion=COMPUTE_MICROVERSION,
        )

    def project_limits(self, project_id: str) -> dict[str, int]:
        """The project's own limits in Keystone (``RegionTwo``'s), by resource name."""
        conn = self.connect("keystone-admin")
        try:
            return limits_of(conn, project_id)
        finally:
            conn.close()

    def domain_name(self, server_id: str) -> str:
        """The libvirt domain Nova made for the server (an admin-only attribute)."""
        conn = self.connect("admin")
        try:
            server = self._show(conn, server_id)
        finally:
            conn.close()
        return str(server["OS-EXT-SRV-ATTR:instance_name"])

    def delete(self, server: Server) -> None:
        """Deletes the server through the API as its member and waits until Nova has no such
        server any more (its domain is then destroyed and undefined)."""
        conn = self.connect(self.member_cloud(server.project))
        try:
            response = conn.compute.delete(f"/servers/{server.id}")
            if response.status_code not in (204, 404):
                raise AssertionError(
                    f"delete of {server.name} refused: {response.status_code} {response.text}"
                )
            deadline = time.monotonic() + DELETE_TIMEOUT_S
            while conn.compute.get(f"/servers/{server.id}").status_code != 404:
                if time.monotonic() > deadline:
                    raise AssertionError(f"server {server.name} still there after delete")
                time.sleep(0.5)
        finally:
            conn.close()

    @staticmethod
    def _show(conn: Any, server_id: str) -> dict[str, Any]:
        response = conn.compute.get(f"/servers/{server_id}", microversion=COMPUTE_MICROVERSION)
        if response.status_code != 200:
            raise AssertionError(
                f"GET /servers/{server_id}: {response.status_code} {response.text}"
            )
        return dict(response.json()["server"])

    def script(self, *args: str) -> None:
        """tests/scripts/nova_cloud.py ``args`` on this cloud (under the cloud's own venv):
        fake compute hosts, the scheduler's configuration."""
        state = self.run.parent
        python = state / "venv" / "bin" / "python"
        done = subprocess.run(
            [str(python), str(SCRIPT.with_suffix(".py")), "--state", str(state), *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise AssertionError(f"nova_cloud.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")

    def host_of(self, server_id: str) -> str:
        """The compute host Nova placed the server on (an admin-only attribute)."""
        conn = self.connect("admin")
        try:
            return str(self._show(conn, server_id)["OS-EXT-SRV-ATTR:host"])
        finally:
            conn.close()

    def hypervisors(self) -> dict[str, dict[str, Any]]:
        """Each compute host's hypervisor as Nova's API shows it (vcpus, memory_mb, …)."""
        conn = self.connect("admin")
        try:
            found = conn.compute.get("/os-hypervisors/detail", microversion="2.1").json()
        finally:
            conn.close()
        return {str(h["service"]["host"]): h for h in found["hypervisors"]}

    def libvirt(self) -> Any:
        """A connection to the libvirtd the cloud's nova-compute uses."""
        import libvirt

        return libvirt.open(self.info["libvirt_uri"])


def session_env() -> dict[str, str]:
    """The environment of tests/scripts/nova_cloud.sh run by the session that holds ``LOCK``."""
    return {**os.environ, "GMD_NOVA_SESSION": "1"}


def start() -> tuple[dict[str, Any], bool]:
    """The cloud's cloud.json (``GMD_TEST_NOVA``'s, or that of one started now), and whether
    this call started it."""
    path = os.environ.get(ENV)
    started = False
    if not path:
        done = subprocess.run(
            ["bash", str(SCRIPT)], capture_output=True, text=True, env=session_env()
        )
        if done.returncode != 0:
            pytest.fail(
                f"tests/scripts/nova_cloud.sh could not start the cloud:\n{done.stderr[-3000:]}"
            )
        path = done.stdout.strip().splitlines()[-1]
        started = True
    return json.loads(Path(path).read_text()), started


def started_beside(logs: Path) -> str | None:
    """The cloud.json of the cloud make test is starting beside the suite, once it is up; None
    when its start failed (the fixture then tries once more itself, and fails saying why)."""
    rc = logs / "nova.rc"
    deadline = time.monotonic() + STARTING_TIMEOUT_S
    while not rc.exists() or not rc.read_text().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"make test's Nova cloud did not finish starting in {STARTING_TIMEOUT_S} s")
        time.sleep(1.0)
    if rc.read_text().strip() != "0":
        return None
    lines = (logs / "nova.out").read_text().strip().splitlines()
    return lines[-1] if lines else None


@pytest.fixture(scope="session")
def nova_cloud() -> Iterator[NovaCloud]:
    starting = os.environ.get(STARTING)
    if starting and not os.environ.get(ENV):
        path = started_beside(Path(starting))
        if path is not None:
            os.environ[ENV] = path
    if os.environ.get(ENV):
        info, _ = start()
        yield NovaCloud(info, Path(info["clouds_yaml"]))
        return
    # One cloud per machine: a second test session (another checkout's pytest, a developer's
    # run beside make test) waits for the first to finish rather than restart its cloud.
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info, _ = start()
        try:
            yield NovaCloud(info, Path(info["clouds_yaml"]))
        finally:
            done = subprocess.run(
                ["bash", str(SCRIPT), "stop"], capture_output=True, text=True, env=session_env()
            )
        if done.returncode != 0:
            pytest.fail(f"tests/scripts/nova_cloud.sh stop failed:\n{done.stderr[-3000:]}")


@pytest.fixture
def nova(nova_cloud: NovaCloud, request: pytest.FixtureRequest) -> NovaCloud:
    """The cloud; a failing test's report carries what its services logged meanwhile."""
    request.node.service_logs = ServiceLogs(nova_cloud.run)
    return nova_cloud
