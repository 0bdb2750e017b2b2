"""The batched, cloud-wide GM: endowment modes, consumer modes, normalization, validation."""

from __future__ import annotations

import numpy as np
import pytest

from gmd.fairness.cloud import CloudInterval, cloud_greediness, flavor_endowment
from gmd.fairness.greediness import greediness


def two_hosts(**overrides) -> CloudInterval:
    """Host 0 (8 cores, 32 GiB) runs VMs 0-2, host 1 (4 cores, 16 GiB) runs VMs 3-4.
    Customers: 0 owns VMs 0 and 3, 1 owns VM 1, 2 owns VMs 2 and 4. Units: per interval."""
    args = dict(
        use=[[6.0, 10.0], [1.0, 10.0], [1.0, 4.0], [1.0, 2.0], [3.0, 14.0]],
        supply=[[8.0, 32.0], [4.0, 16.0]],
        host_of_vm=[0, 0, 0, 1, 1],
        customer_of_vm=[0, 1, 2, 0, 2],
        n_customers=3,
        configured=[[4.0, 16.0], [2.0, 8.0], [2.0, 8.0], [2.0, 8.0], [2.0, 8.0]],
        resources=["cpu", "memory"],
        hosts=["cmp-a", "cmp-b"],
        vms=["vm0", "vm1", "vm2", "vm3", "vm4"],
    )
    args.update(overrides)
    return CloudInterval(**args)


def test_equal_mode_by_hand() -> None:
    r = cloud_greediness(two_hosts(), gamma=0.5, endowment="equal")
    # Cloud share: (12 cores, 48 GiB) / 3 customers = (4, 16).
    np.testing.assert_allclose(r.share, [4.0, 16.0])
    # Host 0, e = (8/3, 32/3): cpu α = 6 − 8/3 = 10/3, β = 2·(8/3 − 1) = 10/3 → κ = 1.
    assert r.credit[0, 0] == pytest.approx(1.0)
    # VM 0: cpu +10/3, memory 10 − 32/3 = −2/3 (memory: α = 0, so no credit).
    g0 = (10 / 3) / (2 * 4) + 0.0
    assert r.greediness[0] == pytest.approx(g0, abs=1e-12)
    # VM 1: cpu −5/3 credited at γκ = 0.5.
    assert r.greediness[1] == pytest.approx(0.5 * (-5 / 3) / 8, abs=1e-12)
    # Host 1, e = (2, 8): VM 3 cedes 1 core and 6 GiB; VM 4 takes 1 core and 6 GiB more.
    assert r.greediness[4] == pytest.approx(1 / 8 + 6 / 32, abs=1e-12)
    assert r.greediness[3] == pytest.approx(0.5 * (-1 / 8 - 6 / 32), abs=1e-12)
    np.testing.assert_allclose(
        r.customer_greediness,
        [r.greediness[0] + r.greediness[3], r.greediness[1], r.greediness[2] + r.greediness[4]],
    )
    np.testing.assert_allclose(r.customer_terms.sum(axis=1), r.customer_greediness)


def test_flavor_endowment_scales_overcommitted_hosts() -> None:
    configured = np.array([[4.0, 16.0], [4.0, np.nan], [8.0, 16.0]])
    supply = np.array([[8.0, 32.0]])
    e = flavor_endowment(configured, supply, np.zeros(3, dtype=np.intp))
    # cpu: 16 vCPUs sold on 8 cores → halved. memory: NaN → 32/3, total 42.67 > 32 → scaled.
    np.testing.assert_allclose(e[:, 0], [2.0, 2.0, 4.0])
    np.testing.assert_allclose(e[:, 1].sum(), 32.0)
    np.testing.assert_allclose(e[1, 1] / e[0, 1], (32 / 3) / 16)


def test_flavor_mode_credits_against_flavors() -> None:
    r = cloud_greediness(two_hosts(), gamma=0.5, endowment="flavor")
    # Host 0 flavors: cpu 4+2+2 = 8 = supply, memory 32 = supply: endowment = flavor.
    np.testing.assert_allclose(r.endowment[:3], [[4, 16], [2, 8], [2, 8]])
    # VM 0 takes 2 cores over its flavor of 4.
    assert r.offsets[0, 0] == pytest.approx(2.0)
    # Host 1: flavors 4 cores on 4, 16 GiB on 16.
    np.testing.assert_allclose(r.endowment[3:], [[2, 8], [2, 8]])


def test_customer_consumer_mode_sums_vms_per_host() -> None:
    interval = two_hosts(customer_of_vm=[0, 0, 2, 0, 2])
    r = cloud_greediness(interval, gamma=0.5, endowment="flavor", consumer="customer")
    # Consumers: (host 0, c0) = VMs 0+1, (host 0, c2) = VM 2, (host 1, c0), (host 1, c2).
    assert r.consumer_host.tolist() == [0, 0, 1, 1]
    assert r.consumer_customer.tolist() == [0, 2, 0, 2]
    assert r.consumer_of_vm.tolist() == [0, 0, 1, 2, 3]
    np.testing.assert_allclose(r.use[0], [7.0, 20.0])
    np.testing.assert_allclose(r.endowment[0], [6.0, 24.0])
    with pytest.raises(ValueError, match="consumer='vm'"):
        _ = r.vm_greediness
    # Two active customers: s = (12, 48) / 2 = (6, 24). On host 0, c0 takes 1 core over its
    # flavors' 6; both cede memory, so nobody profits from it (α = 0): no memory credit.
    np.testing.assert_allclose(r.share, [6.0, 24.0])
    assert r.credit[0, 1] == 0.0
    assert r.greediness[0] == pytest.approx(1.0 / (2 * 6.0), abs=1e-12)


def test_given_endowments_are_used_as_they_are() -> None:
    flavor = cloud_greediness(two_hosts(), endowment="flavor")
    given = cloud_greediness(two_hosts(configured=None), endowment=flavor.endowment)
    np.testing.assert_allclose(given.greediness, flavor.greediness, atol=1e-15)
    with pytest.raises(ValueError, match="endowment for VM 'vm1', resource 'cpu'"):
        cloud_greediness(two_hosts(), endowment=[[1.0, 1.0], [-1.0, 1.0]] + [[1.0, 1.0]] * 3)
    with pytest.raises(ValueError, match=r"endowment must have shape \(5, 2\)"):
        cloud_greediness(two_hosts(), endowment=[[1.0, 1.0]])


def test_single_host_cloud_is_the_paper() -> None:
    """One host whose VMs are all different customers: exactly Eq. 1."""
    use = [[4, 2, 4], [1, 4, 3], [1, 6, 2]]
    supply = [12, 12, 9]
    interval = CloudInterval(use, [supply], [0, 0, 0], [0, 1, 2], 3)
    r = cloud_greediness(interval, gamma=0.5, endowment="equal")
    np.testing.assert_allclose(r.vm_greediness, greediness(use, supply, 0.5), atol=1e-15)


def test_idle_customers_do_not_dilute_the_share() -> None:
    """N counts customers with a VM in the interval, not every customer in the ledger."""
    r = cloud_greediness(two_hosts(n_customers=10), endowment="equal")
    np.testing.assert_allclose(r.share, [4.0, 16.0])
    assert r.active_customers == 3
    assert r.customer_greediness.shape == (10,)
    assert (r.customer_greediness[3:] == 0).all()


def test_weights_scale_terms() -> None:
    base = cloud_greediness(two_hosts(), endowment="equal")
    weighted = cloud_greediness(two_hosts(), endowment="equal", weights=[2.0, 0.0])
    np.testing.assert_allclose(weighted.terms[:, 0], 2 * base.terms[:, 0])
    assert (weighted.terms[:, 1] == 0).all()


@pytest.mark.parametrize(
    ("overrides", "kwargs", "message"),
    [
        ({"use": [[1.0, 2.0]] * 4 + [[1.0, -2.0]]}, {}, r"use for VM 'vm4', resource 'memory'"),
        ({"use": [[1.0, 2.0]] * 4 + [[np.nan, 1.0]]}, {}, "VM 'vm4', resource 'cpu'.*finite"),
        ({"supply": [[8.0, 32.0], [0.0, 16.0]]}, {}, "host 'cmp-b', resource 'cpu'.*zero"),
        ({"host_of_vm": [0, 0, 0, 1, 2]}, {}, r"host_of_vm\[4\] = 2 names no host"),
        ({"customer_of_vm": [0, 1, 2, 0, 3]}, {}, r"customer_of_vm\[4\] = 3"),
        ({"configured": None}, {"endowment": "flavor"}, "needs the VMs' configured"),
        ({"configured": [[1.0, np.inf]] * 5}, {}, "configured for VM 'vm0', resource 'memory'"),
        ({"supply": [[8.0, 32.0, 1.0]]}, {}, "supply must be hosts × 2 resources"),
        ({"host_of_vm": [0.0, 0, 0, 1, 1]}, {}, "integer host indices"),
        ({}, {"gamma": 1.5}, r"gamma = 1.5 is outside \[0, 1\]"),
        ({}, {"endowment": "fair"}, "endowment = 'fair'"),
        ({}, {"consumer": "host"}, "consumer = 'host'"),
        ({}, {"weights": [1.0, -1.0]}, "weights for resource 'memory'"),
        ({}, {"share": [4.0, 0.0]}, "share for resource 'memory'"),
    ],
)
def test_bad_input_is_named(overrides: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cloud_greediness(two_hosts(**overrides), **kwargs)
