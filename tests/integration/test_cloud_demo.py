"""``make cloud-demo``'s files, without the cloud: what tests/support/cloud_demo.py writes is what
gmd-daemon, gmd-admin and gmd-agent load (the story itself runs in the real cloud, as
tests/cloud/test_cloud_loop.py does with the same settings), and a rerun never empties a directory
that is not the demo's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gmd.agent.config import load_agent
from gmd.daemon.config import load
from tests.support.cloud_demo import DemoFailed, prepare, write_configs
from tests.support.cloud_story import CAP, INTERVAL_S
from tests.support.nova_support import NovaCloud

INFO = {
    "keystone_url": "http://127.0.0.1:26357/v3",
    "admin_project": "5c2d35c9864f4484b92488cd89dbd73b",
    "compute_host": "gmdnova-compute",
    "hypervisor_hostname": "vm",
    "libvirt_uri": "qemu:///system",
    "domain_prefix": "gmdnova-",
}


def test_the_demo_writes_what_gmd_loads(tmp_path: Path) -> None:
    nova = NovaCloud(INFO, tmp_path / "clouds.yaml")
    root = prepare(tmp_path / "demo")
    write_configs(nova, root, 8471)
    config = load(root / "gmd.toml")
    agent = load_agent(root / "agent.toml")
    token = (root / "agent.token").read_text().strip()
    assert (
        config.hosts["gmdnova-compute"].token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    )
    assert config.database_url == f"sqlite:///{root / 'ledger.db'}"
    assert (config.daemon.port, config.accounting.interval_s) == (8471, INTERVAL_S)
    assert (config.enforcement.mode, config.enforcement.policy.cpu_cap_fractions) == ("on", (CAP,))
    assert config.enforcement.quota.cloud == "admin"
    assert (config.placement.verify, config.placement.providers) == (
        "on",
        {"gmdnova-compute": "vm"},
    )
    assert config.read_api.auth == "keystone"
    assert agent.daemon_url == "http://127.0.0.1:8471"
    assert agent.token == token
    assert (agent.host, agent.domains.prefixes) == ("gmdnova-compute", ("gmdnova-",))
    assert agent.interval_s == INTERVAL_S


def test_a_rerun_empties_its_own_directory_and_refuses_any_other(tmp_path: Path) -> None:
    root = prepare(tmp_path / "demo")
    (root / "ledger.db").write_text("old")
    assert list(prepare(root).iterdir()) == [root / ".gmd-cloud-demo"]
    other = tmp_path / "precious"
    other.mkdir()
    (other / "keep").write_text("mine")
    with pytest.raises(DemoFailed, match="not an earlier cloud demo's"):
        prepare(other)
    assert (other / "keep").read_text() == "mine"
