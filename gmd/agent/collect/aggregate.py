"""Ticks → per-interval usage aligned to the daemon's interval. Pure: state in, state out.

Each tick turns every VM's counters into a :class:`~gmd.agent.collect.counters.VmSpan` (what it used
since its previous reading) and spreads the span over the accounting intervals it overlaps, in
proportion to time. An interval is *closed* once a tick is taken at or after its end; the
caller turns closed intervals into batches. A span that reaches back into an interval closed
earlier (a VM whose read failed for a while, an agent that was down) closes that interval
again with only the late part: the daemon adds batches with different keys for the same VM,
host and interval, so every delta is sent exactly once, in whatever batch first closes it.

:class:`AgentState` is everything needed to carry on after a restart (baselines, which VMs
ran, the open intervals); it is stored in the spool together with the batches it produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gmd.agent.collect.base import DomainFlavor, HostReading, Ownership
from gmd.agent.collect.counters import Baseline, UsageAmounts, VmSpan, step

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class VmTotals:
    """One VM's use within one interval so far, and its latest owner."""

    usage: UsageAmounts
    owner: Ownership


@dataclass(frozen=True)
class AgentState:
    baselines: dict[str, Baseline] = field(default_factory=dict)
    listed: frozenset[str] = frozenset()
    """every VM running at the last successful reading"""
    last_ok_s: float | None = None
    """when the host was last read successfully; ``None`` before the first reading"""
    open: dict[int, dict[str, VmTotals]] = field(default_factory=dict)
    """interval start → VM uuid → use so far"""
    host_cpu: tuple[float, float] | None = None
    """(when, the host's busy CPU seconds then): the last reading that gave them"""
    open_host_cpu: dict[int, float] = field(default_factory=dict)
    """interval start → the host's busy CPU seconds in it so far"""


@dataclass(frozen=True, slots=True)
class ClosedInterval:
    start_s: int
    interval_s: int
    vms: dict[str, VmTotals]
    host_cpu_s: float | None = None
    """the host's busy CPU seconds in the interval; ``None``: not measured"""


@dataclass(frozen=True, slots=True)
class TickResult:
    state: AgentState
    closed: list[ClosedInterval]
    spans: list[VmSpan]


def split(start_s: float, end_s: float, interval_s: int) -> list[tuple[int, float]]:
    """The intervals ``[start_s, end_s]`` overlaps, each with its share of the span.

    A zero-length span belongs wholly to the interval its end falls in.
    """
    if end_s <= start_s:
        return [(math.floor(end_s / interval_s) * interval_s, 1.0)]
    first = math.floor(start_s / interval_s)
    last = math.ceil(end_s / interval_s) - 1
    length = end_s - start_s
    out = []
    for k in range(first, last + 1):
        overlap = min(end_s, (k + 1) * interval_s) - max(start_s, k * interval_s)
        if overlap > 0:
            out.append((k * interval_s, overlap / length))
    return out


def _spread(usage: UsageAmounts, shares: list[tuple[int, float]]) -> list[tuple[int, UsageAmounts]]:
    """``usage`` divided by ``shares``; the last part takes the remainder so the parts add up
    to the whole exactly (no byte is lost or invented by rounding)."""
    if len(shares) == 1:
        return [(shares[0][0], usage)]
    parts, taken = [], UsageAmounts()
    for start, share in shares[:-1]:
        part = usage.scaled(share)
        parts.append((start, part))
        taken = taken.plus(part)
    remainder = usage.plus(taken.scaled(-1.0))
    parts.append((shares[-1][0], UsageAmounts(*(max(v, 0.0) for v in remainder.amounts()))))
    return parts


def _host_cpu(
    state: AgentState, reading: HostReading, interval_s: int
) -> tuple[tuple[float, float] | None, dict[int, float]]:
    """The host's busy CPU seconds since its last reading that gave them, spread over the
    intervals in proportion to time as a VM's use is, and the new baseline. A counter that
    went down (the host rebooted) counts from zero; a reading without the figure keeps the
    baseline, so the next one measures the whole stretch."""
    open_host = dict(state.open_host_cpu)
    busy = reading.host_cpu_s
    if busy is None:
        return state.host_cpu, open_host
    if state.host_cpu is not None:
        since_s, before = state.host_cpu
        delta = busy - before if busy >= before else busy
        for start, share in split(since_s, max(reading.taken_s, since_s), interval_s):
            open_host[start] = open_host.get(start, 0.0) + delta * share
    return (reading.taken_s, busy), open_host


def advance(state: AgentState, reading: HostReading, interval_s: int) -> TickResult:
    """Fold one host reading into the state; return the new state and the closed intervals."""
    reading = _not_before(reading, state.last_ok_s)
    open_ = {start: dict(vms) for start, vms in state.open.items()}
    open_host = dict(state.open_host_cpu)
    spans: list[VmSpan] = []
    if reading.ok:
        baselines = dict(state.baselines)
        for vm in reading.vms:
            new_since = state.last_ok_s if vm.uuid not in state.listed else None
            span, baselines[vm.uuid] = step(state.baselines.get(vm.uuid), vm, new_since_s=new_since)
            if span is None:
                continue
            spans.append(span)
            for start, part in _spread(span.usage, split(span.start_s, span.end_s, interval_s)):
                bucket = open_.setdefault(start, {})
                before = bucket.get(span.uuid)
                total = part if before is None else before.usage.plus(part)
                bucket[span.uuid] = VmTotals(total, span.owner)
        # A VM not listed, or gone mid-tick, stopped: its counters went with its process.
        # One listed but not read keeps its baseline until a later tick reads it.
        baselines = {
            uuid: b
            for uuid, b in baselines.items()
            if uuid in reading.listed and uuid not in reading.gone
        }
        # The host was up from its previous reading to this one: every interval in between
        # gets a batch, even without VMs, so that its capacity is on record.
        since = state.last_ok_s if state.last_ok_s is not None else reading.taken_s
        for start, _share in split(since, reading.taken_s, interval_s):
            open_.setdefault(start, {})
        host_cpu, open_host = _host_cpu(state, reading, interval_s)
        for start in open_host:
            open_.setdefault(start, {})
        state = AgentState(
            baselines,
            frozenset(reading.listed - reading.gone),
            reading.taken_s,
            open_,
            host_cpu,
            open_host,
        )
    else:
        state = replace(state, open=open_, open_host_cpu=open_host)
    closed = [
        ClosedInterval(start, interval_s, open_.pop(start), open_host.pop(start, None))
        for start in sorted(open_)
        if start + interval_s <= reading.taken_s
    ]
    return TickResult(state, closed, spans)


def _not_before(reading: HostReading, last_ok_s: float | None) -> HostReading:
    """``reading`` timed no earlier than the last good reading.

    A clock stepped back (NTP's step, an operator's ``date``) would stamp the next readings
    with seconds that were already measured: spreading their use over them again would count
    memory twice for those seconds and close their intervals a second time. Until the clock
    is past the last good reading again, a reading is timed at it: the counters' growth
    meanwhile lands in that instant's interval (nothing lost), and the memory of the seconds
    the step took back is not counted again. A clock stepped forward is not undone: the reading
    after it spans the step, and its memory is counted over the step's seconds (once)."""
    if last_ok_s is None or reading.taken_s >= last_ok_s:
        return reading
    return replace(
        reading,
        taken_s=last_ok_s,
        vms=tuple(replace(vm, taken_s=max(vm.taken_s, last_ok_s)) for vm in reading.vms),
    )


def batch_document(
    closed: ClosedInterval, *, key: str, host: str, capacity: dict[str, float]
) -> dict[str, Any]:
    """The ``SampleBatch`` (``POST /v1/samples`` body) for one closed interval."""
    vms = []
    names: dict[str, str] = {}
    for uuid in sorted(closed.vms):
        totals = closed.vms[uuid]
        if totals.owner.customer_name is not None:
            names[totals.owner.customer] = totals.owner.customer_name
        vm: dict[str, Any] = {
            "uuid": uuid,
            "customer": totals.owner.customer,
            **totals.usage.as_wire(),
        }
        flavor = totals.owner.flavor.as_wire()
        if flavor:
            vm["flavor"] = flavor
        if totals.owner.created_s is not None:
            vm["created_s"] = totals.owner.created_s
        vms.append(vm)
    return {
        "key": key,
        "host": host,
        "interval_start_s": closed.start_s,
        "interval_s": closed.interval_s,
        "capacity": capacity,
        "vms": vms,
        # only when known: a batch without names is the same document as before they existed
        **({"customer_names": names} if names else {}),
        **({"host_cpu_s": closed.host_cpu_s} if closed.host_cpu_s is not None else {}),
    }


# -- persistence ------------------------------------------------------------------------------


def _owner_doc(o: Ownership) -> list[Any]:
    return [o.customer, o.source, o.flavor.vcpus, o.flavor.memory_bytes, o.created_s] + (
        [] if o.customer_name is None else [o.customer_name]
    )


def _owner_of(doc: list[Any]) -> Ownership:
    """An owner :func:`_owner_doc` wrote (a state from before project names has five items)."""
    return Ownership(doc[0], doc[1], DomainFlavor(doc[2], doc[3]), doc[4], *doc[5:6])


def dump_state(state: AgentState) -> bytes:
    """The state as JSON, to be stored in the spool with the batches it produced."""
    return orjson.dumps(
        {
            "version": STATE_VERSION,
            "last_ok_s": state.last_ok_s,
            "listed": sorted(state.listed),
            "baselines": {
                uuid: [
                    b.run_id,
                    b.taken_s,
                    b.cpu_time_ns,
                    b.memory_rss_bytes,
                    {d: list(v) for d, v in b.disks.items()},
                    {d: list(v) for d, v in b.nics.items()},
                ]
                for uuid, b in state.baselines.items()
            },
            "open": {
                str(start): {
                    uuid: [list(t.usage.amounts()), _owner_doc(t.owner)] for uuid, t in vms.items()
                }
                for start, vms in state.open.items()
            },
            # Absent from a state written before the host's busy time was measured.
            "host_cpu": None if state.host_cpu is None else list(state.host_cpu),
            "open_host_cpu": {str(start): v for start, v in state.open_host_cpu.items()},
        }
    )


def load_state(blob: bytes) -> AgentState:
    """The state :func:`dump_state` wrote. Raises ``ValueError`` for another version."""
    doc = orjson.loads(blob)
    if doc.get("version") != STATE_VERSION:
        raise ValueError(f"agent state version {doc.get('version')!r}, expected {STATE_VERSION}")
    baselines = {
        uuid: Baseline(
            run_id,
            taken_s,
            cpu,
            rss,
            {d: (v[0], v[1]) for d, v in disks.items()},
            {d: (v[0], v[1]) for d, v in nics.items()},
        )
        for uuid, (run_id, taken_s, cpu, rss, disks, nics) in doc["baselines"].items()
    }
    open_ = {
        int(start): {
            uuid: VmTotals(UsageAmounts(*amounts), _owner_of(owner))
            for uuid, (amounts, owner) in vms.items()
        }
        for start, vms in doc["open"].items()
    }
    host_cpu = doc.get("host_cpu")
    return AgentState(
        baselines,
        frozenset(doc["listed"]),
        doc["last_ok_s"],
        open_,
        None if host_cpu is None else (host_cpu[0], host_cpu[1]),
        {int(start): v for start, v in doc.get("open_host_cpu", {}).items()},
    )
