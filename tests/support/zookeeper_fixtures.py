"""ZooKeeper for the tests: the shared ensemble (``zookeeper_hosts``: ``GMD_TEST_ZOOKEEPER``'s,
which ``make test`` starts, or one started here and stopped at the session's end) and a kazoo
client per test rooted in a path of its own (``zk``), so that tests never see each other's
nodes. A test that cannot have ZooKeeper fails: it is never skipped."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "zookeeper.sh"
ENV = "GMD_TEST_ZOOKEEPER"
RETRY = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}
"""kazoo's reconnect: every second at most, not its default backoff to an hour (which outlives
a session: reconnected minutes after quorum came back, the broker's session had expired)."""


@pytest.fixture(scope="session")
def zookeeper_hosts() -> Iterator[str]:
    hosts = os.environ.get(ENV)
    if hosts:
        yield hosts
        return
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"tests/scripts/zookeeper.sh could not start ZooKeeper:\n{done.stderr[-3000:]}")
    try:
        yield done.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def client(hosts: str, timeout_s: float = 10.0) -> Any:
    """A started kazoo client with the tests' reconnect policy."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=hosts, timeout=timeout_s, connection_retry=dict(RETRY))
    zk.start(timeout=30)
    return zk


@pytest.fixture
def zk_root(zookeeper_hosts: str) -> Iterator[str]:
    """A path of this test's own in the shared ensemble, removed afterwards."""
    root = f"/gmd-test/{uuid.uuid4().hex}"
    admin = client(zookeeper_hosts)
    try:
        admin.ensure_path(root)
        yield root
        admin.sync(root)  # its listing must hold what the test's own sessions made
        admin.delete(root, recursive=True)
    finally:
        admin.stop()
        admin.close()
