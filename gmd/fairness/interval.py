"""One accounting interval, pure: what the VMs used → each customer's greediness and balance,
each account's DirectContr sums, utility, contribution and priority.

The arithmetic of the one step that accounting writes to the ledger, ``gmd-admin explain``
shows, and a what-if replays under other settings (:mod:`gmd.fairness.ledger_step` takes it
from a typed standing to the next, levels and all): written once, so that the three cannot
drift apart.

**Accounts.** Customers and organizations share one space of accounts (DirectContr: an
organization that is also a customer shares its customer's account, so its own load on its own
hosts nets to zero). Customer accounts come first, numbered in the order of their ids; then the
organizations that are not customers. The customers are those with a sample in the interval or a
standing carried from before, and the customers that organizations with a host or a standing are.

**Standing.** What carries from the last interval with a standing: each customer's balance,
decayed by the time elapsed since (``2^(−elapsed/H)``), unless a reset falls in between (then it
starts from 0), and every account's DirectContr sums, decayed alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gmd.fairness.cloud import (
    CloudGreediness,
    CloudInterval,
    ConsumerMode,
    EndowmentMode,
    cloud_greediness,
)
from gmd.fairness.decay import DEFAULT_HALF_LIFE_S, decay_factor
from gmd.fairness.directcontr import DirectContrBalances, directcontr_update, normalized_work


@dataclass(frozen=True)
class IntervalSettings:
    """The accounting settings one interval depends on (``[accounting]``)."""

    resources: tuple[str, ...]
    gamma: float = 0.5
    endowment: EndowmentMode = EndowmentMode.flavor
    consumer: ConsumerMode = ConsumerMode.vm
    weights: tuple[float, ...] | None = None
    half_life_s: float | None = DEFAULT_HALF_LIFE_S
    utility: str = "psi_double_prime"
    origin_s: float = 0.0
    """the origin of ψ and ψ′ times (see :mod:`gmd.fairness.directcontr`): the Unix epoch.
    Moments are then ~1e9 × work, which float64 holds to ~1e-7 of a work unit, far below what
    one interval adds."""


@dataclass(frozen=True)
class Accounts:
    """Which customer and organization each account is (see the module docstring)."""

    customers: tuple[int, ...]
    """account i < len(customers) is customer ``customers[i]`` (ids, ascending … then the
    customers only an organization brought in)"""
    account_of_org: Mapping[int, int]
    """organization id → its account"""
    n_accounts: int

    @classmethod
    def layout(
        cls,
        sample_customers: Iterable[int],
        host_organizations: Iterable[int],
        standing_customers: Iterable[int] = (),
        standing_organizations: Iterable[int] = (),
        customer_of_organization: Mapping[int, int] | None = None,
    ) -> Accounts:
        """The accounts of an interval: every customer with a sample or a standing, then the
        customers organizations are, then the organizations that are not customers."""
        org_customer = customer_of_organization or {}
        customers = sorted(set(standing_customers) | set(sample_customers))
        orgs = sorted(set(standing_organizations) | set(host_organizations))
        known = set(customers)
        customers += sorted({org_customer[o] for o in orgs if o in org_customer} - known)
        index = {c: i for i, c in enumerate(customers)}
        account_of_org: dict[int, int] = {}
        n_accounts = len(customers)
        for o in orgs:
            if o in org_customer:
                account_of_org[o] = index[org_customer[o]]
            else:
                account_of_org[o] = n_accounts
                n_accounts += 1
        return cls(tuple(customers), account_of_org, n_accounts)

    @property
    def n_customers(self) -> int:
        return len(self.customers)

    @property
    def account_of_customer(self) -> dict[int, int]:
        return {c: i for i, c in enumerate(self.customers)}

    def of_customers(self, ids: Sequence[int]) -> np.ndarray:
        """The accounts of these customer ids (each must be one of :attr:`customers`)."""
        index = self.account_of_customer
        return np.array([index[c] for c in ids], dtype=np.intp)

    def of_organizations(self, ids: Sequence[int]) -> np.ndarray:
        return np.array([self.account_of_org[o] for o in ids], dtype=np.intp)


@dataclass(frozen=True)
class Standing:
    """What an interval starts from: the standing after the last interval that had one."""

    start_s: int | None
    """the start of that interval (None: nothing before, balances 0)"""
    balance: np.ndarray
    """per customer account"""
    directcontr: DirectContrBalances
    """per account"""

    @classmethod
    def empty(cls, accounts: Accounts, settings: IntervalSettings) -> Standing:
        return cls(
            None,
            np.zeros(accounts.n_customers),
            DirectContrBalances.zeros(accounts.n_accounts, settings.utility, settings.origin_s),
        )


@dataclass(frozen=True)
class IntervalUse:
    """One interval's VMs and hosts, as arrays (one row per VM, per host)."""

    start_s: int
    length_s: int
    use: np.ndarray
    """VMs × resources: what each VM used in the interval, in the resources' units"""
    supply: np.ndarray
    """hosts × resources: capacity × interval"""
    configured: np.ndarray
    """VMs × resources: the flavor's amounts for the interval (NaN where it sets none)"""
    host_of_vm: np.ndarray
    customer_of_vm: np.ndarray
    """each VM's customer account"""
    organization_of_host: np.ndarray
    """each host's owner's account"""
    release_s: np.ndarray | None = None
    """when each VM was created (NaN: unknown, taken as the interval's start); ψ′ only"""


@dataclass(frozen=True)
class IntervalResult:
    """What one interval gives, per customer account (``balance``) and per account."""

    greediness: CloudGreediness
    balance: np.ndarray
    directcontr: DirectContrBalances
    utility: np.ndarray
    contribution: np.ndarray
    vms: np.ndarray
    decay: float
    reset: np.ndarray = field(repr=False)

    @property
    def priority(self) -> np.ndarray:
        return self.contribution - self.utility


def account_interval(
    interval: IntervalUse,
    standing: Standing,
    settings: IntervalSettings,
    accounts: Accounts,
    reset: np.ndarray | None = None,
) -> IntervalResult:
    """The interval's greediness, balances and DirectContr figures from the standing before it.

    ``reset`` (per customer account, bool) marks balances reset since the standing: they start
    from 0. Utility, contribution and priority are valued at the interval's end."""
    n_customers = accounts.n_customers
    weights = None if settings.weights is None else list(settings.weights)
    result = cloud_greediness(
        CloudInterval(
            use=interval.use,
            supply=interval.supply,
            host_of_vm=interval.host_of_vm,
            customer_of_vm=interval.customer_of_vm,
            n_customers=n_customers,
            configured=interval.configured,
            resources=settings.resources,
        ),
        gamma=settings.gamma,
        endowment=settings.endowment,
        consumer=settings.consumer,
        weights=weights,
    )
    start_s = interval.start_s
    elapsed = 0.0 if standing.start_s is None else float(start_s - standing.start_s)
    decay = decay_factor(elapsed, settings.half_life_s)
    was_reset = np.zeros(n_customers, dtype=bool) if reset is None else reset
    balance = np.where(was_reset, 0.0, standing.balance) * decay + result.customer_greediness

    work = normalized_work(interval.use, result.share, weights)
    release = None
    if settings.utility == "psi_prime":
        created = interval.release_s
        if created is None:
            created = np.full(len(interval.use), np.nan)
        release = np.where(np.isnan(created), float(start_s), created)
    after = directcontr_update(
        standing.directcontr,
        work,
        interval.customer_of_vm,
        interval.organization_of_host.take(interval.host_of_vm),
        interval_start_s=start_s,
        interval_s=elapsed,  # the decay since the standing we start from
        half_life_s=settings.half_life_s,
        release_s=release,
    )
    end_s = float(start_s + interval.length_s)
    return IntervalResult(
        greediness=result,
        balance=balance,
        directcontr=after,
        utility=after.utility(end_s),
        contribution=after.contribution(end_s),
        vms=np.bincount(interval.customer_of_vm, minlength=accounts.n_accounts),
        decay=decay,
        reset=was_reset,
    )
