"""What enforcement really did, as the hosts reported it: the one reading of the enforcement
log's ``host_apply``/``host_restore`` rows that the standings' Enforced column, the usage
report's ``throttle_mode`` and the plot's level panel share.

A level is a decision; whether it was applied is what the hosts say. A VM counts as
throttled from a host's report that it applied the plan to it (``apply``: ok, or failed after
changing some of its settings) until the report that it put it back (``restore`` ok, also
from ``gmd-agent --restore-all``); in dry-run, ``would_apply``/``would_restore`` delimit what
a host would have done. Every throttled episode of a customer (from the level leaving 0 to
its return to 0) starts afresh: when the level returns to 0 its VMs leave the plans and are
put back, and a VM that vanished meanwhile (stopped, deleted, migrated away) took its
settings with it.

An interval at level ≥ 1 was then, for its customer (:class:`Enforced`):

- ``applied``: a host throttled one of its VMs at some moment of the interval;
- ``dry-run``: nothing applied, and the level was decided in dry-run or a host reported what
  it would have done;
- ``not applied``: nothing applied although the level was decided with ``mode = "on"`` (no
  VM running, agents not enforcing, or put back by ``gmd-agent --restore-all``).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import cast

from sqlalchemy import Connection, and_, or_, select

from gmd.daemon.enforce.plans import recent_window, running_vms
from gmd.daemon.reports.actions import level_changes
from gmd.ledger_schema.kinds import ActionKind, ActionStatus
from gmd.ledger_schema.tables import (
    actions as _actions,
    levels as _levels,
    vms as _vms,
)
from gmd.wire import Knob, PlanMode

HOST_KINDS = (ActionKind.host_apply.value, ActionKind.host_restore.value)


class Enforced(StrEnum):
    """What a level above 0 did to its customer (see the module docstring)."""

    applied = "applied"
    dry_run = "dry-run"
    not_applied = "not applied"
    off = "off"


@dataclass(frozen=True)
class Spans:
    """Disjoint time spans ``[start, end]``, sorted; a span of one instant is a report of a
    change undone at once, which still happened."""

    starts: tuple[float, ...] = ()
    ends: tuple[float, ...] = ()

    @classmethod
    def merged(cls, spans: Iterable[tuple[float, float]]) -> Spans:
        out: list[list[float]] = []
        for a, b in sorted(spans):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return cls(tuple(a for a, _ in out), tuple(b for _, b in out))

    def overlaps(self, start_s: float, end_s: float) -> bool:
        """Whether some moment of ``[start_s, end_s)`` is in a span: a span that ended at
        ``start_s`` is not, one that began (or was one instant) inside is."""
        k = bisect_left(self.ends, start_s)
        for a, b in zip(self.starts[k : k + 2], self.ends[k : k + 2], strict=True):
            if a < end_s and (b > start_s or a >= start_s):
                return True
        return False


@dataclass
class Throttling:
    """One customer's throttling as its hosts reported it."""

    applied: Spans = field(default_factory=Spans)
    """when at least one of its VMs was throttled by its host"""
    would: Spans = field(default_factory=Spans)
    """when a host in dry-run reported it would throttle one"""
    applied_now: frozenset[str] = frozenset()
    """the VMs (uuids) throttled at the end of what was read"""
    knobs: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """per VM (uuid), what its host's latest apply report said of each knob
    (``{"disk_weight": ["unsupported", "why"]}``), for the VMs whose host says it"""

    def mode(self, start_s: float, end_s: float, decided_dry_run: bool) -> Enforced:
        """What the level ≥ 1 in force during ``[start_s, end_s)`` did."""
        if self.applied.overlaps(start_s, end_s):
            return Enforced.applied
        if decided_dry_run or self.would.overlaps(start_s, end_s):
            return Enforced.dry_run
        return Enforced.not_applied


def episodes(changes: Iterable[tuple[float, int]]) -> list[tuple[float, float]]:
    """``[start, stop)`` of each run at level ≥ 1, from one customer's level changes (effect
    time, new level) in order; ``stop`` is infinite while the run lasts."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    for t, level in changes:
        if level >= 1 and start is None:
            start = t
        elif level < 1 and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, math.inf))
    return out


def throttling(
    conn: Connection,
    runs: Mapping[int, list[tuple[float, float]]],
    before_s: float | None = None,
) -> dict[int, Throttling]:
    """Customer id → its :class:`Throttling` over its throttled ``runs`` (:func:`episodes`),
    from the hosts' reports recorded before ``before_s``."""
    runs = {c: r for c, r in runs.items() if r}
    if not runs:
        return {}
    first = min(r[0][0] for r in runs.values())
    host_wide = and_(
        _actions.c.customer_id.is_(None), _actions.c.kind == ActionKind.host_restore.value
    )
    query = (
        select(
            _actions.c.customer_id,
            _actions.c.host_id,
            _actions.c.at,
            _actions.c.kind,
            _actions.c.status,
            _actions.c.dry_run,
            _actions.c.before,
            _actions.c.after,
            _actions.c.knobs,
        )
        .where(
            _actions.c.kind.in_(HOST_KINDS),
            or_(_actions.c.customer_id.in_(list(runs)), host_wide),
            _actions.c.at >= _dt(first),
        )
        .order_by(_actions.c.at, _actions.c.id)
    )
    if before_s is not None:
        query = query.where(_actions.c.at < _dt(before_s))
    events: dict[int | None, list[_Event]] = defaultdict(list)
    knobs: dict[int, dict[str, dict[str, list[str]]]] = defaultdict(dict)
    for r in conn.execute(query):
        after, before = _json(r.after), _json(r.before)
        uuid = after.get("vm") or before.get("vm")
        said = _json(r.knobs)
        applied_by_host = r.kind == ActionKind.host_apply.value and not r.dry_run
        if said and applied_by_host and r.customer_id is not None and isinstance(uuid, str):
            knobs[int(r.customer_id)][uuid] = cast(dict[str, list[str]], said)
        if r.customer_id is None:
            if after.get("all") is True and r.status == ActionStatus.ok.value:
                # gmd-agent --restore-all: everything gmd changed on the host is back
                events[None].append(_Event(r.at.timestamp(), None, r.host_id, False, False, True))
            continue
        if not isinstance(uuid, str):
            continue
        events[int(r.customer_id)].append(
            _Event(
                r.at.timestamp(),
                uuid,
                r.host_id,
                r.kind == ActionKind.host_apply.value,
                bool(r.dry_run),
                # a failed apply that changed some settings still throttles
                r.status == ActionStatus.ok.value or len(after) > 1,
            )
        )
    out = {}
    for cid, spans in runs.items():
        mine = sorted(events.get(cid, []) + events.get(None, []), key=lambda e: e.at_s)
        applied: list[tuple[float, float]] = []
        would: list[tuple[float, float]] = []
        now: set[str] = set()
        for start, stop in spans:
            on = _fold(mine, start, stop, applied, would)
            if math.isinf(stop):
                now = on
        out[cid] = Throttling(
            Spans.merged(applied), Spans.merged(would), frozenset(now), knobs.get(cid, {})
        )
    return out


@dataclass(frozen=True)
class _Event:
    """A host's report on a VM (``uuid`` None: on every VM gmd changed on ``host_id``)."""

    at_s: float
    uuid: str | None
    host_id: int | None
    apply: bool
    dry_run: bool
    took: bool
    """an apply that changed something, or a restore that worked"""


def _fold(
    events: list[_Event],
    start_s: float,
    stop_s: float,
    applied: list[tuple[float, float]],
    would: list[tuple[float, float]],
) -> set[str]:
    """Each VM's spans within one run (appended to ``applied`` and ``would``); the VMs still
    throttled at its end."""
    since: dict[bool, dict[str, tuple[float, int | None]]] = {False: {}, True: {}}
    for e in events:
        if not start_s <= e.at_s < stop_s or not e.took:
            continue
        held, out = since[e.dry_run], (would if e.dry_run else applied)
        if e.uuid is None:
            for uuid in [u for u, (_, h) in held.items() if h == e.host_id]:
                out.append((held.pop(uuid)[0], e.at_s))
        elif e.apply:
            # from its first apply on; by the host that applied it last (it may migrate)
            held[e.uuid] = (held[e.uuid][0] if e.uuid in held else e.at_s, e.host_id)
        elif e.uuid in held:
            out.append((held.pop(e.uuid)[0], e.at_s))
    applied.extend((t, stop_s) for t, _ in since[False].values())
    would.extend((t, stop_s) for t, _ in since[True].values())
    return set(since[False])


def level_runs(
    conn: Connection, customer_ids: Collection[int] | None, before_s: float | None = None
) -> tuple[dict[int, list[tuple[float, float]]], dict[int, list[tuple[float, int, bool]]]]:
    """Each customer's throttled runs (:func:`episodes`) and its level changes (effect time,
    level, decided in dry-run), from the level log before ``before_s`` (``customer_ids``
    None: everyone's)."""
    changes: dict[int, list[tuple[float, int, bool]]] = defaultdict(list)
    for r in level_changes(conn, customer_ids=customer_ids, before_s=before_s):
        try:
            level = int(json.loads(r.after or "")["level"])
        except (ValueError, KeyError, TypeError):
            continue
        changes[int(r.customer_id)].append(
            (float(r.start_s) + float(r.length_s), level, bool(r.dry_run))
        )
    runs = {c: episodes((t, lv) for t, lv, _ in ch) for c, ch in changes.items()}
    return runs, dict(changes)


@dataclass(frozen=True)
class EnforcedNow:
    """What a customer's level does now, and why in words (the standings' Enforced and Why)."""

    word: Enforced
    applied: int
    """its running VMs its hosts report throttled"""
    running: int
    """its running VMs"""
    lacking: dict[tuple[str, str], int] = field(default_factory=dict)
    """(knob, "unsupported" or "failed") → of how many of its running VMs their hosts'
    latest reports said so"""

    def why(self) -> str:
        """ "1 of 2 running VMs throttled; disk weight unsupported on 1" """
        if self.word == Enforced.off:
            return "enforcement is off"
        if self.running == 0:
            return "no VM running"
        head = f"{self.applied} of {self.running} running VM(s) reported throttled"
        if self.word == Enforced.dry_run and not self.applied:
            head = f"dry-run: {self.running} running VM(s), none changed"
        notes = [
            f"{Knob(k).words} {outcome} on {n}" for (k, outcome), n in sorted(self.lacking.items())
        ]
        return head + ("; " + ", ".join(notes) if notes else "")


def enforced_now(conn: Connection, mode: str, contention_intervals: int) -> dict[int, EnforcedNow]:
    """Each customer above level 0 → what its level does now, how many of its running VMs
    (:func:`~gmd.daemon.enforce.plans.running_vms`) its hosts report throttled, how many
    run, and the knobs their hosts could not set. ``applied`` needs one; otherwise ``dry-run``
    or ``not applied`` by the mode (a customer without a running VM has nothing applied), and
    ``off`` when the mode is."""
    throttled = [
        int(c)
        for c in conn.execute(select(_levels.c.customer_id).where(_levels.c.level > 0)).scalars()
    ]
    if not throttled:
        return {}
    if mode == PlanMode.off:
        return {c: EnforcedNow(Enforced.off, 0, 0) for c in throttled}
    running = running_vms(recent_window(conn, contention_intervals)).subquery()
    vms: dict[int, set[str]] = defaultdict(set)
    for cid, uuid in conn.execute(
        select(_vms.c.customer_id, _vms.c.uuid).where(
            _vms.c.customer_id.in_(throttled), _vms.c.id.in_(select(running.c.vm_id))
        )
    ):
        vms[int(cid)].add(uuid)
    runs, _ = level_runs(conn, throttled)
    state = throttling(conn, runs)
    out = {}
    for cid in throttled:
        mine = vms.get(cid, set())
        applied = len(mine & state[cid].applied_now) if cid in state else 0
        if applied:
            word = Enforced.applied
        elif mode == PlanMode.dry_run:
            word = Enforced.dry_run
        else:
            word = Enforced.not_applied
        lacking: dict[tuple[str, str], int] = defaultdict(int)
        for uuid, said in (state[cid].knobs if cid in state else {}).items():
            if uuid not in mine:
                continue
            for knob, (outcome, *_detail) in said.items():
                if knob in Knob.__members__ and outcome in ("unsupported", "failed"):
                    lacking[(knob, outcome)] += 1
        out[cid] = EnforcedNow(word, applied, len(mine), dict(lacking))
    return out


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC) if math.isfinite(t) else datetime.max.replace(tzinfo=UTC)


def _json(text: str | None) -> dict[str, object]:
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
