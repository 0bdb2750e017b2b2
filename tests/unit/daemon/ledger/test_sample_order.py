"""The grouping accounting does in numpy: the samples' order and the customers' ids, each
checked against numpy's general (and slower) answer on both of its paths."""

from __future__ import annotations

import numpy as np
import pytest

from gmd.daemon.ledger.interval_samples import (
    SAMPLE_HOST,
    SAMPLE_VM,
    host_vm_batch_order,
    unique_ids,
)


def samples(rng: np.random.Generator, n: int, *, repeat: bool) -> np.ndarray:
    """Rows of host, VM, customer and a batch column last, nearly in host order as they are
    read; with ``repeat`` some VMs have a second row on their host from a later batch."""
    host = np.sort(rng.integers(1, 50, n))
    vm = rng.permutation(n) + 1
    data = np.zeros((n, 4))
    data[:, SAMPLE_HOST], data[:, SAMPLE_VM], data[:, 3] = host, vm, host * 10
    if repeat:
        again = data[rng.choice(n, n // 10, replace=False)].copy()
        again[:, 3] += 1  # the agent's later batch
        data = np.concatenate([again, data])  # read before the first: only the batch orders
    return data


@pytest.mark.parametrize("repeat", [False, True])
def test_samples_are_ordered_by_host_vm_and_batch_as_a_lexsort_orders_them(repeat: bool) -> None:
    data = samples(np.random.default_rng(3), 2000, repeat=repeat)
    want = np.lexsort((data[:, 3], data[:, SAMPLE_VM], data[:, SAMPLE_HOST]))
    assert np.array_equal(host_vm_batch_order(data, 3), want)


def test_no_samples_have_an_empty_order() -> None:
    assert host_vm_batch_order(np.zeros((0, 4)), 3).tolist() == []


@pytest.mark.parametrize(
    "ids",
    [
        np.array([5, 3, 5, 1, 3, 3]),  # dense: the table of ids present
        np.array([7, 10**12, 7, 3]),  # sparse: the sort
        np.array([], dtype=np.int64),
    ],
)
def test_unique_ids_answer_as_np_unique(ids: np.ndarray) -> None:
    unique, inverse = unique_ids(ids)
    want_unique, want_inverse = np.unique(ids, return_inverse=True)
    assert np.array_equal(unique, want_unique)
    assert np.array_equal(inverse, want_inverse.reshape(-1))
