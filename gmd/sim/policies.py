"""Scheduling policies, registered by name: which organization's next job starts now.

A policy only ranks organizations; the scheduler (``scheduler.py``) owns the queues, keeps
every organization's jobs FIFO and never leaves a processor idle while a job waits, so every
policy here is greedy and non-clairvoyant by construction (RRDF excepted: it charges a job's
whole run time at its start, as FALB's profiler predicts it).

Ranks are read at ``t + 1``: a job started at t has done nothing yet at t, while by t + 1 it
has surely done one unit part. Reading at t would let the first choice at t win every free
processor at t, because starting a job would not change anyone's standing.

Ref and Rand need the schedules of other coalitions; they are registered here too, but run by
``coalitions.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gmd.fairness.directcontr import Utility
from gmd.sim.utility import UtilityBook, utility_name


class Policy:
    """The interface the scheduler calls. ``keys`` ranks organizations: lowest key first."""

    name = "policy"

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        self.n_orgs = n_orgs
        self.shares = list(shares)

    def keys(self, t: int) -> Sequence[float | int]:
        raise NotImplementedError

    def started(self, t: int, org: int, owner: int, duration: int, release: int) -> None:
        """Job of ``org`` started at t on a processor of ``owner``."""

    def finished(self, t: int, org: int, owner: int, start: int, release: int) -> None:
        """Job of ``org`` started at ``start`` completed at t on a processor of ``owner``."""


class DirectContr(Policy):
    """Highest contribution − utility first (SPAA Fig. 9; CloudShare ORIG/REL/SIMPL_DIRECT).

    Contribution is the utility of the work done on the organization's own processors, for
    anyone: an organization that only runs its own jobs locally stays at priority 0.
    """

    def __init__(self, utility: str = "psi") -> None:
        self.utility = utility_name(utility)
        self.name = {"psi": "ORIG_DIRECT", "psi_prime": "REL_DIRECT"}.get(
            self.utility, "SIMPL_DIRECT"
        )

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        super().reset(n_orgs, shares)
        self._utility = UtilityBook(n_orgs, self.utility)
        self._contribution = UtilityBook(n_orgs, self.utility)
        self._bonus = self.utility == Utility.psi_prime

    def keys(self, t: int) -> list[int]:
        at = t + 1
        u, c = self._utility.value2, self._contribution.value2
        return [u(o, at) - c(o, at) for o in range(self.n_orgs)]

    def started(self, t: int, org: int, owner: int, duration: int, release: int) -> None:
        bonus = release if self._bonus else 0
        self._utility.start(org, t, bonus)
        self._contribution.start(owner, t, bonus)

    def finished(self, t: int, org: int, owner: int, start: int, release: int) -> None:
        bonus = release if self._bonus else 0
        self._utility.finish(org, start, t, bonus)
        self._contribution.finish(owner, start, t, bonus)


class _ShareOfUtility(Policy):
    """Lowest utility / share first, shares ∝ contributed processors (Kay & Lauder's fair share)."""

    utility = "psi_double_prime"

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        super().reset(n_orgs, shares)
        self._book = UtilityBook(n_orgs, self.utility)

    def keys(self, t: int) -> list[float]:
        v = self._book.value2
        return [v(o, t + 1) / s if s > 0 else float("inf") for o, s in enumerate(self.shares)]

    def started(self, t: int, org: int, owner: int, duration: int, release: int) -> None:
        self._book.start(org, t)

    def finished(self, t: int, org: int, owner: int, start: int, release: int) -> None:
        self._book.finish(org, start, t)


class FairShare(_ShareOfUtility):
    """Processor time used so far / share (CloudShare: "just as ψ″")."""

    name = "FairShare"


class UtFairShare(_ShareOfUtility):
    """FairShare's mechanism on the strategy-resilient utility ψ (SPAA Sec. 7.1)."""

    name = "UtFairShare"
    utility = "psi"


class CurrFairShare(Policy):
    """Only the present: currently running jobs / share, no history (SPAA Sec. 7.1)."""

    name = "CurrFairShare"

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        super().reset(n_orgs, shares)
        self._running = [0] * n_orgs

    def keys(self, t: int) -> list[float]:
        return [
            r / s if s > 0 else float("inf")
            for r, s in zip(self._running, self.shares, strict=True)
        ]

    def started(self, t: int, org: int, owner: int, duration: int, release: int) -> None:
        self._running[org] += 1

    def finished(self, t: int, org: int, owner: int, start: int, release: int) -> None:
        self._running[org] -= 1


class RoundRobin(Policy):
    """CloudShare's LRU round robin: never chosen first, else least recently chosen."""

    name = "RoundRobin"

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        super().reset(n_orgs, shares)
        self._last = [-1] * n_orgs
        self._clock = 0

    def keys(self, t: int) -> list[int]:
        return self._last

    def started(self, t: int, org: int, owner: int, duration: int, release: int) -> None:
        self._last[org] = self._clock
        self._clock += 1


class RRDF(Policy):
    """FALB's tenant order (Chen & Lai Eq. 1-2): least Σ of resource products of started jobs.

    With one resource (a processor) and sequential jobs the product is 1 CPU × run time; FALB
    takes the run time from a profiler, the simulator from the trace (a perfect profiler).
    """

    name = "RRDF"

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        super().reset(n_orgs, shares)
        self._rrdf = [0] * n_orgs

    def keys(self, t: int) -> list[int]:
        return self._rrdf

    def started(self, t: int, org: int, owner: int, duration: int, release: int) -> None:
        self._rrdf[org] += duration


class FCFS(Policy):
    """Earliest released head job first (the scheduler's tie-break alone): the plain greedy."""

    name = "FCFS"

    def reset(self, n_orgs: int, shares: Sequence[float]) -> None:
        super().reset(n_orgs, shares)
        self._zero = [0] * n_orgs

    def keys(self, t: int) -> list[int]:
        return self._zero


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy name: what to run, and whether it needs other coalitions' schedules."""

    name: str
    factory: Callable[[], Policy] | None = None
    samples: int = 0  # Rand: sampled coalitions per organization

    @property
    def is_coalitional(self) -> bool:
        return self.factory is None

    def new_policy(self) -> Policy:
        """A fresh policy object; Ref and Rand, which schedule by coalitions, have none."""
        if self.factory is None:
            raise ValueError(f"{self.name} schedules by coalitions: it has no policy object")
        return self.factory()


REGISTRY: dict[str, Callable[[], Policy]] = {
    "ORIG_DIRECT": lambda: DirectContr("psi"),
    "REL_DIRECT": lambda: DirectContr("psi_prime"),
    "SIMPL_DIRECT": lambda: DirectContr("psi_double_prime"),
    "FairShare": FairShare,
    "UtFairShare": UtFairShare,
    "CurrFairShare": CurrFairShare,
    "RoundRobin": RoundRobin,
    "RRDF": RRDF,
    "FCFS": FCFS,
}
COALITIONAL: tuple[str, ...] = ("Ref", "Rand")
ALIASES = {"DirectContr": "ORIG_DIRECT", "ROUND_ROBIN": "RoundRobin", "FAIRSHARE": "FairShare"}
RAND_DEFAULT_SAMPLES = 15
_RAND = re.compile(r"^rand(?::(\d+))?$", re.IGNORECASE)


def policy_names() -> list[str]:
    return [*REGISTRY, *COALITIONAL]


def parse_policy(name: str) -> PolicySpec:
    """``ORIG_DIRECT``, ``FairShare``, …, ``Ref``, ``Rand`` or ``Rand:N`` (case-insensitive)."""
    text = name.strip()
    m = _RAND.match(text)
    if m:
        n = int(m.group(1)) if m.group(1) else RAND_DEFAULT_SAMPLES
        if n < 1:
            raise ValueError(f"policy {name!r}: Rand needs at least 1 sampled coalition")
        return PolicySpec(f"Rand:{n}", None, n)
    if text.lower() == "ref":
        return PolicySpec("Ref")
    lookup = {k.lower(): k for k in REGISTRY} | {k.lower(): v for k, v in ALIASES.items()}
    canonical = lookup.get(text.lower())
    if canonical is None:
        raise ValueError(f"policy {name!r} is unknown; choose from {', '.join(policy_names())}")
    return PolicySpec(canonical, REGISTRY[canonical])
