"""Which of two policies is fairer, and whether the samples settle it: paired bootstrap intervals.

A table of means (SPAA's Table 1) or of points (CloudShare's) orders the policies, but with a
few dozen samples, most of them quiet, some orderings are noise. Here every pair of policies
gets a statistic of their per-sample difference and a percentile bootstrap interval for it:
the samples are drawn again with replacement (``resamples`` times, from a fixed ``seed``), the
same draw for every policy, since policies were run on the same samples (a paired design), and
the statistic is recomputed on each draw. "A is fairer than B" is *resolved* when the interval
excludes 0, else *not resolved*.

Lower values are fairer (Δψ/p, CloudShare's unfairness). The statistics (:class:`Statistic`):

- ``mean-difference``: the mean of ``value(B) − value(A)``, in the values' unit (SPAA's
  Δψ/p is an average delay per unit part, so means are what its table compares);
- ``win-difference``: the share of samples where A is strictly fairer less the share where B
  is, in [−1, 1]: CloudShare's pairwise points, made a per-sample statistic. The paper scores
  points rather than averaging unfairness because unfairness (a distance between waits, in
  seconds) varies by orders of magnitude across samples and logs; a mean would follow the
  busiest few.

Samples from different runs (several traces, pooled) are resampled within each run
(``strata``), so that each draw keeps every run's number of samples.

Percentile intervals, no correction for the many pairs compared: with 15 pairs at 95 %, about
one "resolved" ordering in 20 among truly equal policies is chance. Pure: numbers in, numbers
out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


class Statistic(StrEnum):
    """How a pair's per-sample values become one number (positive: the first is fairer)."""

    mean_difference = "mean-difference"
    win_difference = "win-difference"


@dataclass(frozen=True)
class Ordering:
    """One pair, oriented so that ``fairer`` has the non-negative ``advantage``."""

    fairer: str
    other: str
    advantage: float
    """the statistic on all samples"""
    low: float
    high: float
    """the bootstrap interval of the advantage"""
    samples: int

    @property
    def resolved(self) -> bool:
        """The interval excludes 0: the samples settle which of the two is fairer."""
        return self.low > 0 or self.high < 0


def differences(values: np.ndarray, a: int, b: int, statistic: Statistic) -> np.ndarray:
    """Per sample, how much fairer column ``a`` is than column ``b`` (positive: a is)."""
    d = values[:, b] - values[:, a]
    return np.sign(d) if statistic == Statistic.win_difference else d


def resample_indices(strata: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` rows of sample indices, each drawn with replacement within every stratum."""
    rng = np.random.default_rng(seed)
    columns = []
    for stratum in np.unique(strata):
        members = np.flatnonzero(strata == stratum)
        columns.append(members[rng.integers(0, members.size, (resamples, members.size))])
    return np.concatenate(columns, axis=1)


def percentile_interval(
    differences: np.ndarray, index: np.ndarray, tail: float
) -> tuple[float, float]:
    """The mean of ``differences`` over each resample (rows of ``index``), and the
    ``tail``/``1 − tail`` quantiles of those means."""
    boot = differences[index].mean(axis=1)
    low, high = np.quantile(boot, [tail, 1 - tail])
    return float(low), float(high)


def orderings(
    values: np.ndarray,
    names: Sequence[str],
    statistic: Statistic,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
    strata: Sequence[int] | np.ndarray | None = None,
) -> list[Ordering]:
    """Every pair of ``names`` (columns of ``values``, one row per sample), in the order the
    names are given, each with its advantage and bootstrap interval.

    Needs at least two samples: one sample's interval is a point, and would "resolve" anything.
    """
    values = np.asarray(values, dtype=np.float64)
    n, k = values.shape if values.ndim == 2 else (0, 0)
    if values.ndim != 2 or k != len(names):
        raise ValueError(f"values must be samples × policies ({len(names)} columns)")
    if n < 2:
        raise ValueError(f"{n} sample(s): a bootstrap interval needs at least 2")
    if not np.all(np.isfinite(values)):
        raise ValueError("every policy needs a finite value on every sample")
    if resamples < 1:
        raise ValueError(f"resamples = {resamples}: need at least 1")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: must be between 0 and 1")
    groups = np.zeros(n, dtype=np.int64) if strata is None else np.asarray(strata)
    if groups.shape != (n,):
        raise ValueError("strata must give one stratum per sample")
    index = resample_indices(groups, resamples, seed)
    tail = (1 - confidence) / 2
    out = []
    for a in range(k):
        for b in range(a + 1, k):
            d = differences(values, a, b, statistic)
            low, high = percentile_interval(d, index, tail)
            estimate = float(d.mean())
            if estimate < 0:
                out.append(Ordering(names[b], names[a], -estimate, -high, -low, n))
            else:
                out.append(Ordering(names[a], names[b], estimate, low, high, n))
    return out
