"""DirectContr bookkeeping: utility, contribution and priority of accounts.

Skowron & Rzadca's heuristic (SPAA 2013), as CloudShare applies it: an organization's
contribution is the utility of the work done on the hosts it owns, its utility that of the
work done for it, and priority = contribution − utility (``fairness-model.md`` Sec. 4).
Customers and organizations live in one space of *accounts*, because an organization that
contributes hosts may also run VMs: its own load on its own hosts then nets to zero.

Utilities (CloudShare Eq. 2-4), for a unit of work done in the interval starting at ``s``:

- ``psi_double_prime`` (ψ″, default): worth 1 — the "surface" of executed work;
- ``psi`` (ψ, strategy-resilient): worth ``T − s`` at time T, so earlier work keeps growing;
- ``psi_prime`` (ψ′): worth ``T + r − s`` for a VM released at ``r``, neutralizing the start.

ψ and ψ′ are linear in T, so each balance is kept as two decayed sums, work ``W = Σ u`` and
moment ``M = Σ u·τ``, and read at T as ``(T − origin)·W − M``. Times are taken relative to
``origin_s`` (the papers' time 0: when the ledger or simulation starts), which also keeps the
products far from float64's precision limits when times are Unix seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from gmd.fairness._validate import (
    Labels,
    as_float_array,
    as_index_array,
    check_amounts,
    check_shape,
    resource_weights,
)
from gmd.fairness.decay import decay_factor
from gmd.fairness.segments import segment_sum


class Utility(StrEnum):
    """How an organization's utility is valued (``accounting.utility``; DirectContr's ψ)."""

    psi_double_prime = "psi_double_prime"
    """ψ″: the work done"""
    psi = "psi"
    """ψ"""
    psi_prime = "psi_prime"
    """ψ′: with a bonus for VMs created in the interval"""


UTILITIES: tuple[Utility, ...] = tuple(Utility)
_ALIASES = {"ψ″": Utility.psi_double_prime, "ψ": Utility.psi, "ψ′": Utility.psi_prime}


def utility_name(name: str) -> Utility:
    """The utility ``name`` names, accepting the papers' ψ, ψ′, ψ″."""
    canonical = _ALIASES.get(name, name)
    if canonical not in UTILITIES:
        raise ValueError(f"utility = {name!r}; choose one of {', '.join(UTILITIES)}")
    return Utility(canonical)


def normalized_work(
    use: object,
    share: object,
    weights: object | None = None,
    *,
    resources: Sequence[str] | None = None,
) -> np.ndarray:
    """Work per VM in normalized units: ``u_j = Σ_i w_i · a_ij / (m · s_i)``.

    The same normalization as the GM's, so that one unit of work is one customer's whole
    share of every resource for the interval, divided by m.
    """
    a = as_float_array("use", use, 2)
    m = a.shape[1]
    cols = Labels("resource", resources, m)
    s = as_float_array("share", share, 1)
    check_shape("share", s, (m,), "one amount per resource")
    check_amounts("share", s, None, cols, positive=True)
    check_amounts("use", a, Labels("VM", None, a.shape[0]), cols)
    w = resource_weights(weights, m, cols)
    return a @ (w / (m * s))


@dataclass(frozen=True)
class DirectContrBalances:
    """Decayed utility and contribution sums of every account (see the module docstring)."""

    utility_kind: Utility
    origin_s: float
    utility_work: np.ndarray
    utility_moment: np.ndarray
    contribution_work: np.ndarray
    contribution_moment: np.ndarray

    @classmethod
    def zeros(
        cls, n_accounts: int, utility: str = "psi_double_prime", origin_s: float = 0.0
    ) -> DirectContrBalances:
        z = np.zeros(int(n_accounts))
        return cls(utility_name(utility), float(origin_s), z, z.copy(), z.copy(), z.copy())

    @property
    def n_accounts(self) -> int:
        return self.utility_work.shape[0]

    def _value(self, work: np.ndarray, moment: np.ndarray, at_s: float | None) -> np.ndarray:
        if self.utility_kind == Utility.psi_double_prime:
            return work.copy()
        if at_s is None:
            raise ValueError(f"utility {self.utility_kind} grows with time: give at_s")
        return (float(at_s) - self.origin_s) * work - moment

    def utility(self, at_s: float | None = None) -> np.ndarray:
        """What each account has received, valued at ``at_s`` (needed for ψ and ψ′)."""
        return self._value(self.utility_work, self.utility_moment, at_s)

    def contribution(self, at_s: float | None = None) -> np.ndarray:
        """What each account's hosts have done for anyone, valued at ``at_s``."""
        return self._value(self.contribution_work, self.contribution_moment, at_s)

    def priority(self, at_s: float | None = None) -> np.ndarray:
        """Contribution − utility: highest first."""
        return self.contribution(at_s) - self.utility(at_s)

    def grown(self, n_accounts: int) -> DirectContrBalances:
        """The same balances with room for accounts that appeared since (they start at 0)."""
        extra = int(n_accounts) - self.n_accounts
        if extra < 0:
            raise ValueError(f"cannot shrink balances from {self.n_accounts} to {n_accounts}")
        pad = np.zeros(extra)
        return replace(
            self,
            utility_work=np.concatenate([self.utility_work, pad]),
            utility_moment=np.concatenate([self.utility_moment, pad]),
            contribution_work=np.concatenate([self.contribution_work, pad]),
            contribution_moment=np.concatenate([self.contribution_moment, pad]),
        )


def directcontr_update(
    balances: DirectContrBalances,
    work: object,
    consumer_account: object,
    provider_account: object,
    *,
    interval_start_s: float,
    interval_s: float,
    half_life_s: float | None = None,
    release_s: object | None = None,
) -> DirectContrBalances:
    """The balances after one interval in which VM j did ``work[j]``.

    ``consumer_account[j]`` is the account of VM j's customer, ``provider_account[j]`` that of
    the organization owning VM j's host. Past sums decay by ``2^(−interval_s/H)`` first.
    ``release_s`` (per VM, when it was created) is needed only for ψ′.
    """
    u = as_float_array("work", work, 1)
    n = u.shape[0]
    check_amounts("work", u, None, Labels("VM", None, n))
    k = balances.n_accounts
    cons = as_index_array("consumer_account", consumer_account, n, k, "account")
    prov = as_index_array("provider_account", provider_account, n, k, "account")
    if not np.isfinite(interval_start_s):
        raise ValueError(f"interval_start_s = {interval_start_s!r} is not a finite time")
    d = decay_factor(interval_s, half_life_s)

    start = float(interval_start_s) - balances.origin_s
    if balances.utility_kind == Utility.psi_prime:
        if release_s is None:
            raise ValueError("utility psi_prime needs release_s, each VM's creation time")
        r = as_float_array("release_s", release_s, 1)
        check_shape("release_s", r, (n,), "one time per VM")
        if not np.all(np.isfinite(r)):
            raise ValueError(f"release_s[{int(np.argwhere(~np.isfinite(r))[0][0])}] is not finite")
        moment = u * (start - (r - balances.origin_s))
    else:
        moment = u * start  # every VM's τ is the interval's start

    return replace(
        balances,
        utility_work=balances.utility_work * d + segment_sum(u, cons, k),
        utility_moment=balances.utility_moment * d + segment_sum(moment, cons, k),
        contribution_work=balances.contribution_work * d + segment_sum(u, prov, k),
        contribution_moment=balances.contribution_moment * d + segment_sum(moment, prov, k),
    )
