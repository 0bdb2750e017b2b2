"""A what-if drawn beside the record: balances and levels, recorded on the left, replayed on
the right, for the customers the change matters to most (``gmd-admin whatif --plot``).

The same conventions as :mod:`gmd.daemon.reports.plot`: a matplotlib Figure without pyplot,
a customer's colour the same in every panel, each level's enter threshold as a grey line.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gmd.common.timespec import iso
from gmd.daemon.reports.plot import _dates, as_text, customer_style, threshold_grey
from gmd.daemon.reports.whatif import WhatIf
from gmd.fairness.policy import ThrottlePolicy

TOP = 6
"""Customers drawn: those whose throttled time the change moves most, then the greatest
balances."""


def chosen(result: WhatIf, top: int = TOP) -> list[int]:
    """The customers to draw, most affected first."""
    entries = result.customers.items()
    return [
        c
        for c, e in sorted(
            entries,
            key=lambda item: (
                -abs(item[1].throttled_s - item[1].recorded_throttled_s),
                -max(item[1].throttled_s, item[1].recorded_throttled_s),
                -abs(item[1].balance),
            ),
        )[:top]
    ]


def draw(result: WhatIf, recorded: ThrottlePolicy, replayed: ThrottlePolicy) -> Figure:
    """Four panels: balances and levels, as recorded (left) and as replayed (right)."""
    fig = Figure(figsize=(14, 8), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True, sharey="row", height_ratios=(3, 2))
    starts = sorted(result.levels)
    x = _dates(np.array(starts, dtype=np.float64))
    changed = " ".join(f"--set {s}" for s in result.sets) or "no change"
    fig.suptitle(
        f"gmd what-if, {len(starts)} intervals from {iso(result.from_s)} to"
        f" {iso(result.to_s)} (UTC)\nrecorded (left), replayed with {as_text(changed)} (right)"
    )
    customers = chosen(result)
    for column, (balances, levels, policy, what) in enumerate(
        (
            (result.recorded_balances, result.recorded_levels, recorded, "recorded"),
            (result.balances, result.levels, replayed, "replayed"),
        )
    ):
        ax_bal: Axes = axes[0][column]
        ax_lvl: Axes = axes[1][column]
        for i, c in enumerate(customers):
            entry = result.customers[c]
            label = as_text(entry.name or entry.customer)
            style = customer_style(i)
            ax_bal.plot(
                x,
                [balances.get(s, {}).get(c, np.nan) for s in starts],
                label=label,
                **style,
            )
            ax_lvl.step(x, [levels.get(s, {}).get(c, 0) for s in starts], where="post", **style)
        for level, enter in enumerate(policy.enter, start=1):
            ax_bal.axhline(enter, color=threshold_grey(level, policy.levels), lw=0.8, ls="--")
        ax_bal.set_title(f"balance, {what}")
        ax_lvl.set_title(f"throttle level, {what}")
        ax_lvl.set_yticks(range(policy.levels + 1))
    axes[0][0].legend(loc="upper left", fontsize="small")
    return fig
