"""What-if (gmd.daemon.reports.whatif): the ledger's intervals replayed under other settings.

A ledger grown through the daemon's real API and accountant (a greedy customer climbs two
levels, then idles and comes back down; a moderate one never moves), on SQLite and PostgreSQL.
With no override the replay reproduces the recorded balances, greediness and levels interval by
interval; an override changes what it should; what cannot be replayed is refused in one line.
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction as F
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from gmd.common.timespec import iso, parse_time
from gmd.daemon.config import Config
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.reports.whatif import (
    WhatIfRefused,
    WhatIfStopped,
    differences,
    indicators,
    replay,
    rows_of,
    summary_lines,
    with_overrides,
)
from gmd.wire import RESOURCES_COMBINED as RESOURCES
from tests.support.cloud_story import toml_document
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)
from tests.support.paper_tables import Q1, Q1_SUPPLY, q3, table6_formula

CMP1 = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
ENFORCEMENT = {
    "mode": "dry-run",
    # Three levels (the default's count); the third is out of reach.
    "enter": [0.05, 0.15, 100.0],
    "leave": [0.02, 0.1, 50.0],
    "dwell_s": 0,
    "max_step": 1,
}
ACCOUNTING = {"endowment": "equal", "half_life_s": 120}
# a's VM takes the whole of the host's 2 cores for six intervals while b's idles, then both idle.
BUSY, IDLE = 6, 10


def config_for(url: str) -> Config:
    return make_config(url, {CMP1.name: "operator"}, accounting=ACCOUNTING, enforcement=ENFORCEMENT)


@contextmanager
def grown(database_url: str) -> Iterator[tuple[Config, sa.Engine, int, int]]:
    """The ledger after BUSY + IDLE intervals, and the range [from, to) they span."""
    config = config_for(database_url)
    n = BUSY + IDLE
    # Read the clock once: a minute that ticks while the batches are posted must not move the
    # range off the intervals they fill.
    first = aligned_past(n + 1)
    with serving(config) as d:
        for k in range(n):
            start = first + k * INTERVAL_S
            cpu = 2 * INTERVAL_S * 0.95 if k < BUSY else 0.0
            vms = [cpu_only("a1", "a", cpu, vcpus=2), cpu_only("b1", "b", 1.0, vcpus=2)]
            r = httpx.post(
                f"{d.url}/v1/samples", json=batch(CMP1, start, vms), headers=auth(CMP1.name)
            )
            assert r.is_success, r.text
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        yield config, d.engine, first, first + n * INTERVAL_S


def recorded(engine: sa.Engine) -> dict[tuple[int, str], tuple[float, float]]:
    with engine.connect() as conn:
        return {
            (int(s), str(c)): (float(b), float(g))
            for s, c, b, g in conn.execute(
                sa.text(
                    "SELECT i.start_s, c.name, l.balance, l.greediness FROM customer_ledger l"
                    " JOIN intervals i ON i.id = l.interval_id"
                    " JOIN customers c ON c.id = l.customer_id"
                )
            )
        }


def names(engine: sa.Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT id, name FROM customers")).all())


def test_no_override_reproduces_the_ledger_interval_by_interval(database_url: str) -> None:
    with grown(database_url) as (config, engine, from_s, to_s):
        with engine.connect() as conn:
            result = replay(conn, config, from_s, to_s)
        ledger = recorded(engine)
        who = names(engine)
    replayed = {
        (start, who[c]): (balance, result.greediness[start][c])
        for start, balances in result.balances.items()
        for c, balance in balances.items()
    }
    assert replayed.keys() == ledger.keys()
    for key, (balance, greediness) in ledger.items():
        assert replayed[key] == pytest.approx((balance, greediness), rel=1e-12, abs=1e-15), key
    rows = {r["customer"]: r for r in rows_of(result)}
    a = rows["a"]
    # a climbed to level 2 and came back down, as recorded: same changes, same times.
    assert (a["max_level"], a["recorded_max_level"]) == (2, 2)
    assert a["changes"] == a["recorded_changes"] >= 3, a
    assert a["throttle_hours"] == a["recorded_throttle_hours"] > 0
    assert (a["added"], a["removed"], a["earlier"], a["later"]) == ("", "", "", "")
    # Its timeline: each change and when it came into force, the first at the end of an
    # interval of the range.
    steps = str(a["timeline"]).split("; ")
    assert a["timeline"] == a["recorded_timeline"] and len(steps) == a["changes"]
    assert steps[0].startswith("0→1 from ") and steps[1].startswith("1→2 from "), steps
    assert from_s < parse_time(steps[0].removeprefix("0→1 from "), to_s) <= to_s
    assert rows["b"]["max_level"] == rows["b"]["recorded_max_level"] == 0
    assert rows["b"]["timeline"] == ""
    summary = indicators(result)
    assert summary["customers_throttled"] == summary["recorded_customers_throttled"] == 1
    assert summary["throttle_hours"] == summary["recorded_throttle_hours"]


def test_higher_thresholds_mean_fewer_and_later_actions_and_change_nothing_else(
    tmp_path: Path,
) -> None:
    with grown(f"sqlite:///{tmp_path / 'ledger.db'}") as (config, engine, from_s, to_s):
        higher = with_overrides(
            config, ["enforcement.enter=[0.15, 10, 100]", "enforcement.leave=[0.1, 5, 50]"]
        )
        with engine.connect() as conn:
            base = replay(conn, config, from_s, to_s)
            result = replay(conn, higher, from_s, to_s, ["enforcement.enter=[0.15, 10, 100]"])
    # Accounting is untouched by thresholds: the same balances.
    assert result.balances == base.balances
    a = next(e for e in result.customers.values() if e.customer == "a")
    assert a.max_level == 1 and a.throttled_s < a.recorded_throttled_s
    diff = differences(a)
    # It never reaches level 2 and, leaving below 0.1 rather than 0.02, is back at 0 within
    # the range (recorded: still at 1 at its end); it enters level 1 no earlier.
    assert [d.split(" after")[0] for d in diff["removed"]] == ["1→2", "2→1"]
    assert [d.split(" after")[0] for d in diff["added"]] == ["1→0"]
    assert not diff["earlier"]


def test_gamma_changes_the_balances_and_nothing_is_written(tmp_path: Path) -> None:
    with grown(f"sqlite:///{tmp_path / 'ledger.db'}") as (config, engine, from_s, to_s):
        before = recorded(engine)
        with engine.connect() as conn:
            zero = replay(conn, with_overrides(config, ["accounting.gamma=0"]), from_s, to_s)
            one = replay(conn, with_overrides(config, ["accounting.gamma=1"]), from_s, to_s)
        assert recorded(engine) == before
    # γ = 0 credits nobody for what it left: b (who left the host to a) is not below 0.
    b_zero = [min(bal.values()) for bal in zero.balances.values()]
    b_one = [min(bal.values()) for bal in one.balances.values()]
    assert min(b_one) < min(b_zero)


def test_caps_hand_the_contended_host_back_to_the_moderate_customer(tmp_path: Path) -> None:
    """While a's VM takes 95 % of the host's 2 cores, the host is contended (≥ 80 %) and b, the
    moderate customer, gets 1 core-second an interval: 1/(1 + a's use) as recorded (dry-run:
    nothing capped). In the replay a's VM is bounded by its level's cap, a fraction of its 2
    vCPUs × the interval; with caps of a whole VM nothing is handed back. (The indicators are
    rounded to 6 digits.)"""
    caps = {1: 0.5, 2: 0.25}
    with grown(f"sqlite:///{tmp_path / 'ledger.db'}") as (config, engine, from_s, to_s):
        capped = with_overrides(
            config, ["enforcement.cap_level=1", "enforcement.cpu_cap_fractions=[0.5, 0.25, 0.25]"]
        )
        whole = with_overrides(
            config, ["enforcement.cap_level=1", "enforcement.cpu_cap_fractions=[1, 1, 1]"]
        )
        with engine.connect() as conn:
            result = replay(conn, capped, from_s, to_s)
            uncapped = replay(conn, whole, from_s, to_s)
            unchanged = replay(conn, config, from_s, to_s)
        a = {v: k for k, v in names(engine).items()}["a"]
    # No change: the replay and the record are the same share (a dry-run record beside a
    # capped replay showed 12.0 % against 7.9 %, only the caps' doing).
    plain = indicators(unchanged)
    assert plain["moderate_share_of_contended_cpu"] == pytest.approx(
        plain["recorded_moderate_share_of_contended_cpu"], abs=1e-9
    )
    busy = sorted(result.levels)[:BUSY]
    a_use = 2 * INTERVAL_S * 0.95
    bounded = [
        min(a_use, caps[result.levels[s][a]] * 2 * INTERVAL_S) if a in result.levels[s] else a_use
        for s in busy
    ]
    assert any(b < a_use for b in bounded), result.levels  # a is capped in some busy interval
    summary = indicators(result)
    measured_share = 1.0 / (1.0 + a_use)
    capped_share = BUSY * 1.0 / (BUSY * 1.0 + sum(bounded))
    assert summary["moderate_share_of_contended_cpu"] == pytest.approx(capped_share, abs=1e-6)
    # Like with like: the record's levels (decided in dry-run, the same as the replay's here)
    # under the same caps give the same share; what the moderate customer got in fact, with no
    # cap holding, is the measured share.
    assert summary["recorded_moderate_share_of_contended_cpu"] == pytest.approx(
        capped_share, abs=1e-6
    )
    assert summary["measured_moderate_share_of_contended_cpu"] == pytest.approx(
        measured_share, abs=1e-6
    )
    assert summary["recorded_modes"] == ["dry-run"]
    line = summary_lines(result)[-1]
    assert "the record was decided in dry-run: its caps did not hold in fact" in line, line
    same = indicators(uncapped)
    assert same["moderate_share_of_contended_cpu"] == pytest.approx(measured_share, abs=1e-6)
    # The moderate customer's share never falls below what it got in fact.
    assert summary["moderate_share_of_contended_cpu"] > same["moderate_share_of_contended_cpu"]


# The GM paper's Table 6 (tests/unit/fairness/test_gm_paper.py has it typed in): Q1's options A12
# and A13 (two resources) and Q3's scenarios S31-S33 (three), one interval each, in this order; the
# paper's resources are the ledger's cpu, disk and network.
TABLE6_COLUMNS = ("A12", "A13", "S31", "S32", "S33")
PAPER_RESOURCES = ("cpu", "disk", "network")


def paper_batch(column: str, start_s: int) -> dict[str, object]:
    """One interval of three customers (a VM each) on one host, as the paper's column: a unit
    of resource r is a core-second (cpu) or a megabyte (disk, network) a second of it."""
    if column in Q1:
        use, supply = Q1[column], Q1_SUPPLY
    else:
        use, supply = q3(column)
    units = {"cpu": 1.0, "disk": 1e6, "network": 1e6}
    host = HostSpec(
        "paper",
        cpu_cores=supply[0],
        disk_bytes_per_s=supply[1] * 1e6,
        network_bytes_per_s=(supply[2] if len(supply) > 2 else 1) * 1e6,
    )
    fields = {"cpu": "cpu_s", "disk": "disk_read_bytes", "network": "network_rx_bytes"}
    vms = []
    for k, row in enumerate(use):
        vm = cpu_only(f"paper-vm-{k}", f"paper-{k}", 0.0, vcpus=float(supply[0]))
        for r, amount in zip(PAPER_RESOURCES, row, strict=False):
            vm[fields[r]] = amount * units[r] * INTERVAL_S
        vms.append(vm)
    return batch(host, start_s, vms)


def test_gamma_one_and_zero_give_table6_of_the_paper_through_the_ledger(
    database_url: str,
) -> None:
    """The ledger records the paper's five columns at γ = 0.5; replayed at γ = 1 and γ = 0,
    each interval's GM is Table 6's formula row at that γ, to the digit. The ledger divides by
    its four resources (m = 4): weights of 4/m on the paper's m resources (0 on the others)
    make it the paper's m, a change a what-if makes too."""
    config = make_config(
        database_url,
        {"paper": "operator"},
        accounting={"endowment": "equal", "half_life_s": "none"},
    )
    first = aligned_past(len(TABLE6_COLUMNS) + 1)
    starts = [first + k * INTERVAL_S for k in range(len(TABLE6_COLUMNS))]
    with serving(config) as d:
        for column, start in zip(TABLE6_COLUMNS, starts, strict=True):
            r = httpx.post(
                f"{d.url}/v1/samples", json=paper_batch(column, start), headers=auth("paper")
            )
            assert r.is_success, r.text
        account_due(d.engine, config.accounting)
        who = {name: c for c, name in names(d.engine).items()}
        before = recorded(d.engine)
        got: dict[tuple[str, F], list[float]] = {}
        for gamma in (F(1), F(0)):
            for m, columns in ((2, TABLE6_COLUMNS[:2]), (3, TABLE6_COLUMNS[2:])):
                weights = {r: (4 / m if r in PAPER_RESOURCES[:m] else 0) for r in RESOURCES}
                sets = [f"accounting.gamma={gamma}"] + [
                    f"accounting.weights.{r}={w!r}" for r, w in weights.items()
                ]
                span = (
                    starts[TABLE6_COLUMNS.index(columns[0])],
                    starts[TABLE6_COLUMNS.index(columns[-1])] + INTERVAL_S,
                )
                with d.engine.connect() as conn:
                    result = replay(conn, with_overrides(config, sets), *span, sets)
                for column in columns:
                    g = result.greediness[starts[TABLE6_COLUMNS.index(column)]]
                    got[column, gamma] = [g[who[f"paper-{k}"]] for k in range(3)]
        assert recorded(d.engine) == before
    for (column, gamma), gm in got.items():
        expected = [float(v) for v in table6_formula(column, gamma)]
        np.testing.assert_allclose(gm, expected, rtol=0, atol=1e-12, err_msg=f"{column} γ={gamma}")
    # γ moves only what a customer left to others: at γ = 1 A13 is fair to all (0, 0, 0).
    assert got["A13", F(1)] == pytest.approx([0, 0, 0], abs=1e-12)
    assert got["A12", F(0)] != got["A12", F(1)]


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("accounting.interval_s=30", "a what-if can change accounting.gamma"),
        ("accounting.gamma", "give KEY=VALUE"),
        ("accounting.gamma=2", "gamma"),
        ("accounting.endowment=fair", "endowment"),
        ("enforcement.enter=[0.1]", "enter"),
        ("database.url=x", "a what-if can change"),
        ("enforcement.contended_above.cpu=2", "contended_above"),
        ("enforcement.mode=on", "a what-if can change"),
    ],
)
def test_what_cannot_be_replayed_is_refused_in_one_line(item: str, words: str) -> None:
    with pytest.raises(WhatIfRefused) as refused:
        with_overrides(config_for("sqlite://"), [item])
    message = str(refused.value)
    assert words in message and "\n" not in message, message


ADMIN = Path(sys.executable).with_name("gmd-admin")


def admin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ADMIN), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_gmd_admin_whatif_shows_the_replay_and_refuses_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with grown(url) as (_, engine, from_s, to_s):
        file = tmp_path / "gmd.toml"
        file.write_text(
            toml_document(
                {
                    "database": {"url": url},
                    "accounting": {"interval_s": INTERVAL_S, **ACCOUNTING},
                    "enforcement": ENFORCEMENT,
                }
            )
        )
        span = ("--from", str(from_s), "--to", str(to_s))
        same = admin(file, "whatif", *span, "-f", "json")
        assert same.returncode == 0, same.stderr
        shown = json.loads(same.stdout)
        assert (
            shown["indicators"]["throttle_hours"] == shown["indicators"]["recorded_throttle_hours"]
        )
        assert shown["indicators"]["customers_throttled"] == 1
        higher = admin(
            file,
            "whatif",
            *span,
            "--set",
            "enforcement.enter=[0.15, 10, 100]",
            "--set",
            "enforcement.leave=[0.1, 5, 50]",
        )
        assert higher.returncode == 0, higher.stderr
        assert "What-if" in higher.stdout and "1→2 after" in higher.stdout
        drawn = admin(
            file, "whatif", *span, "--set", "accounting.gamma=1", "--plot", str(tmp_path / "w.png")
        )
        assert drawn.returncode == 0, drawn.stderr
        assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        unknown = admin(file, "whatif", *span, "--plot", str(tmp_path / "w.txt"))
        assert unknown.returncode == 2 and "name the file FILE.png or FILE.svg" in unknown.stderr
        for args, words in (
            (("--set", "accounting.interval_s=30"), "a what-if can change accounting.gamma"),
            (("--set", "accounting.gamma=2"), "gamma"),
            # A value nested past the TOML reader's stack was a 3,000-line traceback.
            (("--set", "enforcement.enter=" + "[" * 5000 + "]" * 5000), "at most 1000"),
            (("--set", "accounting.weights.cpu=1e308"), "accounting.weights.cpu"),
        ):
            refused = admin(file, "whatif", *span, *args)
            assert refused.returncode == 2, refused.stderr
            assert words in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
        # Raw samples of the first intervals purged: the range is refused, naming retention
        # and the oldest interval still kept; from there on it replays.
        with engine.begin() as conn:
            kept = conn.execute(
                sa.text("SELECT id, start_s FROM intervals ORDER BY start_s LIMIT 1 OFFSET 2")
            ).one()
            conn.execute(sa.text("DELETE FROM samples WHERE interval_id < :i"), {"i": kept.id})
        past = admin(file, "whatif", *span)
        assert past.returncode == 2
        assert "past raw retention (retention.raw_days =" in past.stderr, past.stderr
        assert f"kept from the interval of {iso(kept.start_s)}" in past.stderr, past.stderr
        later = admin(file, "whatif", "--from", str(kept.start_s), "--to", str(to_s), "-f", "json")
        assert later.returncode == 0, later.stderr


def test_the_read_api_answers_what_gmd_admin_whatif_prints(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with grown(url) as (_, _, from_s, to_s):
        local = make_config(
            url,
            {CMP1.name: "operator"},
            accounting=ACCOUNTING,
            enforcement=ENFORCEMENT,
            daemon={"bind": "127.0.0.1"},
            read_api={"auth": "local"},
        )
        with serving(local) as d:
            span = {"from": str(from_s), "to": str(to_s)}
            same = httpx.get(f"{d.url}/v1/whatif", params=span)
            assert same.status_code == 200, same.text
            changed = httpx.get(
                f"{d.url}/v1/whatif",
                params={
                    **span,
                    "set": ["enforcement.enter=[0.15, 10, 100]", "enforcement.leave=[0.1, 5, 50]"],
                },
            )
            refused = httpx.get(f"{d.url}/v1/whatif", params={**span, "set": "accounting.gamma=2"})
            bad_time = httpx.get(f"{d.url}/v1/whatif", params={"from": "yesterday-ish"})
            # The operator's web page: a form, then the same replay (the changes a line each).
            standings = httpx.get(f"{d.url}/ui")
            form = httpx.get(f"{d.url}/ui/whatif")
            page = httpx.get(
                f"{d.url}/ui/whatif",
                params={
                    **span,
                    "set": "enforcement.enter=[0.15, 10, 100]\r\nenforcement.leave=[0.1, 5, 50]",
                },
            )
            page_refused = httpx.get(
                f"{d.url}/ui/whatif", params={**span, "set": "accounting.gamma=2"}
            )
        file = tmp_path / "gmd.toml"
        file.write_text(toml_document(local.document))
        printed = json.loads(
            admin(file, "whatif", "--from", str(from_s), "--to", str(to_s), "-f", "json").stdout
        )
    for served, shown in zip(same.json()["customers"], printed["customers"], strict=True):
        assert served == shown
    assert same.json() == printed
    assert changed.json()["indicators"]["throttle_hours"] < printed["indicators"]["throttle_hours"]
    assert refused.status_code == 400
    cli = admin(file, "whatif", "--from", str(from_s), "--set", "accounting.gamma=2")
    # The same words, but for the file each names ("… with --set …: what is wrong").
    words = cli.stderr.strip().split(" with ", 1)[1]
    assert refused.json()["detail"].endswith(words), (refused.json(), words)
    assert bad_time.status_code == 400 and "from:" in bad_time.text
    assert "href='/ui/whatif'" in standings.text
    assert form.status_code == 200 and "<form id='whatif-form'" in form.text
    assert "<table id='whatif'" not in form.text
    assert page.status_code == 200, page.text
    shown = dict(
        re.findall(
            r"<tr data-customer='([^']*)'>.*?data-key='throttle_hours' data-value='([^']*)'",
            page.text,
        )
    )
    served = {r["customer"]: r["throttle_hours"] for r in changed.json()["customers"]}
    assert shown and {c: float(v) for c, v in shown.items()} == served
    for line in changed.json()["summary"]:
        assert html.escape(line) in page.text, line
    # The changes stay in the form, a line each, for the next question.
    assert (
        "enforcement.enter=[0.15, 10, 100]\nenforcement.leave=[0.1, 5, 50]</textarea>" in page.text
    )
    assert page_refused.status_code == 400
    assert html.escape(refused.json()["detail"]) in page_refused.text


def ledger_of(conn: sa.Connection, table: sa.Table, keys: tuple[str, ...]) -> dict[tuple, dict]:
    """Every row of ``table`` by its key columns."""
    return {
        tuple(r[k] for k in keys): dict(r)
        for r in (row._mapping for row in conn.execute(sa.select(table)))
    }


def test_no_override_reproduces_a_demo_ledger_row_by_row(database_url: str, tmp_path: Path) -> None:
    """A ledger grown by the demo's replay (real agents and daemon, Bitbrains traces, levels
    decided in dry-run), replayed with no override: every row accounting wrote (balances,
    greediness, GM terms per resource, DirectContr utility, contribution and priority) and the
    levels in force, interval by interval, are the replay's."""
    from gmd.admin import demo
    from gmd.daemon.config import load
    from gmd.ledger_schema import migrate, tables

    root = tmp_path / "demo"
    figures = demo.run(
        root,
        vms="1-4,41-46,54-57",
        hosts=2,
        days=1,
        cores_per_host=16,
        out=io.StringIO(),
        database_url=database_url,
    )
    config = load(root / "gmd.toml")
    engine = migrate.engine_for(config.database_url)
    try:
        with engine.connect() as conn:
            span = conn.execute(
                sa.text(
                    "SELECT min(start_s), max(start_s) FROM intervals WHERE state = 'accounted'"
                )
            ).one()
            result = replay(conn, config, span[0], span[1] + 1, keep_rows=True)
            starts = {
                int(i): int(s)
                for i, s in conn.execute(sa.text("SELECT id, start_s FROM intervals"))
            }
            recorded = [
                ledger_of(conn, tables.customer_ledger, ("interval_id", "customer_id")),
                ledger_of(conn, tables.resource_ledger, ("interval_id", "customer_id", "resource")),
                ledger_of(conn, tables.organization_ledger, ("interval_id", "organization_id")),
            ]
    finally:
        engine.dispose()
    assert result.intervals == figures["intervals"] > 0, figures
    replayed: list[dict[tuple, dict]] = [{}, {}, {}]
    for rows in result.rows.values():
        for kept, written, keys in zip(
            replayed,
            (rows.customers, rows.resources, rows.organizations),
            (
                ("interval_id", "customer_id"),
                ("interval_id", "customer_id", "resource"),
                ("interval_id", "organization_id"),
            ),
            strict=True,
        ):
            kept.update({tuple(r[k] for k in keys): r for r in written})
    for kept, ledger in zip(replayed, recorded, strict=True):
        assert kept.keys() == ledger.keys()
        for key, row in kept.items():
            for column, value in row.items():
                expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-12)
                assert ledger[key][column] == expected, (
                    iso(starts[key[0]]),
                    key,
                    column,
                )
    # The levels in force, interval by interval; the demo's customers did change level.
    assert any(result.recorded_levels.values())
    for start in result.levels:
        assert result.levels[start] == result.recorded_levels.get(start, {}), iso(start)
    assert sum(len(e.replayed) for e in result.customers.values()) > 0


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("enforcement.enter=" + "[" * 5000 + "]" * 5000, "at most 1000"),
        ("enforcement.enter=" + "[" * 400 + "1" + "]" * 400, "enter"),
        ("accounting.weights.cpu=1e308", "accounting.weights.cpu"),
    ],
    ids=["deep", "nested", "overflowing-weight"],
)
def test_hostile_settings_are_refused_in_one_line(item: str, words: str) -> None:
    """A value nested thousands deep made tomllib recurse past Python's stack (a 500 with a
    3,000-line traceback); a weight of 1e308 made every balance NaN, counted as throttled."""
    with pytest.raises(WhatIfRefused) as refused:
        with_overrides(config_for("sqlite://"), [item])
    message = str(refused.value)
    assert words in message and "\n" not in message and len(message) < 2000, message


def test_a_replay_stops_when_told_and_past_its_interval_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with grown(url) as (_, engine, from_s, to_s), engine.connect() as conn:
        config = config_for(url)
        asked: list[int] = []

        def stop() -> str | None:
            asked.append(1)
            return "its client has gone" if len(asked) > 2 else None

        with pytest.raises(WhatIfStopped, match=r"after 2 of its .* intervals: its client"):
            replay(conn, config, from_s, to_s, stop=stop)
        with pytest.raises(WhatIfRefused, match=r"at most 2 \(\[read_api\] whatif_max_intervals"):
            replay(conn, config, from_s, to_s, max_intervals=2)


def test_the_read_api_bounds_a_what_if_in_time_and_refuses_hostile_settings(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with grown(url) as (_, _, from_s, to_s):
        local = make_config(
            url,
            {CMP1.name: "operator"},
            accounting=ACCOUNTING,
            enforcement=ENFORCEMENT,
            daemon={"bind": "127.0.0.1"},
            read_api={"auth": "local", "whatif_max_s": 1},
        )
        with serving(local) as d:
            span = {"from": str(from_s), "to": str(to_s)}
            deep = "enforcement.enter=" + "[" * 5000 + "]" * 5000
            nested = httpx.get(f"{d.url}/v1/whatif", params={**span, "set": deep}, timeout=30)
            assert nested.status_code == 400, nested.text[:500]
            assert "at most 1000 characters" in nested.json()["detail"]
            huge = httpx.get(
                f"{d.url}/v1/whatif", params={**span, "set": "accounting.weights.cpu=1e308"}
            )
            assert huge.status_code == 400 and "weights.cpu" in huge.json()["detail"]
            # A budget of 1 s against a replay made to take longer (a clock past it).
            services = d.app.state.services
            services.config = dataclasses.replace(
                services.config,
                read_api=dataclasses.replace(services.config.read_api, whatif_max_s=0.0),
            )
            spent = httpx.get(f"{d.url}/v1/whatif", params=span, timeout=30)
            assert spent.status_code == 503, spent.text
            assert "whatif_max_s = 0 s" in spent.json()["detail"]


def test_a_what_if_whose_client_has_gone_stops_at_its_next_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each interval's raw samples take 0.3 s to read here (a long range, made so on demand):
    the client gives up after 0.5 s, and the replay stops within an interval or two of the
    daemon's noticing, instead of replaying every interval for nobody."""
    from gmd.daemon.reports import whatif

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    read = whatif.read_raw_interval
    reads: list[int] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        time.sleep(0.3)
        return read(*args, **kwargs)

    with grown(url) as (_, _, from_s, to_s):
        local = make_config(
            url,
            {CMP1.name: "operator"},
            accounting=ACCOUNTING,
            enforcement=ENFORCEMENT,
            daemon={"bind": "127.0.0.1"},
            read_api={"auth": "local"},
        )
        monkeypatch.setattr(whatif, "read_raw_interval", slow)
        with serving(local) as d, caplog.at_level("INFO", logger="gmd.daemon.api.read"):
            with pytest.raises(httpx.ReadTimeout):
                httpx.get(f"{d.url}/v1/whatif", params={"from": from_s, "to": to_s}, timeout=0.5)
            deadline = time.monotonic() + 30
            while "its client has gone" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.1)
    assert "stopped after" in caplog.text
    assert len(reads) < BUSY + IDLE, "the replay went on after its client left"
