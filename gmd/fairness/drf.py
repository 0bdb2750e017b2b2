"""Dominant Resource Fairness as an allocation (Ghodsi et al., NSDI 2011, Sec. 4-5).

The GM paper contrasts its metric with DRF; reports and the simulator need DRF's allocation,
not only its bundle value. Progressive filling is the paper's Algorithm 1 with whole tasks;
``equalizing_tasks`` is the continuous (fractional) allocation that equalizes either the
dominant share (DRF) or the sum of shares (Asset Fairness, Sec. 5.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gmd.fairness._validate import Labels, as_float_array, check_amounts, check_shape


@dataclass(frozen=True)
class FillingStep:
    """One task launched: who got it and every user's shares, dominant shares and the total."""

    pick: str
    shares: dict[str, np.ndarray]
    dominant: dict[str, float]
    total: np.ndarray


@dataclass(frozen=True)
class DrfAllocation:
    tasks: dict[str, float]
    allocation: dict[str, np.ndarray]
    dominant: dict[str, float]
    steps: list[FillingStep]


def _demands(
    capacity: object, demands: Mapping[str, object], resources: Sequence[str] | None
) -> tuple[np.ndarray, list[str], np.ndarray]:
    cap = as_float_array("capacity", capacity, 1)
    m = cap.shape[0]
    cols = Labels("resource", resources, m)
    check_amounts("capacity", cap, None, cols, positive=True)
    users = list(demands)
    if not users:
        raise ValueError("no users: demands is empty")
    d = np.array([as_float_array(f"demand of {u!r}", demands[u], 1) for u in users])
    check_shape("demands", d, (len(users), m), "one per-task vector per user, as capacity")
    check_amounts("demand", d, Labels("user", users, len(users)), cols)
    empty = np.flatnonzero(~d.any(axis=1))
    if empty.size:
        raise ValueError(f"demand of user {users[empty[0]]!r} is zero for every resource")
    return cap, users, d


def progressive_filling(
    capacity: object,
    demands: Mapping[str, object],
    *,
    resources: Sequence[str] | None = None,
    max_tasks: int = 1_000_000,
) -> DrfAllocation:
    """DRF with whole tasks: repeatedly launch a task of the user with the lowest dominant share.

    Users whose next task no longer fits are passed over; filling stops when no task fits.
    Ties go to the user listed first in ``demands`` (the NSDI table starts with B).
    """
    cap, users, d = _demands(capacity, demands, resources)
    count = np.zeros(len(users))
    steps: list[FillingStep] = []
    used = np.zeros_like(cap)
    fits_slack = cap * 1e-12
    while len(steps) < max_tasks:
        dominant = ((count[:, None] * d) / cap).max(axis=1)
        fits = np.all(used + d <= cap + fits_slack, axis=1)
        if not fits.any():
            break
        candidates = np.flatnonzero(fits)
        pick = int(candidates[np.argmin(dominant[candidates])])
        count[pick] += 1
        used = used + d[pick]
        shares = {u: count[k] * d[k] / cap for k, u in enumerate(users)}
        steps.append(
            FillingStep(
                pick=users[pick],
                shares=shares,
                dominant={u: float(s.max()) for u, s in shares.items()},
                total=used / cap,
            )
        )
    return DrfAllocation(
        tasks={u: float(count[k]) for k, u in enumerate(users)},
        allocation={u: count[k] * d[k] for k, u in enumerate(users)},
        dominant={u: float((count[k] * d[k] / cap).max()) for k, u in enumerate(users)},
        steps=steps,
    )


def equalizing_tasks(
    capacity: object,
    demands: Mapping[str, object],
    value: str = "dominant",
    *,
    resources: Sequence[str] | None = None,
) -> dict[str, float]:
    """Fractional tasks per user that give every user the same value, as many as fit.

    ``value="dominant"`` equalizes dominant shares (DRF); ``value="asset"`` equalizes the sum
    of shares (Asset Fairness). A user's tasks are ``t / cost_u`` for a common level ``t``,
    raised until the first resource is exhausted.
    """
    cap, users, d = _demands(capacity, demands, resources)
    shares = d / cap
    if value == "dominant":
        cost = shares.max(axis=1)
    elif value == "asset":
        cost = shares.sum(axis=1)
    else:
        raise ValueError(f"value = {value!r}; choose 'dominant' or 'asset'")
    per_level = (d / cost[:, None]).sum(axis=0)
    level = np.min(np.where(per_level > 0, cap / np.where(per_level > 0, per_level, 1), np.inf))
    return {u: float(level / cost[k]) for k, u in enumerate(users)}
