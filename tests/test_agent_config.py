"""The [agent] configuration section and the host's capacity figures."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gmd.agent_config import load_agent, parse_agent
from gmd.collect.capacity import link_speeds_mbit, network_bytes_per_s
from gmd.config import ConfigError


def test_defaults() -> None:
    c = parse_agent({}, "gmd.toml")
    assert c.host == socket.getfqdn()
    assert (c.libvirt_uri, c.tick_s, c.interval_s) == ("qemu:///system", 10.0, 60)
    assert c.daemon_url is None and c.token is None and c.default_customer is None
    assert (c.metrics_bind, c.metrics_port) == ("127.0.0.1", 8471)
    assert c.spool_path.name == "agent-spool.db"
    assert (c.spool_max_bytes, c.spool_max_batches) == (2**30, 10080)
    assert (c.disk_bytes_per_s, c.network_bytes_per_s) == (500e6, None)
    assert (c.enforce_backend, c.plan_every_s) == ("libvirt", 30.0)
    assert c.enforcement_state_path == c.spool_path.parent / "agent-enforcement.json"
    assert (c.cgroup_root, c.cgroup_template) == (Path("/sys/fs/cgroup"), None)


def test_enforcement_keys(tmp_path: Path) -> None:
    (tmp_path / "gmd.toml").write_text(
        '[agent]\nenforce_backend = "cgroup"\nplan_every_s = 0\n'
        'enforcement_state_path = "state/enforcement.json"\ncgroup_root = "/cg"\n'
        'cgroup_template = "machine/{machine}.libvirt-qemu"\n'
    )
    c = load_agent(tmp_path / "gmd.toml")
    assert (c.enforce_backend, c.plan_every_s) == ("cgroup", 0.0)
    assert c.enforcement_state_path == tmp_path / "state" / "enforcement.json"
    assert (c.cgroup_root, c.cgroup_template) == (Path("/cg"), "machine/{machine}.libvirt-qemu")


def test_other_sections_are_left_to_the_daemon() -> None:
    c = parse_agent({"database": {"url": "sqlite:///x"}, "agent": {"host": "cmp-7"}})
    assert c.host == "cmp-7"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"tick_s": 0}, "gmd.toml: agent.tick_s: 0.0 is not in [0.05, 3600]"),
        ({"interval_s": 2.5}, "agent.interval_s: 2.5 is not a whole number of seconds"),
        ({"tick_s": 90}, "agent.tick_s: 90 is longer than interval_s = 60"),
        ({"daemon_url": "gmd:8470"}, "agent.daemon_url: 'gmd:8470': use http://HOST:PORT"),
        ({"token": "a b"}, "agent.token: the token must be printable ASCII"),
        ({"token": "t", "token_file": "f"}, "agent.token_file: give token or token_file"),
        ({"token_file": "/nonexistent/token"}, "agent.token_file: '/nonexistent/token': cannot"),
        ({"metrics_port": 70000}, "agent.metrics_port: 70000.0 is not in [0, 65535]"),
        ({"network_bytes_per_s": 0}, "agent.network_bytes_per_s: 0 must be > 0"),
        ({"tick": 5}, "agent.tick: unknown key (misspelt?)"),
        ({"default_customer": ""}, "agent.default_customer: ''"),
        (
            {"enforce_backend": "tc"},
            "agent.enforce_backend: 'tc' is not one of libvirt, cgroup, none",
        ),
        ({"plan_every_s": -1}, "agent.plan_every_s: -1.0 is not in [0, 86400]"),
        ({"cgroup_template": "../{name}"}, "agent.cgroup_template: cgroup path template"),
        ({"cgroup_template": "{nom}"}, "agent.cgroup_template: cgroup path template '{nom}'"),
        ({"enforcement_state_path": 5}, "agent.enforcement_state_path: expected str, got 5"),
    ],
)
def test_errors_name_the_file_and_key(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_agent({"agent": table}, "gmd.toml")
    assert message in str(err.value)


def test_token_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "gmd.toml").write_text(
        '[agent]\ntoken_file = "token"\nspool_path = "spool/agent.db"\n'
        'daemon_url = "https://gmd.example.org:8470/"\n'
    )
    c = load_agent(tmp_path / "gmd.toml")
    assert c.token == "s3cret-token"
    assert c.spool_path == tmp_path / "spool" / "agent.db"
    assert c.daemon_url == "https://gmd.example.org:8470"


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_agent(tmp_path / "absent.toml")


def fake_net(root: Path, ifaces: dict[str, tuple[str, str | None]]) -> Path:
    """``/sys/class/net``: name → (kind: phys, bond or virtual, speed file content)."""
    for name, (kind, speed) in ifaces.items():
        d = root / name
        d.mkdir(parents=True)
        if kind == "phys":
            (d / "device").mkdir()
        elif kind == "bond":
            (d / "bonding").mkdir()
        if speed is not None:
            (d / "speed").write_text(speed + "\n")
    return root


def test_link_speed_is_the_fastest_physical_or_bonded_link(tmp_path: Path) -> None:
    net = fake_net(
        tmp_path,
        {
            "eno1": ("phys", "1000"),
            "eno2": ("phys", "-1"),  # down
            "bond0": ("bond", "20000"),
            "veth1": ("virtual", "10000"),  # claims 10G, is not the host's link
            "tap0": ("virtual", "10"),
            "lo": ("virtual", None),
        },
    )
    assert link_speeds_mbit(net) == {"eno1": 1000, "bond0": 20000}
    assert network_bytes_per_s(None, net) == (2.5e9, "link speed of bond0 (20000 Mbit/s)")
    assert network_bytes_per_s(4e8, net) == (4e8, "agent.network_bytes_per_s")


def test_no_link_speed_falls_back_to_a_gigabit_and_says_so(tmp_path: Path) -> None:
    net = fake_net(tmp_path, {"eth0": ("phys", "-1")})  # virtio reports no speed
    value, source = network_bytes_per_s(None, net)
    assert value == 125e6
    assert "assuming 1 Gbit/s (set agent.network_bytes_per_s)" in source
