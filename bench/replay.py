"""How fast simulated hosts replay Bitbrains traces: the collector alone, and the whole agent
tick without a daemon (collector, intervals, the spool commit with its fsync).

    python bench/replay.py --vms 1-20 --days 1 --tick 300 --interval 300

It replays the demo's traces, shipped in the package (gmd/admin/demo_data: the first three days
of the GWA-T-12 Bitbrains Rnd sample); ``--traces DIR`` takes others, e.g. the whole trace from
the Grid Workloads Archive (http://gwa.ewi.tudelft.nl/, GWA-T-12 Bitbrains) for longer runs.

A *sample* is one VM read at one tick. The demo's budget is what matters here: a few simulated
days of ~100 VMs over several hosts within a couple of minutes, daemon and accounting included.

Prints a line per stage and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from pathlib import Path

from gmd.admin.demo import PACKAGED_TRACES
from gmd.agent.collect.aggregate import AgentState, advance
from gmd.agent.collect.replay import ReplayClock, ReplayCollector, plan_clock, replay_vms
from gmd.agent.config import parse_agent
from gmd.agent.loop import AgentLoop
from gmd.agent.replay_run import replay_run, tick_times
from gmd.agent.spool import Spool
from gmd.traces import read_trace, trace_paths, trace_ranges


def collector_only(collector: ReplayCollector, clock: ReplayClock, tick_s: float, interval_s: int):
    """Readings folded into intervals in memory: (ticks, samples, seconds)."""
    state, ticks, samples = AgentState(), 0, 0
    began = time.perf_counter()
    for t in tick_times(clock.start_s, clock.end_s, tick_s):
        clock.now_s = t
        reading = collector.collect()
        state = advance(state, reading, interval_s).state
        ticks += 1
        samples += len(reading.vms)
    return ticks, samples, time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vms", default="1-20", help="trace numbers, e.g. 1-20 or 1,5,9")
    p.add_argument("--days", type=float, default=1.0, help="simulated days")
    p.add_argument(
        "--traces",
        type=Path,
        default=PACKAGED_TRACES,
        help="N.csv or N.csv.gz traces (default: the demo's, three days)",
    )
    p.add_argument("--tick", type=float, default=300.0, help="agent.tick_s")
    p.add_argument("--interval", type=int, default=300, help="agent.interval_s")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)

    began = time.perf_counter()
    traces = [read_trace(path) for path in trace_paths(args.traces, trace_ranges(args.vms))]
    parse_s = time.perf_counter() - began
    start = (time.time() - args.days * 86400 - 2 * args.interval) // args.interval * args.interval
    end = start + args.days * 86400

    def fresh() -> tuple[ReplayCollector, ReplayClock]:
        clock = plan_clock(traces, start_s=start, interval_s=args.interval, end_s=end)
        return ReplayCollector(replay_vms(traces, "bench", ["a", "b", "c"]), clock), clock

    collector, clock = fresh()
    ticks, samples, alone_s = collector_only(collector, clock, args.tick, args.interval)
    print(f"parsed {len(traces)} traces in {parse_s:.2f} s")
    print(f"collector + intervals: {ticks} ticks, {samples / alone_s:,.0f} samples/s")

    collector, clock = fresh()
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_agent(
            {
                "agent": {
                    "host": "bench",
                    "tick_s": args.tick,
                    "interval_s": args.interval,
                    "spool_path": str(Path(tmp) / "spool.db"),
                    "network_bytes_per_s": 1.25e9,
                }
            }
        )
        spool = Spool(config.spool_path, max_bytes=2**40, max_batches=10**9)
        agent = AgentLoop(config, collector, spool, None)
        t0 = time.perf_counter()
        report = replay_run(agent, clock)
        agent_s = time.perf_counter() - t0
        spool.close()
    print(
        f"agent ticks (spool, no daemon): {report.ticks} ticks, {report.batches} batches,"
        f" {samples / agent_s:,.0f} samples/s, {agent_s / report.ticks * 1e3:.2f} ms/tick"
    )
    print(
        json.dumps(
            {
                "vms": len(traces),
                "simulated_days": args.days,
                "tick_s": args.tick,
                "interval_s": args.interval,
                "ticks": ticks,
                "samples": samples,
                "parse_s": round(parse_s, 4),
                "collector_samples_per_s": round(samples / alone_s),
                "agent_samples_per_s": round(samples / agent_s),
                "agent_ms_per_tick": round(agent_s / report.ticks * 1e3, 3),
                "simulated_days_per_wall_s": round(args.days / agent_s, 3),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
