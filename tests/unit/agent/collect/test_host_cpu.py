"""The host's own busy CPU time (issue 27): read from ``/proc/stat``, spread over intervals as
a VM's use is, sent with the batch, and supplied by the replay collector consistently with
its VMs' counters."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from gmd.agent.collect.aggregate import (
    AgentState,
    advance,
    batch_document,
    dump_state,
    load_state,
)
from gmd.agent.collect.base import HostReading
from gmd.agent.collect.host import (
    HostCpu,
    local_hypervisor,
    parse_proc_stat_busy,
    parse_proc_stat_ticks,
)
from gmd.agent.collect.libvirt import LibvirtCollector
from gmd.agent.collect.replay import ReplayCollector, plan_clock, replay_vms
from gmd.agent.replay_run import tick_times
from gmd.traces import read_trace
from gmd.wire import SampleBatch

TRACES = Path(__file__).parents[4] / "gmd" / "admin" / "demo_data" / "2013-7"
"""The demo's packaged traces (gmd.admin.demo.PACKAGED_TRACES; not imported: the agent's
tests need nothing of the admin's)."""
PAST = 1_700_000_000

# A 2-CPU host's /proc/stat (Linux 6.1): user nice system idle iowait irq softirq steal guest
# guest_nice, in USER_HZ ticks.
PROC_STAT = """\
cpu  10132153 290696 3084719 46828483 16683 0 25195 175 9000000 0
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0
cpu1 1335848 31224 504584 13461616 5398 0 2305 175 0 0
intr 1462898 0 0 0
ctxt 2538779
btime 1713000000
"""
CAPACITY = {
    "cpu_cores": 2.0,
    "memory_bytes": 3e10,
    "disk_bytes_per_s": 1e9,
    "network_bytes_per_s": 1e9,
}


def test_busy_is_every_state_but_idle_and_iowait_and_guest_is_not_added_twice() -> None:
    busy = 10132153 + 290696 + 3084719 + 0 + 25195 + 175  # user nice system irq softirq steal
    assert parse_proc_stat_busy(PROC_STAT, 100) == pytest.approx(busy / 100)
    # A kernel without the steal column, and text that is not /proc/stat.
    assert parse_proc_stat_busy("cpu 1 2 3 4 5 6 7\n", 100) == pytest.approx(
        (1 + 2 + 3 + 6 + 7) / 100
    )
    for bad in ("", "intr 1 2\n", "cpu 1 2\n", "cpu a b c d\n"):
        with pytest.raises(ValueError):
            parse_proc_stat_busy(bad, 100)


def test_every_state_is_named_and_guest_time_is_left_inside_user_and_nice() -> None:
    ticks = parse_proc_stat_ticks(PROC_STAT)
    assert ticks == {
        "user": 10132153,
        "nice": 290696,
        "system": 3084719,
        "idle": 46828483,
        "iowait": 16683,
        "irq": 0,
        "softirq": 25195,
        "steal": 175,
    }
    older = ("user", "nice", "system", "idle", "iowait", "irq", "softirq")  # no steal
    assert parse_proc_stat_ticks("cpu 1 2 3 4 5 6 7\n") == dict(
        zip(older, range(1, 8), strict=True)
    )


def test_the_real_proc_stat_is_read_and_grows_with_work() -> None:
    """This machine's own /proc/stat: busy seconds since boot, at most every CPU's whole
    uptime, growing while this process spins."""
    cpu = HostCpu()
    try:
        first = cpu.read()
        assert first is not None and first > 0
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        assert first <= (os.cpu_count() or 1) * uptime_s * 1.01
        spun = time.process_time() + 0.2
        while time.process_time() < spun:
            pass
        second = cpu.read()
        assert second is not None and second - first >= 0.1
    finally:
        cpu.close()


def test_an_unreadable_proc_stat_is_none_not_an_error(tmp_path: Path) -> None:
    cpu = HostCpu(tmp_path / "stat")
    assert cpu.read() is None
    (tmp_path / "stat").write_text("garbage\n")
    assert cpu.read() is None
    (tmp_path / "stat").write_text(PROC_STAT)
    assert cpu.read() == pytest.approx(parse_proc_stat_busy(PROC_STAT, os.sysconf("SC_CLK_TCK")))
    cpu.close()


def test_only_a_local_hypervisors_host_is_this_machine() -> None:
    assert local_hypervisor("qemu:///system")
    assert local_hypervisor("qemu+unix:///system?socket=/run/libvirt/x")
    assert not local_hypervisor("qemu+ssh://compute-7/system")
    assert not local_hypervisor("qemu+tcp://10.0.0.7/system")
    assert not local_hypervisor("test:///default")


def test_the_libvirt_test_driver_reports_no_host_busy_time() -> None:
    """The test driver's domains run nowhere: this machine's /proc/stat is not their host's."""
    collector = LibvirtCollector("test:///default")
    try:
        reading = collector.collect()
    finally:
        collector.close()
    assert reading.ok and reading.vms and reading.host_cpu_s is None


def _cut(n: int, dest: Path, first: int, last: int, off: tuple[int, ...] = ()) -> Path:
    """Lines ``first``..``last`` (the header is line 1) of packaged trace ``n``, the lines
    ``off`` made all-zero rows (the VM not running)."""
    with gzip.open(TRACES / f"{n}.csv.gz", "rt") as f:
        lines = f.read().splitlines()
    zero = "\t0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0"
    body = [
        line.split(";")[0] + ";" + zero if first + i in off else line
        for i, line in enumerate(lines[first - 1 : last])
    ]
    dest.write_text("\n".join([lines[0], *body]) + "\n")
    return dest


def _host(t: float, busy: float | None, ok: bool = True) -> HostReading:
    return HostReading(t, ok, host_cpu_s=busy)


def test_the_hosts_busy_time_is_spread_over_intervals_and_sent_with_the_batch() -> None:
    # 1.5 busy cores from t = 50 to 170, a reading without the figure at 110, the host
    # unreadable at 130 (the next reading measures the whole stretch since 90).
    readings = [
        _host(50.0, 1000.0),
        _host(90.0, 1060.0),
        _host(110.0, None),
        _host(130.0, None, ok=False),
        _host(170.0, 1180.0),
    ]
    state, closed = AgentState(), []
    for r in readings:
        result = advance(state, r, 60)
        state, closed = result.state, closed + result.closed
    # [60, 120) closed at 130 with 60..90; the reading at 170 sends 90..120 in a second
    # batch of it, as a VM's use read late is (the daemon adds a host's batches up).
    assert [(c.start_s, c.host_cpu_s) for c in closed] == [
        (0, pytest.approx(15.0)),  # 50..60 at 1.5 cores
        (60, pytest.approx(45.0)),
        (60, pytest.approx(45.0)),
    ]
    assert state.open_host_cpu[120] == pytest.approx(75.0)  # 120..170
    doc = batch_document(closed[1], key="k", host="h", capacity=CAPACITY)
    assert doc["host_cpu_s"] == pytest.approx(45.0)
    SampleBatch.model_validate(doc)
    # Restarted from its spool, the agent carries on from the same baseline.
    again = load_state(dump_state(state))
    assert again == state
    result = advance(again, _host(180.0, 1195.0), 60)
    assert result.closed[0].host_cpu_s == pytest.approx(90.0)
    # A host rebooted meanwhile: its counter starts again from zero, never negative.
    rebooted = advance(result.state, _host(190.0, 4.0), 60)
    assert rebooted.state.open_host_cpu[180] == pytest.approx(4.0)


def test_a_state_and_batch_without_the_figure_are_as_before() -> None:
    """An agent whose collector gives no host busy time (a remote hypervisor) sends batches
    without the field; a state written before the field loads."""
    state = AgentState()
    for t in (10.0, 70.0):
        result = advance(state, _host(t, None), 60)
        state = result.state
    (closed,) = result.closed
    assert closed.host_cpu_s is None
    assert "host_cpu_s" not in batch_document(closed, key="k", host="h", capacity=CAPACITY)
    old = b'{"version": 1, "last_ok_s": 70.0, "listed": [], "baselines": {}, "open": {}}'
    assert load_state(old) == AgentState(last_ok_s=70.0)


def test_the_replayed_hosts_busy_time_is_its_vms_cpu(tmp_path: Path) -> None:
    """The simulated host runs nothing but its VMs: in every interval its busy time is their
    CPU seconds, on a host short of cores (shared CPU) and with one VM that stops and starts
    again mid-replay (its first run's counters stay in the host's)."""
    paths = [_cut(n, tmp_path / f"{n}.csv", 450, 480) for n in (41, 42)]
    paths.append(_cut(1, tmp_path / "7.csv", 2, 31, off=(12, 13, 14)))
    traces = [read_trace(p) for p in paths]
    for cores in (6.0, None):
        clock = plan_clock(traces, start_s=PAST, interval_s=60)
        collector = ReplayCollector(replay_vms(traces, "sim-1"), clock, cores=cores)
        assert (collector.cpu is not None) == (cores is not None)
        state, intervals = AgentState(), 0
        for t in tick_times(clock.start_s, clock.end_s, 45):
            clock.now_s = t
            result = advance(state, collector.collect(), 60)
            state = result.state
            for c in result.closed:
                vms_cpu_s = sum(v.usage.cpu_s for v in c.vms.values())
                assert c.host_cpu_s == pytest.approx(vms_cpu_s, rel=1e-9, abs=1e-6), c.start_s
                intervals += 1
        assert intervals > 100
