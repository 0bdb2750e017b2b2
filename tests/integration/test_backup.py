"""Backups restore to the same ledger: what gmd-admin shows of a restored copy (standings, a
report, the schema) is what it shows of the original. SQLite through ``gmd-admin db backup``
(SQLite's online backup, taken while a daemon writes), PostgreSQL through pg_dump -Fc and
pg_restore into an empty database, as docs/operations.md says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    HostSpec,
    auth,
    batch,
    cpu_only,
    fresh_postgres_database,
    make_config,
    serving,
)

ADMIN = Path(sys.executable).with_name("gmd-admin")
HOUR = 3600
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)


def admin(url: str, tmp: Path, *args: str) -> str:
    config = tmp / f"gmd-{abs(hash(url))}.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    done = subprocess.run(
        [str(ADMIN), "--config", str(config), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def shown(url: str, tmp: Path, first_s: int) -> dict[str, Any]:
    """What gmd-admin shows of the ledger at ``url``."""
    return {
        "standings": json.loads(admin(url, tmp, "standings", "--all", "-f", "json")),
        "report": json.loads(
            admin(
                url,
                tmp,
                "report",
                "--from",
                str(first_s),
                "--to",
                str(first_s + 6 * HOUR),
                "--group-by",
                "host",
                "-f",
                "json",
            )
        ),
        "schema": admin(url, tmp, "db", "current"),
    }


def grow(url: str) -> tuple[Any, int]:
    """The configuration of a ledger of hourly intervals, and the first of six hours."""
    config = make_config(
        url,
        {HOST.name: "operator"},
        accounting={"interval_s": HOUR, "grace_s": 0, "endowment": "equal"},
    )
    now = int(time.time())
    current = now - now % HOUR - HOUR
    first = current - 6 * HOUR
    return config, first


def post(d: Any, start: int, key: str) -> None:
    vms = [cpu_only("vm-a", "a", 3000.0), cpu_only("vm-b", "b", 1000.0)]
    body = {**batch(HOST, start, vms, key=key), "interval_s": HOUR}
    response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name))
    assert response.is_success, response.text


def test_a_sqlite_backup_taken_while_the_daemon_writes_restores_the_same_ledger(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config, first = grow(url)
    with serving(config) as d:
        for k in range(6):
            post(d, first + k * HOUR, f"k{k}")
        account_due(d.engine, config.accounting, now_s=first + 6 * HOUR)
        original = shown(url, tmp_path, first)
        copy = tmp_path / "backup.db"
        # The daemon stores the open hour's batch while the copy is made (outside what is
        # compared: the copy holds it or not, as the moment it was taken).
        writer = threading.Thread(target=post, args=(d, first + 6 * HOUR, "open"))
        writer.start()
        said = admin(url, tmp_path, "db", "backup", str(copy))
        writer.join(30)
    assert said.startswith(f"{tmp_path / 'ledger.db'} copied to {copy}"), said
    assert shown(f"sqlite:///{copy}", tmp_path, first) == original
    # A backup never overwrites.
    again = subprocess.run(
        [
            str(ADMIN),
            "--config",
            str(tmp_path / f"gmd-{abs(hash(url))}.toml"),
            "db",
            "backup",
            str(copy),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2 and "exists" in again.stderr


@pytest.mark.postgres
def test_pg_dump_and_pg_restore_into_an_empty_database_give_the_same_ledger(
    postgres_server_url: str, tmp_path: Path
) -> None:
    pg_dump, pg_restore = shutil.which("pg_dump"), shutil.which("pg_restore")
    assert pg_dump and pg_restore, "PostgreSQL's client tools (Debian's postgresql-client)"
    with fresh_postgres_database(postgres_server_url) as url:
        config, first = grow(url)
        with serving(config) as d:
            for k in range(6):
                post(d, first + k * HOUR, f"k{k}")
            account_due(d.engine, config.accounting, now_s=first + 6 * HOUR)
        original = shown(url, tmp_path, first)
        libpq = url.replace("postgresql+psycopg://", "postgresql://")
        dump = tmp_path / "ledger.dump"
        subprocess.run([pg_dump, "-Fc", "-f", str(dump), libpq], check=True, timeout=120)
        with fresh_postgres_database(postgres_server_url) as restored:
            target = restored.replace("postgresql+psycopg://", "postgresql://")
            subprocess.run(
                [pg_restore, "--no-owner", "--exit-on-error", "-d", target, str(dump)],
                check=True,
                timeout=120,
            )
            assert shown(restored, tmp_path, first) == original
