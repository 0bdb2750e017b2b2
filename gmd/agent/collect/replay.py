"""The replay collector: recorded per-VM traces played back as if libvirt read them.

For what-if analysis and the demo, a host is simulated by replaying real VM traces in the
Bitbrains format (GWA-T-12, ``N.csv`` or ``N.csv.gz``: one row per VM every ~300 s). The
collector hands the agent the same raw cumulative counters libvirt would (CPU time, disk and
network bytes, resident memory), so everything after it — deltas and resets
(:mod:`gmd.agent.collect.counters`), intervals (:mod:`gmd.agent.collect.aggregate`), spool,
sender, the daemon's accounting — runs unchanged and is exercised by real workloads.

**Three clocks.** *Wall* time is what the machine says; *simulated* time is what the agent
stamps its readings with and what the daemon sees; *trace* time is the CSV's timestamps. A
:class:`ReplayClock` maps simulated onto trace time by a constant offset (one simulated second
is one trace second, so a VM's use per second is the trace's), and :func:`replay_run` moves
simulated time forward ``speed`` times faster than wall time, or as fast as the agent can go.
Simulated time starts at a past instant and never passes the present: the daemon refuses
intervals in the future but takes past ones, so a week of trace is replayed as the week that
just ended. The daemon's own accountant must not run meanwhile — it closes every interval up
to the *real* present, and the replayed batches would all arrive late: run the daemon with
``--no-accounting`` and account afterwards, or, with every host replayed in one process in
lock step, account as simulated time passes (``account_due(…, now_s=clock.now_s)`` from
:func:`replay_run`'s ``on_tick``).

**What a row means.** Each row's rates hold from its timestamp until the next row's (the last
row for the file's typical step), so CPU seconds over a span are Σ usage% / 100 × cores × the
overlap of each row with the span, and bytes Σ KB/s × 1024 × overlap. An all-zero row (the
trace's "no VM here": cores and provisioned memory are zero too) means the VM was not running;
each stretch of running rows is one *run*, a process whose counters start from zero, as a
restarted domain's do. When a run ends between two readings, the VM is reported once more with
its final counters, so nothing it used is lost (libvirt cannot do that for a VM that stops).

**A host gives no more than its cores.** The traced VMs ran on other machines; dealt onto a
simulated host with fewer cores, their traces can together ask for more CPU than it has,
which no real host gives (and the daemon refuses as implausible). Where they do, each VM gets
the same fraction of what its trace asks (:class:`HostCpu`), so the host is saturated, not
over-full. A host whose traces never ask more than its cores replays them exactly.

**Bad data stops the replay** with the file and line (:class:`TraceError`): a skipped row would
silently change every integral after it, and the purpose of a replay is exact figures.

**Resuming.** A replay is deterministic: the same traces on the same clock give the same
readings at the same simulated instants. Its plan (what it replays, and its clock) is kept beside
the spool (:func:`save_plan`), whose state holds the counters of the last tick and its simulated
time (``last_ok_s``). An agent killed mid-replay and started again with the same replay takes
the recorded clock (:func:`load_plan`) and ticks on from that instant (:func:`replay_run` with
``resume``): the next reading is measured from the saved counters, the intervals closed before
are not made again, the open ones go on, and the batches still spooled are sent under the keys
they were made with. Those keys are themselves deterministic (:func:`replay_key`: host,
interval, the replay, and the tick that closed it), so a batch made twice — a spool lost while
its batches were already delivered — is a duplicate the daemon acknowledges without counting.
Another replay on the same spool is refused.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gmd.agent.collect.aggregate import AgentState, advance, batch_document
from gmd.agent.collect.base import (
    UNKNOWN_CUSTOMER,
    Flavor,
    HostReading,
    HostResources,
    Ownership,
    VmReading,
)
from gmd.agent.collect.capacity import Bandwidth
from gmd.common.timespec import iso

if TYPE_CHECKING:
    from gmd.agent.config import AgentConfig
    from gmd.agent.loop import Agent

log = logging.getLogger(__name__)

COLUMNS = (
    "timestamp",
    "CPU cores",
    "CPU capacity provisioned [MHz]",
    "CPU usage [MHz]",
    "CPU usage [%]",
    "memory provisioned [KB]",
    "memory usage [KB]",
    "disk read [KB/s]",
    "disk write [KB/s]",
    "network received [KB/s]",
    "network transmitted [KB/s]",
)
KIB = 1024
DEFAULT_STEP_S = 300.0
"""How long a trace's only row holds (Bitbrains samples every 300 s)."""
DEFAULT_HISTORY_S = 7 * 86400
"""Without ``replay_start``, the replay covers the week before now (a Bitbrains trace's length)."""
UUID_NAMESPACE = uuidlib.UUID("6f1c2a47-2f0e-4c55-9a43-0b6a5d3e7a10")
"""Fixed, so a replayed VM keeps its UUID across runs and machines."""
DISK, NIC = "vda", "eth0"
TRACE_SUFFIXES = (".csv", ".csv.gz")
"""A trace file is ``N.csv``, or ``N.csv.gz`` read as it is (gzip): an operator can point
``replay_dir`` at compressed traces, and the demo's packaged traces are compressed."""


class ReplayError(RuntimeError):
    """A replay cannot run as asked; the message says why and where."""


class TraceError(ReplayError):
    """A trace file cannot be used; the message names the file and line."""


# -- reading a trace --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """A trace file's data rows, checked: ``values[i]`` holds the columns of :data:`COLUMNS`
    of the row on line ``lines[i]``."""

    path: Path
    values: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.values)


def _first_bad_line(path: Path, numbered: list[tuple[int, str]]) -> TraceError:
    """Where the bulk parse failed: the first line with the wrong number of columns or a
    field that is not a number (the slow, precise look behind the fast parse)."""
    for line, text in numbered:
        fields = [f.strip() for f in text.split(";")]
        if len(fields) != len(COLUMNS):
            return TraceError(
                f"{path}:{line}: {len(fields)} columns, expected {len(COLUMNS)} separated by ';'"
            )
        for column, field_ in enumerate(fields):
            try:
                float(field_)
            except ValueError:
                return TraceError(f"{path}:{line}: {COLUMNS[column]} is not a number: {field_!r}")
    return TraceError(f"{path}: cannot read the rows")


def _read_bytes(path: Path) -> bytes:
    """A trace file's bytes, decompressed when its name ends in ``.gz``; :class:`TraceError`
    naming the file when it cannot be read (a truncated or corrupt gzip file included)."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except EOFError:
        raise TraceError(f"{path}: cannot read: the compressed file ends early") from None


def _read_text(path: Path) -> str:
    try:
        return _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: cannot read: not UTF-8 text ({exc.reason})") from None


def parse_rows(path: Path) -> Rows:
    """The data rows of a Bitbrains CSV (``;`` + tab separated, one header line).

    Raises :class:`TraceError` naming the file and line for a wrong number of columns, a value
    that is not a finite non-negative number, or a timestamp not after the previous one.
    Blank lines are ignored; a first line that does not start with a number is the header.
    Parsed in bulk with numpy (a week of 100 VMs is 200,000 rows); a failure is located
    line by line.
    """
    text = _read_text(Path(path))
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if numbered and numbered[0][0] == 1 and not numbered[0][1].lstrip()[:1].isdigit():
        numbered = numbered[1:]  # the header
    lines = np.array([n for n, _ in numbered], dtype=np.int64)
    try:
        values = np.array([line.split(";") for _, line in numbered], dtype=np.float64).reshape(
            len(numbered), len(COLUMNS)
        )
    except ValueError:
        raise _first_bad_line(path, numbered) from None
    _check(path, values, lines)
    return Rows(Path(path), values, lines)


def _check(path: Path, values: np.ndarray, lines: np.ndarray) -> None:
    """Finite, non-negative values, strictly increasing timestamps; else the first culprit."""
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i, column = np.argwhere(bad)[0]
        v = float(values[i, column])
        what = f"is {v!r}, not a finite number" if not math.isfinite(v) else f"is negative: {v!r}"
        raise TraceError(f"{path}:{lines[i]}: {COLUMNS[column]} {what}")
    back = np.flatnonzero(np.diff(values[:, 0]) <= 0)
    if len(back):
        i = back[0] + 1
        raise TraceError(
            f"{path}:{lines[i]}: timestamp {values[i, 0]:.0f} is not after line"
            f" {lines[i - 1]}'s {values[i - 1, 0]:.0f} (rows must be in time order)"
        )


@dataclass(frozen=True, slots=True)
class Run:
    """One stretch of rows in which the VM ran: a process, its counters starting from zero.

    ``counters[k]`` holds the cumulative (CPU ns, disk read, disk write, network rx, network
    tx bytes) at ``times[k]``, and ``counters[-1]`` those at ``end_s``.
    """

    run_id: int
    times: list[float]
    end_s: float
    rates: list[list[float]]
    counters: list[list[float]]
    rss_bytes: list[int]

    @property
    def start_s(self) -> float:
        return self.times[0]

    def counters_at(self, t: float) -> tuple[int, ...]:
        """Cumulative counters at trace time ``t`` (clamped to the run), rounded to whole
        units. Rounding is monotonic and ``c + r × dt`` is computed as the prefix sums were,
        so they never go down as ``t`` grows (which the agent would take for a reset)."""
        if t >= self.end_s:
            return tuple(round(c) for c in self.counters[-1])
        k = max(bisect.bisect_right(self.times, t) - 1, 0)
        dt = max(t - self.times[k], 0.0)
        return tuple(
            round(c + r * dt) for c, r in zip(self.counters[k], self.rates[k], strict=True)
        )

    def rss_at(self, t: float) -> int:
        """Memory in use at ``t``: the row in effect (the last row's at or after the end)."""
        k = min(max(bisect.bisect_right(self.times, t) - 1, 0), len(self.times) - 1)
        return self.rss_bytes[k]


def _run(run_id: int, rows: np.ndarray, end_s: float) -> Run:
    """A run from consecutive running rows. ``np.add.accumulate`` adds in order, one row at a
    time, so the value at a row's end is exactly the next row's start value."""
    times = rows[:, 0]
    rates = np.column_stack(
        [rows[:, 4] / 100 * rows[:, 1] * 1e9, rows[:, 7:11] * KIB]
    )  # CPU ns (usage % × cores), disk read/write and network rx/tx bytes, per second
    spans = np.append(times[1:], end_s) - times
    counters = np.vstack([np.zeros(5), np.add.accumulate(rates * spans[:, None], axis=0)])
    rss = np.round(rows[:, 6] * KIB).astype(np.int64)
    return Run(
        run_id, times.tolist(), float(end_s), rates.tolist(), counters.tolist(), rss.tolist()
    )


def typical_step(times: np.ndarray) -> float:
    """The median gap between rows: how long the last row is taken to hold."""
    if len(times) < 2:
        return DEFAULT_STEP_S
    return float(np.median(np.diff(times)))


@dataclass(frozen=True)
class Trace:
    """One VM's trace: its runs, and the flavor it was provisioned with."""

    path: Path
    rows: int
    first_s: float | None
    """the first row's timestamp (running or not); ``None`` for a file without rows"""
    end_s: float | None
    """when the last row stops holding"""
    runs: tuple[Run, ...]
    flavor: Flavor
    run_starts: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_starts", tuple(r.start_s for r in self.runs))

    @property
    def name(self) -> str:
        return trace_name(self.path)

    def run_at(self, t: float) -> Run | None:
        """The run in progress at trace time ``t``."""
        i = bisect.bisect_right(self.run_starts, t) - 1
        if i >= 0 and t < self.runs[i].end_s:
            return self.runs[i]
        return None


def build_trace(rows: Rows) -> Trace:
    """Rows → runs and flavor.

    An all-zero row (cores and provisioned memory too) is the trace's "no VM here": each
    stretch of other rows is a run. The flavor is the largest provisioned cores and memory: a
    flavor is fixed at boot, while the trace's provisioned memory wobbles with ballooning.
    """
    v = rows.values
    if not len(v):
        return Trace(rows.path, 0, None, None, (), Flavor())
    end_s = float(v[-1, 0]) + typical_step(v[:, 0])
    running = (v[:, 1:] != 0).any(axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], running, [False]]).astype(np.int8)))
    runs = []
    for n, (first, stop) in enumerate(zip(edges[::2], edges[1::2], strict=True), start=1):
        run_end = float(v[stop, 0]) if stop < len(v) else end_s
        runs.append(_run(n, v[first:stop], run_end))
    vcpus = float(v[running, 1].max()) if running.any() else 0.0
    memory = float(v[running, 5].max()) * KIB if running.any() else 0.0
    flavor = Flavor(vcpus or None, memory or None)
    return Trace(rows.path, len(v), float(v[0, 0]), end_s, tuple(runs), flavor)


def read_trace(path: Path) -> Trace:
    """Parse and integrate one trace file; :class:`TraceError` for bad data (file and line).

    A file without rows (VMs 14 and 82 of the Rnd sample) or with only all-zero rows is a VM
    that never ran: kept, never listed, and logged, so that a range of files can be given.
    """
    trace = build_trace(parse_rows(Path(path)))
    if not trace.runs:
        log.warning(
            "%s: %s: the VM never runs in this replay",
            path,
            "no rows" if not trace.rows else f"all {trace.rows} rows are zero",
        )
    return trace


_RANGE = re.compile(r"^\s*(\w+)\s*(?:-\s*(\d+)\s*)?$")


def trace_ranges(value: str | Sequence[object]) -> tuple[str, ...]:
    """``[1, 2, "7"]`` or ``"1-10,15"`` → ``("1", …, "10", "15")``, in the order given (the
    ``replay_vms`` key, ``gmd-admin demo --vms``). ValueError says which item is wrong, or
    which trace is listed twice: one host runs a VM once."""
    items: Sequence[object] = value.split(",") if isinstance(value, str) else value
    names: list[str] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            names.append(str(item))
            continue
        m = _RANGE.match(item) if isinstance(item, str) else None
        if m is None:
            raise ValueError(f"{item!r}: give trace numbers (1, 2) or ranges (1-10)")
        first, last = m.groups()
        if last is None:
            names.append(first)
        elif first.isdigit() and int(first) <= int(last):
            names.extend(str(n) for n in range(int(first), int(last) + 1))
        else:
            raise ValueError(f"{item!r} is not a range like 1-10")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"trace {dup} is listed twice (one host runs a VM once)")
    return tuple(names)


def trace_name(path: Path) -> str:
    """``N`` of a trace file ``N.csv`` or ``N.csv.gz``."""
    name = Path(path).name
    for suffix in sorted(TRACE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def trace_file(directory: Path, name: str | int) -> Path:
    """Trace ``name``'s file in ``directory``: ``N.csv`` or ``N.csv.gz``. :class:`ReplayError`
    when there is none, or both (which one is replayed must not be a guess)."""
    found = [Path(directory) / f"{name}{s}" for s in TRACE_SUFFIXES]
    found = [p for p in found if p.is_file()]
    if not found:
        raise ReplayError(f"no trace {name}.csv (or {name}.csv.gz) in {directory}")
    if len(found) > 1:
        raise ReplayError(
            f"both {found[0].name} and {found[1].name} in {directory}: keep one of them"
        )
    return found[0]


def trace_paths(directory: Path, names: Iterable[str | int]) -> list[Path]:
    """Each name's trace file (:func:`trace_file`); :class:`ReplayError` for one missing."""
    return [trace_file(directory, n) for n in names]


def trace_extent(path: Path) -> tuple[float, float] | None:
    """The first and the last row's timestamps of a trace file: a quick look at what it covers
    before a replay (``gmd-admin demo --days``), which checks nothing else (the replay checks
    every row). ``None`` for a file without rows, or whose first or last row does not start
    with a number."""
    lines = [line for line in _read_text(Path(path)).splitlines() if line.strip()]
    if lines and not lines[0].lstrip()[:1].isdigit():
        lines = lines[1:]  # the header
    try:
        return (float(lines[0].split(";")[0]), float(lines[-1].split(";")[0])) if lines else None
    except ValueError:
        return None


def trace_names(directory: Path) -> list[str]:
    """Every trace (``N.csv``, ``N.csv.gz``) in ``directory``, numbers in numeric order, then
    other names."""
    stems = {trace_name(p) for s in TRACE_SUFFIXES for p in Path(directory).glob(f"*{s}")}
    return sorted(stems, key=lambda s: (0, int(s), "") if s.isdigit() else (1, 0, s))


# -- VMs and their owners ---------------------------------------------------------------------


def vm_uuid(host: str, path: Path) -> str:
    """A VM's UUID from its host and trace file (its directory's name and its trace name): the
    same VM replayed on the same host is the same VM in the ledger, run after run, and the same
    trace replayed on two hosts is two VMs. ``N.csv.gz`` is the VM of ``N.csv``."""
    path = Path(path)
    return str(uuidlib.uuid5(UUID_NAMESPACE, f"{host}/{path.parent.name}/{trace_name(path)}.csv"))


def deal_customers(
    names: Sequence[str],
    customers: Sequence[str] | Mapping[str, str] | None,
    default_customer: str | None = None,
) -> dict[str, str]:
    """Trace name → customer: looked up in a mapping, dealt round-robin in order from a list,
    or everything to ``default_customer`` (``"unknown"`` without one).

    A mapping must name every trace (:class:`ReplayError` otherwise): a VM silently given to
    a default customer would make that customer look greedy for someone else's use.
    """
    if customers is None or len(customers) == 0:
        return dict.fromkeys(names, default_customer or UNKNOWN_CUSTOMER)
    if isinstance(customers, Mapping):
        missing = [n for n in names if n not in customers]
        if missing:
            raise ReplayError(f"no customer for trace {missing[0]!r} in the mapping")
        return {n: customers[n] for n in names}
    return {n: customers[i % len(customers)] for i, n in enumerate(names)}


@dataclass(frozen=True)
class ReplayVm:
    trace: Trace
    uuid: str
    name: str
    customer: str


def replay_vms(
    traces: Sequence[Trace],
    host: str,
    customers: Sequence[str] | Mapping[str, str] | None = None,
    default_customer: str | None = None,
) -> list[ReplayVm]:
    """The VMs one simulated host replays, with stable UUIDs and their customers."""
    owners = deal_customers([t.name for t in traces], customers, default_customer)
    return [
        ReplayVm(t, vm_uuid(host, t.path), f"bitbrains-{t.name}", owners[t.name]) for t in traces
    ]


# -- time -------------------------------------------------------------------------------------


@dataclass
class ReplayClock:
    """Where simulated time stands, and how it maps onto trace time.

    ``trace_t = trace_start_s + (sim_t - start_s)``, and :func:`replay_run` advances simulated
    time by ``speed`` simulated seconds per wall second (``None``: as fast as the agent goes),
    so ``trace_t = trace_start_s + (wall - wall_start) × speed`` while it runs. Calling the
    clock gives the simulated now, so it can be handed to anything that takes a clock (an
    in-process daemon's, for one).
    """

    start_s: float
    end_s: float
    trace_start_s: float
    speed: float | None = None
    now_s: float = field(default=math.nan)
    resumed: bool = False
    """the clock is the one an earlier run of this replay recorded (see :func:`save_plan`)"""

    def __post_init__(self) -> None:
        if math.isnan(self.now_s):
            self.now_s = self.start_s

    def __call__(self) -> float:
        return self.now_s

    def to_trace(self, sim_s: float) -> float:
        return self.trace_start_s + (sim_s - self.start_s)

    def to_sim(self, trace_s: float) -> float:
        return self.start_s + (trace_s - self.trace_start_s)

    @property
    def fraction(self) -> float:
        """How much of the replay is done, 0–1 (for a progress bar)."""
        return min(max((self.now_s - self.start_s) / (self.end_s - self.start_s), 0.0), 1.0)


def plan_clock(
    traces: Iterable[Trace],
    *,
    start_s: float,
    interval_s: int,
    end_s: float | None = None,
    speed: float | None = None,
    offset_s: float = 0.0,
    now_s: float | None = None,
) -> ReplayClock:
    """The clock of a replay of ``traces`` from simulated ``start_s``.

    The start is aligned down to ``interval_s``; the earliest first row of the traces, plus
    ``offset_s``, falls on it. The end is the earliest of ``end_s``, the present (``now_s``,
    default the wall clock: the daemon refuses the future) and the end of the traces, aligned
    down to ``interval_s`` so that the last interval is closed whole. Several hosts replayed
    in step share one clock (and so one mapping).
    """
    traces = list(traces)
    firsts = [t.first_s for t in traces if t.first_s is not None]
    ends = [t.end_s for t in traces if t.end_s is not None]
    if not firsts:
        raise ReplayError("none of the traces has a row: nothing to replay")
    if speed is not None and not speed > 0:
        raise ReplayError(f"speed {speed!r}: give a number > 0, or None for as fast as possible")
    start = math.floor(start_s / interval_s) * interval_s
    clock = ReplayClock(start, start, min(firsts) + offset_s, speed)
    now = time.time() if now_s is None else now_s
    last = min(now, clock.to_sim(max(ends)), math.inf if end_s is None else end_s)
    clock.end_s = math.floor(last / interval_s) * interval_s
    if clock.end_s < start + interval_s:
        raise ReplayError(
            f"the replay from {start:.0f} would end at {clock.end_s:.0f} (the earliest of the"
            " requested end, the present and the traces' end): shorter than one interval"
        )
    return clock


# -- the host's CPUs --------------------------------------------------------------------------


def _cpu_rates(run: Run, starts: np.ndarray) -> np.ndarray:
    """The run's CPU rate (ns/s) on each segment beginning at ``starts`` (0 outside it)."""
    rates = np.array([r[0] for r in run.rates])
    k = np.clip(np.searchsorted(run.times, starts, side="right") - 1, 0, len(rates) - 1)
    active = (starts >= run.start_s) & (starts < run.end_s)
    return np.where(active, rates[k], 0.0)


class HostCpu:
    """The CPU counters of a host's VMs when their traces together ask more than its cores.

    On every stretch of trace time where the traced CPU rates add up to more than the host's
    cores, each VM gets the same fraction ``share`` of its rate: what the kernel's fair
    scheduler gives CPU-bound VMs whose runnable vCPU threads compete with equal weights (a
    VM asking for more cores has more threads). A VM's CPU counter is then its rate × the
    integral of ``share``, a function of trace time alone, precomputed on the breakpoints of
    every run: a resumed replay reads the same counters as an uninterrupted one, and they
    never go down. :meth:`of` gives None for a host that is never short of cores (its VMs'
    traces are replayed exactly).
    """

    def __init__(self, runs: Mapping[tuple[str, int], Run], times: np.ndarray, share: np.ndarray):
        self.times, self.share = times, share
        self.integral = np.concatenate([[0.0], np.add.accumulate(share * np.diff(times))])
        self._runs = dict(runs)
        self._before: dict[tuple[str, int], np.ndarray] = {}
        for key, run in self._runs.items():
            rates = np.array([r[0] for r in run.rates])
            given = np.diff(self._given(np.array([*run.times, run.end_s])))
            self._before[key] = np.concatenate([[0.0], np.add.accumulate(rates * given)])

    @classmethod
    def of(cls, runs: Mapping[tuple[str, int], Run], cores: float) -> HostCpu | None:
        """The host's CPU shares, or None when its VMs never ask more than ``cores``."""
        capacity = cores * 1e9
        if not runs or sum(max(r[0] for r in run.rates) for run in runs.values()) <= capacity:
            return None
        times = np.unique(np.concatenate([[*run.times, run.end_s] for run in runs.values()]))
        demand = np.zeros(len(times) - 1)
        for run in runs.values():
            demand += _cpu_rates(run, times[:-1])
        if not (demand > capacity).any():
            return None
        share = np.where(demand > capacity, capacity / np.maximum(demand, capacity), 1.0)
        return cls(runs, times, share)

    def _given(self, t: np.ndarray) -> np.ndarray:
        """∫ share from the first breakpoint to each of ``t`` (within the breakpoints)."""
        i = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, len(self.share) - 1)
        return self.integral[i] + self.share[i] * (t - self.times[i])

    def cpu_ns(self, key: tuple[str, int], t: float) -> int:
        """The CPU counter of run ``key`` (VM uuid, run id) at trace time ``t``."""
        run, before = self._runs[key], self._before[key]
        if t >= run.end_s:
            return round(before[-1])
        k = max(bisect.bisect_right(run.times, t) - 1, 0)
        given = self._given(np.array([max(t, run.times[k]), run.times[k]]))
        return round(before[k] + run.rates[k][0] * (given[0] - given[1]))

    def saturated_s(self) -> float:
        """How long, in trace time, the host was short of cores."""
        return float(np.diff(self.times)[self.share < 1].sum())


# -- the collector ----------------------------------------------------------------------------


class ReplayCollector:
    """A :class:`gmd.agent.collect.base.Collector` whose host runs recorded traces.

    Each reading is taken at the clock's simulated now and reads each VM's trace at the
    matching trace time. ``cores``/``memory_bytes`` are the host's capacity; by default the
    sum of the VMs' flavors (a host exactly big enough for what it runs).
    """

    def __init__(
        self,
        vms: Sequence[ReplayVm],
        clock: ReplayClock,
        *,
        cores: float | None = None,
        memory_bytes: float | None = None,
    ) -> None:
        self.vms, self.clock = list(vms), clock
        uuids = [vm.uuid for vm in self.vms]
        if len(set(uuids)) != len(uuids):
            raise ReplayError("a trace is replayed twice on one host")
        self._owners = {vm.uuid: self._ownership(vm) for vm in self.vms}
        cores = cores or sum(vm.trace.flavor.vcpus or 0.0 for vm in self.vms)
        memory_bytes = memory_bytes or sum(vm.trace.flavor.memory_bytes or 0.0 for vm in self.vms)
        if not (cores > 0 and memory_bytes > 0):
            raise ReplayError(
                "no replayed VM is provisioned with cores and memory: give the host's capacity"
                " (agent.replay_host_cores, agent.replay_host_memory_bytes)"
            )
        self._resources = HostResources(float(cores), float(memory_bytes))
        self._previous_trace_s: float | None = None
        self._final_cpu_ns: dict[tuple[str, int], int] = {}
        runs = {(vm.uuid, run.run_id): run for vm in self.vms for run in vm.trace.runs}
        self.cpu = HostCpu.of(runs, float(cores))
        if self.cpu is not None:
            log.info(
                "the replayed VMs ask more than the host's %g cores for %.1f h of trace: there"
                " each gets the same fraction of what its trace asks",
                cores,
                self.cpu.saturated_s() / 3600,
            )

    def _ownership(self, vm: ReplayVm) -> Ownership:
        runs = vm.trace.runs
        created = None
        if runs:
            created = max(math.floor(self.clock.to_sim(runs[0].start_s)), 0)
        return Ownership(vm.customer, "replay", vm.trace.flavor, created)

    def resources(self) -> HostResources:
        return self._resources

    def resume_at(self, sim_s: float) -> None:
        """Continue from an earlier run's last reading at simulated ``sim_s``: a VM that
        stopped since is then reported once more with its final counters, as it would have
        been without the interruption."""
        self._previous_trace_s = self.clock.to_trace(sim_s)

    def collect(self) -> HostReading:
        now = self.clock.now_s
        t = self.clock.to_trace(now)
        previous, self._previous_trace_s = self._previous_trace_s, t
        vms = []
        for vm in self.vms:
            reading = self._read(vm, t, previous, now)
            if reading is not None:
                vms.append(reading)
        listed = frozenset(v.uuid for v in vms)
        return HostReading(now, True, tuple(vms), listed, host_cpu_s=self.host_cpu_s(t))

    def host_cpu_s(self, t: float) -> float:
        """The simulated host's busy CPU seconds at trace time ``t``: every run's CPU counter
        (its final one once it ended, 0 before it began) added up. The host runs nothing but
        its VMs, so its busy time is theirs, counters that stopped included, and it never
        goes down (a restarted VM's new run adds to it)."""
        total = 0
        for vm in self.vms:
            for run in vm.trace.runs:
                if t <= run.start_s:
                    continue
                key = (vm.uuid, run.run_id)
                if t >= run.end_s and key in self._final_cpu_ns:
                    total += self._final_cpu_ns[key]
                    continue
                ns = self.cpu.cpu_ns(key, t) if self.cpu is not None else run.counters_at(t)[0]
                if t >= run.end_s:
                    self._final_cpu_ns[key] = ns
                total += ns
        return total / 1e9

    def _read(self, vm: ReplayVm, t: float, previous: float | None, now: float) -> VmReading | None:
        """The VM at trace time ``t``: running, just stopped (its final counters, once), or
        not running (``None``)."""
        run = None
        if previous is not None:
            before = vm.trace.run_at(previous)
            if before is not None and before.end_s <= t:
                run = before  # it stopped since the last reading: report what it used
        if run is None:
            run = vm.trace.run_at(t)
        if run is None:
            return None
        cpu, rd, wr, rx, tx = run.counters_at(t)
        if self.cpu is not None:
            cpu = self.cpu.cpu_ns((vm.uuid, run.run_id), t)
        return VmReading(
            uuid=vm.uuid,
            run_id=run.run_id,
            taken_s=now,
            cpu_time_ns=cpu,
            memory_rss_bytes=run.rss_at(t),
            disks={DISK: (rd, wr)},
            nics={NIC: (rx, tx)},
            owner=self._owners[vm.uuid],
            name=vm.name,
        )

    def close(self) -> None:
        """Nothing to release: the traces are in memory."""


# -- from the configuration -------------------------------------------------------------------


def replay_from_config(
    config: AgentConfig, now_s: float | None = None
) -> tuple[ReplayCollector, ReplayClock]:
    """The collector and clock ``[agent] collector = "replay"`` describes (what gmd-agent
    runs). :class:`ReplayError` when the traces cannot be used."""
    if config.replay_dir is None:
        raise ReplayError("agent.replay_dir is not set: which traces should be replayed?")
    now = time.time() if now_s is None else now_s
    names = list(config.replay_vms) or trace_names(config.replay_dir)
    traces = [read_trace(p) for p in trace_paths(config.replay_dir, names)]
    customers = config.replay_customers or None
    vms = replay_vms(traces, config.host, customers, config.default_customer)
    clock = load_plan(config)
    if clock is None:
        start = now - DEFAULT_HISTORY_S if config.replay_start_s is None else config.replay_start_s
        clock = plan_clock(
            traces,
            start_s=start,
            interval_s=config.interval_s,
            end_s=config.replay_end_s,
            speed=config.replay_speed,
            offset_s=config.replay_offset_s,
            now_s=now,
        )
    collector = ReplayCollector(
        vms, clock, cores=config.replay_host_cores, memory_bytes=config.replay_host_memory_bytes
    )
    log.info(
        "%s %d VMs (%d ever running) of %s as host %s: simulated %s → %s (%.1f days),"
        " trace from %.0f, %s; capacity %g cores, %.1f GiB",
        "resuming the replay of" if clock.resumed else "replaying",
        len(vms),
        sum(1 for vm in vms if vm.trace.runs),
        config.replay_dir,
        config.host,
        iso(clock.start_s),
        iso(clock.end_s),
        (clock.end_s - clock.start_s) / 86400,
        clock.trace_start_s,
        "as fast as possible" if clock.speed is None else f"{clock.speed:g}× real time",
        collector.resources().cpu_cores,
        collector.resources().memory_bytes / 2**30,
    )
    return collector, clock


# -- the plan of a replay, kept beside the spool ------------------------------------------------


def plan_path(config: AgentConfig) -> Path:
    """Where a replay's plan (its clock and what it replays) is kept: beside the spool, whose
    state is only meaningful with it."""
    return Path(f"{config.spool_path}.replay.json")


def traces_digest(directory: Path, names: Iterable[str]) -> str:
    """A SHA-256 over the named traces' names and text: what the replay reads, so that a
    trace edited, added (with every trace of a directory replayed) or removed makes another
    replay, not a resumed one whose counters no longer match the saved baselines. A trace
    compressed or decompressed meanwhile is the same replay."""
    digest = hashlib.sha256()
    for path in trace_paths(directory, names):
        data = _read_bytes(path)
        digest.update(f"{trace_name(path)}.csv\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _identity(config: AgentConfig) -> dict[str, Any]:
    """What makes two runs the same replay: the host, the traces (their contents too), the
    owners and what the counters are read and folded with. Not the start and end: ``now-7d``
    means another instant at every start, and a restarted replay must go on with the clock it
    had. Nor the speed, which paces the replay but changes no figure."""
    customers = config.replay_customers
    directory = config.replay_dir
    names = list(config.replay_vms) or ([] if directory is None else trace_names(directory))
    return {
        "host": config.host,
        "replay_dir": str(directory),
        "vms": list(config.replay_vms),
        "traces_sha256": None if directory is None else traces_digest(directory, names),
        "customers": dict(customers) if isinstance(customers, Mapping) else list(customers),
        "default_customer": config.default_customer,
        "interval_s": config.interval_s,
        "tick_s": config.tick_s,
        "offset_s": config.replay_offset_s,
        "host_cores": config.replay_host_cores,
        "host_memory_bytes": config.replay_host_memory_bytes,
    }


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as it reads back from the plan file (tuples become lists, keys strings)."""
    result: dict[str, Any] = json.loads(json.dumps(value))
    return result


def save_plan(config: AgentConfig, clock: ReplayClock) -> None:
    """Record the replay's clock beside its spool (atomically and durably, before the first
    tick commits a state that needs it), so that an agent restarted after a crash or SIGKILL
    resumes the same simulated span instead of starting another."""
    document = {
        "replay": _identity(config),
        "clock": {
            "start_s": clock.start_s,
            "end_s": clock.end_s,
            "trace_start_s": clock.trace_start_s,
            "speed": clock.speed,
        },
    }
    path = plan_path(config)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            f.write(json.dumps(document, indent=1))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        raise ReplayError(f"cannot record the replay's plan in {path}: {exc.strerror}") from None


def load_plan(config: AgentConfig) -> ReplayClock | None:
    """The clock an earlier run of this same replay recorded, or None when there is none.
    :class:`ReplayError` when the spool's plan is another replay's. The speed is the one
    configured now: it only paces the replay, and a replay resumed at another speed counts
    the same."""
    path = plan_path(config)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the replay plan {path}: {exc}") from None
    recorded = document.get("replay") if isinstance(document, dict) else None
    identity = _as_json(_identity(config))
    if recorded != identity:
        differ = [k for k, v in identity.items() if (recorded or {}).get(k) != v]
        raise ReplayError(
            f"spool {config.spool_path} holds another replay (it differs in"
            f" {', '.join(differ) or 'its format'}; plan {path}): use a new agent.spool_path"
        )
    try:
        c = document["clock"]
        return ReplayClock(
            float(c["start_s"]),
            float(c["end_s"]),
            float(c["trace_start_s"]),
            config.replay_speed,
            resumed=True,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"the replay plan {path} has no usable clock ({exc!r})") from None


def replay_id(config: AgentConfig, clock: ReplayClock) -> str:
    """A short digest of what is replayed and on which clock: the same replay, run again or
    resumed, has the same id; another (other traces, host, owners, start, mapping onto the
    traces) has another."""
    document = {
        "replay": _as_json(_identity(config)),
        "start_s": clock.start_s,
        "trace_start_s": clock.trace_start_s,
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def replay_key(replay: str, clock: ReplayClock) -> Callable[[str, int], str]:
    """The batch keys of a replay (``Agent(key=…)``): host, interval, the replay
    (:func:`replay_id`) and the simulated instant of the tick that closed the batch.

    Deterministic, where a live agent's keys are random: a replay reads the same counters at
    the same instants every time, so a batch made again (a spool lost after its batches were
    delivered, a resumed agent) is the same batch under the same key, which the daemon
    acknowledges as a duplicate instead of counting it twice. The closing tick tells apart
    the batches of one interval that different ticks close (a late part). At most 128
    printable characters, like :func:`gmd.agent.loop.new_key`'s."""

    def key(host: str, interval_start_s: int) -> str:
        name = "".join(c if "!" <= c <= "~" else "_" for c in host)[:64]
        return f"{name}/{interval_start_s}/replay-{replay}/{round(clock.now_s * 1000)}"

    return key


# -- driving an agent -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayReport:
    ticks: int
    start_s: float
    reached_s: float
    """simulated time of the last tick"""
    end_s: float
    batches: int
    """batches made (one per host and interval)"""
    waiting: int
    """batches left in the spools after the final send (the daemon could not take them)"""
    stopped: bool
    """interrupted before the end"""
    resumed_s: float | None = None
    """the simulated time of the earlier run's last reading this run went on from (the
    earliest over the agents); ``None`` when it started from the clock's start"""

    @property
    def finished_before(self) -> bool:
        """The replay had been done to its end by an earlier run: nothing was left to tick."""
        return self.resumed_s is not None and self.resumed_s >= self.end_s


def tick_times(start_s: float, end_s: float, tick_s: float) -> Iterator[float]:
    """``start_s``, every ``tick_s`` after it, and ``end_s`` itself (so that a reading is
    taken at the end and closes the last interval). Multiplied, not summed, so that no
    rounding error piles up over a week of ticks."""
    k = 0
    while (t := start_s + k * tick_s) < end_s:
        yield t
        k += 1
    yield end_s


def replay_run(
    agents: Agent | Sequence[Agent],
    clock: ReplayClock,
    *,
    stop: threading.Event | None = None,
    on_tick: Callable[[ReplayClock], None] | None = None,
    wall: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
    resume: bool = False,
) -> ReplayReport:
    """Tick ``agents`` (the hosts of one replay, sharing ``clock``) through simulated time.

    Every ``tick_s`` of simulated time from the clock's start to its end, the clock is set and
    each agent ticks once (``agent.tick(now_s=…)``: read, fold, spool, send), in lock step, so
    that at any moment the daemon has every host's batches up to the same instant. Without a
    speed nothing sleeps; with one, tick k waits until ``k × tick_s / speed`` wall seconds
    after the first. ``stop`` ends the run early (between ticks); ``on_tick`` is called after
    each tick (a progress bar: ``clock.fraction``). At the end each spool is sent once more.

    An agent whose spool holds the state of an earlier run either resumes it (``resume``: the
    caller has checked that it is the same replay, with the same clock — :func:`load_plan`)
    or is refused (:class:`ReplayError`): measuring another replay from those counters, or
    the same simulated span again, would count twice. Resuming, the clock starts at the
    state's last reading (``last_ok_s``, one of the ticks of :func:`tick_times`), and each
    agent ticks only the later ticks: its next reading is measured from the saved counters
    (a VM that stopped in between is reported once more, as :meth:`ReplayCollector.resume_at`
    says), the intervals it closed before are in its spool or already delivered and are not
    made again, and the open ones in the state go on. The batches still spooled are sent by
    the first tick (or the final send, when the replay had already reached its end).
    """
    agents = [agents] if not isinstance(agents, Sequence) else list(agents)
    if not agents:
        raise ReplayError("no agent to replay")
    tick_s = agents[0].config.tick_s
    done: list[float | None] = []
    for agent in agents:
        if agent.config.tick_s != tick_s or agent.config.interval_s != agents[0].config.interval_s:
            raise ReplayError("the agents of one replay must share tick_s and interval_s")
        last = agent.state.last_ok_s
        if last is not None and not resume:
            raise ReplayError(
                f"spool {agent.spool.path} holds the state of an earlier run (host"
                f" {agent.config.host}) but not the plan of this replay: use a new"
                " agent.spool_path"
            )
        if last is not None and not clock.start_s <= last <= clock.end_s:
            raise ReplayError(
                f"spool {agent.spool.path} holds a reading at {iso(last)}, outside this replay"
                f" ({iso(clock.start_s)} → {iso(clock.end_s)}): use a new agent.spool_path"
            )
        if last is not None and isinstance(agent.collector, ReplayCollector):
            agent.collector.resume_at(last)
        done.append(last)
    resumed_at = min((d for d in done if d is not None), default=None)
    if resumed_at is not None:
        clock.now_s = resumed_at
        log.info(
            "resuming the replay at simulated %s (%.0f%% done), where the spools left off",
            iso(resumed_at),
            clock.fraction * 100,
        )
    wall_start = wall()
    first = clock.start_s if resumed_at is None else resumed_at
    ticks = batches = 0
    stopped = False
    for t in tick_times(clock.start_s, clock.end_s, tick_s):
        if all(d is not None and t <= d for d in done):
            continue  # ticked before the interruption
        if clock.speed is not None:
            delay = wall_start + (t - first) / clock.speed - wall()
            if delay > 0:
                if stop is not None:
                    stop.wait(delay)
                else:
                    sleep(delay)
        if stop is not None and stop.is_set():
            stopped = True
            break
        clock.now_s = t
        for agent, d in zip(agents, done, strict=True):
            if d is None or t > d:
                batches += agent.tick(now_s=t).batches
        ticks += 1
        if on_tick is not None:
            on_tick(clock)
    waiting = 0
    for agent in agents:
        if agent.sender is not None:
            agent.sender.drain()
        waiting += agent.spool.size()[0]
    return ReplayReport(
        ticks, clock.start_s, clock.now_s, clock.end_s, batches, waiting, stopped, resumed_at
    )


def replay_dry_run(
    config: AgentConfig, collector: ReplayCollector, clock: ReplayClock
) -> dict[str, Any]:
    """The batch of the replay's first interval, read every ``tick_s`` of simulated time as
    the agent would; nothing is written or sent (``gmd-agent --dry-run``)."""
    resources = collector.resources()
    capacity = Bandwidth.of(config.disk_bytes_per_s, config.network_bytes_per_s).capacity(resources)
    state = AgentState()
    for t in tick_times(clock.start_s, clock.end_s, config.tick_s):
        clock.now_s = t
        result = advance(state, collector.collect(), config.interval_s)
        state = result.state
        if result.closed:
            first = result.closed[0]
            return batch_document(
                first,
                key=f"dry-run/{first.start_s}",
                host=config.host,
                capacity=capacity.as_wire(),
            )
    raise ReplayError("the replay is shorter than one interval")  # plan_clock prevents it
