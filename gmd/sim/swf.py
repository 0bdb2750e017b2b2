"""Reading Standard Workload Format traces (the Parallel Workloads Archive's ``.swf``/``.swf.gz``).

Only the fields a fairness simulation needs are kept: job id, submit time, run time, processors
(allocated, falling back to requested when the log left it at -1) and user id. The header's
``MaxProcs`` is kept because the papers size the simulated system by it; several archive copies
have their header stripped, so it may be missing.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SWF_FIELDS = 18
_JOB, _SUBMIT, _WAIT, _RUN, _ALLOC, _REQ, _USER = 0, 1, 2, 3, 4, 7, 11
_MAXPROCS = re.compile(r"^;\s*MaxProcs:\s*(\d+)")


@dataclass(frozen=True)
class SwfLog:
    """A job log, one entry per job as the log has it (parallel jobs not yet split)."""

    path: str
    job_id: np.ndarray  # int64
    submit_s: np.ndarray  # int64, seconds since the log's start
    run_s: np.ndarray  # int64
    processors: np.ndarray  # int64, >= 1
    user: np.ndarray  # int64, the log's user id (-1 when unknown)
    wait_s: np.ndarray  # int64, how long the job waited in the real system (-1 unknown)
    max_procs: int | None  # the header's MaxProcs, None when the header is missing
    skipped: int  # jobs dropped: no run time or no processor count

    @property
    def n_jobs(self) -> int:
        return int(self.job_id.shape[0])


def read_swf(path: str | Path) -> SwfLog:
    """Read a trace; jobs that never ran (run time or processor count unknown or 0) are dropped.

    Dropping them is what the papers do implicitly: a job with no run time contributes no
    work and no utility under any policy, it would only distort the job counts.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    max_procs: int | None = None
    rows: list[list[str]] = []
    try:
        with opener(path, "rt", encoding="ascii", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.startswith(";"):
                    m = _MAXPROCS.match(line)
                    if m:
                        max_procs = int(m.group(1))
                    continue
                fields = line.split()
                if not fields:
                    continue
                if len(fields) != SWF_FIELDS:
                    raise ValueError(
                        f"{path}:{lineno}: expected {SWF_FIELDS} fields, found {len(fields)}"
                    )
                rows.append(fields)
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc}") from exc
    if not rows:
        raise ValueError(f"{path}: no jobs in the trace")
    try:
        table = np.array(rows, dtype=np.float64)
    except ValueError as exc:
        bad = next(i for i, r in enumerate(rows) if not _numeric(r))
        raise ValueError(f"{path}: job {rows[bad][0]!r} has a non-numeric field") from exc

    alloc = table[:, _ALLOC]
    procs = np.where(alloc > 0, alloc, table[:, _REQ])
    run = table[:, _RUN]
    submit = table[:, _SUBMIT]
    keep = (run > 0) & (procs > 0) & (submit >= 0)
    order = np.argsort(submit[keep], kind="stable")
    return SwfLog(
        path=str(path),
        job_id=table[keep, _JOB].astype(np.int64)[order],
        submit_s=np.floor(submit[keep]).astype(np.int64)[order],
        # Run times are whole seconds in the archive; rounding up keeps every job at least
        # one time unit long, which the utilities' unit-part model needs.
        run_s=np.ceil(run[keep]).astype(np.int64)[order],
        processors=np.round(procs[keep]).astype(np.int64)[order],
        user=table[keep, _USER].astype(np.int64)[order],
        wait_s=np.round(table[keep, _WAIT]).astype(np.int64)[order],
        max_procs=max_procs,
        skipped=int((~keep).sum()),
    )


def peak_processors(trace: SwfLog) -> int:
    """The most processors the logged system had busy at once (from the logged start times).

    A lower bound on the machine's size, used when a copy of a log lost its ``MaxProcs`` header.
    """
    known = trace.wait_s >= 0
    start = trace.submit_s[known] + trace.wait_s[known]
    times = np.concatenate([start, start + trace.run_s[known]])
    deltas = np.concatenate([trace.processors[known], -trace.processors[known]])
    order = np.lexsort((deltas, times))  # at equal times, releases (negative) first
    return int(np.cumsum(deltas[order]).max(initial=0))


def _numeric(fields: list[str]) -> bool:
    try:
        [float(f) for f in fields]
    except ValueError:
        return False
    return True
