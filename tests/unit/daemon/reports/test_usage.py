"""gmd-admin report on a ledger built from samples whose numbers are worked out by hand.

Two hosts, both 2 cores (120 core-seconds per 60 s interval): cmp-1 of the operator runs a's
VM (90 core-s) and b's (30); cmp-2 of organization acme, which is also customer c, runs c's
(60). Equal endowments, γ = 0.5, no decay. On cmp-1 a is 30 over its 60 and b 30 under, so
κ = 1 and b is credited 0.5·30 = 15; on cmp-2 c is alone and under, nobody uses what it
cedes: κ = 0, offset 0. One customer's share of the cloud is 240/3 = 80 core-s and m = 4, so
per interval G_a = 30/320 = 0.09375, G_b = −15/320 = −0.046875, G_c = 0 (all of it cpu).
Work (ψ″): a 90/320 = 0.28125, b 0.09375, c 0.1875 per interval; the operator contributes
a's and b's, acme c's.

Intervals, UTC, across a Sunday → Monday midnight (so days and weeks split):
I1 23:57 and I2 23:58 with samples, I3 23:59 without any (a gap), I4 00:00 and I5 00:01
with samples. Dry-run enforcement enters level 1 at a balance of 0.15: a's balance is 0.1875
after I2, so level 1 is decided at I2's end (23:59) and holds: I3, I4 and I5 began at
level 1, a was throttled 180 s. After accounting, a batch for I2 arrives late (stored with
late = true, not counted), and two quota actions of a are recorded on Monday (one failed).
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from gmd.admin.cli import app
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.resets import reset_balance
from gmd.daemon.reports.usage import report
from gmd.ledger_schema.migrate import engine_for
from gmd.ledger_schema.models import EnforcementAction
from tests.support.daemon_support import HostSpec, auth, batch, cpu_only, make_config, serving

ADMIN = Path(sys.executable).with_name("gmd-admin")
HOST1 = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
HOST2 = HostSpec("cmp-2", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
T0 = int(datetime(2024, 3, 3, 23, 57, tzinfo=UTC).timestamp())  # a Sunday
END = T0 + 300
RANGE = ("--from", "2024-03-03T23:57:00", "--to", "2024-03-04T00:02:00")
ENFORCEMENT = {
    "mode": "dry-run",
    "enter": [0.15, 0.4, 0.8],
    "leave": [0.1, 0.3, 0.6],
    "dwell_s": 0,
    "max_step": 1,
    "priority_weight": 0.0,
    "weight_factors": [0.5, 0.25, 0.1],
    "cap_level": 2,
    "cpu_cap_fractions": [1.0, 0.75, 0.5],
}
G_A, G_B = 0.09375, -0.046875
U_A, U_B, U_C = 0.28125, 0.09375, 0.1875
EXACT = 1e-12


def post(url: str, host: HostSpec, start: int, vms: list[dict[str, Any]], key: str = "") -> Any:
    body = batch(host, start, vms, key=key or None)
    response = httpx.post(f"{url}/v1/samples", json=body, headers=auth(host.name))
    assert response.is_success, response.text
    return response.json()


@pytest.fixture
def ledger(database_url: str, tmp_path: Path) -> tuple[str, Path]:
    """The ledger of the module docstring; returns its URL and a gmd.toml naming it."""
    config = make_config(
        database_url,
        {HOST1.name: "operator", HOST2.name: "acme"},
        accounting={"endowment": "equal", "half_life_s": "none", "gamma": 0.5},
        enforcement=ENFORCEMENT,
        organizations={"customers": {"acme": "c"}},
    )
    with serving(config, clock=lambda: float(END + 600)) as d:
        for start in (T0, T0 + 60, T0 + 180, T0 + 240):
            post(d.url, HOST1, start, [cpu_only("vm-a", "a", 90.0), cpu_only("vm-b", "b", 30.0)])
            post(d.url, HOST2, start, [cpu_only("vm-c", "c", 60.0)])
        run = account_due(
            d.engine, config.accounting, now_s=END, after=after_interval(config.enforcement)
        )
        assert run.accounted == [T0 + 60 * k for k in range(5)]
        late = post(d.url, HOST1, T0 + 60, [cpu_only("vm-a", "a", 10.0)], key="late-one")
        assert late["late"] == 1
        actions: sa.Table = EnforcementAction.__table__  # type: ignore[assignment]
        with d.engine.begin() as conn:
            ids = dict(conn.execute(sa.text("SELECT name, id FROM customers")).all())
            conn.execute(
                sa.insert(actions),
                [
                    {
                        "at": datetime.fromtimestamp(T0 + 270, UTC),
                        "customer_id": ids["a"],
                        "kind": "quota_lower",
                        "status": status,
                        "dry_run": status == "would",
                        "reason": "test",
                    }
                    for status in ("would", "failed")
                ],
            )
    path = tmp_path / "gmd.toml"
    path.write_text(f'[database]\nurl = "{database_url}"\n')
    return database_url, path


def invoke(path: Path, *args: str) -> Any:
    """gmd-admin in-process (a subprocess costs a second of imports); stderr is not a tty."""
    return CliRunner().invoke(app, ["--config", str(path), "report", *args])


def doc(path: Path, *args: str) -> dict[str, Any]:
    out = invoke(path, *args, "--format", "json")
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)


def by(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in rows}


def same_numbers(path: Path, rows: list[dict[str, Any]], *args: str) -> None:
    """The CSV of the same report parses back to exactly the JSON's numbers."""
    out = invoke(path, *args, "--format", "csv")
    assert out.exit_code == 0, out.stderr
    parsed = list(csv.DictReader(io.StringIO(out.stdout)))
    assert len(parsed) == len(rows)
    for got, want in zip(parsed, rows, strict=True):
        assert set(got) == set(want)
        for key, value in want.items():
            if isinstance(value, float):
                assert float(got[key]) == value, key
            elif isinstance(value, int):
                assert int(got[key]) == value, key
            else:  # CSV has no null: an empty field
                assert got[key] == ("" if value is None else value), key


def test_customer_report_holds_the_worked_numbers(ledger: tuple[str, Path]) -> None:
    _, path = ledger
    result = doc(path, *RANGE)
    assert result["from"] == "2024-03-03T23:57:00Z" and result["to"] == "2024-03-04T00:02:00Z"
    assert result["group_by"] == "customer"
    rows = result["rows"]
    assert [r["customer"] for r in rows] == ["a", "c", "b"]  # GM sum, greatest first
    a, b, c = (by(rows, "customer")[n] for n in "abc")
    assert a == pytest.approx(
        {
            "customer": "a",
            "name": None,
            "gm_sum": 4 * G_A,
            "gm_mean": 4 * G_A / 5,  # five accounted intervals, the gap counting 0
            "balance": 4 * G_A,
            "gm_cpu": 4 * G_A,
            "gm_memory": 0.0,
            "gm_disk": 0.0,
            "gm_network": 0.0,
            "utility": 4 * U_A,
            "priority": -4 * U_A,
            "contribution": 0.0,
            "throttled_s": 180,
            "throttle_mode": "dry-run",
            "quota_changes": 1,  # the failed attempt is no change
            "late_samples": 1,
        },
        abs=EXACT,
    )
    assert b["gm_sum"] == pytest.approx(4 * G_B, abs=EXACT)
    assert b["gm_mean"] == pytest.approx(4 * G_B / 5, abs=EXACT)
    assert b["balance"] == pytest.approx(4 * G_B, abs=EXACT)
    assert b["gm_cpu"] == pytest.approx(4 * G_B, abs=EXACT)
    assert b["priority"] == pytest.approx(-4 * U_B, abs=EXACT)
    assert (b["throttled_s"], b["throttle_mode"], b["quota_changes"], b["late_samples"]) == (
        0,
        "",
        0,
        0,
    )
    # c is acme's customer: it contributes its own work, so its priority is 0.
    assert c["gm_sum"] == pytest.approx(0.0, abs=EXACT)
    assert c["utility"] == pytest.approx(4 * U_C, abs=EXACT)
    assert c["contribution"] == pytest.approx(4 * U_C, abs=EXACT)
    assert c["priority"] == pytest.approx(0.0, abs=EXACT)
    assert any("5 accounted interval(s)" in n and "1 of them without" in n for n in result["notes"])
    assert any(n.startswith("* late samples") for n in result["notes"])
    same_numbers(path, rows, *RANGE)

    # Monday only: a entered level 1 before the range and stays there for I4 and I5.
    monday = by(doc(path, "--from", "2024-03-04", "--to", str(END))["rows"], "customer")
    assert monday["a"]["gm_sum"] == pytest.approx(2 * G_A, abs=EXACT)
    assert monday["a"]["gm_mean"] == pytest.approx(G_A, abs=EXACT)
    assert monday["a"]["throttled_s"] == 120
    assert monday["a"]["late_samples"] == 0  # the late sample is Sunday's
    assert monday["a"]["quota_changes"] == 1

    top = doc(path, *RANGE, "--top", "1", "--sort", "priority")["rows"]
    assert [r["customer"] for r in top] == ["c"]  # priority 0 above −0.375 and −1.125
    assert (top[0]["gm_cpu"], top[0]["gm_network"]) == (0.0, 0.0)  # same columns with --top
    (first,) = doc(path, *RANGE, "--top", "1")["rows"]
    assert first["customer"] == "a" and first["gm_cpu"] == pytest.approx(4 * G_A, abs=EXACT)
    (by_cpu,) = doc(path, *RANGE, "--top", "1", "--sort", "gm_cpu")["rows"]
    assert by_cpu["customer"] == "a"
    only = doc(path, *RANGE, "--customer", "b")["rows"]
    assert [r["customer"] for r in only] == ["b"]

    table = invoke(path, *RANGE)
    assert table.exit_code == 0
    assert "a *" in table.stdout and "b *" not in table.stdout
    assert "late samples are stored but not counted" in table.stdout
    assert "0.3750" in table.stdout and "-0.1875" in table.stdout


def test_organization_host_resource_day_and_week_reports(ledger: tuple[str, Path]) -> None:
    _, path = ledger
    orgs = doc(path, *RANGE, "--group-by", "organization")["rows"]
    assert [o["organization"] for o in orgs] == ["operator", "acme"]  # by contribution
    operator, acme = orgs
    assert operator == pytest.approx(
        {
            "organization": "operator",
            "customer": "",
            "contribution": 4 * (U_A + U_B),
            "utility": 0.0,
            "priority": 4 * (U_A + U_B),
            "hosts": 1,
            "customers": 2,
            "cpu_supplied_core_s": 4 * 120.0,
            "cpu_used_core_s": 4 * 120.0,  # the late 10 core-s are not counted
            "late_samples": 1,
        },
        abs=EXACT,
    )
    assert acme == pytest.approx(
        {
            "organization": "acme",
            "customer": "c",
            "contribution": 4 * U_C,
            "utility": 4 * U_C,
            "priority": 0.0,
            "hosts": 1,
            "customers": 1,
            "cpu_supplied_core_s": 480.0,
            "cpu_used_core_s": 240.0,
            "late_samples": 0,
        },
        abs=EXACT,
    )
    same_numbers(path, orgs, *RANGE, "--group-by", "organization")

    hosts = doc(path, *RANGE, "--group-by", "host")["rows"]
    assert [h["host"] for h in hosts] == ["cmp-1", "cmp-2"]  # by cpu core-seconds
    assert hosts[0] == {
        "host": "cmp-1",
        "organization": "operator",
        "vms": 2,
        "customers": 2,
        "samples": 8,
        "cpu_core_s": 480.0,
        "memory_byte_s": 0.0,
        "disk_bytes": 0.0,
        "network_bytes": 0.0,
        "late_samples": 1,
    }
    assert (hosts[1]["organization"], hosts[1]["samples"], hosts[1]["cpu_core_s"]) == (
        "acme",
        4,
        240.0,
    )
    same_numbers(path, hosts, *RANGE, "--group-by", "host")
    mine = doc(path, *RANGE, "--group-by", "host", "--customer", "b")["rows"]
    assert [(h["host"], h["cpu_core_s"], h["vms"]) for h in mine] == [("cmp-1", 120.0, 1)]

    resources = doc(path, *RANGE, "--group-by", "resource")["rows"]
    assert [r["resource"] for r in resources] == ["cpu", "memory", "disk", "network"]
    assert resources[0] == pytest.approx(
        {
            "resource": "cpu",
            "gm_sum": 4 * (G_A + G_B),
            "over": 4 * G_A,
            "under": 4 * G_B,
            "customers_over": 1,
        },
        abs=EXACT,
    )
    assert all(r["over"] == 0 and r["customers_over"] == 0 for r in resources[1:])
    same_numbers(path, resources, *RANGE, "--group-by", "resource")

    # Days and weeks split at UTC midnight.
    days = doc(path, *RANGE, "--group-by", "day")["rows"]
    assert [d["day"] for d in days] == ["2024-03-03", "2024-03-04"]
    sunday, monday = days
    assert sunday == pytest.approx(
        {
            "day": "2024-03-03",
            "intervals": 3,
            "empty_intervals": 1,
            "active_customers": 3,
            "gm_positive": 2 * G_A,
            "greediest": "a",
            "greediest_gm": 2 * G_A,
            "throttled_customers": 1,  # a, during the gap interval at 23:59
            "actions": 1,  # the level change decided at the end of I2
            "late_samples": 1,
        },
        abs=EXACT,
    )
    assert monday == pytest.approx(
        {
            "day": "2024-03-04",
            "intervals": 2,
            "empty_intervals": 0,
            "active_customers": 3,
            "gm_positive": 2 * G_A,
            "greediest": "a",
            "greediest_gm": 2 * G_A,
            "throttled_customers": 1,
            "actions": 2,  # the two quota actions, recorded at 00:01:30
            "late_samples": 0,
        },
        abs=EXACT,
    )
    same_numbers(path, days, *RANGE, "--group-by", "day")
    # 2024-03-04 is a Monday: the Sunday belongs to the week of Monday 2024-02-26.
    weeks = doc(path, *RANGE, "--group-by", "week")["rows"]
    assert [(w["week"], w["intervals"], w["actions"]) for w in weeks] == [
        ("2024-02-26", 3, 1),
        ("2024-03-04", 2, 2),
    ]

    per_day = doc(path, *RANGE, "--group-by", "day", "--customer", "a")["rows"]
    expected = [
        {
            "day": "2024-03-03",
            "customer": "a",
            "name": None,
            "intervals": 3,
            "gm_sum": 2 * G_A,
            "gm_mean": 2 * G_A / 3,
            "balance": 2 * G_A,  # after I2: the gap I3 has no rows
            "throttled_s": 60,
            "throttle_mode": "dry-run",
            "late_samples": 1,
        },
        {
            "day": "2024-03-04",
            "customer": "a",
            "name": None,
            "intervals": 2,
            "gm_sum": 2 * G_A,
            "gm_mean": G_A,
            "balance": 4 * G_A,
            "throttled_s": 120,
            "throttle_mode": "dry-run",
            "late_samples": 0,
        },
    ]
    assert len(per_day) == len(expected)
    for got, want in zip(per_day, expected, strict=True):
        assert got == pytest.approx(want, abs=EXACT)
    same_numbers(path, per_day, *RANGE, "--group-by", "day", "--customer", "a")
    table = invoke(path, *RANGE, "--group-by", "day", "--customer", "a")
    assert "2024-03-03 *" in table.stdout and "2024-03-04 *" not in table.stdout


def test_reset_progress_empty_ranges_and_errors(ledger: tuple[str, Path]) -> None:
    url, path = ledger
    engine = engine_for(url)
    try:
        steps: list[tuple[int, int, str]] = []
        with engine.connect() as conn:
            report(conn, "customer", T0, END, progress=lambda *s: steps.append(s))
        assert [s[0] for s in steps] == list(range(len(steps))) and steps[-1][:2] == (8, 8)
        # A reset after the last interval shows b's balance as 0 in ranges that end after it
        # takes effect (the next interval, at END), and not in those that end before.
        reset_balance(engine, "b", "test", "tester")
    finally:
        engine.dispose()
    before = by(doc(path, *RANGE)["rows"], "customer")
    assert before["b"]["balance"] == pytest.approx(4 * G_B, abs=EXACT)
    after = doc(path, "--from", str(T0), "--to", str(END + 60))
    assert by(after["rows"], "customer")["b"]["balance"] == 0.0
    assert any("reset" in n and n.endswith(": b") for n in after["notes"])

    # Piped, as operators' scripts run it: no progress bar on stderr. The default range (the
    # last 7 days) holds nothing here: exit 0, an empty table that says so.
    out = subprocess.run(
        [str(ADMIN), "--config", str(path), "report", "--group-by", "day"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "no accounted interval starts in" in out.stdout
    assert "nothing to report" in out.stderr
    assert not any(ch in out.stderr for ch in "━\r\x1b")
    empty = doc(path, "--from", "2000-01-01", "--to", "2000-01-02")
    assert empty["rows"] == [] and "no accounted interval" in empty["notes"][0]
    csv_empty = invoke(path, "--from", "2000-01-01", "--to", "2000-01-02", "--format", "csv")
    assert csv_empty.exit_code == 0 and csv_empty.stdout.startswith("customer,name,gm_sum,")

    for args, code, message in [
        (("--group-by", "colour"), 2, "cannot group by 'colour'"),
        (("--from", "yesterday"), 2, "'yesterday' is not a time"),
        (("--from", "now", "--to", "now-1d"), 2, "is not before"),
        ((*RANGE, "--sort", "shoe"), 2, "cannot sort by 'shoe'"),
        (("--top", "0"), 2, ""),
        (("--customer", "nobody"), 3, "'nobody' is not in the ledger"),
        (("--customer", "a", "--group-by", "organization"), 2, "--customer applies to"),
    ]:
        out = invoke(path, *args)
        assert out.exit_code == code, (args, out.stdout, out.stderr)
        assert message in out.stderr


def test_an_unreachable_database_exits_1(tmp_path: Path) -> None:
    dead = tmp_path / "dead.toml"
    dead.write_text('[database]\nurl = "postgresql+psycopg://gmd:pw@127.0.0.1:1/gmd"\n')
    out = invoke(dead)
    assert out.exit_code == 1
    assert "127.0.0.1:1/gmd" in out.stderr and "pw@" not in out.stderr
