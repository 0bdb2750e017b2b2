"""Time the simulator: DirectContr over a whole trace, and Ref on one day for several k.

    python bench/simulate.py --trace LPC-EGEE-2004-1.2-cln.swf.gz   # 5 orgs, Ref for k = 5, 8, 10
    python bench/simulate.py --ref-orgs 5 --jobs 20000

The whole LPC-EGEE trace (the figures in docs/benchmarks.md) is the Parallel Workloads
Archive's, https://www.cs.huji.ac.il/labs/parallel/workload/ ; without ``--trace`` the benchmark
runs on the four weeks of it the repository holds (tests/data/pwa, 22,517 jobs).

DirectContr (ORIG_DIRECT, utility ψ) replays every job of the trace that ran (jobs the log
gives no run time are dropped) with its users dealt to 5 organizations and the header's
processors split equally; the figure is simulated jobs per second (target: the whole LPC-EGEE
trace in under 30 s). Ref simulates all 2^k coalitions of one day of the trace (the same day
for every k). Prints a line per measurement and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from gmd.sim.coalitions import simulate_ref
from gmd.sim.policies import parse_policy
from gmd.sim.scheduler import simulate
from gmd.sim.swf import read_swf
from gmd.sim.workload import assign_users, build_workload, processor_counts

LPC = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "data"
    / "pwa"
    / "LPC-EGEE-2004-1.2-cln.weeks-24-27.swf.gz"
)
REF_START_DAY = 30
"""Ref's day of the trace by default: day 30 of a trace that long, else its middle day."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(LPC))
    parser.add_argument("--orgs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--ref-orgs", type=int, nargs="*", default=[5, 8, 10])
    parser.add_argument("--ref-window", type=int, default=86400)
    parser.add_argument(
        "--ref-start-day",
        type=int,
        default=None,
        help=f"day of the trace (default {REF_START_DAY}, or the middle day of a shorter trace)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-processors", type=int, default=None, help="default: MaxProcs")
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = read_swf(args.trace)
    read_s = time.perf_counter() - t0
    print(f"read {trace.n_jobs} jobs in {read_s:.1f} s")
    total = args.total_processors or trace.max_procs or 140
    first = int(trace.submit_s[0])
    end = int(trace.submit_s[-1]) + 1 if args.jobs is None else int(trace.submit_s[args.jobs])
    mapping = assign_users(trace.user, args.orgs, args.seed)
    whole = build_workload(
        trace, first, end - first, mapping, processor_counts(total, args.orgs, "equal")
    )
    t0 = time.perf_counter()
    schedule = simulate(whole, parse_policy("ORIG_DIRECT").factory(), seed=args.seed)  # type: ignore[misc]
    dc_s = time.perf_counter() - t0
    assert int(np.sum(schedule.start >= 0)) == whole.n_jobs
    print(f"DirectContr: {whole.n_jobs} jobs, {args.orgs} orgs in {dc_s:.2f} s")

    ref: dict[str, dict[str, float | int]] = {}
    day_of = args.ref_start_day
    if day_of is None:
        day_of = min(REF_START_DAY, int(trace.submit_s[-1] - first) // 86400 // 2)
    start = first + day_of * 86400
    for k in args.ref_orgs:
        day = build_workload(
            trace,
            start,
            args.ref_window,
            assign_users(trace.user, k, args.seed),
            processor_counts(total, k, "equal"),
        )
        t0 = time.perf_counter()
        simulate_ref(day)
        seconds = time.perf_counter() - t0
        ref[str(k)] = {"jobs": day.n_jobs, "coalitions": 2**k - 1, "seconds": round(seconds, 3)}
        print(f"Ref: k = {k}, {day.n_jobs} jobs, {2**k - 1} coalitions in {seconds:.2f} s")

    figures = {
        "benchmark": "simulate",
        "trace": Path(args.trace).name,
        "directcontr_jobs": whole.n_jobs,
        "directcontr_orgs": args.orgs,
        "directcontr_processors": total,
        "directcontr_seconds": round(dc_s, 3),
        "directcontr_jobs_per_s": round(whole.n_jobs / dc_s),
        "target_seconds": 30.0,
        "trace_read_seconds": round(read_s, 3),
        "ref_window_s": args.ref_window,
        "ref": ref,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
