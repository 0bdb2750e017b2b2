"""DirectContr bookkeeping (fairness-model.md Sec. 4) and balance decay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gmd.fairness.decay import decay_factor, decayed_balance
from gmd.fairness.directcontr import DirectContrBalances, directcontr_update, normalized_work

# Accounts: 0 = org "ops" (owns host 0), 1 = org "lab" (owns host 1, also runs VMs),
# 2 = customer "alice" (no hosts).
HOST_OWNER = np.array([0, 1])


def step(balances, work, customer, host, start, interval=60.0, half_life=None, release=None):
    return directcontr_update(
        balances,
        work,
        customer,
        HOST_OWNER[np.asarray(host)],
        interval_start_s=start,
        interval_s=interval,
        half_life_s=half_life,
        release_s=release,
    )


def test_normalized_work_matches_the_gm_normalization() -> None:
    use = [[4.0, 16.0], [0.0, 0.0], [8.0, 8.0]]
    u = normalized_work(use, share=[4.0, 16.0])
    np.testing.assert_allclose(u, [1.0, 0.0, (2.0 + 0.5) / 2])
    np.testing.assert_allclose(normalized_work(use, [4.0, 16.0], weights=[0, 2]), [1.0, 0, 0.5])


def test_surface_utility_priorities() -> None:
    b = DirectContrBalances.zeros(3)
    # lab runs 2 units on its own host; alice runs 3 units on ops' host.
    b = step(b, [2.0, 3.0], customer=[1, 2], host=[1, 0], start=0.0)
    np.testing.assert_allclose(b.utility(), [0.0, 2.0, 3.0])
    np.testing.assert_allclose(b.contribution(), [3.0, 2.0, 0.0])
    # Own load on own hosts nets to 0; hosting others gains; a pure consumer goes negative.
    np.testing.assert_allclose(b.priority(), [3.0, 0.0, -3.0])


def test_psi_values_work_by_how_long_ago_it_was_done() -> None:
    """ψ: a unit done in the interval starting at s is worth T − s at T (CloudShare Eq. 2)."""
    origin = 1_700_000_000.0
    b = DirectContrBalances.zeros(3, "psi", origin_s=origin)
    history = [(origin + 0.0, [1.0, 2.0]), (origin + 60.0, [0.5, 0.0]), (origin + 120, [2, 1])]
    for start, work in history:
        b = step(b, work, customer=[2, 2], host=[0, 1], start=start)
    at = origin + 300.0
    want_alice = sum(sum(w) * (at - s) for s, w in history)
    want_ops = sum(w[0] * (at - s) for s, w in history)
    assert b.utility(at)[2] == pytest.approx(want_alice, rel=1e-12)
    assert b.contribution(at)[0] == pytest.approx(want_ops, rel=1e-12)
    assert b.priority(at)[2] == pytest.approx(-want_alice, rel=1e-12)
    with pytest.raises(ValueError, match="give at_s"):
        b.utility()


def test_psi_prime_credits_the_wait_since_release() -> None:
    """ψ′: worth T + r − s, so work that started long after its VM's release counts less."""
    b = DirectContrBalances.zeros(3, "ψ′", origin_s=0.0)
    b = step(b, [1.0, 1.0], customer=[2, 1], host=[0, 1], start=600.0, release=[0.0, 540.0])
    at = 660.0
    np.testing.assert_allclose(b.utility(at)[[2, 1]], [660 + 0 - 600, 660 + 540 - 600])
    with pytest.raises(ValueError, match="release_s"):
        step(b, [1.0], customer=[2], host=[0], start=660.0)


def test_half_life_halves_balances() -> None:
    b = DirectContrBalances.zeros(3)
    b = step(b, [4.0], customer=[2], host=[0], start=0.0)
    b = step(b, [0.0], customer=[2], host=[0], start=60.0, interval=3600.0, half_life=3600.0)
    np.testing.assert_allclose(b.utility(), [0.0, 0.0, 2.0])
    np.testing.assert_allclose(b.contribution(), [2.0, 0.0, 0.0])


def test_decayed_psi_equals_decayed_sum_of_its_terms() -> None:
    h = 600.0
    b = DirectContrBalances.zeros(3, "psi")
    starts = [0.0, 60.0, 120.0, 180.0]
    for s in starts:
        b = step(b, [1.0], customer=[2], host=[0], start=s, half_life=h)
    at = 240.0
    # Each step decays what came before by one interval: the last is undecayed.
    want = sum(2 ** (-(starts[-1] - s) / h) * (at - s) for s in starts)
    assert b.utility(at)[2] == pytest.approx(want, rel=1e-12)


def test_grown_adds_zero_accounts() -> None:
    b = step(DirectContrBalances.zeros(3), [1.0], customer=[2], host=[0], start=0.0)
    g = b.grown(5)
    np.testing.assert_allclose(g.priority(), [1.0, 0.0, -1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="shrink"):
        g.grown(2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"work": [-1.0]}, r"work for VM #0 = -1.0 is negative"),
        ({"work": [math.nan]}, "not a finite number"),
        ({"customer": [7]}, r"consumer_account\[0\] = 7 names no account"),
        ({"start": math.inf}, "interval_start_s"),
        ({"half_life": 0.0}, "half_life_s = 0.0 must be > 0"),
    ],
)
def test_bad_updates_are_named(kwargs: dict, message: str) -> None:
    args = {"work": [1.0], "customer": [2], "host": [0], "start": 0.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        step(
            DirectContrBalances.zeros(3),
            args["work"],
            args["customer"],
            args["host"],
            args["start"],
            half_life=args.get("half_life"),
        )


def test_unknown_utility() -> None:
    with pytest.raises(ValueError, match="choose one of psi_double_prime, psi, psi_prime"):
        DirectContrBalances.zeros(2, "shapley")


def test_decay_factor_and_balance() -> None:
    assert decay_factor(7 * 86400, 7 * 86400) == 0.5
    assert decay_factor(60, None) == 1.0
    assert decay_factor(0, 10) == 1.0
    np.testing.assert_allclose(decayed_balance([4.0, -2.0], [1.0, 1.0], 10, 10), [3.0, 0.0])
    with pytest.raises(ValueError, match="elapsed_s"):
        decay_factor(-1, 10)
    with pytest.raises(ValueError, match="non-finite"):
        decayed_balance([1.0], [math.nan], 1, 1)
    with pytest.raises(ValueError, match="differ in shape"):
        decayed_balance([1.0], [1.0, 2.0], 1, 1)
