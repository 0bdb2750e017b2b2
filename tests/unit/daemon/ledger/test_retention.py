"""Retention on SQLite and PostgreSQL: raw rows go after ``raw_days`` (whole daily partitions
on PostgreSQL), ledger rows after ``ledger_days``; nothing unaccounted and never the current
standings; ``gmd-admin db usage`` says what is there and what goes next."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.admin.explain_text import render_text
from gmd.common.config import ConfigError
from gmd.daemon.config import Config, RetentionConfig
from gmd.daemon.ledger import partitions
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.retention import purge
from gmd.daemon.reports.explain import explain
from tests.support.daemon_support import HostSpec, auth, batch, cpu_only, make_config, serving

ADMIN = Path(sys.executable).with_name("gmd-admin")
HOUR = 3600
DAY = 86400
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)


def hourly(url: str, **retention: Any) -> Config:
    return make_config(
        url,
        {HOST.name: "operator"},
        accounting={"interval_s": HOUR, "grace_s": 0, "endowment": "equal"},
        retention=retention,
    )


def post(d: Any, start: int, key: str) -> None:
    vms = [cpu_only("vm-a", "a", 3000.0), cpu_only("vm-b", "b", 1000.0)]
    body = {**batch(HOST, start, vms, key=key), "interval_s": HOUR}
    response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name))
    assert response.is_success, response.text


def counts(engine: sa.Engine) -> dict[str, list[int]]:
    with engine.connect() as conn:
        return {
            t: sorted({int(r[0]) for r in conn.execute(sa.text(f"SELECT interval_id FROM {t}"))})
            for t in ("samples", "batches", "host_intervals", "customer_ledger")
        }


@pytest.fixture
def ledger(database_url: str) -> tuple[Config, list[int], int]:
    """Intervals of a day ago and of the last hours, accounted, and the last one still open
    (``current``)."""
    now = int(time.time())
    current = now - now % HOUR - HOUR
    starts = [current - 25 * HOUR, current - 24 * HOUR, current - 2 * HOUR, current - HOUR]
    config = hourly(database_url)
    with serving(config) as d:
        for k, start in enumerate([*starts, current]):
            post(d, start, f"k{k}")
        account_due(d.engine, config.accounting, now_s=current)
    return config, starts, current


def test_raw_rows_go_after_raw_days_but_never_unaccounted_ones(
    ledger: tuple[Config, list[int], int],
) -> None:
    config, starts, current = ledger
    engine = sa.create_engine(config.database_url)
    before = counts(engine)
    assert before["samples"] == [*starts, current]
    retention = RetentionConfig(raw_days=31, ledger_days=0, delete_chunk=1)
    # Until 31 days after the oldest interval began, nothing is due.
    assert purge(engine, retention, now_s=starts[0] + 31 * DAY).rows == {}
    assert counts(engine) == before
    # Well past raw retention: every accounted interval's raw rows are due, but the open one
    # holds the cutoff back (on PostgreSQL, its whole day).
    report = purge(engine, retention, now_s=current + 40 * DAY)
    assert report.raw_before_s == current
    if engine.dialect.name == "postgresql":
        kept_from = current - current % DAY
        assert report.partitions and all("20" in p for p in report.partitions)
    else:
        kept_from = current
        assert report.rows["samples"] == 2 * len(starts)  # two VMs, a chunk of one at a time
    after = counts(engine)
    for table in ("samples", "batches", "host_intervals"):
        assert after[table] == [s for s in (*starts, current) if s >= kept_from], table
    assert after["customer_ledger"] == before["customer_ledger"]  # kept for ever here
    engine.dispose()


def test_ledger_rows_go_after_ledger_days_but_the_current_standings_stay(
    ledger: tuple[Config, list[int], int],
) -> None:
    config, starts, current = ledger
    engine = sa.create_engine(config.database_url)
    retention = RetentionConfig(raw_days=0, ledger_days=1, delete_chunk=1)
    report = purge(engine, retention, now_s=current + 0.5 * DAY)
    # One day back from half a day on: yesterday's two intervals go.
    assert report.rows == {
        "customer_ledger": 4,
        "customer_resource_ledger": 16,
        "organization_ledger": 2,
    }
    assert counts(engine)["customer_ledger"] == starts[2:]
    # Long after, everything is due but the latest standings.
    purge(engine, retention, now_s=current + 100 * DAY)
    assert counts(engine)["customer_ledger"] == [starts[-1]]
    assert counts(engine)["samples"] == [*starts, current]  # raw kept for ever here
    engine.dispose()


def test_a_run_stops_at_its_time_limit_and_the_next_goes_on(
    ledger: tuple[Config, list[int], int],
) -> None:
    config, _, current = ledger
    engine = sa.create_engine(config.database_url)
    retention = RetentionConfig(raw_days=0, ledger_days=1, delete_chunk=1, max_run_s=0.0)
    first = purge(engine, retention, now_s=current + 100 * DAY)
    assert first.unfinished and sum(first.rows.values()) == 1
    while purge(engine, retention, now_s=current + 100 * DAY).unfinished:
        pass
    assert len(counts(engine)["customer_ledger"]) == 1
    engine.dispose()


def test_db_usage_counts_every_table_and_says_what_goes_next(
    ledger: tuple[Config, list[int], int], tmp_path: Path
) -> None:
    config, starts, _ = ledger
    path = tmp_path / "gmd.toml"
    path.write_text(
        f'[database]\nurl = "{config.database_url}"\n[retention]\nraw_days = 31\n'
        "ledger_days = 400\n"
    )
    done = subprocess.run(
        [str(ADMIN), "--config", str(path), "db", "usage", "--exact", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    tables = {t["table"]: t for t in doc["tables"]}
    assert tables["samples"]["rows"] == 2 * (len(starts) + 1)
    assert tables["batches"]["rows"] == len(starts) + 1
    assert tables["intervals"]["kept_days"] is None  # never purged
    assert tables["customer_ledger"]["kept_days"] == 400
    # VMs and customers go raw_days after they were last seen, a customer only once unnamed.
    assert tables["vms"]["kept_days"] == 31 and tables["vms"]["oldest"] is not None
    assert tables["vms"]["next_purge"] > tables["vms"]["oldest"]
    assert tables["customers"]["next_purge"].endswith("(once nothing else names it)")
    oldest = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(starts[0]))
    assert tables["samples"]["oldest"] == oldest
    assert tables["samples"]["next_purge"] > oldest  # an ISO time: 31 days on
    postgres = config.database_url.startswith("postgresql")
    assert (doc["partitions"] > 0) == postgres
    if postgres or tables["samples"]["bytes"] is not None:
        assert tables["samples"]["bytes"] > 0
    table = subprocess.run(
        [str(ADMIN), "--config", str(path), "db", "usage"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0 and "customer_ledger" in table.stdout


def test_the_daemon_makes_partitions_ahead(database_url: str) -> None:
    with serving(hourly(database_url)) as d, d.engine.connect() as conn:
        made = {(p.table, p.day) for p in partitions.existing(conn)}
    today = int(time.time()) // DAY
    if database_url.startswith("postgresql"):
        assert {(t, today + k) for t in ("samples", "batches") for k in range(4)} <= made
    else:
        assert made == set()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"raw_days": 7}, "do not outlast [daemon] max_late_s (7 days)"),
        ({"raw_days": 31, "ledger_days": 10}, "shorter than raw_days"),
        ({"ledger_days": 0, "rollup_days": 400}, "shorter than ledger_days (for ever)"),
        ({"ledger_days": 400, "rollup_days": 30}, "shorter than ledger_days"),
    ],
)
def test_retention_that_would_lose_what_is_still_needed_is_refused(
    section: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config("sqlite://", retention=section)


def test_raw_data_kept_for_ever_stands_beside_the_other_defaults() -> None:
    """``raw_days = 0`` was refused unless ``ledger_days = 0`` too: raw data kept for ever can
    be summed again (a what-if replays it), so the summaries' own retention stands."""
    retention = make_config("sqlite://", retention={"raw_days": 0}).retention
    assert (retention.raw_days, retention.ledger_days, retention.rollup_days) == (0, 400, 0)


def test_explain_says_what_is_left_of_an_interval_past_retention(
    ledger: tuple[Config, list[int], int],
) -> None:
    config, starts, current = ledger
    engine = sa.create_engine(config.database_url)
    with engine.connect() as conn:
        whole = explain(conn, config, "a", at_s=starts[0])
    assert whole.hosts and not any("retention" in n for n in whole.notes)
    purge(engine, RetentionConfig(raw_days=31, ledger_days=0), now_s=current + 40 * DAY)
    with engine.connect() as conn:
        raw_gone = explain(conn, config, "a", at_s=starts[0])
    assert raw_gone.hosts == []
    assert raw_gone.ledger_greediness == whole.ledger_greediness  # the ledger's, as stored
    assert raw_gone.balance == whole.balance
    assert any("past raw retention ([retention] raw_days = 31)" in n for n in raw_gone.notes)
    purge(engine, RetentionConfig(raw_days=0, ledger_days=1), now_s=current + 40 * DAY)
    with engine.connect() as conn:
        rows_gone = explain(conn, config, "a", at_s=starts[0])
        text = render_text(rows_gone, "equal")
    assert rows_gone.balance == 0.0
    said = " ".join(rows_gone.notes)
    assert "past ledger retention" in said and "hour's rollup" in said
    assert f"{whole.ledger_greediness:.6g}" in said  # one interval in that hour: its GM sum
    assert "past ledger retention" in text
    engine.dispose()


def test_db_purge_removes_now_what_is_due_in_bounded_runs(tmp_path: Path) -> None:
    """``gmd-admin db purge``: retention's run, now, from the command line (in chunks of one
    row), saying per run what went; a second run finds nothing due."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    now = int(time.time())
    current = now - now % HOUR - HOUR
    old = [current - 30 * HOUR, current - 29 * HOUR]
    config = hourly(url)
    with serving(config) as d:
        for k, start in enumerate([*old, current - HOUR, current]):
            post(d, start, f"k{k}")
        account_due(d.engine, config.accounting, now_s=current)
    path = tmp_path / "gmd.toml"
    path.write_text(
        f'[database]\nurl = "{url}"\n[daemon]\nmax_late_s = 60\n'
        f"[retention]\nraw_days = 1.01\nledger_days = 1.01\ndelete_chunk = 1\nmax_run_s = 60\n"
    )
    engine = sa.create_engine(url)
    before = counts(engine)

    def purge_now(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ADMIN), "--config", str(path), "db", "purge", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = purge_now("--until-done")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run 1: removed ") and "samples" in lines[0], lines
    assert "raw before " in lines[0] and "ledger before " in lines[0], lines
    after = counts(engine)
    for table in ("samples", "batches", "host_intervals", "customer_ledger"):
        assert not set(old) & set(after[table]), (table, after[table])
        assert set(before[table]) - set(old) <= set(after[table]), table
    again = purge_now()
    assert again.returncode == 0 and again.stdout.startswith("run 1: removed nothing")
    engine.dispose()
