"""The core computes one resource column at a time, for speed (issue 33): it must give what the
plain whole-matrix formulas give, to the bit, so that re-accounting an interval reproduces the
ledger. The references below are those formulas as the core had them before."""

from __future__ import annotations

import numpy as np
import pytest

from gmd.fairness._validate import Labels, as_index_array, check_amounts
from gmd.fairness.cloud import flavor_endowment
from gmd.fairness.greediness import pool_offsets, resource_sum
from gmd.fairness.segments import segment_count, segment_sum


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values and equal signs of zero (``array_equal`` takes -0.0 for 0.0)."""
    return (
        got.shape == want.shape
        and np.array_equal(got, want, equal_nan=True)
        and np.array_equal(np.signbit(got), np.signbit(want))
    )


def amounts(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Amounts over many magnitudes, with exact zeros and integers, where rounding shows."""
    x = rng.random(shape) * 10.0 ** rng.integers(-6, 6, shape)
    kind = rng.integers(0, 4, shape)
    x[kind == 0] = 0.0
    x[kind == 1] = np.round(x[kind == 1])
    return x


def offsets_reference(
    use: np.ndarray, endowment: np.ndarray, pool_of: np.ndarray, n_pools: int, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    diff = use - endowment
    over = segment_sum(np.maximum(diff, 0.0), pool_of, n_pools)
    ceded = segment_sum(np.maximum(-diff, 0.0), pool_of, n_pools)
    safe = np.where(ceded > 0.0, ceded, 1.0)
    credit = np.where(ceded > 0.0, np.minimum(1.0, over / safe), 0.0)
    offsets = np.where(diff >= 0.0, diff, gamma * credit[pool_of] * diff)
    return offsets, over, ceded, credit


def flavor_reference(configured: np.ndarray, supply: np.ndarray, host_of: np.ndarray) -> np.ndarray:
    n_hosts = supply.shape[0]
    equal_split = supply / np.maximum(segment_count(host_of, n_hosts), 1)[:, None]
    v = np.where(np.isnan(configured), equal_split[host_of], configured)
    total = segment_sum(v, host_of, n_hosts)
    scale = np.divide(supply, total, out=np.ones_like(total), where=total > supply)
    return v * scale[host_of]


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize(("n", "m", "pools"), [(1, 1, 1), (7, 3, 2), (5000, 4, 300), (999, 6, 1)])
def test_pool_offsets_are_the_whole_matrix_formulas(
    n: int, m: int, pools: int, gamma: float
) -> None:
    rng = np.random.default_rng(n * m + pools)
    use, endowment = amounts(rng, (n, m)), amounts(rng, (n, m))
    endowment[::5] = use[::5]  # offsets of exactly 0
    pool_of = rng.integers(0, pools, n)
    got = pool_offsets(use, endowment, pool_of, pools, gamma)
    want = offsets_reference(use, endowment, pool_of, pools, gamma)
    for name, g, w in zip(
        ("offsets", "over", "ceded", "credit"),
        (got.offsets, got.over, got.ceded, got.credit),
        want,
        strict=True,
    ):
        assert same_bits(g, w), name


def test_flavor_endowment_is_the_whole_matrix_formula() -> None:
    rng = np.random.default_rng(7)
    n, n_hosts = 4000, 150
    supply = amounts(rng, (n_hosts, 5)) + 1.0
    configured = amounts(rng, (n, 5)) * 0.05
    configured[:, 2] = np.nan  # a resource no flavor sets
    configured[rng.random(n) < 0.3, 3] = np.nan  # one some flavors set
    host_of = rng.integers(0, n_hosts + 10, n) % n_hosts  # and hosts without VMs
    assert same_bits(
        flavor_endowment(configured, supply, host_of), flavor_reference(configured, supply, host_of)
    )


@pytest.mark.parametrize("m", range(1, 13))
def test_resource_sum_is_numpys_row_sum_for_any_layout(m: int) -> None:
    rng = np.random.default_rng(m)
    terms = (rng.random((3000, m)) - 0.5) * 10.0 ** rng.integers(-8, 8, (3000, m))
    terms[rng.random(terms.shape) < 0.2] = -0.0
    terms[:50] = -0.0  # rows of negative zeros sum to +0.0
    want = terms.sum(axis=1)
    assert same_bits(resource_sum(terms), want)
    assert same_bits(resource_sum(np.asfortranarray(terms)), want)


@pytest.mark.parametrize(
    ("values", "kwargs", "message"),
    [
        ([[1.0, np.nan]], {}, "is not a finite number"),
        ([[1.0, np.inf]], {"allow_nan": True}, "is not a finite number"),
        ([[np.nan, -1.0]], {"allow_nan": True}, "is negative"),
        ([[1.0, 0.0]], {"positive": True}, "is zero"),
        ([[-0.0, 2.0]], {"positive": True}, "is zero"),
    ],
)
def test_amount_checks_still_name_the_bad_value(
    values: list[list[float]], kwargs: dict[str, bool], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_amounts(
            "use", np.array(values), Labels("VM", None, 1), Labels("resource", None, 2), **kwargs
        )


def test_amount_checks_pass_what_they_allow() -> None:
    cols = Labels("resource", None, 2)
    check_amounts("configured", np.full((3, 2), np.nan), None, cols, allow_nan=True)
    check_amounts("use", np.array([[0.0, -0.0]]), None, cols)
    check_amounts("use", np.empty((0, 2)), None, cols)


def test_index_checks_still_name_the_bad_index() -> None:
    assert as_index_array("host_of_vm", [0, 2, 1], 3, 3, "host").tolist() == [0, 2, 1]
    with pytest.raises(ValueError, match=r"host_of_vm\[1\] = 3 names no host"):
        as_index_array("host_of_vm", [0, 3, -1], 3, 3, "host")
    with pytest.raises(ValueError, match=r"host_of_vm\[2\] = -1 names no host"):
        as_index_array("host_of_vm", [0, 1, -1], 3, 3, "host")
