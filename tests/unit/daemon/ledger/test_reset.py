"""gmd-admin reset: a customer's balance to zero, audited, applied by the next accounting.

The ledger is the hand-worked one of gmd-admin's tests (tests/support/standings_ledger.py: one
2-core host; a uses 90 of 120 core-seconds, b 30; equal endowments, γ = 0.5, no decay): G_a =
0.125 and G_b = −0.0625 per interval. After two intervals a stands at 0.25; reset, a third
identical interval must leave a at 0.125 (that interval alone) while b, not reset, goes on to
−0.1875.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.config import Config
from gmd.daemon.ledger.accounting import account_due, compute_rows
from gmd.ledger_schema.migrate import engine_for
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

ADMIN = Path(sys.executable).with_name("gmd-admin")
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
FIRST = aligned_past(4)


def post_interval(url: str, start: int) -> None:
    body = batch(HOST, start, [cpu_only("vm-a", "a", 90.0), cpu_only("vm-b", "b", 30.0)])
    response = httpx.post(f"{url}/v1/samples", json=body, headers=auth(HOST.name))
    assert response.is_success, response.text


def admin(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def ledger(database_url: str, tmp_path: Path) -> tuple[Config, Path]:
    path = tmp_path / "gmd.toml"
    path.write_text(
        f'[database]\nurl = "{database_url}"\n'
        '[accounting]\ninterval_s = 60\ngrace_s = 0\nendowment = "equal"\nhalf_life_s = "none"\n'
        "gamma = 0.5\n"
    )
    config = make_config(
        database_url,
        {HOST.name: "operator"},
        accounting={"endowment": "equal", "half_life_s": "none"},
    )
    with serving(config) as d:
        for start in (FIRST, FIRST + 60):
            post_interval(d.url, start)
        account_due(d.engine, config.accounting, now_s=FIRST + 120)
    return config, path


def balances(config: Config) -> dict[str, float]:
    engine = engine_for(config.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT c.name, l.balance FROM customer_ledger l"
                    " JOIN customers c ON c.id = l.customer_id"
                    " JOIN intervals i ON i.id = l.interval_id"
                    " WHERE i.start_s = (SELECT max(start_s) FROM intervals"
                    "  WHERE ledger_rows > 0)"
                )
            ).all()
    finally:
        engine.dispose()
    return {name: balance for name, balance in rows}


def test_reset_shows_zero_at_once_and_the_next_interval_starts_from_zero(
    ledger: tuple[Config, Path],
) -> None:
    config, path = ledger
    assert balances(config) == pytest.approx({"a": 0.25, "b": -0.125}, abs=1e-15)

    out = admin(path, "reset", "a", "--reason", "new quarter", "--by", "alice", "--yes")
    assert out.returncode == 0, out.stderr
    assert "balance 0.25 reset to 0 by alice" in out.stdout

    standing = json.loads(admin(path, "standings", "--format", "json").stdout)
    rows = {r["customer"]: r["balance"] for r in standing["customers"]}
    assert rows["a"] == 0.0 and rows["b"] == pytest.approx(-0.125, abs=1e-15)
    assert standing["reset_since"] == ["a"]

    log = json.loads(admin(path, "actions", "--customer", "a", "--format", "json").stdout)
    resets = [r for r in log["actions"] if r["kind"] == "reset"]
    assert len(resets) == 1
    assert resets[0]["before"] == {"balance": 0.25}
    assert resets[0]["after"] == {"balance": 0.0, "from_interval_start_s": FIRST + 120}
    assert "alice" in resets[0]["reason"] and "new quarter" in resets[0]["reason"]

    with serving(config) as d:
        post_interval(d.url, FIRST + 120)
        report = account_due(d.engine, config.accounting, now_s=FIRST + 180)
        assert report.accounted == [FIRST + 120]
        # Accounting the interval again (as an audit would) gives the same rows: the reset
        # is part of the ledger, not of the moment it was made.
        with d.engine.connect() as conn:
            interval_id = conn.execute(
                sa.text("SELECT id FROM intervals WHERE start_s = :s"), {"s": FIRST + 120}
            ).scalar_one()
            again = compute_rows(conn, interval_id, config.accounting)
    assert balances(config) == pytest.approx({"a": 0.125, "b": -0.1875}, abs=1e-15)
    assert {r["customer_id"]: r["balance"] for r in again.customers} == pytest.approx(
        {1: 0.125, 2: -0.1875}, abs=1e-15
    )
    after = json.loads(admin(path, "standings", "--format", "json").stdout)
    assert after["reset_since"] == []


def test_reset_refuses_unknown_customers_and_missing_confirmation(
    ledger: tuple[Config, Path],
) -> None:
    config, path = ledger
    unknown = admin(path, "reset", "nobody", "--reason", "x", "--yes")
    assert unknown.returncode == 3 and "'nobody' is not in the ledger" in unknown.stderr
    unconfirmed = admin(path, "reset", "a", "--reason", "x")
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    no_reason = admin(path, "reset", "a", "--reason", "  ", "--yes")
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    # None of these wrote anything.
    assert balances(config) == pytest.approx({"a": 0.25, "b": -0.125}, abs=1e-15)
    standing = json.loads(admin(path, "standings", "--format", "json").stdout)
    assert standing["reset_since"] == []
