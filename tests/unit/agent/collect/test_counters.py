"""The agent's decisions on data alone: deltas and resets, splitting over intervals, state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gmd.agent.collect.aggregate import (
    AgentState,
    advance,
    batch_document,
    dump_state,
    load_state,
    split,
)
from gmd.agent.collect.base import (
    DomainFlavor,
    FailureKind,
    HostReading,
    Ownership,
    ReadFailure,
    VmReading,
)
from gmd.agent.collect.counters import Baseline, UsageAmounts, charged_memory, counter_delta, step
from gmd.wire import SampleBatch

OWNER = Ownership("proj-a", "nova/1.1", DomainFlavor(2, 2**31), 1_700_000_000)
VM1 = "6f1c5b1e-1c2d-4e3f-8a9b-0c1d2e3f4a5b"  # the wire takes VM ids as UUIDs
GIB = 2**30


def reading(
    t: float,
    cpu_s: float,
    *,
    rss: int = GIB,
    disks: dict | None = None,
    nics: dict | None = None,
    run_id: int = 1,
    uuid: str = VM1,
    owner: Ownership = OWNER,
) -> VmReading:
    return VmReading(
        uuid=uuid,
        run_id=run_id,
        taken_s=t,
        cpu_time_ns=round(cpu_s * 1e9),
        memory_rss_bytes=rss,
        disks=disks if disks is not None else {"vda": (1000, 500)},
        nics=nics if nics is not None else {"tap0": (300, 200)},
        owner=owner,
    )


def test_counter_delta_growth_and_reset() -> None:
    assert counter_delta(100, 250) == (150, False)
    assert counter_delta(100, 100) == (0, False)
    # Went down: the process restarted from zero; its whole value is new use.
    assert counter_delta(5000, 40) == (40, True)
    assert counter_delta(None, 70) == (70, False)


def test_step_measures_growth_of_the_same_process() -> None:
    first = reading(1000.0, 50.0, rss=GIB)
    span, base = step(None, first, new_since_s=None)
    assert span is None  # the agent's first sight of a VM is only a baseline
    second = reading(
        1010.0, 65.0, rss=GIB * 3 // 2, disks={"vda": (4000, 900)}, nics={"tap0": (1300, 260)}
    )
    span, base2 = step(base, second, new_since_s=None)
    assert span is not None
    assert (span.start_s, span.end_s) == (1000.0, 1010.0)
    assert span.usage == UsageAmounts.of(
        cpu_s=15.0,
        memory_byte_s=1.25 * GIB * 10,  # mean of 1 and 1.5 GiB over 10 s
        disk_read_bytes=3000,
        disk_write_bytes=400,
        network_rx_bytes=1000,
        network_tx_bytes=60,
    )
    assert span.resets == ()
    assert base2.cpu_time_ns == 65_000_000_000 and base2.taken_s == 1010.0


def test_memory_is_charged_at_most_the_flavor() -> None:
    """QEMU's own overhead (an idle 96 MiB guest is ~200 MiB resident) is not the customer's:
    each level is capped at the flavor's memory, so a VM within its flavor never looks greedy
    for memory; an unknown flavor caps nothing (issue 27)."""
    assert charged_memory(3 * GIB, 2 * GIB) == 2 * GIB
    assert charged_memory(GIB, 2 * GIB) == GIB
    assert charged_memory(3 * GIB, None) == 3 * GIB
    # Both levels of a span are capped (OWNER's flavor: 2 GiB), and a new VM's half span too.
    _, base = step(None, reading(0.0, 1.0, rss=5 * GIB), new_since_s=None)
    span, _ = step(base, reading(10.0, 2.0, rss=3 * GIB), new_since_s=None)
    assert span is not None and span.usage.memory_byte_s == 2 * GIB * 10
    span, _ = step(None, reading(10.0, 2.0, rss=3 * GIB), new_since_s=0.0)
    assert span is not None and span.usage.memory_byte_s == 2 * GIB * 10 / 2
    unknown = Ownership("proj-a", "default", DomainFlavor(2, None))
    _, base = step(None, reading(0.0, 1.0, rss=5 * GIB, owner=unknown), new_since_s=None)
    span, _ = step(base, reading(10.0, 2.0, rss=3 * GIB, owner=unknown), new_since_s=None)
    assert span is not None and span.usage.memory_byte_s == 4 * GIB * 10


def test_a_counter_that_goes_down_is_a_reset_not_negative_use() -> None:
    _, base = step(None, reading(0.0, 9000.0, disks={"vda": (10**9, 10**8)}), new_since_s=None)
    # Same domain id, but the disk counter fell (a hot-unplug and replug, a QEMU restart that
    # libvirt did not renumber): the new value is what was used since.
    after = reading(10.0, 9004.0, disks={"vda": (7000, 10**8 + 50)})
    span, _ = step(base, after, new_since_s=None)
    assert span is not None
    assert span.usage.disk_read_bytes == 7000
    assert span.usage.disk_write_bytes == 50
    assert span.usage.cpu_s == 4.0
    assert span.resets == ("disk vda",)


def test_a_new_domain_id_is_a_restart_even_if_counters_grew() -> None:
    _, base = step(None, reading(0.0, 5.0), new_since_s=None)
    restarted = reading(10.0, 7.0, run_id=2, disks={"vda": (2000, 600)}, nics={"tap0": (1, 2)})
    span, base2 = step(base, restarted, new_since_s=None)
    assert span is not None
    # All of the new process's counters are use within the span; memory for half of it.
    assert span.usage == UsageAmounts(7.0, GIB * 10 / 2, 2000, 600, 1, 2)
    assert span.resets == ("process (domain id 1 → 2)",)
    assert base2.run_id == 2


def test_a_vm_started_since_the_last_reading_counts_from_zero() -> None:
    span, _ = step(None, reading(20.0, 3.0, rss=2 * GIB), new_since_s=10.0)
    assert span is not None
    assert (span.start_s, span.end_s) == (10.0, 20.0)
    assert span.usage == UsageAmounts(3.0, GIB * 10, 1000, 500, 300, 200)


def test_a_device_missing_from_one_reading_keeps_its_counters() -> None:
    _, base = step(
        None, reading(0.0, 1.0, disks={"vda": (100, 10), "vdb": (50, 5)}), new_since_s=None
    )
    # vdb could not be read this time: its baseline must survive...
    _, base = step(base, reading(10.0, 2.0, disks={"vda": (150, 20)}), new_since_s=None)
    assert base.disks == {"vda": (150, 20), "vdb": (50, 5)}
    # ...so that it is measured from 50, not counted from zero as if hot-plugged.
    span, _ = step(
        base, reading(20.0, 3.0, disks={"vda": (150, 20), "vdb": (80, 9)}), new_since_s=None
    )
    assert span is not None
    assert (span.usage.disk_read_bytes, span.usage.disk_write_bytes) == (30, 4)


def test_a_hot_plugged_device_counts_from_zero() -> None:
    _, base = step(None, reading(0.0, 1.0, nics={"tap0": (10, 10)}), new_since_s=None)
    span, _ = step(
        base, reading(10.0, 2.0, nics={"tap0": (30, 10), "tap1": (500, 7)}), new_since_s=None
    )
    assert span is not None
    assert (span.usage.network_rx_bytes, span.usage.network_tx_bytes) == (520, 7)


def test_split_shares_a_span_by_time() -> None:
    assert split(50.0, 70.0, 60) == [(0, 0.5), (60, 0.5)]
    assert split(60.0, 120.0, 60) == [(60, 1.0)]
    assert split(10.0, 190.0, 60) == [
        (0, 50 / 180),
        (60, 60 / 180),
        (120, 60 / 180),
        (180, 10 / 180),
    ]
    assert split(120.0, 120.0, 60) == [(120, 1.0)]


def host(t: float, vms: list[VmReading], listed: set[str] | None = None, **kw) -> HostReading:
    names = listed if listed is not None else {v.uuid for v in vms}
    return HostReading(t, True, tuple(vms), frozenset(names), **kw)


def test_advance_closes_intervals_with_exact_totals() -> None:
    state = AgentState()
    closed_all = []
    # A VM using 0.5 core, read every 10 s from t = 55 to t = 185: interval [60, 120) is
    # complete, [0, 60) and [120, 180) partly covered.
    for k in range(14):
        t = 55.0 + 10 * k
        r = advance(state, host(t, [reading(t, 0.5 * t)]), 60)
        state = r.state
        closed_all.extend(r.closed)
    assert [c.start_s for c in closed_all] == [0, 60, 120]
    by_start = {c.start_s: c.vms[VM1].usage for c in closed_all}
    assert by_start[0].cpu_s == pytest.approx(2.5)  # 55..60
    assert by_start[60].cpu_s == pytest.approx(30.0)
    assert by_start[60].memory_byte_s == pytest.approx(GIB * 60)
    assert by_start[120].cpu_s == pytest.approx(30.0)
    assert list(state.open) == [180]
    assert state.open[180][VM1].usage.cpu_s == pytest.approx(2.5)
    # Nothing invented or lost: every 10 s delta (5 core-seconds) is in exactly one place.
    total = sum(u.cpu_s for u in by_start.values()) + state.open[180][VM1].usage.cpu_s
    assert total == pytest.approx(0.5 * (185 - 55), abs=1e-9)


def test_a_clock_stepped_back_makes_no_second_happen_twice() -> None:
    """NTP steps the host's clock back 30 s at true time 130: the readings after it are
    stamped 30 s early. The seconds between the new time and the last reading's were already
    counted: none is counted again (no interval closed a second time, no interval with more
    memory than its length holds), and no CPU second is lost or invented."""
    state = AgentState()
    closed = []
    true_times = [55.0 + 10 * k for k in range(21)]  # 55 .. 255
    for true_t in true_times:
        stamped = true_t if true_t < 130 else true_t - 30
        r = advance(state, host(stamped, [reading(stamped, 0.5 * true_t)]), 60)
        state, closed = r.state, closed + r.closed
    starts = [c.start_s for c in closed]
    assert starts == sorted(set(starts)) == [0, 60, 120]
    for c in closed:
        assert c.vms[VM1].usage.memory_byte_s <= GIB * 60 * (1 + 1e-12), c.start_s
    cpu = sum(c.vms[VM1].usage.cpu_s for c in closed) + state.open[180][VM1].usage.cpu_s
    assert cpu == pytest.approx(0.5 * (255 - 55), abs=1e-9)
    assert state.last_ok_s == 225.0


def test_vanished_vm_is_dropped_and_failed_vm_keeps_its_baseline() -> None:
    a, b = reading(0.0, 1.0, uuid="a"), reading(0.0, 1.0, uuid="b")
    state = advance(AgentState(), host(0.0, [a, b]), 60).state
    # "b" listed but not read (a libvirt error): keeps its baseline from t = 0.
    state = advance(state, host(10.0, [reading(10.0, 2.0, uuid="a")], {"a", "b"}), 60).state
    assert state.baselines["b"].taken_s == 0.0
    # Read again at 20: measured over the whole 20 s.
    r = advance(state, host(20.0, [reading(20.0, 2.0, uuid="a"), reading(20.0, 9.0, uuid="b")]), 60)
    spans = {s.uuid: s for s in r.spans}
    assert (spans["b"].start_s, spans["b"].usage.cpu_s) == (0.0, 8.0)
    # "a" gone mid-tick, then no longer listed: its baseline goes.
    r = advance(
        r.state, host(30.0, [reading(30.0, 3.0, uuid="b")], {"a", "b"}, gone=frozenset({"a"})), 60
    )
    assert set(r.state.baselines) == {"b"}
    assert r.state.listed == {"b"}


def test_a_vm_that_appears_counts_since_the_previous_reading() -> None:
    state = advance(AgentState(), host(0.0, [reading(0.0, 1.0, uuid="old")]), 60).state
    new = reading(10.0, 4.0, uuid="new", rss=2 * GIB)
    r = advance(state, host(10.0, [reading(10.0, 2.0, uuid="old"), new]), 60)
    spans = {s.uuid: s for s in r.spans}
    assert spans["new"].start_s == 0.0
    assert spans["new"].usage.cpu_s == 4.0
    assert spans["new"].usage.memory_byte_s == GIB * 10


def test_unreadable_host_changes_nothing_but_closes_due_intervals() -> None:
    state = advance(AgentState(), host(50.0, [reading(50.0, 0.0)]), 60).state
    state = advance(state, host(58.0, [reading(58.0, 8.0)]), 60).state
    r = advance(
        state, HostReading(65.0, False, errors=(ReadFailure(FailureKind.host, "down"),)), 60
    )
    assert [c.start_s for c in r.closed] == [0]
    assert r.closed[0].vms[VM1].usage.cpu_s == 8.0
    assert r.state.baselines == state.baselines and r.state.last_ok_s == 58.0
    # Back at 70: the 12 s since 58 are split 2 s / 10 s; interval 0 closes again with 2 s.
    r = advance(r.state, host(70.0, [reading(70.0, 20.0)]), 60)
    assert [(c.start_s, c.vms[VM1].usage.cpu_s) for c in r.closed] == [(0, pytest.approx(2.0))]
    assert r.state.open[60][VM1].usage.cpu_s == pytest.approx(10.0)


def test_an_idle_host_still_reports_every_interval() -> None:
    state = advance(AgentState(), host(30.0, []), 60).state
    r = advance(state, host(200.0, []), 60)
    assert [(c.start_s, c.vms) for c in r.closed] == [(0, {}), (60, {}), (120, {})]


def test_state_round_trips_through_json() -> None:
    state = AgentState()
    for t in (0.0, 10.0, 70.0):
        state = advance(state, host(t, [reading(t, t / 2, disks={"vda": (int(t), 1)})]), 60).state
    assert load_state(dump_state(state)) == state


def test_batch_document_is_a_valid_sample_batch() -> None:
    state = advance(AgentState(), host(0.0, [reading(0.0, 0.0)]), 60).state
    r = advance(state, host(60.0, [reading(60.0, 30.0)]), 60)
    doc = batch_document(
        r.closed[0],
        key="cmp-1/0/abc",
        host="cmp-1",
        capacity={
            "cpu_cores": 8,
            "memory_bytes": 3e10,
            "disk_bytes_per_s": 1e8,
            "network_bytes_per_s": 1e8,
        },
    )
    batch = SampleBatch.model_validate(doc)
    assert batch.vms == [
        {
            "uuid": VM1,
            "customer": "proj-a",
            "cpu_s": 30.0,
            "memory_byte_s": GIB * 60,
            "disk_read_bytes": 0.0,
            "disk_write_bytes": 0.0,
            "network_rx_bytes": 0.0,
            "network_tx_bytes": 0.0,
            "flavor": {"vcpus": 2.0, "memory_bytes": float(2**31)},
            "created_s": 1_700_000_000,
        }
    ]


def test_project_names_go_with_the_batch_and_the_state() -> None:
    named = replace(OWNER, customer_name="Project A")
    state = advance(AgentState(), host(0.0, [reading(0.0, 0.0, owner=named)]), 60).state
    state = advance(state, host(30.0, [reading(30.0, 10.0, owner=named)]), 60).state
    assert load_state(dump_state(state)) == state
    r = advance(state, host(60.0, [reading(60.0, 30.0, owner=named)]), 60)
    capacity = {
        "cpu_cores": 8,
        "memory_bytes": 3e10,
        "disk_bytes_per_s": 1,
        "network_bytes_per_s": 1,
    }
    doc = batch_document(r.closed[0], key="k", host="cmp-1", capacity=capacity)
    assert SampleBatch.model_validate(doc).customer_names == {"proj-a": "Project A"}
    # Without names the document is the one agents sent before names existed.
    state = advance(AgentState(), host(0.0, [reading(0.0, 0.0)]), 60).state
    r = advance(state, host(60.0, [reading(60.0, 30.0)]), 60)
    assert "customer_names" not in batch_document(r.closed[0], key="k", host="h", capacity={})


def test_baseline_of_a_restarted_vm_does_not_carry_old_devices() -> None:
    old = Baseline(1, 0.0, 10, GIB, {"vda": (5, 5)}, {"tap0": (1, 1)})
    new = Baseline.of(reading(10.0, 1.0, run_id=2, disks={}, nics={}), old)
    assert new.disks == {} and new.nics == {}


def test_a_device_first_seen_in_a_running_process_is_a_baseline_not_use() -> None:
    """An agent upgraded mid-run: the old kernel collector named a disk by its host device and
    read 0 from its cgroup; the new one names it by the guest's and reads QEMU's counters,
    which hold the VM's whole history. That history is not this tick's use."""
    _, base = step(None, reading(0.0, 1.0, disks={"host:254:0": (0, 0)}), new_since_s=None)
    history = {"vda": (40 * GIB, 3 * GIB)}
    span, base = step(base, reading(10.0, 2.0, disks=history), new_since_s=None)
    assert span is not None
    assert (span.usage.disk_read_bytes, span.usage.disk_write_bytes) == (0, 0)
    assert span.usage.cpu_s == 1.0  # the rest is measured as ever
    span, _ = step(
        base, reading(20.0, 3.0, disks={"vda": (40 * GIB + 500, 3 * GIB + 7)}), new_since_s=None
    )
    assert span is not None
    assert (span.usage.disk_read_bytes, span.usage.disk_write_bytes) == (500, 7)


def test_usage_amounts_are_the_contracts_fields_every_one_by_name() -> None:
    """A collector that leaves out a field of the wire contract (a resource added there that it
    does not measure yet) fails where it builds the amounts, not in a batch the daemon refuses."""
    from gmd.wire import USAGE_FIELDS

    every = dict.fromkeys(USAGE_FIELDS, 2.0)
    assert UsageAmounts.of(**every).as_wire() == every
    assert UsageAmounts() == UsageAmounts(*[0.0] * len(USAGE_FIELDS))
    with pytest.raises(ValueError, match=r"missing \['cpu_s'\]"):
        UsageAmounts.of(**{f: 1.0 for f in USAGE_FIELDS if f != "cpu_s"})
    with pytest.raises(ValueError, match=r"unknown \['gpu_s'\]"):
        UsageAmounts.of(**every, gpu_s=1.0)
    with pytest.raises(ValueError, match="amounts for"):
        UsageAmounts(1.0, 2.0)
    with pytest.raises(AttributeError, match="gpu_s"):
        _ = UsageAmounts().gpu_s
