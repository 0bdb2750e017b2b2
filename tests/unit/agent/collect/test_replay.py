"""The replay collector: Bitbrains traces read exactly, integrated into libvirt-like counters,
mapped onto simulated time, and replayed through the real agent into a real daemon's ledger.

Expected figures are computed here from the CSV rows by hand (a row's rates hold until the next
row; an all-zero row means the VM is off), independently of gmd.agent.collect.replay's own parsing
and prefix sums, so a wrong integral, a lost or a doubled tick shows as a mismatch.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import logging
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from gmd.admin.demo import PACKAGED_TRACES
from gmd.agent.cli import app as agent_cli
from gmd.agent.client import DaemonClient, PostOutcome
from gmd.agent.collect.aggregate import AgentState, advance
from gmd.agent.collect.replay import (
    UUID_NAMESPACE,
    ReplayClock,
    ReplayCollector,
    ReplayError,
    deal_customers,
    plan_clock,
    replay_vms,
    vm_uuid,
)
from gmd.agent.config import AgentConfig, parse_agent
from gmd.agent.loop import AgentLoop
from gmd.agent.replay_run import replay_key, replay_run, tick_times
from gmd.agent.sender import Sender
from gmd.agent.spool import Spool
from gmd.daemon.ledger.accounting import account_due
from gmd.traces import TraceError, TraceFlavor, read_trace, trace_names, trace_paths, traces_digest
from gmd.wire import SampleBatch
from tests.conftest import DATA
from tests.support.daemon_support import make_config, serving, token_of

TRACES = PACKAGED_TRACES  # the demo's: the sample's first three days, N.csv.gz
LATE_44 = DATA / "bitbrains" / "44-lines-1262-1290.csv"
"""VM 44 on day 4 of the sample, where it is created (rows of zeros, then running): past the
demo's three days, so a cut of the week lives under tests/data (its README)."""
FIRST_ROW_S = 1372629804  # every trace of the sample starts there


def bb(n: int | str) -> Path:
    """Bitbrains trace ``n`` of the demo's packaged sample."""
    return TRACES / f"{n}.csv.gz"


def text_of(path: Path) -> str:
    """A trace file's text, gunzipped by the standard library (not gmd's reader)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return f.read()
    return path.read_text()


PAST = 1_700_000_000  # a simulated start in the past (2023), 200 s into a 300 s interval


# -- the hand computation ---------------------------------------------------------------------


def rows_of(path: Path) -> list[list[float]]:
    lines = text_of(path).splitlines()[1:]
    return [[float(f) for f in line.split(";")] for line in lines if line.strip()]


def integral(rows: list[list[float]], rate: Callable[[list[float]], float], t0: float, t1: float):
    """Σ rate × the overlap of [row, next row) with [t0, t1]; the last row holds 300 s."""
    total = 0.0
    for i, row in enumerate(rows):
        end = rows[i + 1][0] if i + 1 < len(rows) else row[0] + 300
        overlap = min(end, t1) - max(row[0], t0)
        if overlap > 0:
            total += rate(row) * overlap
    return total


def cpu_s(row: list[float]) -> float:
    return row[4] / 100 * row[1]  # usage % × cores: core-seconds per second


def disk_bytes(row: list[float]) -> float:
    return (row[7] + row[8]) * 1024


def net_bytes(row: list[float]) -> float:
    return (row[9] + row[10]) * 1024


def cut(
    src: Path, dest: Path, first: int, last: int, edit: Callable[[int, str], str] | None = None
):
    """Lines ``first``..``last`` (1-based, the header is line 1) of a real trace, behind its
    header, optionally edited: a small real trace for an edge case."""
    lines = text_of(src).splitlines()
    body = lines[first - 1 : last]
    if edit is not None:
        body = [edit(first + i, line) for i, line in enumerate(body)]
    dest.write_text("\n".join([lines[0], *body]) + "\n")
    return dest


def drive(collector: ReplayCollector, clock: ReplayClock, tick_s: float, interval_s: int):
    """The agent's own aggregation over the whole replay, in memory: per VM, the summed use
    of the closed intervals, and which VMs each reading listed."""
    state, totals, listed = AgentState(), defaultdict(lambda: [0.0, 0.0, 0.0]), []
    for t in tick_times(clock.start_s, clock.end_s, tick_s):
        clock.now_s = t
        reading = collector.collect()
        listed.append((t, reading.listed))
        result = advance(state, reading, interval_s)
        state = result.state
        for closed in result.closed:
            for vm_id, vt in closed.vms.items():
                u = vt.usage
                totals[vm_id][0] += u.cpu_s
                totals[vm_id][1] += u.disk_read_bytes + u.disk_write_bytes
                totals[vm_id][2] += u.network_rx_bytes + u.network_tx_bytes
    return totals, listed


# -- reading ----------------------------------------------------------------------------------


def test_a_real_trace_is_read_whole() -> None:
    trace = read_trace(bb(1))
    assert (trace.rows, trace.first_s, trace.name) == (876, FIRST_ROW_S, "1")
    assert trace.end_s == 1372892335 + 300  # the last row holds one typical step
    assert len(trace.runs) == 1 and trace.runs[0].start_s == FIRST_ROW_S
    # the largest provisioned memory of the three days (8218624 KB in the first rows)
    assert trace.flavor == TraceFlavor(2.0, 8388608 * 1024)


def test_a_compressed_trace_is_the_same_vm_and_replay_as_its_plain_text(tmp_path: Path) -> None:
    """``N.csv.gz`` is read as it is: the same rows, runs and counters as ``N.csv``, the same VM
    UUID (the directory's and the trace's name, not the file's suffix) and the same replay
    identity, so a replay of gzipped traces is the replay of the plain ones."""
    plain_dir = tmp_path / "2013-7"
    plain_dir.mkdir()
    for n in (1, 2):
        (plain_dir / f"{n}.csv").write_text(text_of(bb(n)))
    packed, plain = read_trace(bb(1)), read_trace(plain_dir / "1.csv")
    assert (packed.name, packed.rows, packed.flavor) == (plain.name, plain.rows, plain.flavor)
    assert packed.runs == plain.runs
    assert vm_uuid("h", bb(1)) == vm_uuid("h", plain_dir / "1.csv")
    assert traces_digest(TRACES, ["1", "2"]) == traces_digest(plain_dir, ["1", "2"])
    assert trace_names(plain_dir) == ["1", "2"] and trace_names(TRACES)[:3] == ["1", "2", "3"]
    assert len(trace_names(TRACES)) == 100


def test_a_broken_compressed_trace_is_named(tmp_path: Path) -> None:
    whole = bb(1).read_bytes()
    (tmp_path / "1.csv.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "2.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match=r"1\.csv\.gz: cannot read: the compressed file ends"):
        read_trace(tmp_path / "1.csv.gz")
    with pytest.raises(TraceError, match=r"2\.csv\.gz: cannot read: Not a gzipped file"):
        read_trace(tmp_path / "2.csv.gz")
    (tmp_path / "2.csv").write_text("")
    with pytest.raises(TraceError, match=r"both 2\.csv and 2\.csv\.gz in .*: keep one of them"):
        trace_paths(tmp_path, ["2"])


def test_counters_are_the_rows_integrated_by_hand() -> None:
    run = read_trace(bb(1)).runs[0]
    # Rows 1 and 2 (300 s apart): usage 1.5 % then 0.5 % of 2 cores; 450 s in is mid-row 2.
    t = FIRST_ROW_S + 450
    cpu_ns, rd, wr, rx, tx = run.counters_at(t)
    assert cpu_ns == (0.015 * 2 * 300 + 0.005 * 2 * 150) * 1e9 == 10_500_000_000
    assert rd == round(160.86666666666667 * 1024 * 300 + 0.0 * 1024 * 150) == 49_418_240
    assert wr == round(21.733333333333334 * 1024 * 300 + 2.3333333333333335 * 1024 * 150)
    assert rx == round(0.26666666666666666 * 1024 * 300 + 0.2 * 1024 * 150) == 112_640
    assert tx == round(1.4666666666666666 * 1024 * 300 + 1.0 * 1024 * 150) == 604_160
    assert run.rss_at(t) == round(458575.4666666667 * 1024)  # the row in effect
    # A day in, against the independent sum over 288 rows.
    rows = rows_of(bb(1))
    day = FIRST_ROW_S + 86400 + 123
    cpu_ns, rd, wr, rx, tx = run.counters_at(day)
    assert cpu_ns / 1e9 == pytest.approx(integral(rows, cpu_s, FIRST_ROW_S, day), rel=1e-12)
    # whole bytes: each counter is rounded
    assert rd + wr == pytest.approx(integral(rows, disk_bytes, FIRST_ROW_S, day), abs=1)
    assert rx + tx == pytest.approx(integral(rows, net_bytes, FIRST_ROW_S, day), abs=1)
    # Past the end the counters stop growing.
    assert run.counters_at(run.end_s) == run.counters_at(run.end_s + 10**6)


def header_and(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "9.csv"
    cut(bb(1), path, 2, 4)
    path.write_text(path.read_text() + "".join(r + "\n" for r in rows))
    return path


GOOD = "1372630704;\t2;\t5851.9989;\t23.4;\t0.4;\t8218624.0;\t78292.2;\t0.0;\t0.8;\t0.06;\t1.0"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1372630704;\t2;\t5851.9989", "3 columns, expected 11 separated by ';'"),
        (GOOD.replace("0.4;", "abc;"), "CPU usage [%] is not a number: 'abc'"),
        (GOOD.replace("78292.2", "nan"), "memory usage [KB] is nan, not a finite number"),
        (GOOD.replace("\t0.8;", "\t-0.8;"), "disk write [KB/s] is negative: -0.8"),
        (
            GOOD.replace("1372630704", "1372630000"),
            "timestamp 1372630000 is not after line 4's 1372630404 (rows must be in time order)",
        ),
        (GOOD.replace("1372630704", "1372630404"), "timestamp 1372630404 is not after line 4's"),
    ],
)
def test_bad_rows_stop_the_replay_naming_file_and_line(
    tmp_path: Path, row: str, message: str
) -> None:
    path = header_and(tmp_path, row)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}:5: ")
    assert message in str(err.value)


def test_a_vm_without_rows_never_runs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        empty = read_trace(bb(14))
    assert (empty.rows, empty.runs, empty.first_s, empty.flavor) == (0, (), None, TraceFlavor())
    assert "14.csv.gz: no rows: the VM never runs in this replay" in caplog.text
    traces = [read_trace(bb(1)), empty]
    clock = plan_clock(traces, start_s=PAST, interval_s=300, end_s=PAST + 3600)
    collector = ReplayCollector(replay_vms(traces, "sim-1"), clock)
    clock.now_s = PAST + 600
    assert collector.collect().listed == {vm_uuid("sim-1", bb(1))}
    assert collector.resources().cpu_cores == 2  # the empty VM provisions nothing
    with pytest.raises(ReplayError, match="none of the traces has a row"):
        plan_clock([empty], start_s=PAST, interval_s=300)
    with pytest.raises(ReplayError, match="replay_host_cores"):
        ReplayCollector(replay_vms([empty, read_trace(bb(38))], "h"), clock)


def test_zero_rows_are_a_vm_not_running_and_nothing_is_lost_around_them(tmp_path: Path) -> None:
    # VM 44 is created on day 4 (rows of zeros before); VM 7 here is VM 1 stopped for 3 rows.
    late = read_trace(Path(shutil.copy(LATE_44, tmp_path / "44.csv")))
    zero = "\t0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0;\t0.0"
    stopped = cut(
        bb(1),
        tmp_path / "7.csv",
        2,
        31,
        lambda n, line: line.split(";")[0] + ";" + zero if n in (12, 13, 14) else line,
    )
    pause = read_trace(stopped)
    assert [len(r.times) for r in pause.runs] == [10, 17]
    assert [r.run_id for r in pause.runs] == [1, 2]
    for trace in (late, pause):
        clock = plan_clock([trace], start_s=PAST, interval_s=60)
        collector = ReplayCollector(replay_vms([trace], "sim-1"), clock)
        vm_id = collector.vms[0].uuid
        totals, listed = drive(collector, clock, tick_s=45, interval_s=60)
        runs = [(clock.to_sim(r.start_s), clock.to_sim(r.end_s)) for r in trace.runs]
        for t, names in listed:
            running = any(a <= t < b for a, b in runs)
            just_stopped = any(b <= t < b + 45 for _a, b in runs)  # its final counters, once
            assert (vm_id in names) == (running or just_stopped), t
        t0, t1 = clock.to_trace(clock.start_s), clock.to_trace(clock.end_s)
        rows = rows_of(trace.path)
        want = [integral(rows, f, t0, t1) for f in (cpu_s, disk_bytes, net_bytes)]
        assert want[0] > 0
        assert totals[vm_id] == pytest.approx(want, rel=1e-9, abs=2)  # whole bytes
    assert clock.to_sim(late.runs[0].start_s) > clock.start_s  # it did appear mid-replay


def given_by_hand(paths: list[Path], cores: float, t0: float, t1: float) -> list[float]:
    """Per trace, the core-seconds a host of ``cores`` gives it in [t0, t1]: at each instant
    its rate, times min(1, cores ÷ what all the traces ask then); the last row holds 300 s."""
    steps = []
    for path in paths:
        rows = rows_of(path)
        held = [(row, nxt[0]) for row, nxt in itertools.pairwise(rows)]
        steps.append([*held, (rows[-1], rows[-1][0] + 300)])
    edges = {t0, t1} | {t for held in steps for row, end in held for t in (row[0], end)}
    given = [0.0] * len(paths)
    for a, b in itertools.pairwise(sorted(t for t in edges if t0 <= t <= t1)):
        rates = []
        for held in steps:
            now = [row for row, end in held if row[0] <= a < end]
            rates.append(cpu_s(now[0]) if now else 0.0)
        share = min(1.0, cores / sum(rates)) if sum(rates) else 1.0
        for j, rate in enumerate(rates):
            given[j] += rate * share * (b - a)
    return given


def test_a_host_short_of_cores_shares_them_in_proportion_to_what_each_vm_asks(
    tmp_path: Path,
) -> None:
    """Two of initech's batch VMs (8 cores each, often busy) replayed on a host of 6 cores:
    where they ask more together, each gets the same fraction of what its trace asks, so no
    interval holds more than the host's cores; with enough cores the traces are replayed as
    they are."""
    paths = [cut(bb(n), tmp_path / f"{n}.csv", 450, 520) for n in (41, 42)]
    traces = [read_trace(p) for p in paths]
    for cores, short in ((6.0, True), (20.0, False)):
        clock = plan_clock(traces, start_s=PAST, interval_s=60)
        collector = ReplayCollector(replay_vms(traces, "sim-1"), clock, cores=cores)
        assert (collector.cpu is not None) == short
        totals, _ = drive(collector, clock, tick_s=45, interval_s=60)
        t0, t1 = clock.to_trace(clock.start_s), clock.to_trace(clock.end_s)
        asked = [integral(rows_of(p), cpu_s, t0, t1) for p in paths]
        want = given_by_hand(paths, cores, t0, t1)
        got = [totals[vm.uuid][0] for vm in collector.vms]
        assert got == pytest.approx(want, rel=1e-9)
        assert (sum(want) < 0.9 * sum(asked)) == short and sum(got) <= cores * (t1 - t0)
        # the disk and network counters are the traces' own either way
        assert totals[collector.vms[0].uuid][1] == pytest.approx(
            integral(rows_of(paths[0]), disk_bytes, t0, t1), abs=2
        )
    assert collector.cpu is None
    # Counters are a function of trace time alone (a resumed replay reads the same) and
    # never go down, within a run and across the whole of it.
    shared = ReplayCollector(replay_vms(traces, "sim-1"), clock, cores=6.0).cpu
    assert shared is not None and shared.saturated_s() > 0
    run = traces[0].runs[0]
    key = (vm_uuid("sim-1", paths[0]), run.run_id)
    readings = [shared.cpu_ns(key, run.start_s + 37 * k) for k in range(600)]
    assert readings == sorted(readings) and readings[0] == 0
    assert readings == [shared.cpu_ns(key, run.start_s + 37 * k) for k in range(600)]
    assert shared.cpu_ns(key, run.end_s + 10**6) == readings[-1]


def test_uuids_and_customers_are_stable() -> None:
    path = bb(1)
    assert uuid.UUID(vm_uuid("sim-1", path)).version == 5
    assert vm_uuid("sim-1", path) == str(uuid.uuid5(UUID_NAMESPACE, "sim-1/2013-7/1.csv"))
    assert len({vm_uuid("sim-1", path), vm_uuid("sim-2", path), vm_uuid("sim-1", bb(2))}) == 3
    assert deal_customers(["1", "2", "3"], ["a", "b"]) == {"1": "a", "2": "b", "3": "a"}
    assert deal_customers(["1"], None, "lab") == {"1": "lab"}
    assert deal_customers(["1"], {"1": "x", "9": "y"}) == {"1": "x"}
    with pytest.raises(ReplayError, match="no customer for trace '2'"):
        deal_customers(["1", "2"], {"1": "x"})


# -- time -------------------------------------------------------------------------------------


def test_the_clock_maps_simulated_onto_trace_time() -> None:
    traces = [read_trace(bb(1))]
    clock = plan_clock(traces, start_s=PAST, interval_s=300, end_s=PAST + 7200, offset_s=600)
    assert clock.start_s == PAST - 200 and clock.now_s == clock.start_s  # aligned down
    assert clock.trace_start_s == FIRST_ROW_S + 600  # the start is 600 s into the trace
    assert clock.end_s == PAST - 200 + 7200  # aligned down too
    assert clock.to_trace(clock.start_s + 42) == FIRST_ROW_S + 642
    assert clock.to_sim(clock.to_trace(123456.5)) == 123456.5
    clock.now_s = clock.start_s + 1800
    assert clock() == clock.now_s and clock.fraction == 0.25
    # Never past the present, nor past the traces' end.
    now = PAST + 1100
    assert plan_clock(traces, start_s=PAST, interval_s=300, now_s=now).end_s == PAST + 1000
    week = plan_clock(traces, start_s=PAST, interval_s=300)
    assert week.end_s == (PAST - 200 + (traces[0].end_s - FIRST_ROW_S)) // 300 * 300
    with pytest.raises(ReplayError, match="shorter than one interval"):
        plan_clock(traces, start_s=PAST, interval_s=300, end_s=PAST + 50)


class Recorder:
    """A stand-in agent: records the simulated times it is ticked at."""

    def __init__(self, tick_s: float) -> None:
        self.config = AgentConfig(
            path=None, host="h", spool_path=Path("/nonexistent"), tick_s=tick_s, interval_s=60
        )
        self.state = AgentState()
        self.sender = None
        self.times: list[float] = []
        self.spool = self
        self.collector = None

    def tick(self, now_s: float):
        self.times.append(now_s)
        return type("Report", (), {"batches": 1})()

    def size(self) -> tuple[int, int]:
        return (0, 0)


def test_replay_run_steps_simulated_time_and_paces_it_at_the_speed() -> None:
    clock = ReplayClock(start_s=6000, end_s=6000 + 3600, trace_start_s=FIRST_ROW_S, speed=600)
    agents = [Recorder(tick_s=40), Recorder(tick_s=40)]
    wall = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        wall[0] += s

    report = replay_run(agents, clock, wall=lambda: wall[0], sleep=sleep)  # type: ignore[arg-type]
    want = [6000 + 40 * k for k in range(90)] + [9600]
    assert agents[0].times == agents[1].times == want  # lock step, ending exactly at the end
    assert sum(slept) == pytest.approx(3600 / 600)  # an hour at 600×: six seconds
    assert (report.ticks, report.batches, report.reached_s, report.stopped) == (
        91,
        182,
        9600,
        False,
    )
    # Without a speed, nothing sleeps.
    fast = [Recorder(tick_s=40)]
    clock = ReplayClock(start_s=6000, end_s=6000 + 3600, trace_start_s=FIRST_ROW_S)
    replay_run(fast, clock, sleep=lambda s: pytest.fail("slept"))  # type: ignore[arg-type]
    assert fast[0].times == want
    # A stop (SIGTERM in gmd-agent) ends the run between ticks.
    stop = threading.Event()
    clock = ReplayClock(start_s=6000, end_s=6000 + 3600, trace_start_s=FIRST_ROW_S)
    halted = Recorder(tick_s=40)
    report = replay_run(  # type: ignore[arg-type]
        [halted], clock, stop=stop, on_tick=lambda c: stop.set() if c.now_s >= 6080 else None
    )
    assert (halted.times, report.stopped, report.reached_s) == ([6000, 6040, 6080], True, 6080)


def test_a_live_replay_keeps_to_the_wall_clock_and_catches_up_after_a_stop() -> None:
    """Issue 44's soak replays known usage as it happens. A replay at speed 1 from the present
    to a future end is live: its end is not cut at the present, and each tick waits for its
    instant on the wall clock, so one resumed after a stop catches up at once and then keeps
    to the present. Before, the end was cut at the present (nothing to replay), and a resumed
    replay ran as far behind the present as it had been stopped, its batches all late."""
    traces = [read_trace(bb(1))]
    now = PAST + 1000
    live = plan_clock(traces, start_s=now - 50, interval_s=60, end_s=now + 600, speed=1, now_s=now)
    assert live.live and live.end_s > now  # its end is not cut at the present
    replayed = plan_clock(traces, start_s=now - 50, interval_s=60, end_s=now + 600, now_s=now)
    assert not replayed.live and replayed.end_s <= now  # as fast as possible: not past the present

    clock = ReplayClock(start_s=6000, end_s=6200, trace_start_s=FIRST_ROW_S, speed=1, live=True)
    present = [6000.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        present[0] += s

    agent = Recorder(tick_s=40)
    replay_run([agent], clock, present=lambda: present[0], sleep=sleep)  # type: ignore[list-item]
    assert agent.times == [6000, 6040, 6080, 6120, 6160, 6200]
    assert slept == [40.0] * 5  # each tick at its instant
    # Resumed 100 s late (the agent was down): the missed ticks at once, then the present's pace.
    agent.state = dataclasses.replace(agent.state, last_ok_s=6040)
    clock = ReplayClock(start_s=6000, end_s=6200, trace_start_s=FIRST_ROW_S, speed=1, live=True)
    present[0], slept[:] = 6140.0, []
    agent.times = []
    replay_run([agent], clock, present=lambda: present[0], sleep=sleep, resume=True)  # type: ignore[list-item]
    assert agent.times == [6080, 6120, 6160, 6200]
    assert slept == [20.0, 40.0]  # 6080 and 6120 at once; 6160 at 6160, not at 6140 + 80


# -- end to end -------------------------------------------------------------------------------

HOST = "sim-1"
INTERVAL_S = 300
CUSTOMERS = ["acme", "globex"]
VMS = ["1", "24", "39"]  # acme: 1 and 39 (2 cores each), globex: 24 (32 cores)


def agent_config(tmp_path: Path, url: str, **extra: object) -> AgentConfig:
    table = {
        "daemon_url": url,
        "token": token_of(HOST),
        "host": HOST,
        "tick_s": 150,
        "interval_s": INTERVAL_S,
        "spool_path": str(tmp_path / "spool.db"),
        "network_bytes_per_s": 1.25e9,
        "metrics_port": 0,
        **extra,
    }
    return parse_agent({"agent": table}, "agent-test.toml")


def aligned_start(intervals_ago: int) -> int:
    return (int(time.time()) // INTERVAL_S - intervals_ago) * INTERVAL_S


def test_a_replayed_host_is_accounted_as_the_trace_says(tmp_path: Path) -> None:
    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {HOST: "operator"},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0},
    )
    traces = [read_trace(bb(n)) for n in VMS]
    start = aligned_start(30)
    end = start + 2 * 3600  # two simulated hours: 24 intervals, 49 ticks
    clock = plan_clock(traces, start_s=start, interval_s=INTERVAL_S, end_s=end)
    collector = ReplayCollector(replay_vms(traces, HOST, CUSTOMERS), clock)
    with serving(config) as d:
        agent_cfg = agent_config(tmp_path, d.url)
        spool = Spool(agent_cfg.spool_path, max_bytes=2**30, max_batches=10**6)
        agent = AgentLoop(
            agent_cfg, collector, spool, Sender(spool, DaemonClient(d.url, agent_cfg.token))
        )
        report = replay_run(agent, clock)
        assert (report.batches, report.waiting, report.reached_s) == (24, 0, end)
        account_due(d.engine, config.accounting)
        with d.engine.connect() as conn:
            use = conn.execute(
                sa.text(
                    "SELECT c.name, sum(s.cpu_s), sum(s.disk_read_bytes + s.disk_write_bytes),"
                    " sum(s.network_rx_bytes + s.network_tx_bytes), count(DISTINCT i.id),"
                    " sum(CASE WHEN s.late THEN 1 ELSE 0 END)"
                    " FROM samples s JOIN customers c ON c.id = s.customer_id"
                    " JOIN intervals i ON i.id = s.interval_id AND i.state = 'accounted'"
                    " GROUP BY c.name"
                )
            ).all()
            ledger = conn.execute(
                sa.text(
                    "SELECT c.name, count(*), min(l.vms), max(l.vms) FROM customer_ledger l"
                    " JOIN customers c ON c.id = l.customer_id GROUP BY c.name"
                )
            ).all()
        again = replay_run(agent, clock, resume=True)  # the same replay, resumed once done
        assert (again.finished_before, again.ticks, again.batches, again.waiting) == (
            True,
            0,
            0,
            0,
        )
        with pytest.raises(ReplayError, match="holds the state of an earlier run"):
            replay_run(agent, clock)  # a caller that checked no plan: it could count twice
        with d.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one() == 24
        spool.close()

    t0, t1 = clock.to_trace(start), clock.to_trace(end)
    want: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for i, n in enumerate(VMS):
        rows = rows_of(bb(n))
        for k, f in enumerate((cpu_s, disk_bytes, net_bytes)):
            want[CUSTOMERS[i % 2]][k] += integral(rows, f, t0, t1)
    got = {name: (cpu, disk, net, intervals, late) for name, cpu, disk, net, intervals, late in use}
    assert set(got) == set(CUSTOMERS)
    for name in CUSTOMERS:
        assert got[name][3:] == (24, 0)  # every simulated interval accounted, nothing late
        assert list(got[name][:3]) == pytest.approx(want[name], rel=1e-9, abs=4)  # whole bytes
    assert want["globex"][0] > 10 * want["acme"][0] > 0  # the 32-core VM dominates
    assert sorted(ledger) == [("acme", 24, 2, 2), ("globex", 24, 1, 1)]


class Crash(Exception):
    """What SIGKILL would do to the agent at that point: nothing after it runs."""


class FlakyClient(DaemonClient):
    """A real client to the test daemon that can be made to fail: ``"down"`` (the daemon
    cannot be reached: batches stay in the spool) or ``"dies"`` (the daemon stores the next
    batch and the agent dies before it hears so, the batch still in its spool)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, token_of(HOST))
        self.mode = "up"
        self.outcomes: list[str] = []

    def post_batch(self, body: bytes) -> PostOutcome:
        if self.mode == "down":
            return PostOutcome("unavailable", None, "ConnectError: the test daemon is down")
        outcome = super().post_batch(body)
        self.outcomes.append(outcome.detail)
        if self.mode == "dies":
            raise Crash
        return outcome


def ledger_of(engine: sa.Engine) -> tuple[list[Any], list[Any], list[Any]]:
    """What a daemon holds: per interval and VM, the summed use and how many batches carried
    it; per interval, its batches; and every batch's key and content digest."""
    with engine.connect() as conn:
        use = conn.execute(
            sa.text(
                "SELECT i.start_s, v.uuid, count(*), sum(s.cpu_s), sum(s.memory_byte_s),"
                " sum(s.disk_read_bytes), sum(s.disk_write_bytes), sum(s.network_rx_bytes),"
                " sum(s.network_tx_bytes) FROM samples s JOIN intervals i ON i.id = s.interval_id"
                " JOIN vms v ON v.id = s.vm_id GROUP BY i.start_s, v.uuid"
                " ORDER BY i.start_s, v.uuid"
            )
        ).all()
        per_interval = conn.execute(
            sa.text(
                "SELECT i.start_s, count(*) FROM batches b JOIN intervals i ON i.id = b.interval_id"
                " GROUP BY i.start_s ORDER BY i.start_s"
            )
        ).all()
        keys = conn.execute(sa.text("SELECT key, digest FROM batches ORDER BY key")).all()
    return [tuple(r) for r in use], [tuple(r) for r in per_interval], [tuple(r) for r in keys]


def test_an_interrupted_replay_resumes_and_delivers_what_an_uninterrupted_one_does(
    tmp_path: Path,
) -> None:
    """One replay run straight through into one daemon, and the same replay into another
    daemon stopped part-way (the stop event), started again, crashed (batches spooled while
    the daemon was down, one stored by the daemon but not acknowledged, no final send) just
    before a VM stops, and resumed from its reopened spool: both ledgers hold the same use
    per VM and interval, from the same batches under the same keys — no interval missing,
    none doubled. A spool lost afterwards replays into nothing but duplicates."""
    (tmp_path / "traces").mkdir()
    off = "\t0;" * 9 + "\t0"  # every column but the timestamp zero: the VM is not running
    stops = cut(  # VM 1 with lines 12-14 off: it stops ~3000 s in, then runs again
        bb(1),
        tmp_path / "traces" / "7.csv",
        2,
        40,
        lambda n, line: line.split(";")[0] + ";" + off if n in (12, 13, 14) else line,
    )
    traces = [read_trace(bb(24)), read_trace(bb(39)), read_trace(stops)]
    paused = traces[2]
    assert [r.run_id for r in paused.runs] == [1, 2]
    start = aligned_start(30)
    plan = plan_clock(traces, start_s=start, interval_s=INTERVAL_S, end_s=start + 2 * 3600)
    tick_s = 150
    ticks = list(tick_times(plan.start_s, plan.end_s, tick_s))
    # The last tick at which the paused VM still runs: the crash comes right after it, so the
    # resumed agent must report the VM's final counters once more at the next tick.
    last_running = max(k for k, t in enumerate(ticks) if plan.to_trace(t) < paused.runs[0].end_s)
    assert 12 < last_running < len(ticks) - 10

    def clock() -> ReplayClock:
        return ReplayClock(plan.start_s, plan.end_s, plan.trace_start_s)

    def agent_on(directory: Path, client: DaemonClient, c: ReplayClock) -> AgentLoop:
        cfg = agent_config(directory, client.base_url)
        spool = Spool(cfg.spool_path, max_bytes=2**30, max_batches=10**6)
        collector = ReplayCollector(replay_vms(traces, HOST, CUSTOMERS), c)
        return AgentLoop(cfg, collector, spool, Sender(spool, client), key=replay_key("t", c))

    def daemon(name: str) -> Any:
        ledger = f"sqlite:///{tmp_path / name}.db"
        return serving(
            make_config(ledger, {HOST: "operator"}, accounting={"interval_s": INTERVAL_S})
        )

    with daemon("straight") as straight, daemon("interrupted") as interrupted:
        c = clock()
        agent = agent_on(tmp_path / "straight", DaemonClient(straight.url, token_of(HOST)), c)
        whole = replay_run(agent, c)
        agent.spool.close()
        assert (whole.ticks, whole.batches, whole.waiting, whole.resumed_s) == (49, 24, 0, None)

        # 1. Stopped (SIGTERM) after 7 ticks: the final send delivers everything made so far.
        stop = threading.Event()
        c = clock()
        client = FlakyClient(interrupted.url)
        agent = agent_on(tmp_path / "interrupted", client, c)
        done = [0]

        def count_to(k: int) -> Callable[[ReplayClock], None]:
            def on_tick(_c: ReplayClock) -> None:
                done[0] += 1
                if done[0] == k:
                    stop.set()

            return on_tick

        first = replay_run(agent, c, stop=stop, on_tick=count_to(7))
        assert (first.stopped, first.ticks, first.reached_s, first.waiting) == (
            True,
            7,
            ticks[6],
            0,
        )
        agent.spool.close()

        # 2. Resumed, then killed: the daemon down for a while, and at tick `last_running`
        # the daemon stores the oldest spooled batch but the agent dies before the answer.
        c = clock()
        client = FlakyClient(interrupted.url)
        agent = agent_on(tmp_path / "interrupted", client, c)

        def misfortune(now: ReplayClock) -> None:
            k = ticks.index(now.now_s)
            if k == last_running - 6:
                client.mode = "down"
            elif k == last_running - 1:
                client.mode = "dies"

        with pytest.raises(Crash):
            replay_run(agent, c, on_tick=misfortune, resume=True)
        assert agent.state.last_ok_s == ticks[last_running]
        agent.spool.close()  # the process is gone: nothing else runs, the lock is released
        del agent

        # 3. Started again from the reopened spool: it goes on from the last committed tick.
        c = clock()
        client = FlakyClient(interrupted.url)
        agent = agent_on(tmp_path / "interrupted", client, c)
        assert agent.spool.size()[0] >= 3  # made while the daemon was down, never sent
        rest = replay_run(agent, c, resume=True)
        assert (rest.resumed_s, rest.stopped, rest.waiting) == (ticks[last_running], False, 0)
        assert rest.ticks == len(ticks) - 1 - last_running
        assert client.outcomes[0] == "duplicate"  # the batch the daemon had before the crash
        agent.spool.close()

        want, got = ledger_of(straight.engine), ledger_of(interrupted.engine)
        use, per_interval, _keys = got
        assert [s for s, _n in per_interval] == [plan.start_s + k * INTERVAL_S for k in range(24)]
        assert all(n == 1 for _s, n in per_interval)  # one batch per interval: none doubled
        assert all(row[2] == 1 for row in use)
        assert got == want  # the same use per VM and interval, the same keys and contents
        paused_uuid = vm_uuid(HOST, stops)
        crash_interval = int(ticks[last_running] // INTERVAL_S * INTERVAL_S)
        assert any(r[0] == crash_interval and r[1] == paused_uuid and r[3] > 0 for r in use)

        # 4. The spool lost with everything delivered: the replay made again from scratch is
        # the same batches under the same keys, which the daemon does not count twice.
        for leftover in (tmp_path / "interrupted").glob("spool.db*"):
            leftover.unlink()
        c = clock()
        client = FlakyClient(interrupted.url)
        agent = agent_on(tmp_path / "interrupted", client, c)
        again = replay_run(agent, c)
        agent.spool.close()
        assert (again.batches, again.waiting) == (24, 0)
        assert client.outcomes == ["duplicate"] * 24
        assert ledger_of(interrupted.engine) == want


def write_replay_config(tmp_path: Path, url: str, start: int, hours: float) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "gmd.toml"
    path.write_text(
        "[agent]\n"
        f'daemon_url = "{url}"\ntoken = "{token_of(HOST)}"\nhost = "{HOST}"\n'
        f'tick_s = 300\ninterval_s = {INTERVAL_S}\nspool_path = "spool.db"\nmetrics_port = 0\n'
        'network_bytes_per_s = 1250000000\ncollector = "replay"\n'
        f'replay_dir = "{TRACES}"\nreplay_vms = "1-2"\nreplay_customers = ["acme", "globex"]\n'
        f"replay_start = {start}\nreplay_end = {start + int(hours * 3600)}\n"
    )
    return path


def test_gmd_agent_replays_and_exits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {HOST: "operator"},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0},
    )
    start = aligned_start(20)
    runner = CliRunner()
    with serving(config) as d:
        toml = write_replay_config(tmp_path, d.url, start, hours=1)
        dry = runner.invoke(agent_cli, ["--config", str(toml), "--dry-run"])
        assert dry.exit_code == 0, dry.output
        batch = SampleBatch.model_validate(json.loads(dry.stdout[dry.stdout.index("{") :]))
        assert (batch.interval_start_s, batch.capacity.cpu_cores) == (start, 2 + 1)
        assert sorted(v["customer"] for v in batch.vms) == CUSTOMERS
        assert not (tmp_path / "spool.db").exists()  # nothing written

        done = runner.invoke(agent_cli, ["--config", str(toml)])
        assert done.exit_code == 0, done.output
        caplog.clear()
        caplog.set_level(logging.INFO)
        again = runner.invoke(agent_cli, ["--config", str(toml)])  # resumes a finished replay
        assert again.exit_code == 0, again.output
        assert "resuming the replay of" in caplog.text
        assert (
            "the replay had already finished" in caplog.text and "after 0 ticks" not in caplog.text
        )
        other = toml.read_text().replace('replay_vms = "1-2"', 'replay_vms = "1-3"')
        toml.write_text(other)
        refused = runner.invoke(agent_cli, ["--config", str(toml)])
        assert (
            refused.exit_code == 1 and "holds another replay (it differs in vms" in refused.output
        )
        down = write_replay_config(tmp_path / "down", "http://127.0.0.1:9", start, hours=1)
        lost = runner.invoke(agent_cli, ["--config", str(down)])
        assert lost.exit_code == 1 and "12 batches of the replay could not be" in lost.output
        with d.engine.connect() as conn:
            intervals = conn.execute(
                sa.text(
                    "SELECT i.start_s, sum(s.cpu_s) FROM samples s JOIN intervals i"
                    " ON i.id = s.interval_id GROUP BY i.start_s ORDER BY i.start_s"
                )
            ).all()
    assert [s for s, _ in intervals] == [start + k * INTERVAL_S for k in range(12)]
    rows = rows_of(bb(1)), rows_of(bb(2))
    first = sum(integral(r, cpu_s, FIRST_ROW_S, FIRST_ROW_S + INTERVAL_S) for r in rows)
    assert sum(v["cpu_s"] for v in batch.vms) == pytest.approx(first, rel=1e-9)
    assert intervals[0][1] == pytest.approx(first, rel=1e-9)


def test_a_replaying_agent_killed_mid_replay_resumes_without_counting_twice(
    tmp_path: Path,
) -> None:
    """gmd-agent replaying two simulated hours, SIGKILLed part-way and started again: it
    resumes from its spool, and the ledger holds every simulated interval exactly once, each
    with the traces' CPU integral over it."""
    import signal
    import subprocess
    import sys

    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {HOST: "operator"},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0},
    )
    start = aligned_start(40)
    agent_bin = Path(sys.executable).with_name("gmd-agent")
    with serving(config) as d:
        toml = write_replay_config(tmp_path, d.url, start, hours=2)
        toml.write_text(toml.read_text() + "replay_speed = 1200\n")  # 2 h in ~6 s

        def stored() -> int:
            with d.engine.connect() as conn:
                return int(conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one())

        log = (tmp_path / "agent.log").open("ab")
        first = subprocess.Popen([str(agent_bin), "--config", str(toml)], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while stored() < 6:
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = stored()
        second = subprocess.run(
            [str(agent_bin), "--config", str(toml)], stdout=log, stderr=log, timeout=120
        )
        log.close()
        text = (tmp_path / "agent.log").read_text()
        assert second.returncode == 0, text
        assert "resuming the replay of" in text
        with d.engine.connect() as conn:
            intervals = conn.execute(
                sa.text(
                    "SELECT i.start_s, count(DISTINCT s.batch_id), sum(s.cpu_s) FROM samples s"
                    " JOIN intervals i ON i.id = s.interval_id GROUP BY i.start_s"
                    " ORDER BY i.start_s"
                )
            ).all()
            batches = stored()
            keys = conn.execute(sa.text("SELECT key FROM batches")).scalars().all()
    assert killed_at < 24
    assert all(k.startswith(f"{HOST}/") and "/replay-" in k for k in keys)  # deterministic
    assert [s for s, _n, _c in intervals] == [start + k * INTERVAL_S for k in range(24)]
    assert batches == 24 and all(n == 1 for _s, n, _c in intervals)
    rows = rows_of(bb(1)), rows_of(bb(2))
    for k, (_s, _n, cpu) in enumerate(intervals):
        t0 = FIRST_ROW_S + k * INTERVAL_S
        want = sum(integral(r, cpu_s, t0, t0 + INTERVAL_S) for r in rows)
        assert cpu == pytest.approx(want, rel=1e-9, abs=1e-6), k
