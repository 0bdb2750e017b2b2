"""gmd-admin standings on a ledger built from samples whose greediness is worked out by hand."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.standings_ledger import (
    last_interval,
    ledger_config,  # noqa: F401 - the fixture
)

ADMIN = Path(sys.executable).with_name("gmd-admin")


def admin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(config), "standings", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_standings_json_holds_the_worked_numbers(
    ledger_config: Path,  # noqa: F811
) -> None:
    out = admin(ledger_config, "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["interval_s"] == 60 and doc["latest_accounted_s"] == doc["as_of_s"]
    assert doc["as_of_s"] == last_interval(ledger_config)
    rows = {r["customer"]: r for r in doc["customers"]}
    assert [r["customer"] for r in doc["customers"]] == ["a", "b"]  # greatest balance first
    assert rows["a"]["balance"] == pytest.approx(0.25, abs=1e-15)
    assert rows["b"]["balance"] == pytest.approx(-0.125, abs=1e-15)
    assert rows["a"]["greediness"] == pytest.approx(0.125, abs=1e-15)
    assert rows["b"]["greediness"] == pytest.approx(-0.0625, abs=1e-15)
    assert rows["a"]["utility"] == pytest.approx(0.75, abs=1e-15)
    assert rows["b"]["priority"] == pytest.approx(-0.25, abs=1e-15)
    assert rows["a"]["vms"] == rows["b"]["vms"] == 1


def test_csv_parses_back_to_the_json_numbers_and_sorting_works(
    ledger_config: Path,  # noqa: F811
) -> None:
    as_json = json.loads(admin(ledger_config, "--format", "json").stdout)["customers"]
    out = admin(ledger_config, "--format", "csv", "--sort", "priority")
    assert out.returncode == 0, out.stderr
    parsed = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["customer"] for r in parsed] == ["b", "a"]  # priority −0.25 above −0.75
    by_name = {r["customer"]: r for r in as_json}
    for row in parsed:
        for key in ("balance", "greediness", "utility", "priority"):
            assert float(row[key]) == by_name[row["customer"]][key]
    reversed_ = admin(ledger_config, "--format", "csv", "--sort", "customer", "--reverse")
    assert [r["customer"] for r in csv.DictReader(io.StringIO(reversed_.stdout))] == ["b", "a"]


def test_table_and_errors(
    ledger_config: Path,  # noqa: F811
) -> None:
    table = admin(ledger_config)
    assert table.returncode == 0
    assert "Standings" in table.stdout and "0.2500" in table.stdout and "-0.1250" in table.stdout
    missing = admin(ledger_config, "--customer", "nobody")
    assert missing.returncode == 3
    assert "'nobody' has no standing" in missing.stderr
    bad = admin(ledger_config, "--sort", "colour")
    assert bad.returncode == 2


def test_an_empty_ledger_says_so(tmp_path: Path) -> None:
    path = tmp_path / "gmd.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "l.db"}"\n')
    assert subprocess.run([str(ADMIN), "--config", str(path), "db", "upgrade"]).returncode == 0
    out = admin(path)
    assert out.returncode == 0
    assert "no accounted interval yet" in out.stdout
