"""The run from one interval's standing to the next (gmd.fairness.ledger_step): the typed
standing it carries, what it forgets, resets, and the levels it
decides — each against the parts it composes."""

from __future__ import annotations

import numpy as np
import pytest

from gmd.fairness.interval import Accounts, IntervalSettings, Standing, account_interval
from gmd.fairness.ledger_step import (
    NEGLIGIBLE,
    CustomerStanding,
    LedgerStanding,
    LevelHeld,
    OrganizationStanding,
    SampledInterval,
    decide_next_levels,
    starting_arrays,
    step_interval,
)
from gmd.fairness.policy import ThrottlePolicy, decide_customers

SETTINGS = IntervalSettings(resources=("cpu", "memory"), endowment="equal", half_life_s=300.0)
POLICY = ThrottlePolicy(enter=(0.1, 2.0, 4.0), leave=(0.05, 1.5, 3.0), dwell_s=0.0)


def sampled(start_s: int = 600) -> SampledInterval:
    """Customers 1 and 2 on the hosts of organizations 20 and 21 (21 is customer 3)."""
    return SampledInterval(
        start_s=start_s,
        length_s=60,
        use=np.array([[100.0, 2.0], [10.0, 1.0], [30.0, 4.0]]),
        supply=np.array([[120.0, 8.0], [60.0, 8.0]]),
        configured=np.full((3, 2), np.nan),
        host_of_vm=np.array([0, 0, 1]),
        vm_customers=np.array([1, 2]),
        customer_of_vm=np.array([0, 1, 1]),
        host_organizations=np.array([20, 21]),
    )


def before() -> LedgerStanding:
    return LedgerStanding(
        300,
        {
            1: CustomerStanding(1.0, 0.4, 0.0, 0.1),
            4: CustomerStanding(NEGLIGIBLE / 10, 0.0, 0.0, 0.0),
        },
        {20: OrganizationStanding(0.3, 0.0)},
        {2: LevelHeld(1, 0.0)},
    )


def test_the_step_is_account_interval_from_the_standings_arrays() -> None:
    standing = before()
    step = step_interval(standing, sampled(), SETTINGS, customer_of_organization={21: 3})

    accounts = Accounts.layout([1, 2], [20, 21], [1, 4], [20], {21: 3})
    assert step.accounts == accounts
    arrays = starting_arrays(standing, accounts, SETTINGS)
    assert accounts.customers == (1, 2, 4, 3)
    assert arrays.balance.tolist() == [1.0, 0.0, NEGLIGIBLE / 10, 0.0]
    assert isinstance(arrays, Standing) and arrays.start_s == 300
    want = account_interval(step.use, arrays, SETTINGS, accounts)
    np.testing.assert_array_equal(step.result.balance, want.balance)
    # Customer 4 ran nothing and carries a negligible standing: forgotten. Customer 3 (an
    # organization) ran nothing either, and its priority carries it.
    assert 4 not in step.customers and {1, 2} <= set(step.customers)
    assert step.customers[1].balance == float(want.balance[0])
    assert step.customers[1].priority == float(want.priority[0])
    assert set(step.organizations) == {20, 21}
    assert step.after.start_s == 600 and step.after.customers == step.customers
    # No policy: no decision, and the levels carry as they were.
    assert step.levels is None and step.after.levels == standing.levels


def test_a_reset_customer_starts_from_zero() -> None:
    plain = step_interval(before(), sampled(), SETTINGS)
    reset = step_interval(before(), sampled(), SETTINGS, reset={1})
    greed = plain.result.greediness.customer_greediness[0]
    assert reset.customers[1].balance == pytest.approx(float(greed))
    assert plain.customers[1].balance == pytest.approx(0.5 + float(greed))


def test_levels_are_decide_customers_over_the_standing_left() -> None:
    standing = before()
    step = step_interval(standing, sampled(), SETTINGS, policy=POLICY)
    assert step.levels is not None
    end_s = 660.0
    want = decide_customers(
        {c: (s.balance, s.priority) for c, s in step.customers.items()},
        {2: (1, 0.0)},
        end_s,
        POLICY,
    )
    held = {c: h.level for c, h in step.after.levels.items()}
    for i, c in enumerate(want.customers):
        if want.kept[i]:
            assert held[c] == int(want.decision.level[i])
    assert [(ch.customer_id, ch.after) for ch in step.levels.changes] == [
        (c, int(want.decision.level[i]))
        for i, c in enumerate(want.customers)
        if want.decision.changed[i]
    ]
    assert step.levels == decide_next_levels(step.customers, standing.levels, end_s, POLICY)
