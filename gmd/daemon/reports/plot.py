"""Drawing customers' standings over time (``gmd-admin plot``): a picture an operator can show.

Three panels share one UTC time axis:

1. **Balance** of each customer after each interval, with the ``[enforcement]`` thresholds as
   horizontal grey lines ("level k enter" solid, "level k leave" dashed, darker for higher
   levels), so that one sees how far each customer is from being throttled and why it was.
   When ``priority_weight`` is set, the thresholds compare the *score* (balance − weight ×
   DirectContr priority), which is then drawn too (dotted) and named in the title.
2. **Throttle level** of each customer, a step function rebuilt from the enforcement log.
   Dry-run levels are drawn like applied ones (they are what gmd decided) and marked in the
   legend and the title.
3. **Per-resource breakdown** of the *first* customer (the greatest final balance when chosen
   by ``--top``, else the first ``--customer``): one line per resource term of its interval
   greediness, over their sum (its interval GM) drawn wide and pale. One customer, because the
   terms are signed (a customer that cedes memory while taking CPU has one negative and one
   positive term): stacking them, or summing over customers who offset each other, would hide
   exactly what the panel is for — which resources made this customer greedy, and when.

**Telling lines apart.** Customers are drawn in saturated colours (:data:`CUSTOMER_COLORS`)
and the thresholds in greys, so that no customer can be mistaken for a threshold (with a
red customer and a red "level 3 enter", one could not tell which line crossed which). Lines
that would lie exactly on top of each other — several customers without a standing all at
balance 0, or all at level 0 for the whole range, the common case for most customers — are
drawn once, in black, and the legend names everyone they stand for ("at 0: a, b, c", "level 0
throughout: a, b, c"). That reads better than offsetting them: an offset line claims a
balance or a level (1.05) that nobody has, and a reader checking one customer against the
axis would be misled, whereas one line per value with the names is exact and also tells at a
glance who never moved. Customers whose levels change keep their own lines; where two share a
level for a while, the earlier is drawn wider, so that both stay visible. The title counts
the customers drawn, not the ``--top N`` asked for.

The drawing uses :class:`matplotlib.figure.Figure` directly, never pyplot: no display, no
global figure registry, so it is safe in threads and servers. Only saving SVG touches global
state (``svg.fonttype``, so that names stay searchable text), for the duration of the save.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.dates as mdates
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gmd import OptionError
from gmd.common.timespec import iso
from gmd.common.units import DAY_S, HOUR_S
from gmd.daemon.reports.series import CustomerSeries
from gmd.fairness.policy import ThrottlePolicy
from gmd.wire import PlanMode

FORMATS: dict[str, str] = {".png": "png", ".svg": "svg"}
CUSTOMER_COLORS: tuple[str, ...] = (
    "#1f77b4",  # blue
    "#ff7f0e",  # orange
    "#2ca02c",  # green
    "#d62728",  # red
    "#6b6ecf",  # violet
    "#bcbd22",  # olive
    "#000080",  # navy
    "#e377c2",  # pink
    "#800000",  # maroon
    "#e7298a",  # magenta
)
"""One colour per customer, in order. Each is at least 0.3 away (Euclidean, RGB in [0, 1])
from every other, from every grey the thresholds may take (:func:`threshold_grey`, 0.3-0.7)
and from :data:`GROUP_COLOR`, and dark enough to read on white: matplotlib's tab10 without its
grey and its brown (which sits within 0.21 of a mid grey), and four more that pass the same
test. From the eleventh customer on the colours come round again, dash-dotted (a style neither
thresholds nor scores use)."""
_RESOURCE_COLORS = (9, 6, 5, 8, 7, 4)
"""Indices into CUSTOMER_COLORS for the resources of the breakdown, from the palette's end so
that the default five customers in the panels above share no colour with them (magenta,
navy, olive, maroon: far apart from each other)."""
GROUP_COLOR = "black"
"""One line standing for several customers whose series are identical (see the module doc)."""
# Markers help on short ranges, where each interval is a visible step; on long ones they blur.
_MARKERS_UP_TO = 60


def output_format(path: Path) -> str:
    """ "png" or "svg" from the file's suffix; :class:`~gmd.OptionError` says which suffixes
    work."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise OptionError(
            f"{path}: cannot tell the picture format from {path.suffix or 'no suffix'!r};"
            " name the file FILE.png or FILE.svg"
        )
    return fmt


def _dates(seconds: np.ndarray) -> np.ndarray:
    """Unix seconds → datetime64 (UTC), which matplotlib places on a date axis."""
    return np.round(np.asarray(seconds, dtype=np.float64)).astype(np.int64).astype("datetime64[s]")


def customer_style(i: int) -> dict[str, Any]:
    """Colour and line style of the i-th customer drawn (the same in every panel)."""
    lap, k = divmod(i, len(CUSTOMER_COLORS))
    return {"color": CUSTOMER_COLORS[k], "ls": "-" if lap == 0 else "-."}


def threshold_grey(level: int, levels: int) -> str:
    """The grey of level ``level``'s thresholds (1-based, of ``levels``): 0.7 for the first,
    darkening to 0.3 for the last, so that the harsher levels stand out."""
    share = (level - 1) / (levels - 1) if levels > 1 else 0.5
    return f"{0.7 - 0.4 * share:.3f}"


def identical(rows: np.ndarray) -> list[tuple[int, ...]]:
    """Row indices grouped by identical values, each group in row order, groups by their
    first row: the lines that would be drawn exactly on top of each other."""
    groups: dict[bytes, list[int]] = {}
    for i, row in enumerate(np.asarray(rows, dtype=np.float64)):
        groups.setdefault((row + 0.0).tobytes(), []).append(i)  # + 0.0: -0.0 is 0.0
    return [tuple(g) for g in groups.values()]


def as_text(text: str) -> str:
    """``text`` as matplotlib shows it literally: a name is text, never math markup.

    matplotlib reads a string with an even number of unescaped ``$`` as mathtext: a project
    named ``$x^$`` made every figure naming it raise (a 500 from the read API), and one named
    ``a $5 and $6`` would lose its dollars. Escaped, each ``$`` is a dollar sign."""
    return text.replace("$", r"\$")


def _listing(head: str, labels: Sequence[str]) -> str:
    """One legend entry naming several customers, wrapped so that the legend stays narrow
    (wrapped before it is escaped, so that no line ends between a backslash and its $)."""
    text = f"{head}: {', '.join(labels)}"
    return as_text("\n".join(textwrap.wrap(text, width=32, break_on_hyphens=False)))


def _group_label(values: np.ndarray, labels: Sequence[str]) -> str:
    """The legend entry of one line standing for several customers."""
    if values.size and np.all(values == values[0]):
        return _listing(f"at {float(values[0]):g}", labels)
    return _listing("identical", labels)


def _who(data: CustomerSeries) -> str:
    """The title's account of which customers are drawn: their number, and how chosen."""
    n = len(data.customers)
    counted = f"{n} customer{'' if n == 1 else 's'}"
    if data.top is None:
        return f"{counted}, named"
    if n == data.top:
        return f"{counted}: the top {n} by balance at the end"
    return f"{counted}: all with a standing at the end (--top {data.top} asked)"


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
    points = {0: "intervals", HOUR_S: "points (hourly rollups)", DAY_S: "points (daily rollups)"}
    fig.suptitle(
        f"gmd ledger: {len(line)} {points[line.resolution_s]} from"
        f" {iso(float(line.start_s[0]))} to {iso(float(line.end_s[-1]))} (UTC)\n{_who(data)}"
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
    _customer_lines(ax, data, end, data.balances.balance, marker=marker, ms=3)
    if weight:
        scores = data.balances.scores(weight)
        _customer_lines(ax, data, end, scores, suffix=" score", ls=":")
    for k, (enter, leave) in enumerate(zip(policy.enter, policy.leave, strict=True), start=1):
        shade = threshold_grey(k, policy.levels)
        ax.axhline(enter, color=shade, ls="-", lw=1.5, label=f"level {k} enter")
        ax.axhline(leave, color=shade, ls="--", lw=1.5, label=f"level {k} leave")
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


def _customer_lines(
    ax: Axes,
    data: CustomerSeries,
    end: np.ndarray,
    rows: np.ndarray,
    *,
    suffix: str = "",
    **style: Any,
) -> None:
    """One line per customer (row of ``rows``) in its colour, except that customers with
    identical rows share one black line whose legend entry names them all."""
    for members in identical(rows):
        values = rows[members[0]]
        labels = [data.label(data.customers[i]) for i in members]
        if len(members) == 1:
            look = customer_style(members[0])
            look["ls"] = style.get("ls", look["ls"])
            extra = {k: v for k, v in style.items() if k != "ls"}
            ax.plot(end, values, **look, **extra, label=as_text(labels[0] + suffix))
        else:
            ax.plot(
                end,
                values,
                **{"color": GROUP_COLOR, "lw": 2, "zorder": 1.9, **style},
                label=_group_label(values, labels) + suffix,
            )


def _levels(ax: Axes, data: CustomerSeries, policy: ThrottlePolicy, mode: str) -> None:
    line = data.timeline
    n = len(data.levels)
    if len(line):
        start, stop = float(line.start_s[0]), float(line.end_s[-1])
        corners = [steps.steps(start, stop) for steps in data.levels]
        flat: dict[int, list[str]] = {}
        moving = []
        for i, (steps, (_, level)) in enumerate(zip(data.levels, corners, strict=True)):
            if level.min() == level.max():
                flat.setdefault(int(level[0]), []).append(data.label(steps.customer))
            else:
                moving.append(i)
        for value, labels in sorted(flat.items()):
            ax.plot(
                _dates(np.array([start, stop])),
                [value, value],
                color=GROUP_COLOR,
                lw=2,
                zorder=1.9,
                label=_listing(f"level {value} throughout", labels),
            )
        for rank, i in enumerate(moving):
            steps = data.levels[i]
            t, level = corners[i]
            # what the hosts reported applied, not what the decisions' mode was
            label = data.label(steps.customer) + steps.mark
            label = as_text(label)
            # wider first, so that a customer hidden under another at the same level shows
            ax.plot(
                _dates(t),
                level,
                drawstyle="steps-post",
                **customer_style(i),
                lw=1.5 + 1.2 * (len(moving) - 1 - rank),
                label=label,
            )
    ax.set_title(f"Throttle level ({decided_in(data, mode)})")
    ax.set_ylabel("level")
    ax.set_yticks(range(policy.levels + 1))
    ax.set_ylim(-0.2, policy.levels + 0.2)
    ax.grid(True, alpha=0.3)
    if n:
        _legend(ax)


def decided_in(data: CustomerSeries, mode: str) -> str:
    """The modes the range's level changes were decided in, as the record has them (a range
    that ran dry-run, then on, says both); today's ``mode`` only when no level changed in it."""
    modes = {
        PlanMode.dry_run if dry else PlanMode.on
        for steps in data.levels
        for dry in steps.dry_run.tolist()
    }
    if not modes:
        return f"no change in the range; enforcement.mode = {PlanMode(mode).words}"
    if len(modes) == 1:
        return f"decided in {PlanMode(modes.pop()).words}"
    return "decided in dry-run (not applied) and on (applied): the legend says which"


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
        color = CUSTOMER_COLORS[_RESOURCE_COLORS[k % len(_RESOURCE_COLORS)]]
        ax.plot(end, terms[k], color=color, marker=marker, ms=2, lw=1, label=resource)
    ax.axhline(0.0, color="grey", lw=0.5, label="_nolegend_")
    ax.set_title(
        f"Per-resource terms of {as_text(data.label(first))}'s interval greediness"
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
        path.write_bytes(svg(fig))
    else:
        fig.savefig(path, format=fmt, dpi=100)


def svg(fig: Figure) -> bytes:
    """``fig`` as SVG, its text kept as text and no date in it (see :func:`save`)."""
    out = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gmd"}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()
