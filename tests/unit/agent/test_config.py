"""The [agent] configuration section and the host's capacity figures."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from gmd.admin.demo import PACKAGED_TRACES
from gmd.agent.collect.capacity import link_speeds_mbit, network_bytes_per_s
from gmd.agent.config import load_agent, parse_agent
from gmd.common.config import ConfigError


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
    assert c.post_jitter_s == 20.0


def test_posts_spread_over_a_third_of_a_short_interval_or_as_configured() -> None:
    assert parse_agent({"agent": {"interval_s": 6, "tick_s": 1}}).post_jitter_s == 2.0
    assert parse_agent({"agent": {"interval_s": 900}}).post_jitter_s == 20.0
    assert parse_agent({"agent": {"post_jitter_s": 0}}).post_jitter_s == 0.0
    assert parse_agent({"agent": {"post_jitter_s": 59.5}}).post_jitter_s == 59.5


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
        ({"tick_s": 0}, "gmd.toml: agent.tick_s: 0 is not in [0.05, 3600]"),
        ({"interval_s": 2.5}, "agent.interval_s: 2.5 is not a whole number of seconds"),
        ({"tick_s": 90}, "agent.tick_s: 90 is longer than interval_s = 60"),
        ({"daemon_url": "gmd:8470"}, "agent.daemon_url: 'gmd:8470': use http://HOST:PORT"),
        ({"token": "a b"}, "agent.token: the token must be printable ASCII"),
        ({"token": "t", "token_file": "f"}, "agent.token_file: give token or token_file"),
        ({"token_file": "/nonexistent/token"}, "agent.token_file: '/nonexistent/token': cannot"),
        ({"metrics_port": 70000}, "agent.metrics_port: 70000 is not in [0, 65535]"),
        ({"network_bytes_per_s": 0}, "agent.network_bytes_per_s: 0 must be > 0"),
        ({"tick": 5}, "agent.tick: unknown key (misspelt?)"),
        ({"default_customer": ""}, "agent.default_customer: ''"),
        (
            {"enforce_backend": "tc"},
            "agent.enforce_backend: 'tc' is not one of libvirt, cgroup, none",
        ),
        ({"plan_every_s": -1}, "agent.plan_every_s: -1 is not in [0, 86400]"),
        ({"post_jitter_s": 60}, "agent.post_jitter_s: 60 is not shorter than interval_s = 60"),
        ({"post_jitter_s": -1}, "agent.post_jitter_s: -1 is not in [0, 86400]"),
        ({"post_jitter_s": "5"}, "agent.post_jitter_s: expected"),
        ({"cgroup_template": "../{name}"}, "agent.cgroup_template: cgroup path template"),
        ({"cgroup_template": "{nom}"}, "agent.cgroup_template: cgroup path template '{nom}'"),
        ({"enforcement_state_path": 5}, "agent.enforcement_state_path: expected a string, got 5"),
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


TRACES = PACKAGED_TRACES  # the demo's, N.csv.gz


def test_replay_keys(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    for n in (1, 2, 3, 5, 12):
        (tmp_path / "traces" / f"{n}.csv").write_text("")
    (tmp_path / "gmd.toml").write_text(
        '[agent]\ncollector = "replay"\nreplay_dir = "traces"\nreplay_vms = "1-3,12"\n'
        'replay_customers = ["acme", "globex"]\nreplay_start = "now-3d"\n'
        "replay_end = 2099-01-02T03:04:05Z\nreplay_speed = 5000\nreplay_offset_s = 3600\n"
        "replay_host_cores = 48\nreplay_host_memory_bytes = 2e11\n"
    )
    c = load_agent(tmp_path / "gmd.toml")
    assert (c.collector, c.replay_dir) == ("replay", tmp_path / "traces")
    assert c.replay_vms == ("1", "2", "3", "12")
    assert c.replay_customers == ("acme", "globex")
    assert c.replay_start_s == pytest.approx(time.time() - 3 * 86400, abs=60)
    assert c.replay_end_s == 4071006245.0
    assert (c.replay_speed, c.replay_offset_s) == (5000.0, 3600.0)
    assert (c.replay_host_cores, c.replay_host_memory_bytes) == (48.0, 2e11)

    table = {"collector": "replay", "replay_dir": str(tmp_path / "traces")}
    c = parse_agent({"agent": {**table, "replay_vms": [5, "1"], "replay_speed": "max"}})
    assert (c.replay_vms, c.replay_speed, c.replay_start_s, c.replay_end_s) == (
        ("5", "1"),
        None,
        None,
        None,
    )
    owners = {"5": "acme", "1": "globex", "99": "other-host's"}
    c = parse_agent({"agent": {**table, "replay_vms": [5, 1], "replay_customers": owners}})
    assert c.replay_customers == owners
    assert parse_agent({}).collector == "auto"


def test_replay_of_the_packaged_traces_parses() -> None:
    c = parse_agent(
        {"agent": {"collector": "replay", "replay_dir": str(TRACES), "replay_vms": "1-100"}}
    )
    assert len(c.replay_vms) == 100


def test_a_trace_both_plain_and_compressed_is_refused(tmp_path: Path) -> None:
    """``gunzip -k`` leaves N.csv beside N.csv.gz: which one is replayed is not guessed."""
    for name in ("1.csv", "1.csv.gz", "2.csv.gz"):
        (tmp_path / name).write_text("")
    table = {"collector": "replay", "replay_dir": str(tmp_path)}
    assert parse_agent({"agent": {**table, "replay_vms": [2]}}).replay_vms == ("2",)
    with pytest.raises(ConfigError) as err:
        parse_agent({"agent": {**table, "replay_vms": [2, 1]}}, "gmd.toml")
    assert f"agent.replay_vms: both 1.csv and 1.csv.gz in {tmp_path}: keep one" in str(err.value)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"collector": "xen"},
            "agent.collector: 'xen' is not one of auto, kernel, libvirt, replay",
        ),
        ({"collector": "replay"}, 'agent.replay_dir: required with collector = "replay"'),
        (
            {"collector": "replay", "replay_dir": "/nonexistent"},
            "agent.replay_dir: '/nonexistent' is not a directory",
        ),
        ({"replay_vms": "10-1"}, "agent.replay_vms: '10-1' is not a range like 1-10"),
        ({"replay_vms": [1.5]}, "agent.replay_vms: 1.5: give trace numbers (1, 2) or ranges"),
        ({"replay_vms": "1,2,1"}, "agent.replay_vms: trace 1 is listed twice"),
        (
            {"collector": "replay", "replay_vms": [101]},
            "agent.replay_vms: no trace 101.csv (or 101.csv.gz) in",
        ),
        ({"replay_customers": []}, "agent.replay_customers: an empty list"),
        ({"replay_customers": ["a", 7]}, "agent.replay_customers: 7: 1–255 characters"),
        (
            {"replay_vms": [1, 2], "replay_customers": {"1": "a"}},
            "agent.replay_customers: no customer for trace 2 (replay_vms)",
        ),
        ({"replay_start": "yesterday"}, "agent.replay_start: 'yesterday' is not a time"),
        ({"replay_end": -5}, "agent.replay_end: -5 is not a time"),
        (
            {"replay_start": "2026-01-02", "replay_end": "2026-01-01"},
            "agent.replay_end: 1767225600 is not after replay_start (1767312000)",
        ),
        ({"replay_speed": 0}, 'agent.replay_speed: 0: give a number > 0, or "max"'),
        ({"replay_speed": "fast"}, "agent.replay_speed: 'fast': give a number > 0"),
        ({"replay_offset_s": -1}, "agent.replay_offset_s: -1 is not in [0, ∞)"),
        ({"replay_host_cores": 0}, "agent.replay_host_cores: 0 must be > 0"),
        ({"replay_dirs": "x"}, "agent.replay_dirs: unknown key (misspelt?)"),
    ],
)
def test_replay_errors_name_the_file_and_key(table: dict, message: str) -> None:
    if table.get("collector") == "replay" and "replay_vms" in table:
        table = {**table, "replay_dir": str(TRACES)}
    with pytest.raises(ConfigError) as err:
        parse_agent({"agent": table}, "gmd.toml")
    assert message in str(err.value)
