"""The installed console scripts, run as an operator runs them."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gmd.common.cli import ExitCode
from gmd.fairness.greediness import greediness
from tests.support.standings_ledger import ledger_config  # noqa: F401 - the fixture

BIN = Path(sys.executable).parent


def run(*args: str, script: str = "gmd-admin") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / script), *args], capture_output=True, text=True, timeout=60, check=False
    )


Q1_A12 = ["--supply", "6,12", "--use", "c1=3,0", "--use", "c2=0,6", "--use", "c3=3,6"]


def test_gm_table_ranks_greediest_first() -> None:
    out = run("gm", *Q1_A12)
    assert out.returncode == 0, out.stderr
    # Piped, the table is plain columns: no box characters for grep and awk to trip on.
    assert not set("│┃─━┏┓└┘") & set(out.stdout)
    lines = out.stdout.splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith("GM rank"))
    rows = lines[head + 1 : head + 4]
    assert [line.split()[1] for line in rows] == ["c3", "c1", "c2"]
    assert "0.5000" in rows[0]
    assert "credit factor" in out.stdout


def test_gm_json_matches_the_engine() -> None:
    out = run("gm", *Q1_A12, "--gamma", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    by_name = {c["consumer"]: c for c in doc["consumers"]}
    want = greediness([[3, 0], [0, 6], [3, 6]], [6, 12], gamma=1.0)
    assert [by_name[n]["gm"] for n in ("c1", "c2", "c3")] == pytest.approx(want, abs=1e-12)
    assert by_name["c1"]["offset_r2"] == pytest.approx(-4.0)
    assert doc["credit_factor"] == {"r1": 1.0, "r2": 1.0}
    assert by_name["c3"]["drf"] == pytest.approx(0.5)


def test_gm_csv_parses_back_to_the_same_numbers() -> None:
    out = run("gm", "--scenario", "S32", "--format", "csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["consumer"] for r in rows] == ["c3", "c1", "c2"]
    assert float(rows[1]["gm"]) == pytest.approx(1 / 36, abs=1e-15)
    assert float(rows[0]["gm"]) == pytest.approx(1 / 9, abs=1e-15)
    assert rows[0]["drf_rank"] == "1" and rows[1]["price_rank"] == "1"


def test_gm_reads_a_csv_file_with_endowments(tmp_path: Path) -> None:
    f = tmp_path / "host.csv"
    f.write_text(
        "consumer,cpu,ram\n"
        "# a comment line\n"
        "supply,8,32\n"
        "web,6,10\nbatch,1,10\n"
        "endowment:web,4,16\nendowment:batch,4,16\n"
    )
    out = run("gm", "--csv", str(f), "--format", "json", "--gamma", "0.5")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    want = greediness([[6, 10], [1, 10]], [8, 32], 0.5, endowment=[[4, 16], [4, 16]])
    got = {c["consumer"]: c["gm"] for c in doc["consumers"]}
    assert [got["web"], got["batch"]] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--supply", "6,12", "--use", "c1=3,-1"], "use for consumer 'c1', resource 'r2'"),
        (["--supply", "6,x", "--use", "c1=3,1"], "--supply: amount 2 is 'x', not a number"),
        (["--supply", "6,12", "--use", "c1=3"], "consumer 'c1' has 1 amounts for 2 resources"),
        (["--supply", "6,12", "--use", "3,1"], "write NAME=AMOUNT"),
        (["--supply", "6,0", "--use", "c1=3,0"], "supply for resource 'r2' = 0.0 is zero"),
        (["--supply", "6,12", "--use", "c1=3,8", "--use", "c2=1,5"], "r2: the consumers use 13"),
        (["--supply", "1e308,1", "--use", "a=1e308,0", "--use", "b=1e308,0"], "beyond what"),
        (["--supply", "6,12", "--use", "c1=nan,1"], "not a finite number"),
        (["--use", "c1=3,1"], "--use needs --supply"),
        (["--scenario", "S99"], "unknown scenario 'S99'"),
        ([], "give exactly one of --scenario, --csv or --use"),
        (["--csv", "/nonexistent/x.csv"], "/nonexistent/x.csv: cannot read"),
    ],
)
def test_gm_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    out = run("gm", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_gm_gamma_out_of_range_is_a_usage_error() -> None:
    out = run("gm", *Q1_A12, "--gamma", "1.5")
    assert out.returncode == 2
    assert "--gamma" in out.stderr


def test_help_explains() -> None:
    out = run("gm", "--help")
    assert out.returncode == 0
    assert "Greediness Metric" in out.stdout and "--gamma" in out.stdout


def test_db_upgrade_and_current(tmp_path: Path, database_url: str) -> None:
    cfg = tmp_path / "gmd.toml"
    cfg.write_text(f'[database]\nurl = "{database_url}"\n')
    if database_url.startswith("sqlite"):
        # A SQLite file that is not there is not a database: reading makes none.
        out = run("--config", str(cfg), "db", "current")
        assert out.returncode == 1 and "no ledger at" in out.stderr
        assert "run `gmd-admin db upgrade`" in out.stderr
        assert not (tmp_path / "ledger.db").exists()
        (tmp_path / "ledger.db").touch()
    # An empty database (a fresh PostgreSQL one, an empty SQLite file) is a state, not a
    # failure: it says so and what to do, and exits 0 (it exited 1, "unavailable": issue 27).
    out = run("--config", str(cfg), "db", "current")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("no schema (empty database ")
    assert out.stdout.rstrip().endswith("run `gmd-admin db upgrade`") and out.stderr == ""
    out = run("--config", str(cfg), "db", "upgrade")
    assert out.returncode == 0, out.stderr
    assert "schema upgraded from empty to" in out.stdout
    out = run("--config", str(cfg), "db", "upgrade")
    assert out.returncode == 0 and "already at schema revision" in out.stdout
    out = run("--config", str(cfg), "db", "current")
    assert out.returncode == 0 and "(head)" in out.stdout


def test_db_commands_report_bad_config_and_dead_database(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[accounting]\ngamma = 2\n")
    out = run("--config", str(bad), "db", "current")
    assert out.returncode == 2 and "accounting.gamma" in out.stderr
    dead = tmp_path / "dead.toml"
    dead.write_text('[database]\nurl = "postgresql+psycopg://gmd:pw@127.0.0.1:1/gmd"\n')
    out = run("--config", str(dead), "db", "current")
    assert out.returncode == 1
    assert "127.0.0.1:1/gmd" in out.stderr and "pw@" not in out.stderr
    assert "Traceback" not in out.stderr


def test_db_unusable_url_is_a_config_error_without_the_password(tmp_path: Path) -> None:
    cfg = tmp_path / "gmd.toml"
    cfg.write_text('[database]\nurl = "postgresql+nodriver://gmd:secret@db/gmd"\n')
    out = run("--config", str(cfg), "db", "upgrade")
    assert out.returncode == 2
    assert "gmd:***@db/gmd" in out.stderr and "secret" not in out.stderr


@pytest.mark.parametrize(
    "command", [["standings"], ["report"], ["actions"], ["explain"], ["reset"], ["plot"]]
)
def test_help_says_a_customer_is_named_by_uuid_or_name(command: list[str]) -> None:
    """Every command taking a customer takes a project uuid or its name (issue 27): its help
    says both, never "project uuid" alone."""
    out = run(*command, "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "project uuid or project name" in text
    assert "(project uuid)" not in text


ERROR_LINE = r"{program}: error: \S.*"


def one_error_line(out: subprocess.CompletedProcess[str], program: str, code: int) -> None:
    """The one way a gmd program ends with an error: ``PROGRAM: error: WHAT`` as the only line
    on stderr, no traceback, and the documented code."""
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert re.fullmatch(ERROR_LINE.format(program=program), lines[0]), lines[0]
    assert "Traceback" not in out.stderr


def configs(tmp_path: Path) -> dict[str, Path]:
    bad = tmp_path / "bad.toml"
    bad.write_text("[accounting]\ngamma = 2\n[agent]\ntick_s = 0\n")
    dead = tmp_path / "dead.toml"
    dead.write_text('[database]\nurl = "postgresql+psycopg://gmd:pw@127.0.0.1:1/gmd"\n')
    return {"bad": bad, "dead": dead}


@pytest.mark.parametrize(
    ("program", "args", "code"),
    [
        ("gmd-admin", ["standings", "--bogus"], ExitCode.USAGE),
        ("gmd-admin", ["standings", "--sort", "nope"], ExitCode.USAGE),
        ("gmd-admin", ["nosuch"], ExitCode.USAGE),
        ("gmd-admin", ["explain"], ExitCode.USAGE),
        ("gmd-admin", ["gm", "--scenario", "S32", "--gamma", "3"], ExitCode.USAGE),
        ("gmd-admin", ["--config", "{bad}", "standings"], ExitCode.USAGE),
        ("gmd-admin", ["--config", "{dead}", "standings"], ExitCode.UNAVAILABLE),
        ("gmd-admin", ["--config", "{dead}", "db", "current"], ExitCode.UNAVAILABLE),
        ("gmd-admin", ["--config", "{dead}", "report", "--from", "yesterday"], ExitCode.USAGE),
        ("gmd-daemon", ["--log-level", "bogus"], ExitCode.USAGE),
        ("gmd-daemon", ["--nope"], ExitCode.USAGE),
        ("gmd-daemon", ["--config", "{bad}"], ExitCode.USAGE),
        ("gmd-daemon", ["--config", "{dead}"], ExitCode.UNAVAILABLE),
        ("gmd-agent", ["--log-level", "loud"], ExitCode.USAGE),
        ("gmd-agent", ["--config", "{bad}", "--once"], ExitCode.USAGE),
    ],
)
def test_every_error_is_one_line_with_a_documented_code(
    tmp_path: Path, program: str, args: list[str], code: ExitCode
) -> None:
    """Errors came in three formats (issue 27): "gmd-admin: error: …", "gmd-admin: …", and
    click's three-line usage message; the services logged theirs as log records. Now one."""
    where = configs(tmp_path)
    out = run(*(a.format(**where) for a in args), script=program)
    one_error_line(out, program, code)
    assert "pw@" not in out.stderr


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_errors_about_the_ledger_are_one_line_with_a_documented_code(
    ledger_config: Path,  # noqa: F811
) -> None:
    cases = [
        (["explain", "nobody"], ExitCode.NOT_FOUND),
        (["report", "--customer", "nobody"], ExitCode.NOT_FOUND),
        (
            ["standings", "--customer", "a", "--customer", "zz", "--customer", "yy"],
            ExitCode.NOT_FOUND,
        ),
        (["batches", "drop", "nope", "--reason", "typo"], ExitCode.NOT_FOUND),
        (["actions", "--customer", "nobody"], ExitCode.NOT_FOUND),
        (["report", "--from", "yesterday"], ExitCode.USAGE),
        (["standings", "-c", "nope"], ExitCode.USAGE),
        (["reset", "a", "--reason", " ", "--yes"], ExitCode.USAGE),
    ]
    for args, code in cases:
        one_error_line(run("--config", str(ledger_config), *args), "gmd-admin", code)


def test_the_exit_code_table_is_documented() -> None:
    """docs/cli.md's table holds exactly the codes of gmd.common.cli.ExitCode."""
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", text, flags=re.MULTILINE)}
    assert documented == {int(c) for c in ExitCode}
