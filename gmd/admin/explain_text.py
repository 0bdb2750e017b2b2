"""gmd-admin's terminal rendering of an explanation (``gmd-admin explain``): the five summary
lines alone, or with the detail as paragraphs an operator can paste into a ticket.

:mod:`gmd.daemon.reports.explain` computes the explanation (and its summary lines, which its
document holds for the read API too); this module only turns it into text, with the units
people read rates in.
"""

from __future__ import annotations

import json

from gmd.common.timespec import iso
from gmd.daemon.reports.actions import knobs_words
from gmd.daemon.reports.explanation import (
    Explanation,
    drivers_words,
    signed,
    summary_lines,
)
from gmd.fairness.policy import caps_wanted
from gmd.wire import PlanMode

# Amounts per interval → the rates people read: cores, GiB, MB/s.
_UNITS = {
    "cpu": ("cores", 1.0),
    "memory": ("GiB", float(2**30)),
}
_IO_UNIT = ("MB/s", 1e6)


def unit(resource: str) -> tuple[str, float]:
    """The unit a resource's rate is shown in, and the divisor from amount per second."""
    return _UNITS.get(resource, _IO_UNIT)


_ENDOWMENT_WORDS = {
    "equal": "an equal split of the host among the VMs on it",
    "flavor": "what its flavor gives it (scaled down when the host is overcommitted)",
}


def _rate(resource: str, amount: float, length_s: int) -> str:
    name, divisor = unit(resource)
    return f"{amount / length_s / divisor:.4g} {name}"


def _thresholds(e: Explanation) -> str:
    return "; ".join(
        f"level {k + 1} from {enter:g}, left below {leave:g}"
        for k, (enter, leave) in enumerate(zip(e.enter, e.leave, strict=True))
    )


def render_summary(e: Explanation) -> str:
    """The five summary lines alone (``explain --summary``)."""
    return "\n".join(summary_lines(e)) + "\n"


def render_text(e: Explanation, endowment_mode: str) -> str:
    """The summary, then the explanation as paragraphs an operator can paste into a ticket:
    the interval, then its five steps (use against endowment, greediness, balance, level,
    what was enforced), then the range and the notes."""
    out = [
        *summary_lines(e),
        "",
        *_interval_words(e),
        *_endowment_words(e, endowment_mode),
        *_balance_words(e),
        *_level_words(e),
        *_enforced_words(e),
        *_range_words(e),
    ]
    return "\n".join(out) + "\n"


def _interval_words(e: Explanation) -> list[str]:
    """Which interval, and the fair share of the cloud in it."""
    length = e.length_s
    out: list[str] = []
    say = out.append
    say(f"Customer {e.who}, interval {iso(e.start_s)} ({length} s)")
    say("")
    share = ", ".join(_rate(r, v, length) for r, v in e.share.items())
    say(
        f"{e.active_customers} customer(s) ran VMs in this interval; one customer's fair share of"
        f" the whole cloud is {share} (the cloud's capacity divided among them)."
    )
    say("")
    return out


def _endowment_words(e: Explanation, endowment_mode: str) -> list[str]:
    """Step 1: each VM's use against its endowment, term by term."""
    length = e.length_s
    out: list[str] = []
    say = out.append
    say("1. Where it used more than its endowment, and what it left to others")
    if not e.hosts:
        say("   It ran no VM in this interval: it took nothing and ceded nothing (greediness 0).")
    for h in e.hosts:
        say(
            f"   On host {h.name} (owned by {h.organization}; {h.consumers} VM(s) share it),"
            f" its VMs add {signed(h.greediness)}:"
        )
        for v in h.vms:
            say(f"   - VM {v.uuid}: greediness {signed(v.greediness)}")
            idle = []
            for r in v.resources:
                host_r = next(x for x in h.resources if x.resource == r.resource)
                if r.offset == 0 and (r.used < r.endowment and host_r.credit == 0):
                    idle.append(r.resource)
                    continue
                if r.used == 0 and r.endowment == 0:
                    continue
                used = _rate(r.resource, r.used, length)
                endowed = _rate(r.resource, r.endowment, length)
                if r.offset > 0:
                    what = (
                        f"over its endowment by {_rate(r.resource, r.offset, length)}:"
                        " counted in full"
                    )
                elif r.used < r.endowment:
                    left = r.endowment - r.used
                    what = (
                        f"left {_rate(r.resource, left, length)} unused; others on the host took"
                        f" {host_r.credit:.0%} of what was left (κ), so it is credited"
                        f" γ·κ = {e.gamma * host_r.credit:.3g} of it"
                    )
                else:
                    what = "exactly its endowment"
                term = signed(r.term)
                say(f"       {r.resource:<10} used {used}, endowment {endowed}: {what} → {term}")
            if idle:
                say(
                    f"       {', '.join(idle)}: less than its endowment, but nobody else on the"
                    " host needed the rest (κ = 0): no credit → 0"
                )
    say(
        f"   A VM's endowment is {_ENDOWMENT_WORDS.get(endowment_mode, endowment_mode)}. Each"
        " amount over or credited is divided by the fair share of that resource and by the"
        f" number of resources ({len(e.resources)}), so that the resources add up comparably."
    )
    say("")
    return out


def _balance_words(e: Explanation) -> list[str]:
    """Steps 2 and 3: the interval's greediness and the balance it makes."""
    out: list[str] = []
    say = out.append
    say(
        f"2. Greediness of the interval: {signed(e.ledger_greediness)}"
        + (
            " (positive: it took more than its share)"
            if e.ledger_greediness > 0
            else " (negative or zero: it took no more than its share)"
        )
    )
    say("")
    half = "no decay" if e.half_life_s is None else f"half-life {e.half_life_s:g} s"
    if e.reset:
        start = "0 (its balance was reset by an operator before this interval)"
    elif e.previous_start_s is None:
        start = "0 (the first interval of the ledger)"
    else:
        start = f"{e.previous_balance:.6g} (after the interval of {iso(e.previous_start_s)})"
    say(
        f"3. Balance: {start}, × {e.decay:.6g} ({half}),"
        f" {'−' if e.ledger_greediness < 0 else '+'} {abs(e.ledger_greediness):.6g}"
        f" (this interval's greediness) = {e.balance:.6g}"
    )
    say("")
    return out


def _level_words(e: Explanation) -> list[str]:
    """Step 4: the score, the level it gives and what the level does."""
    out: list[str] = []
    say = out.append
    if e.priority_weight:
        score = (
            f"score = balance {e.balance:.6g} − {e.priority_weight:g} × DirectContr priority"
            f" {e.priority:.6g} = {e.score:.6g}"
        )
    else:
        score = f"score = its balance, {e.score:.6g}"
    say(f"4. Throttle level: {score}. Thresholds: {_thresholds(e)}.")
    if e.level == 0:
        say("   Level 0 after this interval: not throttled.")
    else:
        since = "" if e.level_since_s is None else f" (held since {iso(int(e.level_since_s))})"
        decided = (
            ""
            if e.entered_after_s is None
            else f", decided after the interval of {iso(e.entered_after_s)}"
        )
        say(
            f"   Level {e.level} after this interval{since}{decided}: {e.level_reason};"
            f" its score now, after this interval, is {e.score:.6g}."
        )
        if e.drivers:
            say(f"   The greed that made its balance: {drivers_words(e.drivers)}.")
    effect = e.policy.effect(e.level)
    if e.level > 0 and not caps_wanted(effect):
        say(
            f"   Level {e.level} sets weights only: hard caps come from level"
            f" {e.policy.cap_level} on, and only on hosts where they protect someone."
        )
    elif e.level > 0 and e.caps:
        say(
            "   Its hard caps apply only where the host is contended (weights apply on every host):"
        )
        for c in e.caps:
            window = next(iter(c.decisions.values())).window
            say(f"   - {c.host}: {c.words} (over the last {window} accounted interval(s))")
    say(f"   (enforcement is {PlanMode(e.mode).words})")
    say("")
    return out


def _enforced_words(e: Explanation) -> list[str]:
    """Step 5: the enforcement actions recorded for the level in force."""
    out: list[str] = []
    say = out.append
    say("5. What was enforced")
    if not e.actions:
        say("   Nothing recorded for the level in force.")
    for a in e.actions:
        dry = " (dry-run)" if a["dry_run"] else ""
        where = f" on {a['host']}" if a["host"] else ""
        raw = a.get("knobs")
        knobs = knobs_words(raw if isinstance(raw, dict) else None)
        say(
            f"   - {a['at']} {a['kind']}{where}{dry} {a['status']}:"
            f" {json.dumps(a['before'])} → {json.dumps(a['after'])}"
            + (f" [{knobs}]" if knobs else "")
            + f"; {a['reason']}"
        )
    return out


def _range_words(e: Explanation) -> list[str]:
    """The range's summary, where one was asked, and the notes."""
    out: list[str] = []
    say = out.append
    if e.range_summary is not None:
        summary = e.range_summary
        terms = ", ".join(f"{k} {v:+.4g}" for k, v in sorted(summary["terms"].items()))
        say("")
        say(
            f"Over the range: {summary['intervals_with_a_standing']} interval(s) with a"
            f" standing, greediness summed {summary['greediness_sum']:+.6g}"
            f" ({terms or 'no resource terms'}); balance {summary['first_balance']:.6g}"
            f" → {summary['last_balance']:.6g}. The interval above"
            " is its greediest."
        )
    for note in e.notes:
        say("")
        say(f"Note: {note}")
    return out
