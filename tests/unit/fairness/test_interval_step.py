"""The pure interval step (gmd.fairness.interval): the one computation accounting writes,
explain shows and a what-if replays. Its account layout, its standing arithmetic (decay,
resets, DirectContr) against the engine's parts composed by hand, and its purity."""

from __future__ import annotations

import numpy as np
import pytest

from gmd.fairness.cloud import CloudInterval, cloud_greediness
from gmd.fairness.decay import decay_factor
from gmd.fairness.directcontr import DirectContrBalances, directcontr_update, normalized_work
from gmd.fairness.interval import (
    Accounts,
    IntervalSettings,
    IntervalUse,
    Standing,
    account_interval,
)

RESOURCES = ("cpu", "memory")


def test_accounts_put_customers_first_then_organizations_that_are_not_customers() -> None:
    accounts = Accounts.layout(
        sample_customers=[5, 3, 5],
        host_organizations=[10, 11],
        standing_customers=[7],
        standing_organizations=[12],
        customer_of_organization={11: 9, 13: 8},
    )
    # Customers with samples or a standing in id order, then those an organization is.
    assert accounts.customers == (3, 5, 7, 9)
    # Organization 11 is customer 9 (one account); 10 and 12 get accounts of their own.
    assert dict(accounts.account_of_org) == {10: 4, 11: 3, 12: 5}
    assert (accounts.n_customers, accounts.n_accounts) == (4, 6)
    assert accounts.of_customers([9, 3]).tolist() == [3, 0]


def interval(start_s: int = 600) -> tuple[IntervalUse, Accounts]:
    accounts = Accounts.layout([1, 2], [20, 21], [3], [], {21: 3})
    use = IntervalUse(
        start_s=start_s,
        length_s=60,
        use=np.array([[100.0, 2.0], [10.0, 1.0], [30.0, 4.0]]),
        supply=np.array([[120.0, 8.0], [60.0, 8.0]]),
        configured=np.full((3, 2), np.nan),
        host_of_vm=np.array([0, 0, 1]),
        customer_of_vm=accounts.of_customers([1, 2, 2]),
        organization_of_host=accounts.of_organizations([20, 21]),
    )
    return use, accounts


@pytest.mark.parametrize("utility", ["psi_double_prime", "psi"])
def test_the_step_is_the_engines_parts_composed_with_decay_and_resets(utility: str) -> None:
    use, accounts = interval()
    settings = IntervalSettings(
        resources=RESOURCES, gamma=0.5, endowment="equal", half_life_s=300.0, utility=utility
    )
    before = DirectContrBalances.zeros(accounts.n_accounts, utility)
    before.utility_work[:] = [0.4, 0.2, 0.1, 0.0]
    before.contribution_work[:] = [0.0, 0.0, 0.3, 0.5]
    standing = Standing(300, np.array([1.0, -0.5, 2.0]), before)
    kept = (standing.balance.copy(), before.utility_work.copy(), use.use.copy())
    reset = np.array([False, False, True])

    got = account_interval(use, standing, settings, accounts, reset)

    engine = cloud_greediness(
        CloudInterval(use.use, use.supply, use.host_of_vm, use.customer_of_vm, 3),
        gamma=0.5,
        endowment="equal",
    )
    decay = decay_factor(300.0, 300.0)
    assert got.decay == pytest.approx(0.5)
    expected_balance = np.array([1.0 * decay, -0.5 * decay, 0.0]) + engine.customer_greediness
    np.testing.assert_allclose(got.balance, expected_balance)
    after = directcontr_update(
        before,
        normalized_work(use.use, engine.share),
        use.customer_of_vm,
        use.organization_of_host[use.host_of_vm],
        interval_start_s=600,
        interval_s=300.0,
        half_life_s=300.0,
    )
    np.testing.assert_allclose(got.directcontr.utility_work, after.utility_work)
    np.testing.assert_allclose(got.utility, after.utility(660.0))
    np.testing.assert_allclose(got.priority, after.contribution(660.0) - after.utility(660.0))
    assert got.vms.tolist() == [1, 2, 0, 0]
    # Pure: what it was given is as it was.
    np.testing.assert_array_equal(standing.balance, kept[0])
    np.testing.assert_array_equal(before.utility_work, kept[1])
    np.testing.assert_array_equal(use.use, kept[2])


def test_without_a_standing_nothing_decays_and_balances_are_the_greediness() -> None:
    use, accounts = interval()
    settings = IntervalSettings(resources=RESOURCES, endowment="equal")
    got = account_interval(use, Standing.empty(accounts, settings), settings, accounts)
    assert got.decay == 1.0
    np.testing.assert_allclose(got.balance, got.greediness.customer_greediness)
    # Customer 1's VM takes 100 of host 0's 120 where customer 2's idles: one greedy, one
    # credited for what it left.
    assert got.balance[0] > 0 > got.balance[1]
