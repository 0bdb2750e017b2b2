"""Customers' project names from the real Keystone, shown beside their uuids by gmd-admin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.project_names import NameRefresher, ProjectNames, store_names
from gmd.ledger_schema.kinds import NameSource
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)
from tests.support.openstack_support import LEGACY, RealCloud

pytest_plugins = ("tests.support.openstack_support",)
pytestmark = pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")

ADMIN = Path(sys.executable).with_name("gmd-admin")
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
STRANGER = "0123456789abcdef0123456789abcdef"


def admin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(config), "standings", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_names_from_keystone_appear_in_the_standings(real_cloud: RealCloud, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "gmd.toml"
    path.write_text(f'[database]\nurl = "{url}"\n')
    config = make_config(url, {HOST.name: "operator"}, accounting={"endowment": "equal"})
    # The agent names a customer as the Nova metadata does: the project's uuid.
    acme = real_cloud.acme
    with serving(config) as d:
        last = aligned_past(3)
        body = batch(HOST, last, [cpu_only("vm-a", acme, 90.0), cpu_only("vm-b", STRANGER, 30.0)])
        assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name)).is_success
        account_due(d.engine, config.accounting, now_s=last + 60)
        before = admin(path)
        assert "Project" not in before.stdout  # no names yet: no column of dashes

        job = NameRefresher(d.engine, ProjectNames(LEGACY, timeout_s=30, retries=0))
        assert job.run() == 1  # acme; the stranger's project is not in Keystone
        assert job.run() == 0  # nothing new
        job.close()
        # A name from the Nova metadata never replaces Keystone's.
        assert store_names(d.engine, {acme: "from-metadata"}, source=NameSource.nova) == 0

    table = admin(path)
    assert table.returncode == 0, table.stderr
    assert "Project" in table.stdout and "acme" in table.stdout
    doc = json.loads(admin(path, "--format", "json").stdout)
    rows = {r["customer"]: r for r in doc["customers"]}
    assert rows[acme]["name"] == "acme"  # the uuid stays the key
    assert rows[STRANGER]["name"] is None
    only = json.loads(admin(path, "--customer", "acme", "--format", "json").stdout)
    assert [r["customer"] for r in only["customers"]] == [acme]
