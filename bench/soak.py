"""The soak (issue 44): gmd's real processes under faults drawn from a seed, against an oracle.

    python bench/soak.py --seconds 3600 --seeds 1,2,3            # PostgreSQL, then SQLite
    python bench/soak.py --seconds 300 --seeds 7 --backend sqlite

Each run (a seed on a backend) starts a PostgreSQL cluster of its own with a streaming replica
(or a SQLite ledger), gmd-daemons (two sharing the port on PostgreSQL), and three hosts whose
gmd-agents replay known usage live through TCP proxies of the soak's; it injects the faults the
seed draws (:class:`tests.support.soak.Kind`), singly and overlapping, heals them, lets every
replay end and every interval be accounted, and checks what the ledger holds against what the
agents replayed and against an independent recomputation (:mod:`tests.support.soak`). Run as
root to include full filesystems (tmpfs mounted under the spools and the SQLite ledger).

Prints progress, then one JSON line per run, then the summary as JSON on the last line: run
time, faults by kind, samples checked, lost, doubled, late (allowed or not), figures off. On a
violation the run's JSON holds the seed and the fault trail that reproduce it, and the exit
code is 1 (2: the soak itself could not run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.soak import (
    Backend,
    SoakError,
    check,
    figures,
    soak,
    teardown,
    trail_json,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=3600.0, help="soak time per run")
    p.add_argument("--seeds", default="1", help="comma-separated seeds (one run each)")
    p.add_argument(
        "--backend", choices=["postgres", "sqlite", "both"], default="both", help="the ledger"
    )
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--vms", type=int, default=4, help="VMs per host")
    p.add_argument("--root", type=Path, default=None, help="keep the runs' files here")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: comma-separated whole numbers")
    backends = (
        [Backend.postgres, Backend.sqlite] if args.backend == "both" else [Backend(args.backend)]
    )
    root = args.root or Path(tempfile.mkdtemp(prefix="gmd-soak-"))
    runs = []
    for seed in seeds:
        for backend in backends:
            began = time.monotonic()
            try:
                run = soak(
                    root / f"{backend}-{seed}",
                    seed,
                    args.seconds,
                    backend,
                    args.hosts,
                    args.vms,
                    say=lambda m: print(m, flush=True),
                )
            except SoakError as exc:
                print(f"soak: seed {seed} on {backend}: could not run: {exc}", file=sys.stderr)
                return 2
            except Exception as exc:  # the harness's own failure: said in one line, kept whole
                where = root / f"{backend}-{seed}" / "harness-error.txt"
                where.parent.mkdir(parents=True, exist_ok=True)
                where.write_text(traceback.format_exc())
                print(
                    f"soak: seed {seed} on {backend}: the harness failed: {type(exc).__name__}:"
                    f" {exc} (traceback in {where})",
                    file=sys.stderr,
                )
                return 2
            try:
                found = check(run)
            finally:
                teardown(run.world)
            (root / f"{backend}-{seed}" / "trail.json").write_text(trail_json(run))
            result = figures(run, found, time.monotonic() - began)
            runs.append(result)
            print(json.dumps(result), flush=True)
    summary = {
        "benchmark": "soak",
        "runs": len(runs),
        "seeds": seeds,
        "soak_s": sum(r["duration_s"] for r in runs),
        "faults": sum(r["faults"] for r in runs),
        "fault_kinds": sorted({k for r in runs for k in r["faults_by_kind"]}),
        "faults_by_kind": {
            k: sum(r["faults_by_kind"].get(k, 0) for r in runs)
            for k in sorted({k for r in runs for k in r["faults_by_kind"]})
        },
        "samples_checked": sum(r["samples_checked"] for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "doubled": sum(r["doubled"] for r in runs),
        "off": sum(r["off"] for r in runs),
        "late_allowed": sum(r["late_allowed"] for r in runs),
        "late_unexplained": sum(r["late_unexplained"] for r in runs),
        "figures_checked": sum(r["figures_checked"] for r in runs),
        "figures_off": sum(r["figures_off"] for r in runs),
        "violations": sum(r["violations"] for r in runs),
        "root": str(root),
    }
    print(json.dumps(summary), flush=True)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
