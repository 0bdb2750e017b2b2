"""Throttle levels: hysteresis, dwell and bounded steps keep levels from flapping."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gmd.fairness.policy import (
    CapResource,
    Contention,
    ContentionPolicy,
    ThrottlePolicy,
    capped_effect,
    caps_wanted,
    cpu_cap_cores,
    decide_customers,
    decide_levels,
    for_customer,
    host_contention,
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


# --- caps only where the host is contended ------------------------------------------------------

CPU, DISK = CapResource.cpu, CapResource.disk


def contention(
    used: list[tuple[float, float]], supply: list[tuple[float, float]], **kw: float
) -> dict[CapResource, tuple[bool, Contention, float | None]]:
    decided = host_contention(used, supply, ContentionPolicy(**kw))  # type: ignore[arg-type]
    return {r: (d.applied, d.reason, d.utilisation) for r, d in decided.items()}


def test_caps_apply_from_the_threshold_on_and_not_just_below_it() -> None:
    supply = [(100.0, 1000.0)] * 3
    at = contention([(80.0, 0.0)] * 3, supply)
    assert at[CPU] == (True, Contention.contended, 0.8)
    below = contention([(80.0, 0.0), (80.0, 0.0), (79.97, 0.0)], supply)
    assert below[CPU][:2] == (False, Contention.idle)
    assert below[CPU][2] == pytest.approx(0.7999)
    full = contention([(100.0, 1000.0)] * 3, supply, cpu_above=1.0, disk_above=1.0)
    assert full == {
        CPU: (True, Contention.contended, 1.0),
        DISK: (True, Contention.contended, 1.0),
    }


def test_each_resource_is_judged_on_its_own_use_and_threshold() -> None:
    supply = [(100.0, 1000.0)] * 2
    decided = contention([(95.0, 100.0), (85.0, 300.0)], supply, disk_above=0.15)
    assert decided == {
        CPU: (True, Contention.contended, 0.9),
        DISK: (True, Contention.contended, 0.2),
    }
    decided = contention([(95.0, 100.0), (85.0, 100.0)], supply, disk_above=0.15)
    assert decided[CPU][0] and decided[DISK] == (False, Contention.idle, 0.1)


def test_utilisation_weighs_each_interval_by_what_the_host_offered() -> None:
    """A host that grew from 100 to 300 core-s an interval: 90 + 90 of 400 is 45 %, not the
    mean of 90 % and 30 %; an interval the host offered nothing in does not count."""
    decided = contention(
        [(90.0, 0.0), (90.0, 0.0), (50.0, 0.0)], [(100.0, 1.0), (300.0, 1.0), (0.0, 0.0)]
    )
    assert decided[CPU] == (False, Contention.idle, 0.45)


def test_no_measure_withholds_caps_and_a_zero_threshold_applies_them_everywhere() -> None:
    assert contention([], []) == {
        CPU: (False, Contention.unmeasured, None),
        DISK: (False, Contention.unmeasured, None),
    }
    assert contention([], [], cpu_above=0.0)[CPU] == (True, Contention.always, None)
    assert contention([(0.0, 0.0)], [(100.0, 100.0)], cpu_above=0.0)[CPU][:2] == (
        True,
        Contention.always,
    )


def test_a_levels_caps_are_kept_only_for_the_contended_resources() -> None:
    p = ThrottlePolicy(disk_caps_bytes_per_s=(None, 5e6, 1e6))
    effect = p.effect(2)
    assert caps_wanted(effect) == (CPU, DISK) and caps_wanted(p.effect(1)) == ()
    decided = host_contention([(90.0, 0.0)], [(100.0, 100.0)], ContentionPolicy())
    on_host = capped_effect(effect, decided)
    assert (on_host.cpu_cap_fraction, on_host.disk_bytes_per_s) == (0.75, None)
    assert (on_host.weight_factor, on_host.quota_steps) == (effect.weight_factor, 0)
    decided = host_contention([(10.0, 90.0)], [(100.0, 100.0)], ContentionPolicy())
    assert capped_effect(effect, decided).cpu_cap_fraction is None
    assert capped_effect(effect, decided).disk_bytes_per_s == 5e6


def test_the_decision_says_why_in_words() -> None:
    def words(used: float, supply: float = 100.0, **kw: float) -> str:
        decided = host_contention([(used, 0.0)], [(supply, 1.0)], ContentionPolicy(**kw))  # type: ignore[arg-type]
        return decided[CPU].words()

    assert words(91.0) == "applied: cpu 91 % ≥ 80 %"
    assert words(22.0) == "not applied: cpu 22 % < 80 %"
    assert words(79.96) == "not applied: cpu 79.96 % < 80 %"  # never "80 % < 80 %"
    assert words(80.0, cpu_above=0.8) == "applied: cpu 80 % ≥ 80 %"
    assert words(50.0, cpu_above=0.825) == "not applied: cpu 50 % < 82.5 %"
    assert words(1.0, cpu_above=0.0) == "applied: cpu: contended_above = 0 (caps on every host)"
    none = host_contention([], [], ContentionPolicy(intervals=5))[DISK]
    assert none.words() == "not applied: disk: no use reported in the last 5 interval(s)"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_above": 1.5}, "contended_above.cpu = 1.5 must lie in [0, 1]"),
        ({"disk_above": -0.1}, "contended_above.disk = -0.1 must lie in [0, 1]"),
        ({"intervals": 0}, "contention_intervals = 0 must be >= 1"),
        ({"intervals": 2.5}, "contention_intervals = 2.5 must be a whole number"),
        ({"others_above": 1.5}, "others_above = 1.5 must lie in [0, 1]"),
        ({"others_above": float("nan")}, "others_above = nan must lie in [0, 1]"),
    ],
)
def test_contention_settings_out_of_range_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ContentionPolicy(**kwargs)


def test_a_customer_alone_on_the_host_it_contends_keeps_its_caps_withheld() -> None:
    """Caps protect others: where the other customers used less than ``others_above`` of a
    contended host, a customer's caps there are withheld (``alone``), and said so; from the
    threshold on they apply. Hosts that are idle, unmeasured or capped everywhere
    (``contended_above = 0``) are not the rule's to change."""
    policy = ContentionPolicy(others_above=0.05)
    busy = host_contention([(95.0, 90.0)], [(100.0, 100.0)], policy)
    alone = for_customer(busy, {CPU: 0.01, DISK: 0.05}, policy)
    assert (alone[CPU].applied, alone[CPU].reason) == (False, Contention.alone)
    assert (alone[DISK].applied, alone[DISK].reason) == (True, Contention.contended)
    assert alone[CPU].words() == (
        "not applied: cpu 95 % ≥ 80 %, but the other customers used 1 % < 5 %: nobody to protect"
    )
    assert alone[CPU].figures()["reason"] == "alone"
    effect = ThrottlePolicy(cap_level=1, cpu_cap_fractions=(0.5, 0.5, 0.5)).effect(1)
    assert capped_effect(effect, alone).cpu_cap_fraction is None
    assert capped_effect(effect, busy).cpu_cap_fraction == 0.5
    # a customer the ledger saw no use of beside others: everyone else's use counts
    assert for_customer(busy, {}, policy)[CPU].reason is Contention.alone
    assert for_customer(busy, {CPU: 0.3, DISK: 0.3}, policy) == busy
    # 0: the old rule, caps wherever the host is contended
    assert for_customer(busy, {CPU: 0.0}, ContentionPolicy(others_above=0.0)) == busy
    idle = host_contention([(10.0, 0.0)], [(100.0, 100.0)], policy)
    assert for_customer(idle, {}, policy) == idle
    always = host_contention([(10.0, 0.0)], [(100.0, 100.0)], ContentionPolicy(cpu_above=0.0))
    assert for_customer(always, {}, policy)[CPU].applied


def test_decide_customers_is_decide_levels_over_standings_and_levels() -> None:
    """Customers with a standing or a level are decided together; one with a level but no
    standing answers for nothing (score 0); one that stays at level 0 keeps no row."""
    standing = {1: (50.0, 0.0), 2: (0.0, 0.0), 3: (1e9, 2.0)}
    state = {3: (1, -math.inf), 4: (2, -math.inf)}
    step = decide_customers(standing, state, 1000.0, POLICY)
    assert step.customers == (1, 2, 3, 4)
    assert step.before.tolist() == [0, 0, 1, 2]
    scores_ = [50.0, 0.0, 1e9 - POLICY.priority_weight * 2.0, 0.0]
    direct = decide_levels(np.array(scores_), step.before, [-math.inf] * 4, 1000.0, POLICY)
    assert step.decision.level.tolist() == direct.level.tolist()
    assert step.decision.level[3] == 0  # no standing left: back down
    assert step.kept.tolist() == [bool(direct.level[0] > 0), False, True, True]
