"""Recorded per-VM traces in the Bitbrains format (GWA-T-12 Rnd, ``N.csv`` or ``N.csv.gz``: one
row per VM every ~300 s): reading, checking and integrating them, and naming them.

What the agent's replay collector (:mod:`gmd.agent.collect.replay`) plays back, what
``gmd-admin demo`` deals onto its simulated hosts, and what the benchmarks and tests cut from:
numpy and the standard library only, so that every package may import it.

**What a row means.** Each row's rates hold from its timestamp until the next row's (the last
row for the file's typical step), so CPU seconds over a span are Σ usage% / 100 × cores × the
overlap of each row with the span, and bytes Σ KB/s × 1024 × overlap. An all-zero row (the
trace's "no VM here": cores and provisioned memory are zero too) means the VM was not running;
each stretch of running rows is one *run*, a process whose counters start from zero, as a
restarted domain's do.

**Bad data stops the reader** with the file and line (:class:`TraceError`): a skipped row would
silently change every integral after it, and the purpose of a replay is exact figures.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gmd import GmdError

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
TRACE_SUFFIXES = (".csv", ".csv.gz")
"""A trace file is ``N.csv``, or ``N.csv.gz`` read as it is (gzip): an operator can point
``replay_dir`` at compressed traces, and the demo's packaged traces are compressed."""


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceFlavor:
    """What a trace says its VM was given: the most cores and provisioned memory of its running
    rows (None: never running). The agent's replay reports it as the VM's flavor."""

    vcpus: float | None = None
    memory_bytes: float | None = None


class TraceError(GmdError, RuntimeError):
    """A trace file cannot be used; the message names the file and line (or the trace that is
    missing)."""


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
    flavor: TraceFlavor
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
        return Trace(rows.path, 0, None, None, (), TraceFlavor())
    end_s = float(v[-1, 0]) + typical_step(v[:, 0])
    running = (v[:, 1:] != 0).any(axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], running, [False]]).astype(np.int8)))
    runs = []
    for n, (first, stop) in enumerate(zip(edges[::2], edges[1::2], strict=True), start=1):
        run_end = float(v[stop, 0]) if stop < len(v) else end_s
        runs.append(_run(n, v[first:stop], run_end))
    vcpus = float(v[running, 1].max()) if running.any() else 0.0
    memory = float(v[running, 5].max()) * KIB if running.any() else 0.0
    flavor = TraceFlavor(vcpus or None, memory or None)
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
    """Trace ``name``'s file in ``directory``: ``N.csv`` or ``N.csv.gz``. :class:`TraceError`
    when there is none, or both (which one is replayed must not be a guess)."""
    found = [Path(directory) / f"{name}{s}" for s in TRACE_SUFFIXES]
    found = [p for p in found if p.is_file()]
    if not found:
        raise TraceError(f"no trace {name}.csv (or {name}.csv.gz) in {directory}")
    if len(found) > 1:
        raise TraceError(
            f"both {found[0].name} and {found[1].name} in {directory}: keep one of them"
        )
    return found[0]


def trace_paths(directory: Path, names: Iterable[str | int]) -> list[Path]:
    """Each name's trace file (:func:`trace_file`); :class:`TraceError` for one missing."""
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
