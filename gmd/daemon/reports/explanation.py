"""An explanation of one interval of a customer, and its words: summary lines and JSON.

The summary's five lines in plain words and the JSON document are what the read API serves;
:func:`gmd.daemon.reports.explain.explain` builds the explanation from the ledger, and
gmd-admin renders it for a terminal (:mod:`gmd.admin.explain_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gmd.common.timespec import iso
from gmd.common.units import DAY_S
from gmd.daemon.reports.actions import knobs_words
from gmd.daemon.reports.explain_recompute import HostExplained
from gmd.fairness.policy import (
    CapDecision,
    CapResource,
    ThrottlePolicy,
    caps_wanted,
)
from gmd.wire import PlanMode


@dataclass(frozen=True)
class CapsOnHost:
    """Whether the hard caps of the customer's level apply on one of its hosts, and why."""

    host: str
    decisions: dict[CapResource, CapDecision]
    words: str
    """for the level in force: "applied: cpu 91 % ≥ 80 %", or "none at level 1"."""
    disk_weight: bool = True
    """whether the host has a disk weight (its agent's word: no BFQ on its disks, none)"""

    def document(self) -> dict[str, object]:
        return {
            "host": self.host,
            "caps": self.words,
            "disk_weight": self.disk_weight,
            "resources": [d.figures() for d in self.decisions.values()],
        }


@dataclass(frozen=True)
class Driver:
    """An interval whose greed makes up much of the balance after the interval explained."""

    start_s: int
    greediness: float
    """what the customer took beyond its share in it"""
    contribution: float
    """what of it is left in the balance explained, after decay"""
    resource: str | None
    """the resource of its largest term, where the ledger holds its terms"""

    def document(self) -> dict[str, object]:
        return {
            "interval": iso(self.start_s),
            "start_s": self.start_s,
            "greediness": self.greediness,
            "contribution": self.contribution,
            "resource": self.resource,
        }


@dataclass
class Explanation:
    customer: str
    """the project uuid, however the operator named it"""
    start_s: int
    length_s: int
    resources: tuple[str, ...]
    gamma: float
    share: dict[str, float]
    active_customers: int
    hosts: list[HostExplained]
    greediness: float
    ledger_greediness: float
    previous_balance: float
    previous_start_s: int | None
    decay: float
    half_life_s: float | None
    reset: bool
    balance: float
    priority: float
    utility: float
    score: float
    priority_weight: float
    enter: tuple[float, ...]
    leave: tuple[float, ...]
    level: int
    level_since_s: float | None
    mode: str
    level_reason: str | None
    """why the level in force was entered: its decision's words, with its score then"""
    actions: list[dict[str, object]]
    range_summary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    name: str | None = None
    """the project's name, where the ledger knows it"""
    policy: ThrottlePolicy = field(default_factory=ThrottlePolicy)
    caps: list[CapsOnHost] = field(default_factory=list)
    """per host the customer ran VMs on in the interval"""
    quota_cloud: str = ""
    """[enforcement.quota] cloud: empty when gmd changes no quota"""
    raw_kept: bool = True
    """the interval's samples are still in the ledger (not past raw retention)"""
    entered_after_s: int | None = None
    """start of the interval whose accounting decided the level in force"""
    entry_score: float | None = None
    """the score then, which the decision compared (``score`` is the one after this interval)"""
    drivers: list[Driver] = field(default_factory=list)
    """the intervals whose greed makes up most of the balance, oldest first (level > 0)"""

    @property
    def who(self) -> str:
        return self.customer if self.name is None else f"{self.customer} ({self.name})"

    def document(self) -> dict[str, object]:
        """Everything, as JSON-ready values."""
        return {
            "customer": self.customer,
            "name": self.name,
            "interval": {"start": iso(self.start_s), "start_s": self.start_s, "s": self.length_s},
            "gamma": self.gamma,
            "share": self.share,
            "active_customers": self.active_customers,
            "greediness": self.greediness,
            "ledger_greediness": self.ledger_greediness,
            "hosts": [
                {
                    "host": h.name,
                    "organization": h.organization,
                    "consumers": h.consumers,
                    "greediness": h.greediness,
                    "resources": [vars(r) for r in h.resources],
                    "vms": [
                        {
                            "uuid": v.uuid,
                            "greediness": v.greediness,
                            "resources": [vars(r) for r in v.resources],
                        }
                        for v in h.vms
                    ],
                }
                for h in self.hosts
            ],
            "balance": {
                "previous": self.previous_balance,
                "previous_interval_start_s": self.previous_start_s,
                "decay": self.decay,
                "half_life_s": self.half_life_s,
                "reset": self.reset,
                "greediness": self.ledger_greediness,
                "balance": self.balance,
            },
            "priority": self.priority,
            "utility": self.utility,
            "level": {
                "score": self.score,
                "priority_weight": self.priority_weight,
                "enter": list(self.enter),
                "leave": list(self.leave),
                "level": self.level,
                "since_s": self.level_since_s,
                "mode": self.mode,
                "reason": self.level_reason,
                "entered_after": None
                if self.entered_after_s is None
                else {
                    "interval": iso(self.entered_after_s),
                    "start_s": self.entered_after_s,
                    "score": self.entry_score,
                },
                "drivers": [d.document() for d in self.drivers],
            },
            "caps": [c.document() for c in self.caps],
            "actions": self.actions,
            "range": self.range_summary,
            "notes": self.notes,
            "summary": summary_lines(self),
        }


# --- in words ------------------------------------------------------------------------------------


def reported_knobs(actions: list[dict[str, object]]) -> dict[str, str]:
    """Per host, what its latest report on the customer's VMs said of each knob (in words),
    for the hosts whose report says it (agents older than knobs say nothing)."""
    out: dict[str, str] = {}
    for a in actions:
        knobs = a.get("knobs")
        if a.get("kind") == "host_apply" and isinstance(knobs, dict) and knobs and a.get("host"):
            out[str(a["host"])] = knobs_words(knobs)
    return out


def signed(x: float) -> str:
    """+0.125, −0.0625, 0 (never "-0")."""
    return "0" if x == 0 else f"{x:+.4g}".replace("-", "−")


def duration(seconds: float) -> str:
    """A duration as a person reads it: 30 s, 90 s, 15 min, 1.5 h, 2.0 days (never "0 min":
    short half-lives and dwells are real settings, a test cloud's or a demo's)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


def _hosts_where(caps: list[CapsOnHost], resource: CapResource) -> str:
    """ "on cmp-01 (cpu 91 % ≥ 80 %); not on cmp-02 (cpu 22 % < 80 %), …"."""
    on: list[str] = []
    off: list[str] = []
    for c in caps:
        d = c.decisions[resource]
        (on if d.applied else off).append(f"{c.host} ({d.why()})")
    parts = []
    if on:
        parts.append(f"on {', '.join(on)}")
    if off:
        parts.append(f"not on {', '.join(off)}, where nobody needs protecting from it")
    return "; ".join(parts)


def drivers_words(drivers: list[Driver]) -> str:
    """ "the interval of 2026-… (+0.27, mostly cpu), the interval of 2026-… (+0.05)"."""
    return ", ".join(
        f"the interval of {iso(d.start_s)} ({signed(d.greediness)}"
        + (f", mostly {d.resource})" if d.resource else ")")
        for d in drivers
    )


def summary_lines(e: Explanation) -> list[str]:
    """Five lines in plain words: who and at which level since when; why (the balance
    against the thresholds); what is done on which hosts (weights everywhere, hard caps only
    where the host is contended); the quota; what would lift it."""
    level, n = e.level, len(e.enter)
    quantity = "balance" if e.priority_weight == 0 else "score (balance less weighted priority)"
    mode = f"enforcement is {PlanMode(e.mode).words}"
    if level == 0:
        first = f"Customer {e.who} is not throttled (level 0 of {n}); {mode}."
        why = f"Why: its {quantity}, {e.score:.4g}, is below {e.enter[0]:g}, where level 1 begins."
        done = "On its hosts: nothing; its VMs keep their own weights and no cap."
        quota = "Quota: unchanged."
        lift = f"Nothing to lift; a {quantity} of {e.enter[0]:g} would bring level 1."
        return [first, why, done, quota, lift]
    since = "" if e.level_since_s is None else f" since {iso(int(e.level_since_s))}"
    first = f"Customer {e.who} is at throttle level {level} of {n}{since}; {mode}."
    return [first, _why(e, quantity), _done(e), _quota(e), _lift(e, quantity)]


def _why(e: Explanation, quantity: str) -> str:
    """Why the level holds (at a level above 0): the score against its thresholds, the score
    when it was decided, and the intervals whose greed made the balance."""
    level = e.level
    enter, leave = e.enter[level - 1], e.leave[level - 1]
    now = f"{e.score:.4g} now (after the interval of {iso(e.start_s)})"
    if e.score >= enter:
        why = f"Why: its {quantity} is {now}, at or above {enter:g}, where level {level} begins"
    else:
        why = (
            f"Why: its {quantity} is {now}, still at or above {leave:g}, below which"
            f" level {level} (entered at {enter:g}) is left"
        )
    if e.entry_score is not None and e.entered_after_s not in (None, e.start_s):
        why += (
            f"; it was {e.entry_score:.4g} when the level was decided, after the interval of"
            f" {iso(e.entered_after_s)}"
        )
    if e.drivers:
        why += f"; the greed that made its balance: {drivers_words(e.drivers)}"
    return why + "."


def _done(e: Explanation) -> str:
    """What the level does on the customer's hosts: weights everywhere, hard caps only where
    the host is contended, and what the hosts last reported."""
    effect = e.policy.effect(e.level)
    hosts = ", ".join(c.host for c in e.caps)
    if not e.raw_kept:
        return (
            f"On its hosts: weights × {effect.weight_factor:g}; which hosts ran its VMs in this"
            " interval, and whether caps applied there, is past raw retention."
        )
    if not hosts:
        return "On its hosts: it ran no VM in this interval, so no host holds it back now."
    weighed = ", ".join(c.host for c in e.caps if c.disk_weight)
    unweighed = ", ".join(c.host for c in e.caps if not c.disk_weight)
    if not unweighed:
        done = (
            f"On its hosts: CPU and I/O weights × {effect.weight_factor:g} on {hosts} (they"
            " only take effect where a host is busy)"
        )
    else:
        done = (
            f"On its hosts: CPU weights × {effect.weight_factor:g} on {hosts}"
            + (f", I/O weights on {weighed}" if weighed else "")
            + " (they only take effect where a host is busy); no disk weight on"
            f" {unweighed}, whose disks no proportional I/O scheduler runs (a disk limit of"
            " the weight's share stands in where the disk is contended, unless"
            " disk_weight_fallback = none)"
        )
    wanted = caps_wanted(effect)
    if CapResource.cpu in wanted:
        done += (
            f"; a CPU cap of {100 * (effect.cpu_cap_fraction or 0):g} % of its vCPUs"
            f" {_hosts_where(e.caps, CapResource.cpu)}"
        )
    if CapResource.disk in wanted:
        done += (
            f"; disk caps of {(effect.disk_bytes_per_s or 0) / 1e6:g} MB/s per VM"
            f" {_hosts_where(e.caps, CapResource.disk)}"
        )
    if not wanted:
        done += f"; no hard caps below level {e.policy.cap_level}"
    reported = reported_knobs(e.actions)
    if reported:
        done += "; as its hosts last reported: " + "; ".join(
            f"{host}: {words}" for host, words in sorted(reported.items())
        )
    return done + "."


def _quota(e: Explanation) -> str:
    """What the level does to the customer's quota."""
    p, level = e.policy, e.level
    effect = p.effect(level)
    if effect.quota_steps == 0:
        return "Quota: unchanged" + (
            f" (lowered from level {p.quota_level} on)." if p.quota_level <= len(e.enter) else "."
        )
    if e.quota_cloud:
        return (
            f"Quota: its OpenStack compute quota is lowered by {effect.quota_steps} step(s)"
            f" (from level {p.quota_level} on), and restored when it falls below."
        )
    return (
        f"Quota: level {level} lowers it by {effect.quota_steps} step(s), but no cloud is"
        " configured ([enforcement.quota] cloud), so gmd changes none."
    )


def _lift(e: Explanation, quantity: str) -> str:
    """What would lift the level: the threshold to fall below, and how long decay alone
    takes there."""
    p, level = e.policy, e.level
    leave = e.leave[level - 1]
    lift = f"What would lift it: a {quantity} below {leave:g} brings level {level - 1}"
    if p.dwell_s:
        lift += f" (one level per {duration(p.dwell_s)} at most)"
    if e.priority_weight == 0 and e.half_life_s is not None and e.balance > 0:
        if leave > 0:
            wait = e.half_life_s * math.log2(e.balance / leave) if e.balance > leave else 0.0
            lift += (
                f"; with no more greed its balance halves every {duration(e.half_life_s)},"
                f" below {leave:g} in about {duration(wait)}"
            )
        else:
            lift += "; decay alone never takes it below 0: leaving its share to others does"
    return lift + "."
