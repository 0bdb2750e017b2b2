"""gmd-admin plot on a ledger built through the daemon from samples worked out by hand.

One 2-core host (120 core-seconds per 60 s interval), equal endowments, γ = 0.5, no decay,
m = 4 resources of which only CPU is used (see tests/unit/daemon/reports/test_standings.py for the
arithmetic):

- intervals 1–4: alpha's VM uses 90, beta's 30: G_alpha = 30/(4·60) = +0.125,
  G_beta = −0.5·30/240 = −0.0625;
- intervals 5–8: the other way round: G_alpha = −0.0625, G_beta = +0.125;
- interval 9: gamma joins (shares 40): alpha 40 (G 0), beta 30 (ceded 10, all of it used:
  G = −0.5·10/160 = −0.03125), gamma 50 (G = 10/160 = +0.0625).

Thresholds enter (0.2, 0.4, 0.8), leave (0.1, 0.3, 0.6), no dwell, one step per decision:
alpha (0.125, 0.25, …, 0.5, then down to 0.25) goes 0→1 after interval 2, 1→2 after 4 and
2→1 after 8 (0.25 < leave 0.3); beta reaches 0.25 after interval 8 and goes 0→1; gamma has no
row before interval 9 (a zero standing) and stays at level 0.
"""

from __future__ import annotations

import itertools
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import matplotlib.image
import numpy as np
import pytest
import sqlalchemy as sa
from click.testing import Result
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from typer.testing import CliRunner

from gmd.admin.cli import app
from gmd.daemon.config import Config
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.lookup import UnknownCustomer
from gmd.daemon.reports import plot
from gmd.daemon.reports.plot import decided_in
from gmd.daemon.reports.series import CustomerSeries, EmptyRange, LevelSteps, collect
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

HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
A, B, C = "proj-alpha", "proj-beta", "proj-gamma"
# A second host where two customers use exactly their equal shares: GM 0, balance 0 and level
# 0 throughout, so that their lines coincide (only in the ledger that asks for them).
QUIET_HOST = HostSpec("cmp-2", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
D, E = "proj-delta", "proj-epsilon"
ENFORCEMENT = {
    "mode": "dry-run",
    "enter": [0.2, 0.4, 0.8],
    "leave": [0.1, 0.3, 0.6],
    "dwell_s": 0,
    "max_step": 1,
    "weight_factors": [0.5, 0.25, 0.1],
    "cap_level": 2,
    "cpu_cap_fractions": [1.0, 0.75, 0.5],
}
# core-seconds per interval: (alpha, beta, gamma); None: no VM
USE: list[tuple[float, float, float | None]] = [(90, 30, None)] * 4 + [(30, 90, None)] * 4
USE.append((40, 30, 50))
BALANCE = {
    A: [0.125, 0.25, 0.375, 0.5, 0.4375, 0.375, 0.3125, 0.25, 0.25],
    B: [-0.0625, -0.125, -0.1875, -0.25, -0.125, 0.0, 0.125, 0.25, 0.21875],
    C: [0.0] * 8 + [0.0625],
}
GREEDINESS = {
    A: [0.125] * 4 + [-0.0625] * 4 + [0.0],
    B: [-0.0625] * 4 + [0.125] * 4 + [-0.03125],
    C: [0.0] * 8 + [0.0625],
}
# (interval number after which it was decided, level after)
CHANGES = {A: [(2, 1), (4, 2), (8, 1)], B: [(8, 1)], C: []}


@dataclass(frozen=True)
class Ledger:
    config: Config
    starts: list[int]

    def end(self, k: int) -> float:
        """End of interval k (1-based): when the level decided after it takes effect."""
        return float(self.starts[k - 1] + INTERVAL_S)


def build(database_url: str, *, quiet_pair: bool = False, **enforcement: object) -> Ledger:
    """The ledger of the module's doc; with ``quiet_pair``, also D and E on QUIET_HOST, each
    using exactly its share (60 of 120 core-seconds) in every interval."""
    hosts = {HOST.name: "operator"} | ({QUIET_HOST.name: "operator"} if quiet_pair else {})
    config = make_config(
        database_url,
        hosts,
        accounting={"endowment": "equal", "half_life_s": "none"},
        enforcement={**ENFORCEMENT, **enforcement},
    )
    first = aligned_past(len(USE) + 1)
    starts = [first + k * INTERVAL_S for k in range(len(USE))]
    with serving(config) as d:
        for start, (a, b, c) in zip(starts, USE, strict=True):
            vms = [cpu_only("vm-a", A, a), cpu_only("vm-b", B, b)]
            if c is not None:
                vms.append(cpu_only("vm-c", C, c))
            r = httpx.post(
                f"{d.url}/v1/samples", json=batch(HOST, start, vms), headers=auth(HOST.name)
            )
            assert r.is_success, r.text
            if quiet_pair:
                quiet = [cpu_only("vm-d", D, 60.0), cpu_only("vm-e", E, 60.0)]
                r = httpx.post(
                    f"{d.url}/v1/samples",
                    json=batch(QUIET_HOST, start, quiet),
                    headers=auth(QUIET_HOST.name),
                )
                assert r.is_success, r.text
        account_due(
            d.engine,
            config.accounting,
            now_s=starts[-1] + INTERVAL_S,
            after=after_interval(config.enforcement),
        )
    return Ledger(config, starts)


def ledger_rows(engine: sa.Engine, table: str, value: str) -> dict[tuple[object, ...], float]:
    """(customer, interval start) → value, straight from a ledger table."""
    extra = ", r.resource" if table == "customer_resource_ledger" else ""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT c.name, i.start_s, r.{value}{extra} FROM {table} r"
                " JOIN customers c ON c.id = r.customer_id"
                " JOIN intervals i ON i.id = r.interval_id"
            )
        ).all()
    return {(r[0], r[1], *r[3:]): r[2] for r in rows}


def test_series_are_the_ledger_rows(database_url: str) -> None:
    ledger = build(database_url)
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            data = collect(conn, customers=[A, B, C])
            top2 = collect(conn, top=2)
            top5 = collect(conn)
            window = collect(conn, customers=[A], from_s=ledger.starts[3], to_s=ledger.starts[8])
            with pytest.raises(UnknownCustomer, match="'nobody'"):
                collect(conn, customers=[A, "nobody"])
            with pytest.raises(EmptyRange):
                collect(conn, from_s=946684800, to_s=946771200)
        balance = ledger_rows(engine, "customer_ledger", "balance")
        greediness = ledger_rows(engine, "customer_ledger", "greediness")
        terms = ledger_rows(engine, "customer_resource_ledger", "term")
        with engine.connect() as conn:
            actions = conn.execute(
                sa.text(
                    "SELECT c.name, i.start_s + i.length_s, a.after, a.dry_run"
                    " FROM enforcement_actions a JOIN customers c ON c.id = a.customer_id"
                    " JOIN intervals i ON i.id = a.interval_id WHERE a.kind = 'level'"
                    " ORDER BY i.start_s, a.id"
                )
            ).all()
    finally:
        engine.dispose()

    line = data.timeline
    assert line.start_s.tolist() == ledger.starts
    assert line.end_s.tolist() == [s + INTERVAL_S for s in ledger.starts]
    assert data.customers == (A, B, C) and data.chosen_by == "customer"
    bal = data.balances
    for i, name in enumerate(data.customers):
        # exactly the ledger's numbers where it has a row, 0 where it has none
        expected = [balance.get((name, s), 0.0) for s in ledger.starts]
        assert bal.balance[i].tolist() == expected
        assert bal.present[i].tolist() == [(name, s) in balance for s in ledger.starts]
        assert bal.greediness[i].tolist() == [greediness.get((name, s), 0.0) for s in ledger.starts]
        # and those are the numbers worked out by hand
        np.testing.assert_allclose(bal.balance[i], BALANCE[name], rtol=0, atol=1e-12)
        np.testing.assert_allclose(bal.greediness[i], GREEDINESS[name], rtol=0, atol=1e-12)
    assert bal.present[2].tolist() == [False] * 8 + [True]  # gamma: no row, a zero standing
    np.testing.assert_array_equal(bal.scores(0.0), bal.balance)

    # levels: the changes of the enforcement log, at the end of the interval decided after
    by_name = {s.customer: s for s in data.levels}
    for name in (A, B, C):
        steps = by_name[name]
        logged = [(t, json.loads(after)["level"]) for n, t, after, _ in actions if n == name]
        assert list(zip(steps.change_s.tolist(), steps.level.tolist(), strict=True)) == logged
        assert logged == [(ledger.end(k), lv) for k, lv in CHANGES[name]]
        assert steps.initial == 0 and steps.dry_run.all() and steps.dry_run.size == len(logged)
    assert all(bool(a[3]) for a in actions)
    assert by_name[A].at(line.end_s).tolist() == [0, 1, 1, 2, 2, 2, 2, 1, 1]
    assert by_name[B].at(line.end_s).tolist() == [0] * 7 + [1, 1]
    t, lv = by_name[A].steps(float(line.start_s[0]), float(line.end_s[-1]))
    corners = [ledger.starts[0], *(ledger.end(k) for k in (2, 4, 8, 9))]
    assert t.tolist() == corners
    assert lv.tolist() == [0, 1, 2, 1, 1]

    # per-resource terms: the ledger's rows; only CPU was used, so it carries all the GM
    res = data.resources
    assert res.resources == ("cpu", "memory", "disk", "network")
    for i, name in enumerate(data.customers):
        for k, r in enumerate(res.resources):
            assert res.terms[i, k].tolist() == [terms.get((name, s, r), 0.0) for s in ledger.starts]
        np.testing.assert_allclose(res.of(name)[0], GREEDINESS[name], rtol=0, atol=1e-12)
        assert not res.of(name)[1:].any()

    # top N by the balance after the range's last interval: 0.25, 0.21875, 0.0625
    assert top2.customers == (A, B) and top2.chosen_by == "top 2"
    assert top5.customers == (A, B, C)

    # a window: intervals 4..8; the level set before it (1, after interval 2) is the initial one
    assert window.timeline.start_s.tolist() == ledger.starts[3:8]
    np.testing.assert_allclose(window.balances.balance[0], BALANCE[A][3:8], rtol=0, atol=1e-12)
    (steps,) = window.levels
    assert steps.initial == 1
    assert steps.change_s.tolist() == [ledger.end(4), ledger.end(8)]
    assert steps.level.tolist() == [2, 1]


@pytest.fixture(scope="module")
def sqlite_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Ledger, Path]:
    """One SQLite ledger for the drawing and CLI tests, with its gmd.toml."""
    base = tmp_path_factory.mktemp("plot")
    url = f"sqlite:///{base / 'ledger.db'}"
    ledger = build(url)
    toml = base / "gmd.toml"
    lists = {k: v for k, v in ENFORCEMENT.items() if isinstance(v, list)}
    toml.write_text(
        f'[database]\nurl = "{url}"\n[enforcement]\nmode = "dry-run"\n'
        + "".join(f"{k} = {v}\n" for k, v in lists.items())
        + "dwell_s = 0\ncap_level = 2\n"
    )
    return ledger, toml


def _series(ledger: Ledger, customers: list[str]) -> CustomerSeries:
    engine = sa.create_engine(ledger.config.database_url)
    try:
        with engine.connect() as conn:
            return collect(conn, customers=customers)
    finally:
        engine.dispose()


def test_the_figure_draws_the_series_and_the_thresholds(
    sqlite_ledger: tuple[Ledger, Path], tmp_path: Path
) -> None:
    ledger, _ = sqlite_ledger
    data = _series(ledger, customers=[A, B, C])
    policy = ledger.config.enforcement.policy
    fig = plot.draw(data, policy, "dry-run")
    ax_bal, ax_lvl, ax_res = fig.axes[:3]

    lines = {ln.get_label(): ln for ln in ax_bal.get_lines()}
    for k, (enter, leave) in enumerate(zip(policy.enter, policy.leave, strict=True), start=1):
        assert list(lines[f"level {k} enter"].get_ydata()) == [enter, enter]
        assert list(lines[f"level {k} leave"].get_ydata()) == [leave, leave]
    assert [enter for enter in policy.enter] == [0.2, 0.4, 0.8]
    for name in (A, B, C):
        np.testing.assert_allclose(lines[name].get_ydata(), BALANCE[name], rtol=0, atol=1e-12)
    assert not any(label.endswith(" score") for label in lines)
    assert "priority" not in ax_bal.get_title()
    assert fig.get_suptitle().endswith("\n3 customers, named")

    levels = {ln.get_label(): ln for ln in ax_lvl.get_lines()}
    # gamma never leaves level 0: one line for the customers that stay put, naming them
    assert set(levels) == {f"{A} (dry-run)", f"{B} (dry-run)", f"level 0 throughout: {C}"}
    assert list(levels[f"{A} (dry-run)"].get_ydata()) == [0, 1, 2, 1, 1]
    assert levels[f"{A} (dry-run)"].get_drawstyle() == "steps-post"
    assert list(levels[f"level 0 throughout: {C}"].get_ydata()) == [0, 0]
    assert "dry-run" in ax_lvl.get_title()

    breakdown = {ln.get_label(): ln for ln in ax_res.get_lines()}
    assert {"cpu", "memory", "disk", "network", "sum (interval GM)"} <= set(breakdown)
    np.testing.assert_allclose(breakdown["cpu"].get_ydata(), GREEDINESS[A], rtol=0, atol=1e-12)
    assert A in ax_res.get_title()

    png, svg = tmp_path / "p.png", tmp_path / "p.svg"
    plot.save(fig, png)
    plot.save(fig, svg)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    texts = {
        "".join(e.itertext()).strip()
        for e in ET.parse(svg).getroot().iter()
        if e.tag.endswith("}text")
    }
    assert {A, f"{B} (dry-run)", C, "level 1 enter", "level 3 leave", "cpu"} <= texts
    assert f"level 0 throughout: {C}" in texts


def test_priority_weight_is_named_and_its_score_drawn(sqlite_ledger: tuple[Ledger, Path]) -> None:
    ledger, _ = sqlite_ledger
    data = _series(ledger, customers=[A])
    policy = replace(ledger.config.enforcement.policy, priority_weight=0.5)
    fig = plot.draw(data, policy, "on")
    ax_bal, ax_lvl = fig.axes[:2]
    assert "priority_weight" in ax_bal.get_title() and "0.5" in ax_bal.get_title()
    lines = {ln.get_label(): ln for ln in ax_bal.get_lines()}
    expected = data.balances.balance[0] - 0.5 * data.balances.priority[0]
    np.testing.assert_array_equal(lines[f"{A} score"].get_ydata(), expected)
    # The record's own mode, whatever today's (drawn with "on": A's changes were dry-run).
    assert ax_lvl.get_title() == f"Throttle level ({decided_in(data, 'on')})"
    assert "decided in dry-run" in ax_lvl.get_title()


# --- the plot as a picture ----------------------------------------------------------------

CLEAR = 0.3
"""The least distance, in RGB with channels in [0, 1], at which two lines read as different."""


def distance(a: object, b: object) -> float:
    return float(np.linalg.norm(np.array(to_rgb(a)) - np.array(to_rgb(b))))


def drawn(ax: Axes) -> list[Line2D]:
    """The lines of a panel that stand for something (the rest are labelled "_…")."""
    return [ln for ln in ax.get_lines() if not str(ln.get_label()).startswith("_")]


def named(label: str) -> list[str]:
    """The customers a legend entry stands for: its own name, or the list after the colon of
    a line several customers share ("at 0: a, b", "level 0 throughout: a, b")."""
    label = label.replace("\n", " ").removesuffix(" (dry-run)")
    return label.split(": ", 1)[1].split(", ") if ": " in label else [label]


def panel(img: np.ndarray, ax: Axes) -> np.ndarray:
    """The pixels inside a panel's frame (a PNG saved at the figure's dpi), RGB."""
    box = ax.get_window_extent()
    height = img.shape[0]
    top, bottom = round(height - box.y1) + 3, round(height - box.y0) - 3
    return img[top:bottom, round(box.x0) + 3 : round(box.x1) - 3, :3]


def pixels_of(pixels: np.ndarray, color: object, tol: float = 0.04) -> int:
    """How many pixels show ``color`` itself (each channel within ``tol``)."""
    return int((np.abs(pixels - np.array(to_rgb(color))).max(axis=-1) <= tol).sum())


@pytest.fixture(scope="module")
def quiet_ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    """The module's ledger with D and E beside it, both at balance 0 and level 0 throughout."""
    return build(f"sqlite:///{tmp_path_factory.mktemp('quiet') / 'ledger.db'}", quiet_pair=True)


def picture(ledger: Ledger, path: Path, **chosen: object) -> tuple[Figure, np.ndarray]:
    """The figure of ``gmd-admin plot`` for ``chosen`` (collect's arguments), saved as a PNG
    and read back as pixels."""
    engine = sa.create_engine(ledger.config.database_url)
    try:
        with engine.connect() as conn:
            data = collect(conn, **chosen)  # type: ignore[arg-type]
    finally:
        engine.dispose()
    fig = plot.draw(data, ledger.config.enforcement.policy, "dry-run")
    plot.save(fig, path)
    img = matplotlib.image.imread(path)
    w, h = fig.get_size_inches() * fig.dpi
    assert img.shape[:2] == (round(h), round(w))  # saved at the dpi the layout was made for
    return fig, img


def test_the_picture_keeps_customers_thresholds_and_coinciding_lines_apart(
    quiet_ledger: Ledger, tmp_path: Path
) -> None:
    """Rendered from a real ledger where D and E coincide (balance 0, level 0 all along) and
    gamma stays at level 0: customers and thresholds differ clearly in colour, on the objects
    and in the pixels; no customer is hidden under another; the legend has an entry per
    line; the title counts the customers drawn, not the --top asked for."""
    fig, img = picture(quiet_ledger, tmp_path / "quiet.png", top=10)
    ax_bal, ax_lvl, ax_res = fig.axes[:3]
    policy = quiet_ledger.config.enforcement.policy
    everyone = {A, B, C, D, E}

    thresholds = [ln for ln in drawn(ax_bal) if str(ln.get_label()).startswith("level ")]
    customers = [ln for ln in drawn(ax_bal) if ln not in thresholds]
    assert len(thresholds) == 2 * policy.levels
    for ln, other in itertools.product(customers, thresholds):
        gap = distance(ln.get_color(), other.get_color())
        assert gap >= CLEAR, (ln.get_label(), other.get_label(), gap)
    for ln, other in itertools.combinations(customers, 2):
        gap = distance(ln.get_color(), other.get_color())
        assert gap >= CLEAR, (ln.get_label(), other.get_label(), gap)

    title = fig.get_suptitle()
    count = re.search(r"\n(\d+) customers?\b", title)
    assert count is not None, title
    assert "(--top 10 asked)" in title  # five have a standing at the end, ten were asked for

    for ax in (ax_bal, ax_lvl):
        lines = drawn(ax)
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == [ln.get_label() for ln in lines]
        shown = [
            name
            for ln in lines
            if not str(ln.get_label()).startswith("level ") or ax is ax_lvl
            for name in named(str(ln.get_label()))
        ]
        # each customer drawn once, on its own line or named on the one it shares
        assert sorted(shown) == sorted(everyone) and int(count[1]) == len(shown), shown
        pixels = panel(img, ax)
        for ln in lines:
            seen = pixels_of(pixels, ln.get_color())
            assert seen >= 20, f"{ln.get_label()!r} ({ln.get_color()}): {seen} pixels"
    assert drawn(ax_res) and ax_res.get_legend() is not None

    # the coinciding customers share one line, which says so: at balance 0, and at level 0
    balance_labels = [str(ln.get_label()) for ln in customers]
    assert f"at 0: {D}, {E}" in [label.replace("\n", " ") for label in balance_labels]
    level_labels = [str(ln.get_label()).replace("\n", " ") for ln in drawn(ax_lvl)]
    assert f"level 0 throughout: {C}, {D}, {E}" in level_labels


def test_the_title_counts_what_is_drawn(sqlite_ledger: tuple[Ledger, Path], tmp_path: Path) -> None:
    ledger, _ = sqlite_ledger
    for chosen, ending in (
        ({"top": 2}, "\n2 customers: the top 2 by balance at the end"),
        ({"top": 10}, "\n3 customers: all with a standing at the end (--top 10 asked)"),
        ({"customers": [B]}, "\n1 customer, named"),
    ):
        fig, _ = picture(ledger, tmp_path / "t.png", **chosen)
        assert fig.get_suptitle().endswith(ending), fig.get_suptitle()


def test_the_palette_keeps_clear_of_thresholds_and_itself() -> None:
    """Whatever the number of levels, every customer colour is clearly apart from every
    threshold grey, from the shared-line black and from the other customers' colours; past the
    palette's end, the colours come round again in another line style."""
    colors = plot.CUSTOMER_COLORS
    for a, b in itertools.combinations(colors, 2):
        assert distance(a, b) >= CLEAR, (a, b)
    for levels in range(1, 9):
        greys = [plot.threshold_grey(k, levels) for k in range(1, levels + 1)]
        for color, grey in itertools.product((*colors, plot.GROUP_COLOR), greys):
            assert distance(color, grey) >= CLEAR, (color, grey, levels)
    styles = [plot.customer_style(i) for i in range(2 * len(colors))]
    assert len({(s["color"], s["ls"]) for s in styles}) == len(styles)
    assert {s["ls"] for s in styles[len(colors) :]} == {"-."}


def test_identical_series_are_grouped_in_order() -> None:
    rows = np.array([[0.0, 0.0], [1.0, 2.0], [-0.0, 0.0], [1.0, 2.0], [1.0, 2.5]])
    assert plot.identical(rows) == [(0, 2), (1, 3), (4,)]


def test_output_format_comes_from_the_suffix() -> None:
    assert plot.output_format(Path("x.PNG")) == "png"
    assert plot.output_format(Path("dir/x.svg")) == "svg"
    for bad in ("x.pdf", "x", "x.png.txt"):
        with pytest.raises(ValueError, match=r"FILE\.png or FILE\.svg"):
            plot.output_format(Path(bad))


def test_cli_writes_pictures_and_fails_clearly(
    sqlite_ledger: tuple[Ledger, Path], tmp_path: Path
) -> None:
    ledger, toml = sqlite_ledger
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(app, ["--config", str(toml), "plot", *args])

    png = tmp_path / "top.png"
    ok = run("-o", str(png))
    assert ok.exit_code == 0, ok.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert A in ok.stdout and str(png) in ok.stdout

    svg = tmp_path / "two.svg"
    since = str(ledger.starts[4])
    ok = run("--customer", C, "--customer", B, "--from", since, "-o", str(svg))
    assert ok.exit_code == 0, ok.output
    text = svg.read_text()
    ET.fromstring(text)
    assert C in text and B in text and A not in text and "level 2 enter" in text

    bad_suffix = run("--customer", A, "-o", str(tmp_path / "p.pdf"))
    assert bad_suffix.exit_code == 2 and "FILE.png or FILE.svg" in bad_suffix.stderr
    unknown = run("--customer", "nobody", "-o", str(tmp_path / "u.png"))
    assert unknown.exit_code == 3 and "'nobody'" in unknown.stderr
    empty = run("--from", "2000-01-01", "--to", "2000-01-02", "-o", str(tmp_path / "e.png"))
    assert empty.exit_code == 3 and "no accounted interval" in empty.stderr
    backwards = run("--from", "now", "--to", "now-1d", "-o", str(tmp_path / "b.png"))
    assert backwards.exit_code == 2
    bad_time = run("--from", "yesterday", "-o", str(tmp_path / "t.png"))
    assert bad_time.exit_code == 2 and "'yesterday' is not a time" in bad_time.stderr
    both = run("--customer", A, "--top", "2", "-o", str(tmp_path / "c.png"))
    assert both.exit_code == 2
    assert not any((tmp_path / f).exists() for f in ("p.pdf", "u.png", "e.png", "b.png"))

    helped = runner.invoke(app, ["plot", "--help"])
    assert helped.exit_code == 0
    for option in ("--from", "--to", "--customer", "--top", "--output", "-o"):
        assert option in helped.stdout


def test_levels_fall_back_to_the_current_level_when_the_log_is_gone(
    sqlite_ledger: tuple[Ledger, Path], tmp_path: Path
) -> None:
    """A ledger whose enforcement log was pruned still shows each customer's current level,
    from when it was set (``customer_levels.since_s``)."""
    import shutil

    ledger, _ = sqlite_ledger
    source = Path(ledger.config.database_url.removeprefix("sqlite:///"))
    copy = tmp_path / "pruned.db"
    shutil.copy(source, copy)
    engine = sa.create_engine(f"sqlite:///{copy}")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM enforcement_actions"))
        with engine.connect() as conn:
            whole = collect(conn, customers=[A, B, C])
            late = collect(conn, customers=[A], from_s=ledger.starts[8])
    finally:
        engine.dispose()
    steps = {s.customer: s for s in whole.levels}
    # alpha is at 1 since the end of interval 8, beta too; gamma never left 0
    for name in (A, B):
        assert steps[name].initial == 0
        assert steps[name].change_s.tolist() == [ledger.end(8)]
        assert steps[name].level.tolist() == [1]
    assert steps[C].change_s.size == 0 and steps[C].initial == 0
    assert late.levels[0].initial == 1 and late.levels[0].change_s.size == 0


def test_names_are_text_and_alike_names_are_told_apart(
    sqlite_ledger: tuple[Ledger, Path], tmp_path: Path
) -> None:
    """A project name with matplotlib's math markup is drawn as it is written (it made the
    figure raise: gmd-admin plot exited 1, the read API's plot.svg answered 500), by name and
    in every --top N that holds it; two projects of one name get one legend entry each, told
    apart by their uuids' start; the command lists the customers as the legend names them."""
    import shutil

    ledger, toml = sqlite_ledger
    copy = tmp_path / "named.db"
    shutil.copy(Path(ledger.config.database_url.removeprefix("sqlite:///")), copy)
    engine = sa.create_engine(f"sqlite:///{copy}")
    markup = r"$x^$ team \$5"
    try:
        with engine.begin() as conn:
            rename = sa.text("UPDATE customers SET display_name = :shown WHERE name = :uuid")
            conn.execute(rename, [{"shown": markup, "uuid": A}])
            conn.execute(rename, [{"shown": "twin", "uuid": B}, {"shown": "twin", "uuid": C}])
    finally:
        engine.dispose()
    config = tmp_path / "gmd.toml"
    config.write_text(toml.read_text().replace(ledger.config.database_url, f"sqlite:///{copy}"))
    runner = CliRunner()
    twins = {f"twin ({B[:8]})", f"twin ({C[:8]})"}
    for args in ((), ("--top", "1"), ("--customer", markup)):
        svg = tmp_path / f"plot{len(args)}.svg"
        done = runner.invoke(app, ["--config", str(config), "plot", *args, "-o", str(svg)])
        assert done.exit_code == 0, (args, done.output)
        texts = {
            "".join(e.itertext()).strip()
            for e in ET.parse(svg).getroot().iter()
            if e.tag.endswith("}text")
        }
        assert f"{markup} (dry-run)" in texts, texts
        assert f"Per-resource terms of {markup}'s interval greediness (> 0: took more than" in (
            " ".join(texts)
        )
        assert f"{svg}: {markup}" in done.stdout and A not in done.stdout
        if not args:
            assert twins <= texts and "twin" not in texts
            for label in twins:
                assert label in done.stdout
            assert B not in done.stdout.replace(f"({B[:8]})", "")


def test_the_level_panel_names_the_modes_the_range_was_decided_in() -> None:
    """A range that ran dry-run, then on, was titled with today's mode alone."""

    def steps(*dry: bool) -> LevelSteps:
        n = len(dry)
        return LevelSteps(
            "c", 0, np.arange(n, dtype=float), np.ones(n, dtype=int), np.array(dry, dtype=bool)
        )

    def series(*levels: LevelSteps) -> Any:
        return SimpleNamespace(levels=list(levels))

    assert decided_in(series(steps(True), steps(True, True)), "on") == (
        "decided in dry-run: levels decided and recorded, not applied"
    )
    assert "decided in on:" in decided_in(series(steps(False)), "dry-run")
    both = decided_in(series(steps(True, False)), "on")
    assert "dry-run" in both and "on (applied)" in both
    assert decided_in(series(steps()), "dry-run").startswith(
        "no change in the range; enforcement.mode = dry-run"
    )
