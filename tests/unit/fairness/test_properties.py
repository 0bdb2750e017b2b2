"""Properties of the GM that the paper's reasoning implies, checked on random pools."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from gmd.fairness.cloud import CloudInterval, cloud_greediness
from gmd.fairness.greediness import greediness, greediness_detail

amount = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
gammas = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def pools(draw: st.DrawFn, min_n: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A pool: use (n × m) and a supply that covers it (a self-serving store)."""
    n = draw(st.integers(min_n, 7))
    m = draw(st.integers(1, 5))
    use = draw(arrays(np.float64, (n, m), elements=amount))
    slack = draw(arrays(np.float64, (m,), elements=st.floats(0.5, 1e3)))
    return use, use.sum(axis=0) + slack


@given(pools(min_n=2), gammas, st.data())
def test_consumer_at_its_endowment_scores_zero(pool, gamma, data) -> None:
    use, supply = pool
    j = data.draw(st.integers(0, use.shape[0] - 1))
    use = use.copy()
    use[j] = supply / use.shape[0]
    assert abs(greediness(use, supply, gamma)[j]) <= 1e-12


@given(pools(), gammas, st.data())
def test_consumer_at_a_given_endowment_scores_zero(pool, gamma, data) -> None:
    use, supply = pool
    n, m = use.shape
    endowment = data.draw(arrays(np.float64, (n, m), elements=amount))
    j = data.draw(st.integers(0, n - 1))
    use = use.copy()
    use[j] = endowment[j]
    assert abs(greediness(use, supply, gamma, endowment)[j]) <= 1e-12


@given(pools(), gammas, st.randoms(use_true_random=False))
def test_permuting_consumers_permutes_greediness(pool, gamma, rnd) -> None:
    use, supply = pool
    order = list(range(use.shape[0]))
    rnd.shuffle(order)
    np.testing.assert_allclose(
        greediness(use[order], supply, gamma),
        greediness(use, supply, gamma)[order],
        rtol=1e-9,
        atol=1e-12,
    )


@given(pools(), gammas, st.data())
def test_scaling_a_resource_changes_nothing(pool, gamma, data) -> None:
    use, supply = pool
    i = data.draw(st.integers(0, use.shape[1] - 1))
    factor = data.draw(st.floats(1e-3, 1e3))
    scaled_use, scaled_supply = use.copy(), supply.copy()
    scaled_use[:, i] *= factor
    scaled_supply[i] *= factor
    np.testing.assert_allclose(
        greediness(scaled_use, scaled_supply, gamma),
        greediness(use, supply, gamma),
        rtol=1e-9,
        atol=1e-9,
    )


@given(pools())
def test_gamma_zero_gives_no_credit(pool) -> None:
    use, supply = pool
    d = greediness_detail(use, supply, gamma=0.0)
    assert (d.offsets >= 0).all()
    over_only = np.maximum(use - supply / use.shape[0], 0)
    np.testing.assert_allclose(d.offsets, over_only, rtol=1e-12, atol=1e-12)
    assert (d.greediness >= 0).all()


@given(pools(), gammas, st.data())
def test_taking_more_never_lowers_ones_greediness(pool, gamma, data) -> None:
    """Raising any consumer's use of any resource, in particular an over-consumer's, never
    lowers its GM: the GM gives no incentive to consume more than needed."""
    use, supply = pool
    n, m = use.shape
    j = data.draw(st.integers(0, n - 1))
    i = data.draw(st.integers(0, m - 1))
    more = use.copy()
    more[j, i] += data.draw(st.floats(1e-6, 1e3))
    before = greediness(use, supply, gamma)[j]
    after = greediness(more, supply, gamma)[j]
    assert after >= before - 1e-12


@given(pools(min_n=2), gammas, st.data())
def test_over_consumer_pays_the_full_excess(pool, gamma, data) -> None:
    use, supply = pool
    n = use.shape[0]
    j = data.draw(st.integers(0, n - 1))
    use = use.copy()
    use[j] = supply / n + data.draw(st.floats(0.0, 10.0))
    d = greediness_detail(use, supply, gamma)
    np.testing.assert_allclose(d.offsets[j], use[j] - supply / n, rtol=1e-9, atol=1e-9)


@st.composite
def clouds(draw: st.DrawFn) -> tuple[CloudInterval, int]:
    n_hosts = draw(st.integers(1, 5))
    m = draw(st.integers(1, 4))
    n_vms = draw(st.integers(1, 25))
    n_customers = draw(st.integers(1, 6))
    host_of = draw(arrays(np.int64, (n_vms,), elements=st.integers(0, n_hosts - 1)))
    customer_of = draw(arrays(np.int64, (n_vms,), elements=st.integers(0, n_customers - 1)))
    use = draw(arrays(np.float64, (n_vms, m), elements=amount))
    supply = draw(arrays(np.float64, (n_hosts, m), elements=st.floats(1.0, 1e4)))
    configured = draw(
        arrays(np.float64, (n_vms, m), elements=st.one_of(st.just(np.nan), st.floats(0, 1e3)))
    )
    interval = CloudInterval(
        use=use,
        supply=supply,
        host_of_vm=host_of,
        customer_of_vm=customer_of,
        n_customers=n_customers,
        configured=configured,
    )
    return interval, n_hosts


@settings(max_examples=60)
@given(clouds(), gammas, st.sampled_from(["equal", "flavor"]))
def test_batched_equals_single_pool_host_by_host(cloud, gamma, mode) -> None:
    interval, n_hosts = cloud
    result = cloud_greediness(interval, gamma=gamma, endowment=mode)
    host_of = np.asarray(interval.host_of_vm)
    for h in range(n_hosts):
        vms = np.flatnonzero(host_of == h)
        if vms.size == 0:
            continue
        supply = np.asarray(interval.supply)[h]
        endowment = None if mode == "equal" else result.endowment[vms]
        single = greediness_detail(np.asarray(interval.use)[vms], supply, gamma, endowment)
        np.testing.assert_allclose(result.offsets[vms], single.offsets, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(result.credit[h], single.credit, rtol=1e-12, atol=1e-12)
        # The same host alone, normalized by its own equal share, is the single-pool GM.
        alone = cloud_greediness(
            interval, gamma=gamma, endowment=mode, share=supply / vms.size
        ).greediness[vms]
        np.testing.assert_allclose(alone, single.greediness, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        result.customer_greediness,
        np.bincount(interval.customer_of_vm, result.greediness, interval.n_customers),
        rtol=1e-9,
        atol=1e-9,
    )
