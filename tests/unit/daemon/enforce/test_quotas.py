"""Quota enforcement: the pure lowering arithmetic.

What the real services do (lowering with force, read-back, restore, 400/401/403/406, unified
limits) is in tests/cloud/test_openstack_quotas.py against real Keystone and Nova; what only a
fake cloud can show of reaching them (5xx, slowness, a refused connection, a 401 on a valid
token, an SDK that breaks) is the client's, in tests/unit/openstack/test_client.py.
"""

from __future__ import annotations

import pytest

from gmd.daemon.enforce.quotas import (
    QuotaSet,
    QuotaStep,
    lowered,
)

DEFAULTS = QuotaSet(cores=20, ram_mb=51200, instances=10)
NO_FLOOR = QuotaSet(0, 0, 0)


# --- pure: lowered ------------------------------------------------------------------------


def test_steps_remove_a_fraction_of_the_original_each_rounded_down() -> None:
    step = QuotaStep(cores=0.25, ram=0.25, instances=0.25)
    got = [lowered(DEFAULTS, n, step, NO_FLOOR) for n in range(6)]
    assert got == [
        QuotaSet(20, 51200, 10),
        QuotaSet(15, 38400, 7),  # 7.5 instances: a step removes at least its share
        QuotaSet(10, 25600, 5),
        QuotaSet(5, 12800, 2),
        QuotaSet(0, 0, 0),
        QuotaSet(0, 0, 0),  # past 100 %: nothing left to remove, never negative
    ]


def test_per_resource_fractions_and_exact_arithmetic() -> None:
    step = QuotaStep(cores=0.1, ram=0.5, instances=0.0)
    # 30 × (1 − 3 × 0.1) is 21 exactly; floating point would give 20.999… → 20.
    assert lowered(QuotaSet(30, 4096, 8), 3, step, NO_FLOOR) == QuotaSet(21, 0, 8)
    assert lowered(QuotaSet(30, 4096, 8), 1, step, NO_FLOOR) == QuotaSet(27, 2048, 8)


def test_never_below_the_floor() -> None:
    floor = QuotaSet(cores=4, ram_mb=16384, instances=3)
    step = QuotaStep()
    assert lowered(DEFAULTS, 1, step, floor) == QuotaSet(15, 38400, 7)
    assert lowered(DEFAULTS, 3, step, floor) == QuotaSet(5, 16384, 3)
    assert lowered(DEFAULTS, 100, step, floor) == QuotaSet(4, 16384, 3)


def test_never_above_the_original() -> None:
    small = QuotaSet(cores=2, ram_mb=1024, instances=1)
    floor_above = QuotaSet(cores=8, ram_mb=2048, instances=1)
    for steps in range(5):
        assert lowered(small, steps, QuotaStep(), floor_above) == small
    # A floor of -1 means "never lower this resource".
    assert lowered(DEFAULTS, 3, QuotaStep(), QuotaSet(-1, 0, -1)) == QuotaSet(20, 12800, 10)


def test_monotonic_and_bounded_over_many_steps() -> None:
    original = QuotaSet(cores=37, ram_mb=99999, instances=13)
    floor = QuotaSet(cores=3, ram_mb=2048, instances=2)
    step = QuotaStep(cores=0.15, ram=0.3, instances=0.2)
    previous = original
    for steps in range(1, 12):
        now = lowered(original, steps, step, floor)
        for name in ("cores", "ram_mb", "instances"):
            value = getattr(now, name)
            assert getattr(floor, name) <= value <= getattr(previous, name), (steps, name)
        previous = now
    assert previous == floor


def test_unlimited_stays_unlimited_without_a_base() -> None:
    original = QuotaSet(cores=-1, ram_mb=51200, instances=-1)
    assert lowered(original, 2, QuotaStep(), NO_FLOOR) == QuotaSet(-1, 25600, -1)


def test_unlimited_counts_from_the_configured_base() -> None:
    original = QuotaSet(cores=-1, ram_mb=-1, instances=10)
    step = QuotaStep(unlimited_base=QuotaSet(cores=40, ram_mb=81920, instances=99))
    floor = QuotaSet(cores=8, ram_mb=0, instances=0)
    assert lowered(original, 0, step, floor) == original
    assert lowered(original, 1, step, floor) == QuotaSet(30, 61440, 7)
    assert lowered(original, 4, step, floor) == QuotaSet(8, 0, 0)


def test_invalid_inputs_are_refused_with_the_name() -> None:
    with pytest.raises(ValueError, match="steps must be ≥ 0"):
        lowered(DEFAULTS, -1, QuotaStep(), NO_FLOOR)
    with pytest.raises(ValueError, match=r"QuotaStep\.ram"):
        QuotaStep(ram=1.5)
    with pytest.raises(ValueError, match=r"QuotaSet\.cores"):
        QuotaSet(cores=-2, ram_mb=0, instances=0)
    with pytest.raises(ValueError, match="unlimited_base must be finite"):
        QuotaStep(unlimited_base=QuotaSet(-1, 1, 1))
