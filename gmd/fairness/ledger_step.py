"""One run of intervals, pure: from the standing the ledger carries after one interval to the
standing after the next, and the throttle levels decided at its end.

The accountant writes this step's figures as ledger rows and decides levels from them,
``gmd-admin explain`` recomputes it to show an interval VM by VM, and a what-if replays it
interval after interval under other settings: one step, so that the three cannot drift apart.
The arithmetic inside is :func:`gmd.fairness.interval.account_interval`'s and
:func:`gmd.fairness.policy.decide_customers`'; this module owns what carries between intervals.

**The standing** (:class:`LedgerStanding`) is what a ledger row carries from one interval to
the next: per customer its balance, its DirectContr utility sums and its priority; per
organization its DirectContr contribution sums; per customer its throttle level and since when
it holds it (the dwell). After an interval a customer carries a standing when it ran a VM in it
or when any of its four figures is not yet negligible (:data:`NEGLIGIBLE`): the ledger is dense
for the standings that matter and forgets the rest. An interval after which no customer carries
a standing (nothing ran and nothing is left) leaves the standing where it was: the next interval
decays the balances from the last interval that had one, and no level is decided.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from gmd.fairness.interval import (
    Accounts,
    IntervalResult,
    IntervalSettings,
    IntervalUse,
    Standing,
    account_interval,
)
from gmd.fairness.policy import ThrottlePolicy, decide_customers

NEGLIGIBLE = 1e-12
"""A standing this small is forgotten (after ~45 half-lives of silence) to bound the ledger."""


@dataclass(frozen=True)
class CustomerStanding:
    """What a customer carries after an interval (its ledger row's standing)."""

    balance: float
    utility_work: float
    utility_moment: float
    priority: float = 0.0
    """DirectContr priority at the interval's end (what a level's score may weigh)"""


@dataclass(frozen=True)
class OrganizationStanding:
    """What an organization carries after an interval: its DirectContr contribution sums."""

    contribution_work: float
    contribution_moment: float


@dataclass(frozen=True)
class LevelHeld:
    """A customer's throttle level and when it took effect (its dwell counts from then)."""

    level: int
    since_s: float


@dataclass(frozen=True)
class LedgerStanding:
    """What the next interval starts from (see the module docstring)."""

    start_s: int | None
    """the start of the interval it is the standing after (None: nothing before)"""
    customers: Mapping[int, CustomerStanding]
    organizations: Mapping[int, OrganizationStanding]
    levels: Mapping[int, LevelHeld] = field(default_factory=dict)
    """customer id → the level in force; absent: level 0 since ever"""

    @classmethod
    def nothing(cls, levels: Mapping[int, LevelHeld] | None = None) -> LedgerStanding:
        """The standing before any interval: balances and sums 0."""
        return cls(None, {}, {}, {} if levels is None else levels)


@dataclass(frozen=True)
class SampledInterval:
    """One interval's VMs and hosts as arrays, by ledger id (before accounts are laid out)."""

    start_s: int
    length_s: int
    use: np.ndarray
    """VMs × resources: what each VM used in the interval"""
    supply: np.ndarray
    """hosts × resources: capacity × interval"""
    configured: np.ndarray
    """VMs × resources: the flavor's amounts for the interval (NaN where it sets none)"""
    host_of_vm: np.ndarray
    """each VM's host row"""
    vm_customers: np.ndarray
    """the distinct ids of the customers with a VM, ascending"""
    customer_of_vm: np.ndarray
    """each VM's customer, as an index into ``vm_customers``"""
    host_organizations: np.ndarray
    """each host row's owner organization id"""
    release_s: np.ndarray | None = None
    """when each VM was created (NaN: unknown); ψ′ only"""


@dataclass(frozen=True)
class LevelChange:
    """A customer's level moved at the end of an interval."""

    customer_id: int
    before: int
    after: int
    score: float
    reason: str


@dataclass(frozen=True)
class LevelKept:
    """A level row after a decision: for each customer that had one or leaves level 0."""

    customer_id: int
    level: int
    since_s: float
    score: float


@dataclass(frozen=True)
class LevelStep:
    """One interval's level decisions."""

    held: Mapping[int, LevelHeld]
    """every level in force after the decision (the next standing's)"""
    kept: tuple[LevelKept, ...]
    changes: tuple[LevelChange, ...]


@dataclass(frozen=True)
class IntervalStep:
    """What one interval gives: its figures, the standing after it, its level decisions."""

    accounts: Accounts
    use: IntervalUse
    result: IntervalResult
    customers: Mapping[int, CustomerStanding]
    """the customers carrying a standing after this interval (its ledger rows), in account
    order"""
    organizations: Mapping[int, OrganizationStanding]
    """every organization of the interval (its ledger rows)"""
    after: LedgerStanding
    """what the next interval starts from"""
    levels: LevelStep | None
    """None: no level decided (no policy given, or nobody carries a standing)"""


def step_interval(
    standing: LedgerStanding,
    sampled: SampledInterval,
    settings: IntervalSettings,
    *,
    reset: Collection[int] = frozenset(),
    customer_of_organization: Mapping[int, int] | None = None,
    policy: ThrottlePolicy | None = None,
) -> IntervalStep:
    """The interval accounted from ``standing``, and with ``policy`` the levels decided at its
    end. ``reset``: the customers whose balance was reset since the standing (they start from
    0); ``customer_of_organization``: the organizations that are customers (one account)."""
    host_orgs = sampled.host_organizations
    accounts = Accounts.layout(
        sampled.vm_customers.tolist(),
        np.unique(host_orgs).tolist(),
        standing.customers,
        standing.organizations,
        customer_of_organization or {},
    )
    use = IntervalUse(
        start_s=sampled.start_s,
        length_s=sampled.length_s,
        use=sampled.use,
        supply=sampled.supply,
        configured=sampled.configured,
        host_of_vm=sampled.host_of_vm,
        customer_of_vm=accounts.of_customers(sampled.vm_customers.tolist())[sampled.customer_of_vm],
        organization_of_host=accounts.of_organizations(host_orgs.tolist()),
        release_s=sampled.release_s,
    )
    was_reset = np.array([c in reset for c in accounts.customers], dtype=bool)
    result = account_interval(
        use, starting_arrays(standing, accounts, settings), settings, accounts, was_reset
    )
    customers, organizations = carried(accounts, result)
    levels = standing.levels
    decided = None
    if customers and policy is not None:
        decided = decide_next_levels(
            customers, levels, float(sampled.start_s + sampled.length_s), policy
        )
        levels = decided.held
    after = standing
    if customers:
        after = LedgerStanding(sampled.start_s, customers, organizations, levels)
    return IntervalStep(accounts, use, result, customers, organizations, after, decided)


def starting_arrays(
    standing: LedgerStanding, accounts: Accounts, settings: IntervalSettings
) -> Standing:
    """The standing as the engine's arrays over ``accounts`` (absent: 0)."""
    empty = Standing.empty(accounts, settings)
    arrays = Standing(standing.start_s, empty.balance, empty.directcontr)
    before = arrays.directcontr
    for c, i in accounts.account_of_customer.items():
        row = standing.customers.get(c)
        if row is not None:
            arrays.balance[i] = row.balance
            before.utility_work[i] = row.utility_work
            before.utility_moment[i] = row.utility_moment
    for o, a in accounts.account_of_org.items():
        org = standing.organizations.get(o)
        if org is not None:
            before.contribution_work[a] = org.contribution_work
            before.contribution_moment[a] = org.contribution_moment
    return arrays


def carried(
    accounts: Accounts, result: IntervalResult
) -> tuple[dict[int, CustomerStanding], dict[int, OrganizationStanding]]:
    """What the interval's customers and organizations carry after it: every customer with a
    VM or a standing not yet negligible, every organization."""
    after = result.directcontr
    priority = result.priority
    customers: dict[int, CustomerStanding] = {}
    for i, c in enumerate(accounts.customers):
        figures = (result.balance[i], after.utility_work[i], after.utility_moment[i], priority[i])
        if result.vms[i] <= 0 and all(abs(v) < NEGLIGIBLE for v in figures):
            continue
        customers[c] = CustomerStanding(*(float(v) for v in figures))
    organizations = {
        o: OrganizationStanding(
            float(after.contribution_work[a]), float(after.contribution_moment[a])
        )
        for o, a in accounts.account_of_org.items()
    }
    return customers, organizations


def decide_next_levels(
    customers: Mapping[int, CustomerStanding],
    levels: Mapping[int, LevelHeld],
    end_s: float,
    policy: ThrottlePolicy,
) -> LevelStep:
    """The levels after an interval's end from the standings it left (a customer with a level
    but no standing scores 0): :func:`gmd.fairness.policy.decide_customers` over typed
    standings."""
    decided = decide_customers(
        {c: (s.balance, s.priority) for c, s in customers.items()},
        {c: (h.level, h.since_s) for c, h in levels.items()},
        end_s,
        policy,
    )
    decision = decided.decision
    held = dict(levels)
    kept: list[LevelKept] = []
    changes: list[LevelChange] = []
    for i, c in enumerate(decided.customers):
        level, score = int(decision.level[i]), float(decision.score[i])
        if decided.kept[i]:
            held[c] = LevelHeld(level, float(decision.since_s[i]))
            kept.append(LevelKept(c, level, float(decision.since_s[i]), score))
        if decision.changed[i]:
            changes.append(LevelChange(c, int(decided.before[i]), level, score, decision.reason[i]))
    return LevelStep(held, tuple(kept), tuple(changes))


def finite_balances(customers: Mapping[int, CustomerStanding]) -> bool:
    """Whether every balance is a finite number (settings that overflow give NaN or inf)."""
    return all(math.isfinite(s.balance) for s in customers.values())
