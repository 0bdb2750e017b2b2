"""Cumulative counters → use over a time span, with reset detection. Pure functions.

A VM's counters only grow while its process lives. When they go down, the process restarted
(a reboot through Nova, a migration, a stop and start) and started again from zero, so the use
since the reset is the new value itself — never a negative amount. When libvirt's domain id
changes, the process restarted even if a counter has since grown past its old value.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

from gmd.agent.collect.amounts import FieldAmounts
from gmd.agent.collect.base import Ownership, VmReading
from gmd.wire import USAGE_FIELDS


class UsageAmounts(FieldAmounts):
    """Amounts used over a span, in the batch format's units: one per
    :data:`gmd.wire.USAGE_FIELDS` (:class:`~gmd.agent.collect.amounts.FieldAmounts`)."""

    FIELDS = USAGE_FIELDS
    __slots__ = ()

    def amounts(self) -> tuple[float, ...]:
        return self.values

    def scaled(self, factor: float) -> UsageAmounts:
        return UsageAmounts(*[v * factor for v in self.values])

    def plus(self, other: UsageAmounts) -> UsageAmounts:
        return UsageAmounts(*map(operator.add, self.values, other.values))


@dataclass(frozen=True, slots=True)
class Baseline:
    """The counters a VM's next delta is measured from.

    Devices keep their last known counters while the VM's process lives, even in a tick where
    one was not read, so that a device read again later is measured from its own last value
    instead of being mistaken for a new (hot-plugged) one.
    """

    run_id: int
    taken_s: float
    cpu_time_ns: int | None
    memory_rss_bytes: int | None
    disks: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    nics: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @staticmethod
    def of(reading: VmReading, carried: Baseline | None = None) -> Baseline:
        disks, nics = dict(reading.disks), dict(reading.nics)
        cpu, rss = reading.cpu_time_ns, reading.memory_rss_bytes
        if carried is not None and carried.run_id == reading.run_id:
            disks = {**carried.disks, **disks}
            nics = {**carried.nics, **nics}
            cpu = carried.cpu_time_ns if cpu is None else cpu
            rss = carried.memory_rss_bytes if rss is None else rss
        return Baseline(reading.run_id, reading.taken_s, cpu, rss, disks, nics)


@dataclass(frozen=True, slots=True)
class VmSpan:
    """What one VM used between two moments, and who owned it then."""

    uuid: str
    start_s: float
    end_s: float
    usage: UsageAmounts
    owner: Ownership
    resets: tuple[str, ...] = ()
    """the counters that went down (or all of them, for a restarted process)"""


def counter_delta(previous: int | None, current: int) -> tuple[int, bool]:
    """Growth of a cumulative counter, and whether it was reset.

    No previous value (a new VM or a new device) counts from zero. A counter below its previous
    value restarted from zero, so its whole current value is new use.
    """
    if previous is None:
        return current, False
    if current < previous:
        return current, True
    return current - previous, False


def charged_memory(resident_bytes: int, flavor_memory_bytes: float | None) -> float:
    """The memory a VM is charged for holding: its resident set, capped at its flavor's memory.

    The resident set of a VM's QEMU process is what it holds of the host's RAM, but it also
    holds QEMU's own overhead (its code and libraries, TCG's translation cache, device
    buffers): an idle 96 MiB guest is ~200 MiB resident. That overhead is the hypervisor's,
    not the customer's, so a VM is charged at most the memory it was sold; within it, what it
    really holds. The guest's own figures (the balloon driver's stats) are not used: the
    customer's kernel writes them (it could report nothing in use), they exist only with a
    driver the customer may unload, and reading them costs QEMU monitor requests that the
    kernel collector is there to avoid. The one rule for every collector, applied where
    readings become use (:func:`step`). An unknown flavor caps nothing.
    """
    if flavor_memory_bytes is None:
        return float(resident_bytes)
    return float(min(resident_bytes, flavor_memory_bytes))


def _pairs_delta(
    previous: Mapping[str, tuple[int, int]] | None,
    current: Mapping[str, tuple[int, int]],
    what: str,
    resets: list[str],
) -> tuple[int, int]:
    """The growth of a VM's per-device counters. ``previous`` None: the process is new, every
    device counts from zero. A device the same process had no counters for counts from zero
    beside devices it had (hot-plugged: its counters began with it). Where none of the
    process's known devices is read (none known, or all under other names), the devices read
    are measured from this reading on: their counters hold use from before gmd could read
    them, which an earlier agent may have counted already — an upgraded agent whose
    collector names devices otherwise (the kernel collector once named disks by their host
    device, now by the guest's), counters unreadable until now."""
    first = second = 0
    renamed = previous is not None and not any(d in previous for d in current)
    for device, (a, b) in current.items():
        if renamed:
            continue
        old = None if previous is None else previous.get(device)
        da, reset_a = counter_delta(None if old is None else old[0], a)
        db, reset_b = counter_delta(None if old is None else old[1], b)
        first += da
        second += db
        if reset_a or reset_b:
            resets.append(f"{what} {device}")
    return first, second


def step(
    previous: Baseline | None, reading: VmReading, *, new_since_s: float | None
) -> tuple[VmSpan | None, Baseline]:
    """The use since ``previous`` and the baseline to measure the next reading from.

    Three cases:

    - a baseline of the same process: each counter's growth (a counter that went down is a
      reset), memory as the mean of the two levels over the span, each
      :func:`charged_memory` (capped at the flavor);
    - no baseline but ``new_since_s`` (the VM was not running at the host's previous reading,
      at ``new_since_s``), or a baseline of an earlier process (its domain id changed): the
      process started within the span, so all its counters are use within it, and memory is
      counted for half the span (it started at some unknown moment in it);
    - no baseline and no ``new_since_s`` (the agent's first reading of this host): the counters
      hold use from before anyone watched, possibly already reported by an earlier agent, so the
      reading is only a baseline.
    """
    baseline = Baseline.of(reading, previous)
    restarted = previous is not None and previous.run_id != reading.run_id
    if previous is None and new_since_s is None:
        return None, baseline
    same = previous if previous is not None and not restarted else None
    start_s = previous.taken_s if previous is not None else new_since_s
    assert start_s is not None
    resets: list[str] = []
    if restarted and previous is not None:
        resets.append(f"process (domain id {previous.run_id} → {reading.run_id})")

    cpu_ns = 0
    if reading.cpu_time_ns is not None:
        cpu_ns, reset = counter_delta(
            None if same is None else same.cpu_time_ns, reading.cpu_time_ns
        )
        if reset:
            resets.append("cpu.time")
    rd, wr = _pairs_delta(None if same is None else same.disks, reading.disks, "disk", resets)
    rx, tx = _pairs_delta(None if same is None else same.nics, reading.nics, "interface", resets)

    span_s = max(reading.taken_s - start_s, 0.0)
    rss = reading.memory_rss_bytes
    cap = reading.owner.flavor.memory_bytes
    if rss is None:
        memory_byte_s = 0.0
    elif same is not None and same.memory_rss_bytes is not None:
        memory_byte_s = (
            (charged_memory(same.memory_rss_bytes, cap) + charged_memory(rss, cap)) / 2 * span_s
        )
    else:
        memory_byte_s = charged_memory(rss, cap) / 2 * span_s
    usage = UsageAmounts.of(
        cpu_s=cpu_ns / 1e9,
        memory_byte_s=memory_byte_s,
        disk_read_bytes=float(rd),
        disk_write_bytes=float(wr),
        network_rx_bytes=float(rx),
        network_tx_bytes=float(tx),
    )
    end_s = max(reading.taken_s, start_s)
    return VmSpan(reading.uuid, start_s, end_s, usage, reading.owner, tuple(resets)), baseline
