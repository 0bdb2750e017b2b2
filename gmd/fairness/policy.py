"""From standing to throttle level: thresholds with hysteresis, dwell time and bounded steps.

A customer's *score* is its balance (the decayed sum of its greediness), optionally minus a
weighted DirectContr priority (an organization that contributes hosts earns some slack).
Level k > 0 is entered when the score reaches ``enter[k-1]`` and left only when it falls
below ``leave[k-1]`` (< ``enter[k-1]``): a balance oscillating around a threshold does not
flap. On top of that a customer stays at a level at least ``dwell_s`` and moves at most
``max_step`` levels per decision, so a sudden spike throttles gradually and a sudden recovery
releases gradually.

Each level maps to what enforcement does (``LevelEffect``): scheduling weights (work
conserving: they only bite on contended hosts), a hard CPU cap and disk caps from
``cap_level`` on, and quota steps from ``quota_level`` on — never below the configured floors.

A hard cap is not work conserving: on an idle host it takes from the capped VM what nobody
else wanted, and protects nobody. So the caps a level sets are applied only on a host where
the capped resource is contended (:func:`host_contention`: the host's own use against its
capacity over its last intervals, per resource), while weights apply everywhere.
Everything here is arrays in, arrays out: no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class LevelEffect:
    """What level k means for a customer's VMs and quota (level 0: nothing)."""

    level: int
    weight_factor: float
    cpu_cap_fraction: float | None
    disk_bytes_per_s: float | None
    quota_steps: int


@dataclass(frozen=True)
class ThrottlePolicy:
    """Thresholds and effects; ``enter``/``leave`` hold one value per level above 0.

    ``weight_factors[k-1]`` scales a VM's CPU and I/O weights at level k (floored at
    ``weight_floor``); from ``cap_level`` on, a VM may use at most ``cpu_cap_fractions`` of its
    vCPUs (floored at ``cap_floor``) and ``disk_caps_bytes_per_s``; from ``quota_level`` on,
    the customer's quota is lowered by one step per level above it.
    """

    enter: tuple[float, ...] = (1.0, 2.0, 4.0)
    leave: tuple[float, ...] = (0.5, 1.5, 3.0)
    dwell_s: float = 600.0
    max_step: int = 1
    priority_weight: float = 0.0
    weight_factors: tuple[float, ...] = (0.5, 0.25, 0.1)
    weight_floor: float = 0.05
    cap_level: int = 2
    cpu_cap_fractions: tuple[float, ...] = (1.0, 0.75, 0.5)
    cap_floor: float = 0.1
    disk_caps_bytes_per_s: tuple[float | None, ...] = (None, None, None)
    quota_level: int = 3

    def __post_init__(self) -> None:
        problems = policy_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def levels(self) -> int:
        """The highest level."""
        return len(self.enter)

    def effect(self, level: int) -> LevelEffect:
        if not 0 <= level <= self.levels:
            raise ValueError(f"level {level} is not in 0..{self.levels}")
        if level == 0:
            return LevelEffect(0, 1.0, None, None, 0)
        capped = level >= self.cap_level
        return LevelEffect(
            level=level,
            weight_factor=max(self.weight_factors[level - 1], self.weight_floor),
            cpu_cap_fraction=max(self.cpu_cap_fractions[level - 1], self.cap_floor)
            if capped
            else None,
            disk_bytes_per_s=self.disk_caps_bytes_per_s[level - 1] if capped else None,
            quota_steps=max(0, level - self.quota_level + 1),
        )


def _written(values: tuple[float, ...]) -> str:
    """Thresholds as the operator wrote them in gmd.toml (``[1, 0.5]``, not ``[1.0, 0.5]``)."""
    return f"[{', '.join(f'{v:g}' for v in values)}]"


def policy_problems(p: ThrottlePolicy) -> list[str]:
    """Everything inconsistent in a policy, as sentences naming the setting."""
    problems = []
    n = len(p.enter)
    for name in ("leave", "weight_factors", "cpu_cap_fractions", "disk_caps_bytes_per_s"):
        if len(getattr(p, name)) != n:
            problems.append(f"{name} has {len(getattr(p, name))} values, enter has {n}")
    if any(not math.isfinite(v) for v in (*p.enter, *p.leave)):
        problems.append("thresholds must be finite")
    if list(p.enter) != sorted(p.enter) or len(set(p.enter)) != n:
        problems.append(f"enter = {_written(p.enter)} must increase strictly")
    if len(p.leave) == n:
        for k, (e, lv) in enumerate(zip(p.enter, p.leave, strict=True), start=1):
            if not lv < e:
                problems.append(f"level {k}: leave {lv:g} must be below enter {e:g} (hysteresis)")
        if list(p.leave) != sorted(p.leave):
            problems.append(f"leave = {_written(p.leave)} must increase")
    if p.dwell_s < 0:
        problems.append(f"dwell_s = {p.dwell_s:g} must be >= 0")
    if p.max_step < 1:
        problems.append(f"max_step = {p.max_step} must be >= 1")
    for name in ("weight_factors", "cpu_cap_fractions"):
        if any(not 0 < f <= 1 for f in getattr(p, name)):
            problems.append(f"{name} must lie in (0, 1]")
    if list(p.weight_factors) != sorted(p.weight_factors, reverse=True):
        problems.append("weight_factors must not grow with the level")
    if not 0 < p.weight_floor <= 1 or not 0 < p.cap_floor <= 1:
        problems.append("weight_floor and cap_floor must lie in (0, 1]")
    if any(c is not None and not c > 0 for c in p.disk_caps_bytes_per_s):
        problems.append("disk caps must be > 0 (or none)")
    for name in ("cap_level", "quota_level"):
        if not 1 <= getattr(p, name) <= n + 1:
            problems.append(f"{name} = {getattr(p, name)} must be in 1..{n + 1} ({n + 1}: never)")
    return problems


@dataclass(frozen=True)
class LevelDecision:
    """Levels after one decision; ``reason`` says per customer why (for the audit)."""

    level: np.ndarray
    since_s: np.ndarray
    changed: np.ndarray
    score: np.ndarray
    target: np.ndarray
    reason: list[str]


def scores(balance: object, priority: object | None, priority_weight: float) -> np.ndarray:
    """Balance, less ``priority_weight`` × DirectContr priority when one is given."""
    b = np.asarray(balance, dtype=np.float64)
    if priority is None or priority_weight == 0:
        return b.copy()
    return b - priority_weight * np.asarray(priority, dtype=np.float64)


def decide_levels(
    score: object,
    level: object,
    since_s: object,
    now_s: float,
    policy: ThrottlePolicy,
) -> LevelDecision:
    """Each customer's next level, from its score and its current level (held since when).

    The *target* is the highest level whose ``enter`` the score reaches, or, if higher, the
    highest level at or below the current one whose ``leave`` it still reaches (hysteresis).
    A change waits until the current level has been held ``dwell_s`` and moves at most
    ``max_step`` levels. NaN scores (no standing) count as 0.
    """
    s = np.nan_to_num(np.asarray(score, dtype=np.float64), nan=0.0)
    cur = np.asarray(level, dtype=np.int64)
    since = np.asarray(since_s, dtype=np.float64)
    if not (s.shape == cur.shape == since.shape):
        raise ValueError(f"score {s.shape}, level {cur.shape}, since_s {since.shape} differ")
    if cur.size and (cur.min() < 0 or cur.max() > policy.levels):
        raise ValueError(f"levels must lie in 0..{policy.levels}")
    enter = np.asarray(policy.enter)
    leave = np.asarray(policy.leave)
    reached = np.searchsorted(enter, s, side="right")  # levels whose enter ≤ score
    held = np.minimum(np.searchsorted(leave, s, side="right"), cur)  # hysteresis
    target = np.maximum(reached, held)
    want = np.clip(target, cur - policy.max_step, cur + policy.max_step)
    dwelt = (now_s - since) >= policy.dwell_s
    new = np.where(dwelt, want, cur)
    changed = new != cur
    reasons = [
        _reason(float(s[i]), int(cur[i]), int(new[i]), int(target[i]), bool(dwelt[i]), policy)
        for i in range(s.size)
    ]
    return LevelDecision(new, np.where(changed, now_s, since), changed, s, target, reasons)


@dataclass(frozen=True)
class CustomerLevels:
    """One interval's level decisions, customer by customer (:func:`decide_customers`)."""

    customers: tuple[int, ...]
    before: np.ndarray
    """each customer's level in force before the decision"""
    decision: LevelDecision
    kept: np.ndarray
    """whose level is kept as a row: those that had one, and those leaving level 0 (a customer
    that never left level 0 needs none: absent means level 0 since ever)"""


def decide_customers(
    standing: Mapping[int, tuple[float, float]],
    state: Mapping[int, tuple[int, float]],
    now_s: float,
    policy: ThrottlePolicy,
) -> CustomerLevels:
    """The step from an interval's standings to the next levels, for every customer with a
    standing (``customer → (balance, DirectContr priority)``) or a level (``customer →
    (level, since_s)``): the one the accountant takes after each interval and the what-if
    replays. A customer with a level but no standing has nothing left to answer for: balance
    and priority 0."""
    customers = tuple(sorted(standing.keys() | state.keys()))
    balance = np.array([standing.get(c, (0.0, 0.0))[0] for c in customers], dtype=np.float64)
    priority = np.array([standing.get(c, (0.0, 0.0))[1] for c in customers], dtype=np.float64)
    level = np.array([state.get(c, (0, -math.inf))[0] for c in customers], dtype=np.int64)
    since = np.array([state.get(c, (0, -math.inf))[1] for c in customers], dtype=np.float64)
    decision = decide_levels(
        scores(balance, priority, policy.priority_weight), level, since, now_s, policy
    )
    had = np.array([c in state for c in customers], dtype=bool)
    return CustomerLevels(customers, level, decision, had | (decision.level > 0))


def _reason(score: float, cur: int, new: int, target: int, dwelt: bool, p: ThrottlePolicy) -> str:
    if new > cur:
        return f"score {score:.4g} ≥ enter {p.enter[new - 1]:g} of level {new}"
    if new < cur:
        return f"score {score:.4g} < leave {p.leave[cur - 1]:g} of level {cur}"
    if target != cur and not dwelt:
        return f"would move to level {target}, but level {cur} is held for {p.dwell_s:g} s first"
    if cur > 0:
        return f"score {score:.4g} still ≥ leave {p.leave[cur - 1]:g} of level {cur}"
    return f"score {score:.4g} below enter {p.enter[0]:g} of level 1"


def weights_for(factor: float, base: int = 100, low: int = 1, high: int = 10000) -> int:
    """A cgroup v2 / libvirt ``cpu_shares`` weight: ``base × factor`` within ``[low, high]``."""
    return int(min(max(round(base * factor), low), high))


def cpu_cap_cores(fraction: float | None, vcpus: float | None) -> float | None:
    """A VM's CPU cap in cores: ``fraction`` of its vCPUs (None: uncapped or vCPUs unknown)."""
    if fraction is None or vcpus is None or not vcpus > 0:
        return None
    return fraction * vcpus


# --- hard caps only where they protect someone -------------------------------------------------


class CapResource(enum.StrEnum):
    """A resource a level caps hard: the CPU cap (``cpu_cap_fractions``) and the disk caps
    (``disk_caps_bytes_per_s``), each applied where its own resource is contended."""

    cpu = "cpu"
    disk = "disk"


class Contention(enum.StrEnum):
    """Why a host's caps of one resource are applied or not."""

    contended = "contended"
    """its utilisation reached the threshold: caps applied"""
    idle = "idle"
    """its utilisation is below the threshold: caps withheld, weights alone suffice"""
    unmeasured = "unmeasured"
    """the host reported no use in the intervals looked at: caps withheld (nothing shows that
    anyone needs protecting)"""
    always = "always"
    """the threshold is 0: caps applied on every host, busy or not"""
    unsupported = "unsupported"
    """the host cannot set this cap (its agent's probe says why): none is asked of it"""
    alone = "alone"
    """the host is contended, but by the capped customer alone: the other customers' VMs used
    less than ``others_above`` of it, so a cap would take from the customer what nobody else
    wanted (measured: a greedy project alone on a host lost 18 % of its work to caps there,
    and nobody gained; docs/benchmarks.md, bench/protection.py): caps withheld for it"""


@dataclass(frozen=True)
class ContentionPolicy:
    """When a host counts as contended for a resource: its use over its last ``intervals``
    accounted intervals reaches ``cpu_above`` / ``disk_above`` of its capacity (0: always,
    caps everywhere)."""

    cpu_above: float = 0.8
    disk_above: float = 0.8
    intervals: int = 3
    others_above: float = 0.05
    """A customer's caps apply on a contended host only where the other customers' VMs used at
    least this fraction of it (per resource, over the same intervals): caps protect others,
    and with nobody else there they protect no one. 0: wherever the host is contended."""

    def __post_init__(self) -> None:
        problems = [
            f"contended_above.{r} = {t!r} must lie in [0, 1] (a fraction of the host's capacity)"
            for r, t in ((CapResource.cpu, self.cpu_above), (CapResource.disk, self.disk_above))
            if not (math.isfinite(t) and 0 <= t <= 1)
        ]
        if not (math.isfinite(self.others_above) and 0 <= self.others_above <= 1):
            problems.append(
                f"others_above = {self.others_above!r} must lie in [0, 1] (a fraction of the"
                " host's capacity)"
            )
        if isinstance(self.intervals, bool) or not isinstance(self.intervals, int):
            problems.append(f"contention_intervals = {self.intervals!r} must be a whole number")
        elif self.intervals < 1:
            problems.append(f"contention_intervals = {self.intervals} must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))

    def threshold(self, resource: CapResource) -> float:
        return self.cpu_above if resource is CapResource.cpu else self.disk_above


def _percent(x: float, threshold: float) -> str:
    """``x`` as a percentage with as few decimals as keep it from reading like the threshold
    it is compared with (0.7996 against 0.8 is "79.96 %", not "80 %"), or like none at all
    when it is some (0.005 is "0.5 %", not "0 %")."""
    for digits in range(5):
        shown = f"{100 * x:.{digits}f}"
        some = x == 0 or float(shown) != 0
        if some and (x == threshold or float(shown) != round(100 * threshold, digits)):
            return f"{shown} %"
    return f"{100 * x:g} %"


@dataclass(frozen=True)
class CapDecision:
    """Whether a host's caps of one resource apply, and the figures that decided it."""

    resource: CapResource
    applied: bool
    reason: Contention
    utilisation: float | None
    """use ÷ capacity over the intervals measured; None when there were none"""
    threshold: float
    intervals: int
    """how many intervals of the host were measured"""
    window: int
    """how many intervals were looked at (``contention_intervals``)"""
    detail: str = ""
    """for ``unsupported``: why the host cannot set it, in its agent's words"""
    others: float | None = None
    """for ``alone``: what the other customers' VMs used of the host (a fraction)"""
    others_above: float = 0.0
    """for ``alone``: the fraction they needed to use for the caps to apply"""

    def why(self) -> str:
        """The figures, in words: "cpu 91 % ≥ 80 %"."""
        r = self.resource.value
        if self.reason is Contention.unsupported:
            return f"{r}: this host cannot set the cap ({self.detail or 'its agent says so'})"
        if self.reason is Contention.alone and self.utilisation is not None:
            o, t = self.others or 0.0, self.others_above
            return (
                f"{r} {_percent(self.utilisation, self.threshold)} ≥ {100 * self.threshold:g} %,"
                f" but the other customers used {_percent(o, t)} < {100 * t:g} %: nobody to"
                " protect"
            )
        if self.reason is Contention.always:
            return f"{r}: contended_above = 0 (caps on every host)"
        if self.utilisation is None:
            return f"{r}: no use reported in the last {self.window} interval(s)"
        u, t = self.utilisation, self.threshold
        sign = "≥" if self.applied else "<"
        return f"{r} {_percent(u, t)} {sign} {100 * t:g} %"

    def words(self) -> str:
        """ "applied: cpu 91 % ≥ 80 %" or "not applied: cpu 22 % < 80 %"."""
        return f"{'applied' if self.applied else 'not applied'}: {self.why()}"

    def figures(self) -> dict[str, object]:
        """The decision as plain values, as the plan, explain and enforce --plan carry it."""
        return {
            "resource": self.resource.value,
            "applied": self.applied,
            "reason": self.reason.value,
            "utilisation": self.utilisation,
            "threshold": self.threshold,
            "intervals": self.intervals,
            "window": self.window,
        }


def host_contention(
    used: object, supply: object, policy: ContentionPolicy
) -> dict[CapResource, CapDecision]:
    """Per cap resource, whether its caps apply on one host.

    ``used`` and ``supply`` are (intervals × :class:`CapResource`) arrays of what the host's
    VMs used and what it could give (capacity × length) in each of its last intervals. The
    utilisation is their ratio over the intervals with a supply (a supply-weighted mean, so
    that a host whose capacity changed counts each interval by what it offered). It reaches
    the threshold: contended, caps applied; below it: idle; no interval: unmeasured, caps
    withheld. A threshold of 0 applies caps whatever the figures.
    """
    u = np.asarray(used, dtype=np.float64).reshape(-1, len(CapResource))
    s = np.asarray(supply, dtype=np.float64).reshape(-1, len(CapResource))
    if u.shape != s.shape:
        raise ValueError(f"used {u.shape} and supply {s.shape} differ")
    out = {}
    for k, resource in enumerate(CapResource):
        threshold = policy.threshold(resource)
        measured = s[:, k] > 0
        n = int(measured.sum())
        utilisation = float(u[measured, k].sum() / s[measured, k].sum()) if n else None
        if threshold == 0:
            reason = Contention.always
        elif utilisation is None:
            reason = Contention.unmeasured
        elif utilisation >= threshold:
            reason = Contention.contended
        else:
            reason = Contention.idle
        applied = reason in (Contention.always, Contention.contended)
        out[resource] = CapDecision(
            resource, applied, reason, utilisation, threshold, n, policy.intervals
        )
    return out


def for_customer(
    caps: Mapping[CapResource, CapDecision],
    others: Mapping[CapResource, float],
    policy: ContentionPolicy,
) -> dict[CapResource, CapDecision]:
    """A host's cap decisions for one customer: a cap the host's contention applies is
    withheld (``alone``) where the other customers' VMs used less than ``others_above`` of the
    host (``others``: their use as a fraction of its capacity over the same intervals).
    Decisions of ``contended_above = 0`` (caps everywhere) stand as they are."""
    out = dict(caps)
    for resource, decision in caps.items():
        used = others.get(resource, 0.0)
        if decision.reason is Contention.contended and used < policy.others_above:
            out[resource] = replace(
                decision,
                applied=False,
                reason=Contention.alone,
                others=used,
                others_above=policy.others_above,
            )
    return out


def unsupported(decision: CapDecision, detail: str) -> CapDecision:
    """``decision`` on a host that cannot set the cap: withheld, and why."""
    return replace(decision, applied=False, reason=Contention.unsupported, detail=detail)


class DiskWeightFallback(enum.StrEnum):
    """What a level's disk weight becomes on a host whose disks no proportional scheduler runs
    (no BFQ: most NVMe and virtio hosts), where a weight would do nothing."""

    limit = "limit"
    """a bytes/s limit of the share the weight would have given, where the host's disk is
    contended (:func:`weight_as_disk_limit`)"""
    none = "none"
    """weights only: disk throttling is unavailable on that host, and its plan says so"""


def weight_as_disk_limit(weight_factor: float, disk_bytes_per_s: float, vms: int) -> float | None:
    """The disk limit standing in for a weight where a host has none: the share of the disk a
    proportional scheduler would give a VM of weight ``weight_factor`` against ``vms - 1``
    neighbours of normal weight when all of them want the disk, ``w / (w + vms - 1)`` of its
    bandwidth. None where the weight asks nothing (factor 1) or nobody shares the disk."""
    if not weight_factor < 1 or vms < 2 or not disk_bytes_per_s > 0:
        return None
    return weight_factor / (weight_factor + vms - 1) * disk_bytes_per_s


def capped_effect(effect: LevelEffect, caps: Mapping[CapResource, CapDecision]) -> LevelEffect:
    """``effect`` on one host: its CPU cap only where CPU is contended, its disk caps only
    where disk is; weights and quota steps as they are."""
    return replace(
        effect,
        cpu_cap_fraction=effect.cpu_cap_fraction if caps[CapResource.cpu].applied else None,
        disk_bytes_per_s=effect.disk_bytes_per_s if caps[CapResource.disk].applied else None,
    )


def caps_wanted(effect: LevelEffect) -> tuple[CapResource, ...]:
    """The resources a level caps (before contention decides where)."""
    wanted = []
    if effect.cpu_cap_fraction is not None:
        wanted.append(CapResource.cpu)
    if effect.disk_bytes_per_s is not None:
        wanted.append(CapResource.disk)
    return tuple(wanted)
