"""gmd-admin's output layer: the openstack client's and Slurm's output options, on every listing
command, and the defects an operator trying gmd cold ran into (issue 17)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gmd.admin.cli import app
from gmd.admin.output import Format, Listing, Output, OutputError, View, render
from gmd.render import Column
from tests.support.standings_ledger import (
    last_interval,
    ledger_config,  # noqa: F401 - the fixture
)

ADMIN = Path(sys.executable).with_name("gmd-admin")

COLUMNS = (
    Column("customer", "Customer", None, "left"),
    Column("balance", "Balance", 4),
    Column("dry_run", "Dry-run", None, "left"),
    Column("detail", "Detail", None, "left"),
)
ROWS = [
    {"customer": "b", "balance": -0.0, "dry_run": True, "detail": {"a": 1, "b": [1, 2]}},
    {"customer": "a", "balance": 2.5, "dry_run": False, "detail": None},
    {"customer": "c", "balance": None, "dry_run": False, "detail": "x"},
]


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a person's shell is."""

    def isatty(self) -> bool:
        return True


def shown(out: Output, tty: bool = False, notes: tuple[str, ...] = ()) -> str:
    listing = Listing([View(ROWS, COLUMNS, title="T", notes=notes, keep=("customer",))])
    return render(listing, out, Terminal() if tty else io.StringIO())


def test_piped_tables_are_plain_and_terminal_tables_are_framed() -> None:
    piped = shown(Output())
    assert not set("│┃─━┌┐└┘") & set(piped)
    assert piped.splitlines()[1].split() == ["Customer", "Balance", "Dry-run", "Detail"]
    framed = shown(Output(), tty=True)
    assert "│" in framed


def test_cells_show_odd_values_plainly() -> None:
    lines = shown(Output()).splitlines()
    assert lines[2].split()[:3] == ["b", "0.0000", "yes"]  # -0.0 is 0, True is yes
    assert '{"a":1,"b":[1,2]}' in lines[2]  # a document on one line, not six
    assert lines[3].split()[:3] == ["a", "2.5000", "no"]
    assert lines[4].split()[:2] == ["c", "-"]  # no amount


def test_csv_parsable_and_value_formats() -> None:
    rows = list(csv.DictReader(io.StringIO(shown(Output(format=Format.csv)))))
    assert rows[0] == {
        "customer": "b",
        "balance": "0.0",
        "dry_run": "true",
        "detail": rows[0]["detail"],
    }
    assert json.loads(rows[0]["detail"]) == {"a": 1, "b": [1, 2]}
    assert rows[2]["balance"] == ""
    piped = shown(Output(parsable=True, columns=("customer", "Balance"))).splitlines()
    assert piped == ["customer|balance", "b|0.0", "a|2.5", "c|"]
    assert shown(Output(parsable=True, noheader=True, columns=("customer",))) == "b\na\nc\n"
    assert shown(Output(format=Format.value, columns=("customer", "dry_run"))) == (
        "b true\na false\nc false\n"
    )


def test_json_and_yaml_hold_the_same_document() -> None:
    as_json = json.loads(shown(Output(format=Format.json)))
    as_yaml = yaml.safe_load(shown(Output(format=Format.yaml)))
    assert as_json == as_yaml
    assert as_json["rows"][0]["balance"] == 0.0 and str(as_json["rows"][0]["balance"]) == "0.0"
    compact = shown(Output(format=Format.json, noindent=True, columns=("customer",)))
    assert compact == '{"rows": [{"customer": "b"}, {"customer": "a"}, {"customer": "c"}]}\n'


def test_columns_and_sorting() -> None:
    out = Output(format=Format.value, columns=("Balance", "customer"), sort_columns=("balance",))
    assert shown(out) == "0.0 b\n2.5 a\n c\n"  # ascending; nothing sorts last
    down = Output(
        format=Format.value, columns=("customer",), sort_columns=("balance",), sort_descending=True
    )
    assert shown(down) == "a\nb\nc\n"
    with pytest.raises(OutputError, match="no column 'nope' here; the columns are: customer"):
        shown(Output(columns=("nope",)))
    with pytest.raises(OutputError, match="-P/--parsable"):
        shown(Output(format=Format.json, parsable=True))


def test_a_narrow_table_leaves_columns_out_and_says_which() -> None:
    text = shown(Output(max_width=30), notes=("balance: after the last interval", "general"))
    lines = text.splitlines()
    assert all(len(line) <= 30 for line in lines[:5])
    assert lines[1].split() == ["Customer", "Balance", "Dry-run"]
    assert "Left out to fit 30 columns: detail" in " ".join(lines)
    narrower = shown(Output(max_width=12), notes=("balance: after the last interval", "general"))
    assert "balance: after" not in narrower  # a note about a column not shown is left out
    assert "general" in narrower
    assert shown(Output(noheader=True, columns=("customer",))) == "b\na\nc\n"


def admin(
    config: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_listing_command_takes_the_output_options(ledger_config: Path) -> None:  # noqa: F811
    runner = CliRunner()
    for command in (
        ["standings"],
        ["report", "--from", "0"],
        ["actions"],
        ["enforce", "--plan"],
        ["batches"],
        ["db", "usage"],
        ["gm", "--scenario", "S32"],
    ):
        for extra in (["-f", "yaml"], ["-f", "value"], ["-P", "-n"], ["--max-width", "80"]):
            out = runner.invoke(app, ["--config", str(ledger_config), *command, *extra])
            assert out.exit_code == 0, (command, extra, out.output, out.exception)
            assert out.stdout.strip() or command in (["actions"], ["enforce", "--plan"])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_standings_show_every_customer_asked_for_with_its_level(ledger_config: Path) -> None:  # noqa: F811
    out = admin(ledger_config, "standings", "--customer", "a", "--customer", "b", "-f", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["customers"]
    assert sorted(r["customer"] for r in rows) == ["a", "b"]
    assert all(r["level"] == 0 and r["enforced"] is None for r in rows)
    missing = admin(
        ledger_config,
        "standings",
        "--customer",
        "a",
        "--customer",
        "zz",
        "-f",
        "value",
        "-c",
        "customer",
    )
    assert missing.returncode == 3 and missing.stdout == "a\n"
    assert "'zz' has no standing" in missing.stderr


def test_actions_count_by_their_interval_and_limit_keeps_the_newest(ledger_config: Path) -> None:  # noqa: F811
    last = last_interval(ledger_config)
    for who in ("a", "b"):
        done = admin(ledger_config, "reset", who, "--reason", "test", "--yes")
        assert done.returncode == 0, done.stderr
    # A second reset of a before the next interval is accounted does nothing and logs nothing.
    again = admin(ledger_config, "reset", "a", "--reason", "test", "--yes")
    assert again.returncode == 0 and "already reset" in again.stdout
    everything = json.loads(admin(ledger_config, "actions", "-f", "json").stdout)["actions"]
    assert [(r["kind"], r["customer"]) for r in everything] == [("reset", "a"), ("reset", "b")]
    # Both resets are tied to the interval they were made after, three minutes ago: that
    # interval's range holds them though they were recorded now.
    in_interval = admin(
        ledger_config,
        "actions",
        "--from",
        str(last),
        "--to",
        str(last + 60),
        "-f",
        "value",
        "-c",
        "customer",
    )
    assert in_interval.stdout == "a\nb\n"
    later = admin(
        ledger_config, "actions", "--from", str(last + 60), "-f", "value", "-c", "customer"
    )
    assert later.returncode == 0 and later.stdout == ""
    newest = admin(ledger_config, "actions", "--limit", "1", "-f", "value", "-c", "customer")
    assert newest.stdout == "b\n"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["actions", "--customer", "nobody"], 3, "'nobody' is not in the ledger"),
        (["enforce", "--plan", "--host", "nowhere"], 3, "host 'nowhere' is not in the ledger"),
        (["batches", "--host", "nowhere"], 3, "host 'nowhere' is not in the ledger"),
        (["report", "--from", "99999999999999"], 2, "after 9999-12-31T23:59:59Z"),
        (["explain", "a", "--at", "99999999999999"], 2, "after 9999-12-31T23:59:59Z"),
        (["actions", "--from", "99999999999999"], 2, "after 9999-12-31T23:59:59Z"),
        (["standings", "-c", "nope"], 2, "no column 'nope' here"),
        (
            ["gm", "--supply", "6,12", "--use", "c1=3,8", "--use", "c2=1,5"],
            2,
            "more than the supply",
        ),
    ],
)
def test_not_found_and_bad_input_have_one_exit_code_each(
    ledger_config: Path,  # noqa: F811
    args: list[str],
    code: int,
    message: str,
) -> None:
    out = admin(ledger_config, *args)
    assert out.returncode == code, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_report_from_the_epoch_is_a_range(ledger_config: Path) -> None:  # noqa: F811
    out = admin(ledger_config, "report", "--from", "0", "-f", "json")
    assert out.returncode == 0, out.stderr
    assert {r["customer"] for r in json.loads(out.stdout)["rows"]} == {"a", "b"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_enforce_plan_csv_holds_every_table(ledger_config: Path) -> None:  # noqa: F811
    out = admin(ledger_config, "enforce", "--plan", "-f", "csv")
    assert out.returncode == 0, out.stderr
    levels, plans, caps = out.stdout.split("\n\n")
    assert levels.startswith("customer,level,score")
    assert "disk_read_bytes_per_s,disk_write_bytes_per_s" in plans.splitlines()[0]
    assert caps.startswith("host,resource,applied,reason,utilisation,threshold,intervals")


def test_reading_commands_create_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GMD_CONFIG"}
    typo = tmp_path / "gmd.toml"
    typo.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "nope" / "ledger.db"}"\n')
    out = admin(typo, "standings", env=env)
    assert out.returncode == 1 and "no ledger at" in out.stderr and "db upgrade" in out.stderr
    assert not (tmp_path / "nope").exists()
    (tmp_path / "empty.db").touch()
    empty = tmp_path / "empty.toml"
    empty.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "empty.db"}"\n')
    out = admin(empty, "report", env=env)
    assert out.returncode == 1 and "no ledger schema" in out.stderr
    assert "Traceback" not in out.stderr and "OperationalError" not in out.stderr


def test_version() -> None:
    out = subprocess.run([str(ADMIN), "--version"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.startswith("gmd-admin ")


COLUMN_NAME = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
"""A column key as footnotes write it (gm_mean, throttled_s); ``gm_<resource>`` stands for
the per-resource columns and is not one."""


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_footnote_names_columns_of_its_own_table(ledger_config: Path) -> None:  # noqa: F811
    """A footnote explains a column the reader sees: the resource report's note said what
    gm_mean divides by under a table without gm_mean (issue 27)."""
    runner = CliRunner()
    for group in ("customer", "organization", "host", "resource", "day", "week"):
        for only in ([], ["--customer", "a"]):
            if group == "organization" and only:
                continue
            base = ["--config", str(ledger_config), "report", "--from", "0", "--group-by", group]
            doc = runner.invoke(app, [*base, *only, "-f", "json"])
            assert doc.exit_code == 0, (group, only, doc.output)
            heading = runner.invoke(app, [*base, *only, "-f", "csv"])
            assert heading.exit_code == 0, (group, only, heading.output)
            keys = set(heading.stdout.splitlines()[0].split(","))
            notes = json.loads(doc.stdout)["notes"]
            assert notes, (group, only)
            named = {n for note in notes for n in COLUMN_NAME.findall(note)}
            assert named <= keys, (group, only, named - keys, notes)


RANGE_NOTE = re.compile(r"start in \[(\S+), (\S+)\)")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("range_", [["--from", "0"], ["--from", "@0.5", "--to", "now-0.5s"]])
def test_a_report_shows_one_now(ledger_config: Path, range_: list[str]) -> None:  # noqa: F811
    """The title's range and the note's range are one range: the title showed --to now
    rounded down and the note the range the query used, a second later (issue 27)."""
    table = admin(ledger_config, "report", *range_)
    assert table.returncode == 0, table.stderr
    title = table.stdout.splitlines()[0]
    start, end = title.removeprefix("Usage by customer, ").split(" to ")
    note = RANGE_NOTE.search(table.stdout)
    assert note is not None, table.stdout
    assert (start, end) == note.groups()
    doc = json.loads(admin(ledger_config, "report", *range_, "-f", "json").stdout)
    note = RANGE_NOTE.search(doc["notes"][0])
    assert note is not None and (doc["from"], doc["to"]) == note.groups()


def test_byte_columns_show_units_in_tables_and_raw_numbers_elsewhere() -> None:
    """Tables showed 1610612736 under "Disk bytes" (issue 27): a table shows binary multiples
    with the unit in the cell; CSV and JSON keep the number under a key naming the unit."""
    from gmd.admin.db_usage import COLUMNS as DB_COLUMNS
    from gmd.daemon.reports.enforcement import PLAN_COLUMNS
    from gmd.daemon.reports.usage import HOST_COLUMNS
    from gmd.render import Unit, cell

    for column in (*HOST_COLUMNS, *PLAN_COLUMNS, *DB_COLUMNS):
        if "byte" in column.key:
            assert column.unit is not None, column
    assert cell(1.5 * 2**30, 0, Unit.bytes) == "1.5 GiB"
    assert cell(512, None, Unit.bytes) == "512 B"
    assert cell(10 * 2**20, 0, Unit.bytes_per_s) == "10.0 MiB/s"
    assert cell(3 * 2**40, 0, Unit.byte_seconds) == "3.0 TiB·s"
    assert cell(None, 0, Unit.bytes) == "-"
    columns = (
        Column("host", "Host", None, "left"),
        Column("disk_bytes", "Disk", 0, unit=Unit.bytes),
    )
    listing = Listing([View([{"host": "h", "disk_bytes": 1610612736}], columns)])
    table = render(listing, Output(), io.StringIO()).splitlines()
    assert table[-1].split() == ["h", "1.5", "GiB"]
    assert render(listing, Output(format=Format.csv)) == "host,disk_bytes\nh,1610612736\n"
    doc = json.loads(render(listing, Output(format=Format.json)))
    assert doc == {"rows": [{"host": "h", "disk_bytes": 1610612736}]}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_report_by_host_and_db_usage_show_byte_units(ledger_config: Path) -> None:  # noqa: F811
    hosts = admin(ledger_config, "report", "--from", "0", "--group-by", "host")
    assert hosts.returncode == 0, hosts.stderr
    lines = hosts.stdout.splitlines()
    heading = lines[1]
    cells = lines[2]
    shown = {h: cells[heading.index(h) :].split()[:2] for h in ("Memory", "Disk", "Network")}
    assert shown == {"Memory": ["0", "B·s"], "Disk": ["0", "B"], "Network": ["0", "B"]}
    raw = admin(ledger_config, "report", "--from", "0", "--group-by", "host", "-f", "csv")
    record = next(csv.DictReader(io.StringIO(raw.stdout)))
    assert float(record["memory_byte_s"]) == 0 and float(record["disk_bytes"]) == 0
    usage = admin(ledger_config, "db", "usage")
    assert usage.returncode == 0, usage.stderr
    samples = next(line for line in usage.stdout.splitlines() if line.startswith("samples "))
    assert samples.split()[3] in ("B", "KiB", "MiB"), usage.stdout
