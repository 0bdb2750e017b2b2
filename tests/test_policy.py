"""Throttle levels: hysteresis, dwell and bounded steps keep levels from flapping."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmd.fairness.policy import (
    ThrottlePolicy,
    cpu_cap_cores,
    decide_levels,
    scores,
    weights_for,
)

POLICY = ThrottlePolicy(dwell_s=0, max_step=3)


def run(policy: ThrottlePolicy, series: list[float], step_s: float = 60.0) -> list[int]:
    """One customer's levels over a series of scores, one decision per interval."""
    level, since = np.array([0]), np.array([-1e12])
    out = []
    for i, s in enumerate(series):
        d = decide_levels(np.array([s]), level, since, i * step_s, policy)
        level, since = d.level, d.since_s
        out.append(int(level[0]))
    return out


def test_a_balance_oscillating_around_a_threshold_does_not_flap() -> None:
    assert run(POLICY, [0.9, 1.1, 0.9, 1.1, 0.9, 1.1, 0.9]) == [0, 1, 1, 1, 1, 1, 1]
    # left only below leave (0.5), and not re-entered until enter (1.0) again
    assert run(POLICY, [1.2, 0.6, 0.45, 0.55, 0.9, 0.99, 1.0]) == [1, 1, 0, 0, 0, 0, 1]


def test_levels_follow_the_thresholds_both_ways() -> None:
    assert run(POLICY, [0, 2.5, 4.0, 3.1, 2.9, 1.4, 0.4]) == [0, 2, 3, 3, 2, 1, 0]


def test_dwell_holds_a_level_before_it_changes() -> None:
    policy = ThrottlePolicy(dwell_s=600, max_step=1)
    # 60 s intervals: enter level 1 at 60 s, hold it until 660 s, then one level per 600 s
    levels = run(policy, [0] + [10.0] * 30)
    assert levels[:2] == [0, 1]
    assert levels[2:11] == [1] * 9 and levels[11] == 2
    assert levels[12:21] == [2] * 9 and levels[21] == 3
    # and back down, one level per dwell
    down = run(policy, [10.0] * 31 + [0.0] * 31)
    changes = [i for i in range(1, len(down)) if down[i] != down[i - 1]]
    assert all(b - a >= 10 for a, b in itertools.pairwise(changes))


def test_max_step_bounds_a_jump() -> None:
    assert run(ThrottlePolicy(dwell_s=0, max_step=1), [100.0, 100.0, 100.0]) == [1, 2, 3]


def test_priority_gives_contributors_slack() -> None:
    s = scores([2.0, 2.0], [0.0, 1.5], priority_weight=1.0)
    assert s.tolist() == [2.0, 0.5]
    assert scores([2.0], None, 1.0).tolist() == [2.0]


def test_effects_respect_cap_level_quota_level_and_floors() -> None:
    p = ThrottlePolicy(
        weight_factors=(0.5, 0.2, 0.01),
        cpu_cap_fractions=(1.0, 0.5, 0.05),
        disk_caps_bytes_per_s=(None, 50e6, 10e6),
        weight_floor=0.05,
        cap_floor=0.1,
        cap_level=2,
        quota_level=3,
    )
    e0, e1, e2, e3 = (p.effect(k) for k in range(4))
    assert (e0.weight_factor, e0.cpu_cap_fraction, e0.quota_steps) == (1.0, None, 0)
    assert (e1.weight_factor, e1.cpu_cap_fraction, e1.disk_bytes_per_s) == (0.5, None, None)
    assert (e2.cpu_cap_fraction, e2.disk_bytes_per_s, e2.quota_steps) == (0.5, 50e6, 0)
    assert (e3.weight_factor, e3.cpu_cap_fraction, e3.quota_steps) == (0.05, 0.1, 1)
    assert weights_for(e3.weight_factor) == 5
    assert weights_for(0.0001) == 1 and weights_for(500) == 10000
    assert cpu_cap_cores(0.5, 4) == 2.0 and cpu_cap_cores(0.5, None) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"leave": (1.0, 1.5, 3.0)}, "level 1: leave 1 must be below enter 1 "),
        ({"enter": (2.0, 1.0, 4.0)}, "must increase strictly"),
        ({"leave": (0.5,)}, "leave has 1 values, enter has 3"),
        ({"max_step": 0}, "max_step = 0"),
        ({"weight_factors": (0.5, 0.7, 0.1)}, "must not grow"),
        ({"cap_level": 9}, "cap_level = 9 must be in 1..4"),
    ],
)
def test_inconsistent_policies_are_refused_with_the_setting_named(
    kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        ThrottlePolicy(**kwargs)


def test_decisions_say_why() -> None:
    p = ThrottlePolicy(dwell_s=600)
    d = decide_levels(np.array([1.2, 5.0, 0.7]), np.array([0, 1, 1]), np.array([0, 0, 0]), 100, p)
    assert d.level.tolist() == [0, 1, 1]
    assert "held for 600 s" in d.reason[0] and "held for 600 s" in d.reason[1]
    assert d.reason[2] == "score 0.7 still ≥ leave 0.5 of level 1"
    d = decide_levels(np.array([1.2]), np.array([0]), np.array([0]), 700, p)
    assert d.changed.tolist() == [True] and d.reason[0] == "score 1.2 ≥ enter 1 of level 1"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-2, 8, allow_nan=False), min_size=1, max_size=60),
    st.integers(0, 5),
    st.integers(1, 3),
)
def test_no_change_sooner_than_the_dwell_nor_bigger_than_the_step(
    series: list[float], dwell_intervals: int, max_step: int
) -> None:
    policy = ThrottlePolicy(dwell_s=60.0 * dwell_intervals, max_step=max_step)
    levels = [0, *run(policy, series)]
    changes = [i for i in range(1, len(levels)) if levels[i] != levels[i - 1]]
    assert all(abs(levels[i] - levels[i - 1]) <= max_step for i in changes)
    assert all(b - a >= dwell_intervals for a, b in itertools.pairwise(changes))
    assert all(0 <= k <= policy.levels for k in levels)
