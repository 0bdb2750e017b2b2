"""The papers' utilities of a schedule, kept incrementally while the simulation runs.

A job run on ``[s, e)`` is ``e − s`` unit parts, the part started at τ completing at τ + 1.
At time T a completed part is worth (CloudShare Eq. 2-4; SPAA Eq. 3):

- ψ (``psi``): ``T − τ`` — earlier work keeps growing in value (strategy-resilient);
- ψ′ (``psi_prime``): ``T + r − τ`` for a job released at r;
- ψ″ (``psi_double_prime``): 1 — the surface of executed work.

Non-clairvoyance: a running job counts only the parts done by T. Every sum is kept *doubled*
in Python integers, so values are exact whatever the trace length, and ties between
organizations are real ties, not rounding noise.
"""

from __future__ import annotations

import numpy as np

from gmd.fairness.directcontr import UTILITIES, Utility, utility_name

__all__ = ["UTILITIES", "UtilityBook", "schedule_utility", "utility_name"]


class UtilityBook:
    """Per-organization doubled utility of started jobs, readable at any T ≥ every start.

    Completed jobs are ``2A·T + B``; running ones ``R·T² + (R − 2·S1 + 2·C1)·T + S2 − S1 −
    2·CS`` with R jobs, S1 = Σs, S2 = Σs², C1 = Σc, CS = Σc·s (c the job's ψ′ bonus r, else 0).
    """

    __slots__ = ("_a", "_b", "_c1", "_cs", "_r", "_s1", "_s2", "kind")

    def __init__(self, n_orgs: int, kind: str = "psi") -> None:
        self.kind = utility_name(kind)
        self._a = [0] * n_orgs
        self._b = [0] * n_orgs
        self._r = [0] * n_orgs
        self._s1 = [0] * n_orgs
        self._s2 = [0] * n_orgs
        self._c1 = [0] * n_orgs
        self._cs = [0] * n_orgs

    def start(self, org: int, s: int, bonus: int = 0) -> None:
        self._r[org] += 1
        self._s1[org] += s
        self._s2[org] += s * s
        if bonus:
            self._c1[org] += bonus
            self._cs[org] += bonus * s

    def finish(self, org: int, s: int, e: int, bonus: int = 0) -> None:
        p = e - s
        self._r[org] -= 1
        self._s1[org] -= s
        self._s2[org] -= s * s
        self._a[org] += p
        if self.kind == Utility.psi_double_prime:
            return
        self._b[org] += 2 * p * bonus - p * (s + e - 1)
        if bonus:
            self._c1[org] -= bonus
            self._cs[org] -= bonus * s

    def value2(self, org: int, at: int) -> int:
        """Twice the utility of ``org`` at time ``at``."""
        r, s1 = self._r[org], self._s1[org]
        if self.kind == Utility.psi_double_prime:
            return 2 * (self._a[org] + r * at - s1)
        running = r * at * at + (r - 2 * s1 + 2 * self._c1[org]) * at + self._s2[org] - s1
        return 2 * self._a[org] * at + self._b[org] + running - 2 * self._cs[org]

    def values(self, at: int) -> list[float]:
        return [self.value2(o, at) / 2 for o in range(len(self._a))]


def schedule_utility(
    release: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    org: np.ndarray,
    n_orgs: int,
    at: int,
    kind: str = "psi",
) -> np.ndarray:
    """Each organization's utility at ``at`` of a finished schedule (unstarted jobs: start < 0)."""
    kind = utility_name(kind)
    ran = (start >= 0) & (start < at)
    s = start[ran].astype(np.float64)
    n = np.minimum(s + duration[ran], at) - s
    if kind == Utility.psi_double_prime:
        per_job = n
    else:
        per_job = n * (at - s) - n * (n - 1) / 2
        if kind == Utility.psi_prime:
            per_job = per_job + n * release[ran]
    return np.bincount(org[ran], weights=per_job, minlength=n_orgs)
