"""The protection gmd gives a moderate customer, measured on real QEMU guests (issue 43).

    python bench/protection.py                 # every phase below, once (~17 min)
    python bench/protection.py --rounds 2      # the sequence twice, figures pooled
    python bench/protection.py --phases baseline,off,on --on-s 120
    python bench/protection.py --phases baseline,off,on,idle-off --weight-factors 0.1,0.1,0.1 \
        --protected-jobs 5 --on-max-s 400    # what tests/realvm/test_protection_realvm.py runs

As root (the real libvirtd of tests/scripts/libvirt.sh). One host, overcommitted as a flat-rate
cloud is: a greedy project whose ``--greedy-vms`` guests spin every vCPU, and ``--moderates``
projects of one guest each that run a job of a known size (``--job-loops`` iterations of a
shell loop, ~1.6 s on an idle 2-core host under TCG), pause ``--job-pause-s`` and run it again,
reporting each job's start and end on the guest's console: the guest's work itself is timed,
not its QEMU's CPU time. Every domain has the scheduler's default weight, as Nova leaves it.
gmd runs as processes (gmd-daemon on a fresh SQLite ledger per phase, gmd-agent with its
default collector and applier), on 10 s intervals with a 30 s half-life and thresholds that a
greedy project of this host crosses within a minute (tests/support/protection.py says which).

Phases, in this order, on the same guests:

- ``baseline``: the greedy guests paused; the moderate jobs' uncontended time (gmd on);
- ``off``, ``dry-run``, ``on``: the greedy load started at the phase's start, gmd's mode as named
  (``on`` with weights and caps, as etc/gmd.toml's level table);
- ``weights``, ``caps``: ``on`` with only the weights (no cap at any level) or only the caps
  (weight factors 1);
- ``idle-off``, ``idle-on``: the moderate guests paused, the greedy project alone on the host,
  gmd off and on: what gmd costs the greedy project where nobody else wants the host.

Figures, as JSON on the last line: per phase the moderate jobs' completion time over the
baseline's median (median and p90; by the greedy project's level when each job started; and
``top_level``: the jobs started while it stood at the highest level it reached; ``protected``:
those started while it stood at level 1 or above and had for an interval), each
project's CPU share of the host against its fair share (an equal share of the projects
running), the seconds from the greedy load's start to gmd's first change of a greedy guest,
to its first CPU cap and to the moderate jobs' recovery (the end of the first job from which
five in a row have a median within 1.25× of the baseline), the greedy project's cores while
capped against what its caps allowed, and once its level no longer changed; the host's
capabilities (``gmd-agent --check``), cores and load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gmd.wire import PlanMode  # noqa: E402
from tests.support.protection import (  # noqa: E402
    BOUND,
    HOST,
    Console,
    Knobs,
    Phase,
    PhaseResult,
    booted,
    enforcement,
    quantile,
    recovery_s,
    run_phase,
    stop_on_sigterm,
)

PHASES = ("baseline", "off", "dry-run", "on", "weights", "caps", "idle-off", "idle-on")


def phase_of(name: str, args: argparse.Namespace) -> Phase:
    if name == "baseline":
        return Phase(name, args.baseline_s, greedy=False)
    if name in ("off", "dry-run"):
        return Phase(name, args.contended_s, greedy=True, mode=PlanMode(name))
    if name in ("on", "weights", "caps"):
        return Phase(
            name,
            args.on_s,
            greedy=True,
            knobs=Knobs.both if name == "on" else Knobs(name),
            protected_jobs=args.protected_jobs,
            max_seconds=max(args.on_s, args.on_max_s),
        )
    if name == "idle-off":
        return Phase(name, args.idle_s, greedy=True, moderate=False, mode=PlanMode.off)
    if name == "idle-on":
        return Phase(name, args.on_s, greedy=True, moderate=False)
    raise ValueError(name)


def settled_after(r: PhaseResult) -> float:
    """Seconds into the phase after which the greedy project's level no longer changed."""
    last = 0.0
    for (_, a), (t, b) in zip(r.levels, r.levels[1:], strict=False):
        if a != b:
            last = t
    return last


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def figures(results: list[PhaseResult], baseline_s: float, host_cores: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_name: dict[str, list[PhaseResult]] = {}
    for r in results:
        by_name.setdefault(r.phase.name, []).append(r)
    for name, runs in by_name.items():
        ratios = [x for r in runs for x in r.ratios(baseline_s)]
        protected = [x for r in runs if r.max_level > 0 for x in r.ratios(baseline_s, 1)]
        top = [
            job.seconds / baseline_s
            for r in runs
            for job in r.jobs
            if r.max_level > 0 and r.level_at(job) == r.max_level
        ]
        projects = sorted({p for r in runs for p in r.cores})
        running = 1 + (len(projects) - 1 if runs[0].phase.moderate else 0)
        if not runs[0].phase.greedy:
            running -= 1
        shares = {
            p: _r(statistics.mean(r.cores.get(p, 0.0) for r in runs) / host_cores) for p in projects
        }
        after = [settled_after(r) for r in runs]
        greedy_settled = [
            _settled_cores(r, s) for r, s in zip(runs, after, strict=True) if r.phase.greedy
        ]
        by_level: dict[int, list[float]] = {}
        for r in runs:
            for job in r.jobs:
                by_level.setdefault(r.level_at(job), []).append(job.seconds / baseline_s)
        out[name] = {
            "seconds": runs[0].phase.seconds,
            "mode": runs[0].phase.mode,
            "knobs": runs[0].phase.knobs,
            "jobs": len(ratios),
            "ratio_median": _r(quantile(ratios, 0.5)),
            "ratio_p90": _r(quantile(ratios, 0.9)),
            "ratio_median_by_level": {
                str(level): _r(statistics.median(v)) for level, v in sorted(by_level.items())
            },
            "jobs_by_level": {str(level): len(v) for level, v in sorted(by_level.items())},
            "protected_jobs": len(protected),
            "protected_ratio_median": _r(quantile(protected, 0.5)),
            "top_level_jobs": len(top),
            "top_level_ratio_median": _r(quantile(top, 0.5)),
            "top_level_ratio_p90": _r(quantile(top, 0.9)),
            "cpu_share_of_host": shares,
            "fair_share": _r(1 / max(1, running)),
            "greedy_cores_settled": [_r(c) for c in greedy_settled],
            "greedy_cores_settled_after_s": [_r(a, 1) for a in after],
            "max_level": [r.max_level for r in runs],
            "first_throttle_s": [_r(r.first_throttle_s, 1) for r in runs],
            "first_cap_s": [_r(r.first_cap_s, 1) for r in runs],
            "recovery_s": [_r(recovery_s(r, baseline_s), 1) for r in runs],
            "greedy_cores_capped": [_r(r.greedy_capped_cores) for r in runs],
            "greedy_cores_cap_allowed": [_r(r.greedy_cap_cores) for r in runs],
        }
    return out


def _settled_cores(r: PhaseResult, after_s: float) -> float | None:
    """The greedy project's cores from ``after_s`` into the phase to its end."""
    window = [(t, c) for t, c in r.greedy_cpu if t - r.began >= after_s]
    if len(window) < 2:
        return None
    (t0, c0), (t1, c1) = window[0], window[-1]
    return (c1 - c0) / (t1 - t0)


def capabilities(workdir: Path, uri: str) -> Any:
    config = workdir / "check.toml"
    config.write_text(f'[agent]\nhost = "{HOST}"\nlibvirt_uri = "{uri}"\n')
    done = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "gmd-agent"),
            "--config",
            str(config),
            "--check",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"error": (done.stderr.strip().splitlines() or ["no answer"])[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order")
    parser.add_argument("--rounds", type=int, default=1, help="the phases this many times")
    parser.add_argument("--greedy-vms", type=int, default=3)
    parser.add_argument("--greedy-vcpus", type=int, default=1)
    parser.add_argument("--moderates", type=int, default=2)
    parser.add_argument("--job-loops", type=int, default=100_000)
    parser.add_argument("--job-pause-s", type=float, default=2.0)
    parser.add_argument("--baseline-s", type=float, default=60.0)
    parser.add_argument("--contended-s", type=float, default=90.0)
    parser.add_argument("--on-s", type=float, default=150.0)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument(
        "--weight-factors",
        default=None,
        help="comma-separated, one per level from 1: the level table's weight factors for the"
        " phases with gmd's weights (not caps, whose factors are 1; default: etc/gmd.toml's)",
    )
    parser.add_argument(
        "--protected-jobs",
        type=int,
        default=0,
        help="on, weights, caps: go on past --on-s until this many moderate jobs started while"
        " the greedy project stood at level 1 or above, up to --on-max-s",
    )
    parser.add_argument("--on-max-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.weight_factors:
        try:
            overrides["weight_factors"] = [float(x) for x in args.weight_factors.split(",")]
        except ValueError:
            parser.error(f"--weight-factors: {args.weight_factors!r} is not numbers and commas")
    names = [n.strip() for n in args.phases.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PHASES))
    if unknown:
        parser.error(f"--phases: {', '.join(unknown)} not among {', '.join(PHASES)}")
    if "baseline" not in names:
        parser.error("--phases: baseline is needed (the ratios are over its median)")
    if os.geteuid() != 0:
        parser.error("run as root: the guests run under the system libvirtd")
    stop_on_sigterm()
    load_before = os.getloadavg()
    results: list[PhaseResult] = []
    with tempfile.TemporaryDirectory(prefix="gmd-protection-") as tmp:
        workdir = Path(tmp)
        with booted(
            workdir,
            greedy_vms=args.greedy_vms,
            greedy_vcpus=args.greedy_vcpus,
            moderates=args.moderates,
            job_loops=args.job_loops,
            job_pause_s=args.job_pause_s,
        ) as host:
            caps = capabilities(workdir, host.uri)
            console = Console(host.moderate)
            for k in range(args.rounds):
                for name in names:
                    phase = phase_of(name, args)
                    began = time.monotonic()
                    # caps keeps weight factors 1: its point is the caps alone
                    mine = {} if phase.knobs is Knobs.caps else overrides
                    r = run_phase(workdir / f"round{k}", host, phase, console, mine)
                    results.append(r)
                    done = [round(j.seconds, 2) for j in r.jobs]
                    print(
                        f"round {k + 1} {name}: {time.monotonic() - began:.0f} s, jobs {done}, "
                        f"cores { ({p: round(c, 2) for p, c in r.cores.items()}) }, levels "
                        f"{[lv for _, lv in r.levels]}",
                        file=sys.stderr,
                        flush=True,
                    )
    base = [j.seconds for r in results if r.phase.name == "baseline" for j in r.jobs]
    if not base:
        print("protection: the baseline completed no job", file=sys.stderr)
        return 1
    baseline_s = statistics.median(base)
    host_cores = os.cpu_count() or 1
    result = {
        "benchmark": "protection",
        "host": {
            "kernel": platform.release(),
            "cores": host_cores,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "capabilities": caps,
        },
        "setup": {
            "greedy_vms": args.greedy_vms,
            "greedy_vcpus": args.greedy_vcpus,
            "moderates": args.moderates,
            "job_loops": args.job_loops,
            "job_pause_s": args.job_pause_s,
            "rounds": args.rounds,
            "enforcement": enforcement(PlanMode.on, **overrides),
        },
        "baseline_job_s": {
            "median": round(baseline_s, 3),
            "p90": _r(quantile(base, 0.9)),
            "jobs": len(base),
        },
        "bound": BOUND,
        "phases": figures(results, baseline_s, host_cores),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
