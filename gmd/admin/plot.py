"""Drawing customers' standings over time (``gmd-admin plot``): a picture an operator can show.

Three panels share one UTC time axis:

1. **Balance** of each customer after each interval, with the ``[enforcement]`` thresholds as
   horizontal lines ("level k enter" solid, "level k leave" dashed, one shade per level), so
   that one sees how far each customer is from being throttled and why it was. When
   ``priority_weight`` is set, the thresholds compare the *score* (balance − weight ×
   DirectContr priority), which is then drawn too (dotted) and named in the title.
2. **Throttle level** of each customer, a step function rebuilt from the enforcement log.
   Dry-run levels are drawn like applied ones (they are what gmd decided) and marked in the
   legend and the title. Overlapping customers stay visible: earlier ones are drawn wider.
3. **Per-resource breakdown** of the *first* customer (the greatest final balance when chosen
   by ``--top``, else the first ``--customer``): one line per resource term of its interval
   greediness, over their sum (its interval GM) drawn wide and pale. One customer, because the
   terms are signed (a customer that cedes memory while taking CPU has one negative and one
   positive term): stacking them, or summing over customers who offset each other, would hide
   exactly what the panel is for — which resources made this customer greedy, and when.

The drawing uses :class:`matplotlib.figure.Figure` directly, never pyplot: no display, no
global figure registry, so it is safe in threads and servers. Only saving SVG touches global
state (``svg.fonttype``, so that names stay searchable text), for the duration of the save.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import matplotlib
import matplotlib.dates as mdates
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gmd.admin.series import CustomerSeries
from gmd.common.timespec import iso
from gmd.fairness.policy import ThrottlePolicy

FORMATS: dict[str, str] = {".png": "png", ".svg": "svg"}
_PALETTE = matplotlib.colormaps["tab10"]
_THRESHOLD_COLORS = matplotlib.colormaps["autumn_r"]
# Markers help on short ranges, where each interval is a visible step; on long ones they blur.
_MARKERS_UP_TO = 60


def output_format(path: Path) -> str:
    """ "png" or "svg" from the file's suffix; ValueError says which suffixes work."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"{path}: cannot tell the picture format from {path.suffix or 'no suffix'!r};"
            " name the file FILE.png or FILE.svg"
        )
    return fmt


def _dates(seconds: np.ndarray) -> np.ndarray:
    """Unix seconds → datetime64 (UTC), which matplotlib places on a date axis."""
    return np.round(np.asarray(seconds, dtype=np.float64)).astype(np.int64).astype("datetime64[s]")


def _color(i: int) -> tuple[float, float, float, float]:
    return _PALETTE(i % _PALETTE.N)


def _legend(ax: Axes) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def draw(data: CustomerSeries, policy: ThrottlePolicy, mode: str) -> Figure:
    """The three panels for ``data``; ``policy`` gives the thresholds, ``mode`` is
    ``enforcement.mode`` (named in the level panel's title). Returns the figure unsaved."""
    fig = Figure(figsize=(12, 10), layout="constrained")
    ax_bal, ax_lvl, ax_res = fig.subplots(3, 1, sharex=True, height_ratios=(3, 2, 2))
    line = data.timeline
    marker = "o" if len(line) <= _MARKERS_UP_TO else None
    end = _dates(line.end_s)
    chosen = (
        "named customers"
        if data.chosen_by == "customer"
        else f"{data.chosen_by} by balance at the end"
    )
    points = {0: "intervals", 3600: "points (hourly rollups)", 86400: "points (daily rollups)"}
    fig.suptitle(
        f"gmd ledger: {len(line)} {points[line.resolution_s]} from"
        f" {iso(float(line.start_s[0]))} to {iso(float(line.end_s[-1]))} (UTC); {chosen}"
        if len(line)
        else "gmd ledger: no intervals in the range"
    )

    _balances(ax_bal, data, policy, end, marker)
    _levels(ax_lvl, data, policy, mode)
    _breakdown(ax_res, data, end, marker)

    locator = mdates.AutoDateLocator(tz=UTC)
    ax_res.xaxis.set_major_locator(locator)
    ax_res.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    ax_res.set_xlabel("time (UTC)")
    return fig


def _balances(
    ax: Axes,
    data: CustomerSeries,
    policy: ThrottlePolicy,
    end: np.ndarray,
    marker: str | None,
) -> None:
    weight = policy.priority_weight
    for i, name in enumerate(data.customers):
        ax.plot(
            end,
            data.balances.balance[i],
            color=_color(i),
            marker=marker,
            ms=3,
            label=data.label(name),
        )
    if weight:
        scores = data.balances.scores(weight)
        for i, name in enumerate(data.customers):
            ax.plot(end, scores[i], color=_color(i), ls=":", label=f"{data.label(name)} score")
    for k, (enter, leave) in enumerate(zip(policy.enter, policy.leave, strict=True), start=1):
        shade = _THRESHOLD_COLORS(k / max(policy.levels, 1))
        ax.axhline(enter, color=shade, ls="-", lw=1, label=f"level {k} enter")
        ax.axhline(leave, color=shade, ls="--", lw=1, label=f"level {k} leave")
    if weight:
        ax.set_title(
            f"Balance, and score = balance − {weight:g} × priority (priority_weight):"
            " the thresholds apply to the score"
        )
        ax.set_ylabel("balance / score")
    else:
        ax.set_title("Balance (decayed sum of greediness): the thresholds apply to it")
        ax.set_ylabel("balance")
    ax.grid(True, alpha=0.3)
    _legend(ax)


def _levels(ax: Axes, data: CustomerSeries, policy: ThrottlePolicy, mode: str) -> None:
    line = data.timeline
    n = len(data.levels)
    if len(line):
        start, stop = float(line.start_s[0]), float(line.end_s[-1])
        for i, steps in enumerate(data.levels):
            t, level = steps.steps(start, stop)
            label = data.label(steps.customer) + (" (dry-run)" if steps.any_dry_run else "")
            # wider first, so that a customer hidden under another at the same level shows
            ax.plot(
                _dates(t),
                level,
                drawstyle="steps-post",
                color=_color(i),
                lw=1.2 + 0.9 * (n - 1 - i),
                alpha=0.85,
                label=label,
            )
    note = {
        "dry-run": "dry-run: decided and recorded, not applied",
        "off": "off: no levels decided",
        "on": "on: applied",
    }.get(mode, mode)
    ax.set_title(f"Throttle level (enforcement.mode = {note})")
    ax.set_ylabel("level")
    ax.set_yticks(range(policy.levels + 1))
    ax.set_ylim(-0.2, policy.levels + 0.2)
    ax.grid(True, alpha=0.3)
    if n:
        _legend(ax)


def _breakdown(ax: Axes, data: CustomerSeries, end: np.ndarray, marker: str | None) -> None:
    res = data.resources
    if not data.customers:
        ax.set_title("Per-resource terms: no customer to show")
        return
    first = data.customers[0]
    terms = res.of(first)
    # the sum underneath, wide and pale: where one resource carries it all, both stay visible
    ax.plot(
        end, data.balances.greediness[0], color="0.6", lw=4, alpha=0.6, label="sum (interval GM)"
    )
    for k, resource in enumerate(res.resources):
        ax.plot(end, terms[k], color=_color(k + 3), marker=marker, ms=2, lw=1, label=resource)
    ax.axhline(0.0, color="grey", lw=0.5, label="_nolegend_")
    ax.set_title(
        f"Per-resource terms of {data.label(first)}'s interval greediness"
        " (> 0: took more than its endowment)"
    )
    ax.set_ylabel("GM term")
    ax.grid(True, alpha=0.3)
    _legend(ax)


def save(fig: Figure, path: Path, fmt: str | None = None) -> None:
    """Write ``fig`` as PNG or SVG (``fmt``, else from the suffix). SVG keeps text as text
    (customer names can be searched and copied) and carries no date, so that the same ledger
    gives the same file."""
    fmt = fmt or output_format(path)
    if fmt == "svg":
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gmd"}):
            fig.savefig(path, format="svg", metadata={"Date": None})
    else:
        fig.savefig(path, format=fmt, dpi=100)
