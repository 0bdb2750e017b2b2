"""gmd-broker's command line and inbox: a local request left for the running broker and kept
until the broker hands it on, bad input refused in one line with exit 2, and files in the inbox
that are not requests of this site set aside without stopping anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.exceptions import SessionExpiredError
from typer.testing import CliRunner

from gmd.broker import inbox
from gmd.broker.config import parse_broker

GMD_BROKER = str(Path(sys.executable).with_name("gmd-broker"))

pytest_plugins = ("tests.support.zookeeper_fixtures",)


def broker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GMD_BROKER, *args], capture_output=True, text=True, timeout=60)


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "gmd.toml"
    path.write_text(f'[broker]\nsite = "a"\norg = "org-a"\ninbox = "inbox"\n{extra}')
    return path


def test_submit_leaves_the_request_in_the_inbox(tmp_path: Path) -> None:
    done = broker("submit", "--config", str(config(tmp_path)), "--id", "j1", "--cores", "2")
    assert done.returncode == 0, done.stderr
    (left,) = (tmp_path / "inbox").glob("*.json")
    assert json.loads(left.read_text())["cores"] == 2.0
    again = broker("submit", "--config", str(config(tmp_path)), "--id", "j1")
    assert again.returncode == 2 and "already waiting" in again.stderr
    (request,) = inbox.take(tmp_path / "inbox", "a", "org-a")
    assert (request.id, request.site, request.org, request.cores) == ("j1", "a", "org-a", 2.0)
    assert not list((tmp_path / "inbox").glob("*.json"))


def test_a_taken_request_stays_on_disk_until_the_broker_hands_it_on(tmp_path: Path) -> None:
    """Issue 44 (the soak's seed 11): a request read from the inbox is kept under ``taken/``
    until the broker has published it or started it, so that a broker killed meanwhile finds
    it again when it starts; its id cannot be submitted again meanwhile."""
    path = config(tmp_path)
    box = tmp_path / "inbox"
    for rid in ("j2", "j1"):
        assert broker("submit", "--config", str(path), "--id", rid).returncode == 0
    assert [r.id for r in inbox.take(box, "a", "org-a")] == ["j1", "j2"]
    assert inbox.take(box, "a", "org-a") == []  # taken once
    again = broker("submit", "--config", str(path), "--id", "j1")
    assert again.returncode == 2 and "already waiting" in again.stderr
    assert [r.id for r in inbox.held(box, "a", "org-a")] == ["j1", "j2"]  # the broker killed
    inbox.handed(box, "j1")
    assert [r.id for r in inbox.held(box, "a", "org-a")] == ["j2"]
    (box / "taken" / "bad.json").write_text("not json")
    assert [r.id for r in inbox.held(box, "a", "org-a")] == ["j2"]
    assert [p.name for p in (box / "rejected").iterdir()] == ["bad.json"]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad_id = broker("submit", "--config", str(config(tmp_path)), "--id", "a/b")
    assert bad_id.returncode == 2 and "no '/'" in bad_id.stderr
    bad_key = broker("run", "--config", str(config(tmp_path, "treshold = 0.5\n")))
    assert bad_key.returncode == 2
    assert bad_key.stderr.strip().endswith("broker.treshold: unknown key (misspelt?)")
    bad_value = broker("run", "--config", str(config(tmp_path, "threshold = 2\n")))
    assert bad_value.returncode == 2 and "broker.threshold: 2 is not in [0, 1]" in bad_value.stderr
    for done in (bad_id, bad_key, bad_value):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_what_is_not_a_request_of_this_site_is_set_aside(tmp_path: Path) -> None:
    box = tmp_path / "inbox"
    box.mkdir()
    (box / "1.json").write_text("not json")
    (box / "2.json").write_text("[1]")
    (box / "3.json").write_text(json.dumps({"id": "x", "cores": 1, "run_s": 1, "site": "b"}))
    (box / "4.json").write_text(json.dumps({"id": "ok", "cores": 1, "run_s": 5}))
    taken = inbox.take(box, "a", "org-a")
    assert [r.id for r in taken] == ["ok"]
    assert sorted(p.name for p in (box / "rejected").iterdir()) == ["1.json", "2.json", "3.json"]


def test_the_defaults_name_the_site_after_the_host_and_the_org_after_the_site() -> None:
    parsed = parse_broker({}, "test.toml")
    assert parsed.site and parsed.org == parsed.site
    assert (parsed.threshold, parsed.session_timeout_s, parsed.root) == (
        1.0,
        10.0,
        "/gmd/federation",
    )


def test_a_start_that_zookeeper_cuts_short_is_one_line_and_exit_1(
    tmp_path: Path, zookeeper_hosts: str, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The federation's soak, seed 5: a broker started while ZooKeeper expired its session
    (a quorum lost and back) ended in a traceback. It is one line, and exit 1: systemd starts
    it again (Restart=on-failure)."""
    from gmd.broker import broker as broker_module
    from gmd.broker.cli import app

    def expired(self: object, held: object = ()) -> None:
        raise SessionExpiredError()

    monkeypatch.setattr(broker_module.Broker, "start", expired)
    path = config(
        tmp_path,
        f'zookeeper = "{zookeeper_hosts}"\nroot = "{zk_root}"\n'
        f'[database]\nurl = "sqlite:///{tmp_path / "ledger.db"}"\n',
    )
    done = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert isinstance(done.exception, SystemExit), repr(done.exception)  # not escaped
    assert done.exit_code == 1, done.output
    assert done.stderr.strip().splitlines()[-1].endswith("SessionExpiredError while starting"), (
        done.stderr
    )
    assert "Traceback" not in done.stderr
