"""The configuration file: defaults, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmd.common.config import ConfigError
from gmd.daemon.config import load, parse
from gmd.wire import RESOURCES_SPLIT


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gmd.toml"
    path.write_text(text)
    return path


def test_defaults_when_the_default_file_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GMD_CONFIG", raising=False)
    monkeypatch.setattr("gmd.common.config.DEFAULT_PATH", Path("/nonexistent/gmd.toml"))
    cfg = load()
    assert cfg.accounting.gamma == 0.5
    assert cfg.accounting.interval_s == 60
    assert cfg.accounting.endowment == "flavor"
    assert cfg.accounting.half_life_s == 7 * 86400
    assert cfg.database_url.startswith("sqlite:///") and cfg.database_url.endswith("ledger.db")


def test_a_full_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        """
[database]
url = "postgresql+psycopg://gmd@db/gmd"
[accounting]
interval_s = 300
gamma = 0.4
endowment = "equal"
half_life_s = "none"
split_io = true
utility = "psi"
weights = { cpu = 2, network_rx = 0 }
[organizations]
default_owner = "ops"
customers = { lab = "5f0c1b" }
[hosts.cmp1]
owner = "lab"
token_sha256 = "%s"
"""
        % ("ab" * 32),
    )
    monkeypatch.setenv("GMD_CONFIG", str(path))
    cfg = load()
    assert cfg.path == path
    assert cfg.accounting.resources == RESOURCES_SPLIT
    assert cfg.accounting.weight_vector() == [2.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert cfg.accounting.half_life_s is None
    assert cfg.owner_of("cmp1") == "lab" and cfg.owner_of("cmp9") == "ops"
    assert cfg.organization_customers == {"lab": "5f0c1b"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[accounting]\ngamma = 1.5\n", r"accounting\.gamma: 1\.5 is not in \[0, 1\]"),
        ("[accounting]\ngama = 0.5\n", "accounting.gama: unknown key"),
        ("[acounting]\n", "acounting: unknown key"),
        ("[accounting]\nendowment = 'fair'\n", "accounting.endowment: 'fair' is not one of"),
        ("[accounting]\ninterval_s = 'x'\n", "accounting.interval_s: expected a number, got 'x'"),
        ("[accounting]\ninterval_s = 0.5\n", r"accounting\.interval_s: 0\.5 is not in \[1"),
        ("[accounting]\nhalf_life_s = -1\n", "accounting.half_life_s: -1: give seconds > 0"),
        ("[accounting]\nweights = { cpu = -1 }\n", r"accounting\.weights\.cpu: -1 is not in"),
        ("[accounting]\nweights = { gpu = 1 }\n", "accounting.weights.gpu: unknown key"),
        (
            "[accounting]\nweights = { cpu = 0, memory = 0, disk = 0, network = 0 }\n",
            "accounting.weights: are all zero",
        ),
        ("[database]\nurl = 'mysql://x'\n", "database.url: 'mysql://x'"),
        ("[database]\nread_url = 'mysql://x'\n", "database.read_url: 'mysql://x': use sqlite"),
        ("[database]\nread_url = 5\n", "database.read_url: expected a string, got 5"),
        (
            "[database]\nurl = 'postgresql+psycopg://gmd@db/gmd'\nread_url = 'sqlite:///r.db'\n",
            "database.read_url: 'sqlite:///r.db' is not the same kind of database as url",
        ),
        ("[database]\nreplica_url = 'sqlite://'\n", "database.replica_url: unknown key"),
        ("[hosts.cmp1]\ntoken_sha256 = 'secret'\n", "hosts.cmp1.token_sha256: must be 64"),
        ("[accounting\n", "not valid TOML"),
        ("[daemon]\nauth = 'maybe'\n", "daemon.auth: 'maybe' is not one of token, none"),
        ("[daemon]\ntls_cert = 'nowhere.pem'\n", "daemon.tls_cert: 'nowhere.pem': no such file"),
        ("[daemon]\nport = 70000\n", r"daemon\.port: 70000 is not in \[0, 65535\]"),
        ("[daemon]\nlisten = '::'\n", "daemon.listen: unknown key"),
        ("[enforcement]\nmode = 'maybe'\n", "enforcement.mode: 'maybe' is not one of off"),
        ("[enforcement]\nenter = 'x'\n", "enforcement.enter: expected an array"),
        ("[enforcement]\nenter = [1, 'a', 3]\n", "enforcement.enter: .* give a list of numbers"),
        (
            "[enforcement]\nleave = [1.0, 1.5, 3.0]\n",
            r"enforcement: level 1: leave 1 must be below enter 1 ",
        ),
        (
            "[enforcement]\ncontended_above = 80\n",
            r"enforcement\.contended_above: 80 is not in \[0, 1\]",
        ),
        (
            "[enforcement]\nothers_above = 2\n",
            r"enforcement\.others_above: 2 is not in \[0, 1\]",
        ),
        (
            "[enforcement]\ncontended_above = 'busy'\n",
            "enforcement.contended_above: expected a number or a table, got 'busy'",
        ),
        (
            "[enforcement]\ncontended_above = { cpu = 0.9, disk = 1.2 }\n",
            r"enforcement\.contended_above\.disk: 1\.2 is not in \[0, 1\]",
        ),
        (
            "[enforcement]\ncontended_above = { cpu = 0.9, network = 0.5 }\n",
            "enforcement.contended_above.network: caps exist for cpu and disk only",
        ),
        (
            "[enforcement]\ncontention_intervals = 2.5\n",
            "enforcement.contention_intervals: 2.5 is not a whole number of intervals",
        ),
        (
            "[enforcement]\ncontention_intervals = 0\n",
            r"enforcement\.contention_intervals: 0 is not in \[1, 1440\]",
        ),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        load(path)
    assert str(path) in str(err.value)


def test_read_url_names_a_replica_and_defaults_to_none(tmp_path: Path) -> None:
    """Reads go to url unless read_url names a replica: an empty read_url is no replica."""
    assert parse({}).read_url is None
    assert parse({"database": {"read_url": ""}}).read_url is None
    cfg = load(
        write(
            tmp_path,
            "[database]\nurl = 'postgresql+psycopg://gmd@db1/gmd'\n"
            "read_url = 'postgresql+psycopg://gmd@db2/gmd'\n",
        )
    )
    assert cfg.database_url == "postgresql+psycopg://gmd@db1/gmd"
    assert cfg.read_url == "postgresql+psycopg://gmd@db2/gmd"


def test_tls_needs_certificate_and_key(tmp_path: Path) -> None:
    (tmp_path / "d.crt").write_text("x")
    (tmp_path / "d.key").write_text("x")
    with pytest.raises(ConfigError, match=r"daemon\.tls_key: give tls_cert and tls_key together"):
        load(write(tmp_path, "[daemon]\ntls_cert = 'd.crt'\n"))
    cfg = load(write(tmp_path, "[daemon]\ntls_cert = 'd.crt'\ntls_key = 'd.key'\n"))
    assert cfg.daemon.tls_cert == tmp_path / "d.crt" and cfg.daemon.tls_key == tmp_path / "d.key"


def test_asked_for_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load(tmp_path / "missing.toml")


def test_the_example_file_loads_with_the_defaults() -> None:
    example = Path(__file__).resolve().parents[3] / "etc" / "gmd.toml"
    cfg = load(example)
    assert cfg.accounting == parse({}).accounting
    assert cfg.daemon == parse({}).daemon
    assert cfg.enforcement == parse({}).enforcement
    assert cfg.default_owner == "operator" and cfg.hosts == {}
    assert cfg.read_url is None


def test_the_example_file_serves_the_agent_too() -> None:
    """One gmd.toml for a host that runs both: the daemon ignores [agent], the agent reads it."""
    from gmd.agent.config import load_agent

    example = Path(__file__).resolve().parents[3] / "etc" / "gmd.toml"
    agent = load_agent(example)
    assert (agent.tick_s, agent.interval_s, agent.metrics_port) == (10, 60, 8471)
    assert agent.disk_bytes_per_s == 500e6 and agent.daemon_url is None


def test_systemds_state_directory_is_the_default_state_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gmd.common.config import default_database_url, default_state_dir

    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/gmd:{tmp_path}/other")
    assert default_state_dir() == tmp_path / "gmd"
    assert default_database_url() == f"sqlite:///{tmp_path / 'gmd' / 'ledger.db'}"
    monkeypatch.delenv("STATE_DIRECTORY")
    assert default_state_dir() in (Path("/var/lib/gmd"), Path("var").resolve())


def test_contention_thresholds_one_for_all_or_one_per_resource(tmp_path: Path) -> None:
    from gmd.fairness.policy import ContentionPolicy

    assert parse({}).enforcement.contention == ContentionPolicy(0.8, 0.8, 3)
    both = load(write(tmp_path, "[enforcement]\ncontended_above = 0.9\ncontention_intervals = 5\n"))
    assert both.enforcement.contention == ContentionPolicy(0.9, 0.9, 5)
    each = load(write(tmp_path, "[enforcement]\ncontended_above = { disk = 0.5 }\n"))
    assert each.enforcement.contention == ContentionPolicy(0.8, 0.5, 3)
    always = load(write(tmp_path, "[enforcement]\ncontended_above = 0\n"))
    assert always.enforcement.contention == ContentionPolicy(0.0, 0.0, 3)
    others = load(write(tmp_path, "[enforcement]\nothers_above = 0.1\n"))
    assert others.enforcement.contention == ContentionPolicy(0.8, 0.8, 3, 0.1)
