"""``gmd-admin check`` against the tests' real Keystone, Placement and Nova: what it says of a
configuration whose services answer, of one whose cloud entry cannot log in, of a ledger at an
older schema, and of a file gmd-daemon would refuse; and that it writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gmd.ledger_schema import migrate
from tests.support.openstack_support import LEGACY, RealCloud

pytest_plugins = ["tests.support.openstack_support"]

ADMIN = Path(sys.executable).with_name("gmd-admin")


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(config), "check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write(path: Path, ledger: Path, cloud: str) -> Path:
    path.write_text(
        f'[database]\nurl = "sqlite:///{ledger}"\n[enforcement.quota]\ncloud = "{cloud}"\n'
    )
    return path


def test_a_configuration_whose_services_answer_is_ok_and_nothing_is_written(
    real_cloud: RealCloud, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.db"
    done = check(write(tmp_path / "gmd.toml", ledger, LEGACY))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok   configuration",
        "ok   ledger database",
        "ok   Placement",
        "ok   quotas",
    ], lines
    assert "not there yet: gmd-daemon creates it" in lines[1]
    assert not ledger.exists(), "a check creates no ledger"


def test_a_cloud_that_cannot_log_in_and_an_old_schema_fail_with_why(
    real_cloud: RealCloud, tmp_path: Path
) -> None:
    clouds = json.loads(real_cloud.clouds_yaml.read_text())
    wrong = json.loads(json.dumps(clouds["clouds"][LEGACY]))
    wrong["auth"]["password"] = "not-the-password"
    clouds["clouds"]["wrong"] = wrong
    (tmp_path / "clouds.yaml").write_text(json.dumps(clouds))
    ledger = tmp_path / "ledger.db"
    engine = migrate.engine_for(f"sqlite:///{ledger}")
    migrate.upgrade(engine, "0014")
    engine.dispose()
    env_file = tmp_path / "clouds.yaml"
    done = subprocess.run(
        [str(ADMIN), "--config", str(write(tmp_path / "gmd.toml", ledger, "wrong")), "check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "OS_CLIENT_CONFIG_FILE": str(env_file)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert "run `gmd-admin db upgrade`" in lines["FAIL ledger database"]
    assert "at schema 0014" in lines["FAIL ledger database"]
    for what in ("FAIL Placement", "FAIL quotas"):
        assert "cloud 'wrong'" in lines[what] and "401" in lines[what], lines[what]


def test_a_file_the_daemon_would_refuse_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "gmd.toml"
    config.write_text('[database]\nurl = "sqlite:///x.db"\n[enforcement]\nmode = "sometimes"\n')
    done = check(config)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "enforcement.mode: 'sometimes'" in done.stderr
