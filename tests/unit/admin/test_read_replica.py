"""Reads off the primary: gmd-admin's read-only commands on a real streaming replica.

``bash tests/scripts/postgres.sh replica`` makes a hot standby of the test cluster (pg_basebackup
-R, streaming replication). A ledger is built on the primary with the daemon's own ingest and
accounting; once the replica has replayed it, ``report`` and ``standings`` with ``[database]
read_url`` naming the replica must say exactly what the primary says. With the replica's
replay paused, a reset (a write: the primary) shows at once with --primary and on the
replica only after replay resumes, which shows where each command reads. The read-only
engine refuses writes, on the primary too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from gmd.admin import cli, common
from gmd.common.cli import ExitCode
from gmd.daemon.ledger.accounting import account_due
from tests.conftest import REPO
from tests.support.daemon_support import HostSpec, auth, batch, cpu_only, make_config, serving

ADMIN = Path(sys.executable).with_name("gmd-admin")
REPLICA_ENV = "GMD_TEST_POSTGRES_REPLICA_URL"
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
T0 = int(datetime(2024, 5, 6, 12, 0, tzinfo=UTC).timestamp())
INTERVALS = 3
RANGE = ("--from", "2024-05-06T12:00:00", "--to", "2024-05-06T12:05:00")
# Replay of a few MB of WAL takes well under a second here; this bounds a stuck replica.
REPLAY_TIMEOUT_S = 120.0


def _scalar(url: str, query: str, **params: Any) -> Any:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(query), params).scalar()
    finally:
        engine.dispose()


def _until(what: str, check: Callable[[], bool], timeout_s: float = REPLAY_TIMEOUT_S) -> None:
    """Polls ``check`` until it holds; fails naming ``what`` when it does not in time."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.05)


def _on_database(server_url: str, name: str) -> str:
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="module")
def replica_server_url(postgres_server_url: str) -> Iterator[str]:
    """The streaming replica named by GMD_TEST_POSTGRES_REPLICA_URL, else one started here and
    stopped after this module (a standby replays all the primary writes: every other test's
    databases, made and dropped, for as long as it runs); never skipped: a replica that cannot
    be started fails the tests that need it, with the script's reason."""
    url = os.environ.get(REPLICA_ENV)
    started = not url
    if started:
        done = _postgres_sh("replica")
        if done.returncode != 0 or not done.stdout.strip():
            pytest.fail(
                f"bash tests/scripts/postgres.sh replica failed ({done.returncode}):"
                f" {done.stderr.strip() or 'no URL printed'}"
            )
        url = done.stdout.strip().splitlines()[-1]
    try:
        system = "SELECT system_identifier FROM pg_control_system()"
        if not _scalar(url, "SELECT pg_is_in_recovery()"):
            pytest.fail(f"{url} is not a standby (pg_is_in_recovery() is false)")
        if _scalar(url, system) != _scalar(postgres_server_url, system):
            pytest.fail(f"{url} is not a replica of GMD_TEST_POSTGRES_URL {postgres_server_url}")
        yield url
    finally:
        if started:
            _postgres_sh("stop-replica")


def _postgres_sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "tests" / "scripts" / "postgres.sh"), command],
        capture_output=True,
        text=True,
        timeout=900,
    )


def wait_for_replay(primary_server_url: str, replica_server_url: str) -> None:
    """Until the replica has replayed everything the primary has written so far."""
    lsn = _scalar(primary_server_url, "SELECT pg_current_wal_lsn()::text")
    _until(
        f"the replica replaying the primary's WAL up to {lsn}",
        lambda: bool(
            _scalar(
                replica_server_url,
                "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), CAST(:lsn AS pg_lsn)) >= 0",
                lsn=lsn,
            )
        ),
    )


@dataclass(frozen=True)
class Replicated:
    primary_url: str
    replica_url: str
    primary_server: str
    replica_server: str
    # url = the primary, read_url = the replica
    config: Path
    # url = the primary only: what the primary says
    primary_config: Path


@contextmanager
def replicated_ledger(
    primary_server: str, replica_server: str, directory: Path
) -> Iterator[Replicated]:
    """A fresh ledger database on the primary, three accounted intervals of two customers
    ("a" greedy, "b" ceding), replayed on the replica; dropped on the primary at the end (the
    replica follows)."""
    name = f"gmd_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(primary_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    primary_url = _on_database(primary_server, name)
    replica_url = _on_database(replica_server, name)
    try:
        config = make_config(
            primary_url,
            {HOST.name: "operator"},
            accounting={"endowment": "equal", "half_life_s": "none"},
        )
        end = T0 + 60 * INTERVALS
        with serving(config, clock=lambda: float(end + 600)) as daemon:
            for k in range(INTERVALS):
                body = batch(
                    HOST, T0 + 60 * k, [cpu_only("vm-a", "a", 90.0), cpu_only("vm-b", "b", 30.0)]
                )
                posted = httpx.post(f"{daemon.url}/v1/samples", json=body, headers=auth(HOST.name))
                assert posted.is_success, posted.text
            run = account_due(daemon.engine, config.accounting, now_s=end)
            assert run.accounted == [T0 + 60 * k for k in range(INTERVALS)]
        wait_for_replay(primary_server, replica_server)
        both = directory / "gmd.toml"
        both.write_text(f'[database]\nurl = "{primary_url}"\nread_url = "{replica_url}"\n')
        primary_only = directory / "primary.toml"
        primary_only.write_text(f'[database]\nurl = "{primary_url}"\n')
        yield Replicated(
            primary_url, replica_url, primary_server, replica_server, both, primary_only
        )
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def replicated(
    postgres_server_url: str, replica_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicated]:
    """The ledger of :func:`replicated_ledger` for the tests that do not change it."""
    directory = tmp_path_factory.mktemp("replica")
    with replicated_ledger(postgres_server_url, replica_server_url, directory) as ledger:
        yield ledger


def _argv(config: Path, *args: str) -> list[str]:
    return [str(ADMIN), "--config", str(config), *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GMD_CONFIG"}


def gmd_admin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _argv(config, *args), capture_output=True, text=True, timeout=120, env=_env()
    )


def documents(*calls: tuple[Path, str]) -> list[dict[str, Any]]:
    """The JSON of each ``(config, command)`` of gmd-admin, run as the operator would, all at
    once (each process spends a second or two importing)."""
    running = [
        subprocess.Popen(
            _argv(config, command, *(RANGE if command == "report" else ()), "--format", "json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for config, command in calls
    ]
    out = []
    for process in running:
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


def in_process(config: Path, *args: str) -> Any:
    """gmd-admin in this process: a subprocess costs a second or two of imports."""
    return CliRunner().invoke(cli.app, ["--config", str(config), *args])


def balances(config: Path, *options: str) -> dict[str, float]:
    done = in_process(config, *options, "standings", "--format", "json")
    assert done.exit_code == 0, done.output
    return {row["customer"]: row["balance"] for row in json.loads(done.stdout)["customers"]}


def test_the_replica_answers_reports_and_standings_as_the_primary(
    replicated: Replicated,
) -> None:
    report, primary_report, standing, primary_standing = documents(
        (replicated.config, "report"),
        (replicated.primary_config, "report"),
        (replicated.config, "standings"),
        (replicated.primary_config, "standings"),
    )
    assert report == primary_report
    assert {row["customer"] for row in report["rows"]} == {"a", "b"}
    assert standing == primary_standing
    rows = {row["customer"]: row["balance"] for row in standing["customers"]}
    # 2 cores, equal shares of 60 core-s: a 30 over, b 30 under and credited half of it
    # (κ = 1); one customer's share of the cloud is 120/2 = 60 core-s and m = 4.
    assert rows == pytest.approx({"a": INTERVALS * 30 / 240, "b": -INTERVALS * 15 / 240})


@pytest.fixture
def own_ledger(
    postgres_server_url: str, replica_server_url: str, tmp_path: Path
) -> Iterator[Replicated]:
    """The ledger of :func:`replicated_ledger` for a test that changes it."""
    with replicated_ledger(postgres_server_url, replica_server_url, tmp_path) as ledger:
        yield ledger


def test_reads_go_to_the_replica_and_writes_to_the_primary(own_ledger: Replicated) -> None:
    """While the replica's replay is paused, a reset written on the primary is seen there
    (--primary) and not on the replica; once replay resumes, the replica has it too."""
    replicated = own_ledger
    before = balances(replicated.config)
    assert before["a"] > 0
    _scalar(replicated.replica_server, "SELECT pg_wal_replay_pause()")
    try:
        _until(
            "the replica's replay pausing",
            lambda: (
                _scalar(replicated.replica_server, "SELECT pg_get_wal_replay_pause_state()")
                == "paused"
            ),
        )
        upgraded = in_process(replicated.config, "db", "upgrade")
        assert upgraded.exit_code == 0, upgraded.output
        assert "already at schema revision" in upgraded.stdout
        reset = in_process(replicated.config, "reset", "a", "--reason", "replica test", "--yes")
        assert reset.exit_code == 0, reset.output
        assert balances(replicated.config, "--primary")["a"] == 0
        assert balances(replicated.primary_config)["a"] == 0
        assert balances(replicated.config) == before
    finally:
        _scalar(replicated.replica_server, "SELECT pg_wal_replay_resume()")
    wait_for_replay(replicated.primary_server, replicated.replica_server)
    after = balances(replicated.config)
    assert after["a"] == 0 and after["b"] == before["b"]
    assert after == balances(replicated.primary_config)


def _reading(config: Path, *, primary: bool = False) -> Any:
    """gmd-admin's read-only ledger, as a read command opens it."""
    ctx = typer.Context(typer.main.get_command(cli.app))
    ctx.obj = common.Options(config, primary)
    return common.reading(ctx)


@pytest.mark.parametrize("primary", [False, True], ids=["replica", "primary"])
def test_the_read_only_engine_refuses_writes(
    replicated: Replicated, primary: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the primary too (--primary): a read command that wrote by mistake fails loudly
    instead of writing, and nothing is written."""
    insert = "INSERT INTO customers (name) VALUES ('written-by-a-reader')"
    with pytest.raises(typer.Exit) as stopped, _reading(replicated.config, primary=primary) as e:
        assert (
            e.url.port
            == sa.make_url(replicated.primary_url if primary else replicated.replica_url).port
        )
        with e.begin() as conn:
            conn.execute(sa.text(insert))
    assert stopped.value.exit_code == ExitCode.UNAVAILABLE
    err = capsys.readouterr().err
    assert "cannot execute INSERT in a read-only transaction" in err
    assert ("read_url" in err) is not primary
    count = "SELECT count(*) FROM customers WHERE name = 'written-by-a-reader'"
    assert _scalar(replicated.primary_url, count) == 0


def test_the_read_only_engine_refuses_writes_on_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gmd.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "ledger.db"}"\n')
    upgraded = in_process(config, "db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    with pytest.raises(typer.Exit) as stopped, _reading(config) as engine:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM customers")).scalar() == 0
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO customers (name) VALUES ('x')"))
    assert stopped.value.exit_code == ExitCode.UNAVAILABLE
    assert "readonly database" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_replica_that_is_down_is_named_and_primary_reads_on(
    replicated: Replicated, tmp_path: Path
) -> None:
    down = sa.make_url(replicated.replica_url).set(port=_closed_port())
    config = tmp_path / "gmd.toml"
    config.write_text(
        f'[database]\nurl = "{replicated.primary_url}"\n'
        f'read_url = "{down.render_as_string(hide_password=False)}"\n'
    )
    failed = gmd_admin(config, "standings")
    assert failed.returncode == 1
    assert f":{down.port}/" in failed.stderr and "--primary" in failed.stderr
    assert balances(config, "--primary") == balances(replicated.primary_config)
