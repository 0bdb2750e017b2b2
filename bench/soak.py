"""The soak (issue 44): gmd's real processes under faults drawn from a seed, against an oracle.

    python bench/soak.py --seconds 3600 --seeds 1,2,3            # PostgreSQL, then SQLite
    python bench/soak.py --seconds 300 --seeds 7 --backend sqlite --no-federation

Each run (a seed on a backend) starts a PostgreSQL cluster of its own with a streaming replica
(or a SQLite ledger), gmd-daemons (two sharing the port on PostgreSQL), and three hosts whose
gmd-agents replay known usage live through TCP proxies of the soak's; it injects the faults the
seed draws (:class:`tests.support.soak.Kind`), singly and overlapping, heals them, lets every
replay end and every interval be accounted, and checks what the ledger holds against what the
agents replayed and against an independent recomputation (:mod:`tests.support.soak`). Run as
root to include full filesystems (tmpfs mounted under the spools and the SQLite ledger).

Beside each seed's PostgreSQL run (at the same time, on the same machine) runs the
federation's soak (:mod:`tests.support.soak_federation`, ``--no-federation`` to leave it out):
gmd-broker processes over a private ZooKeeper ensemble of Debian's, brokers killed and paused,
the ensemble's leader killed and a follower stopped, requests submitted throughout; its oracle
counts the requests doubled and lost.

Prints progress, then one JSON line per run, then the summary as JSON on the last line: run
time, faults by kind, samples checked, lost, doubled, late (allowed or not), figures off,
requests doubled and lost. On a
violation the run's JSON holds the seed and the fault trail that reproduce it, and the exit
code is 1 (2: the soak itself could not run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

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
    p.add_argument(
        "--federation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the federation's soak beside each seed's first run (needs ZooKeeper)",
    )
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: comma-separated whole numbers")
    backends = (
        [Backend.postgres, Backend.sqlite] if args.backend == "both" else [Backend(args.backend)]
    )
    if args.federation and not zookeeper_installed():
        print(
            "soak: ZooKeeper is not installed (tests/scripts/zookeeper.sh installs Debian's):"
            " install it, or run with --no-federation",
            file=sys.stderr,
        )
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="gmd-soak-"))
    runs = []
    federations: list[dict[str, Any]] = []
    for seed in seeds:
        beside = None
        if args.federation:
            beside = Beside(root / f"federation-{seed}", seed, args.seconds)
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
                if beside is not None:
                    beside.abandon()
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
                if beside is not None:
                    beside.abandon()
                return 2
            try:
                found = check(run)
            finally:
                teardown(run.world)
            (root / f"{backend}-{seed}" / "trail.json").write_text(trail_json(run))
            result = figures(run, found, time.monotonic() - began)
            runs.append(result)
            print(json.dumps(result), flush=True)
            if beside is not None:
                outcome = beside.result()
                beside = None
                if "error" in outcome:
                    print(f"soak: federation, seed {seed}: {outcome['error']}", file=sys.stderr)
                    return 2
                federations.append(outcome)
                print(json.dumps(outcome), flush=True)
    every = [*runs, *federations]
    kinds = sorted({k for r in every for k in r["faults_by_kind"]})
    summary = {
        "benchmark": "soak",
        "runs": len(runs),
        "seeds": seeds,
        "soak_s": sum(r["duration_s"] for r in runs),
        "faults": sum(r["faults"] for r in every),
        "fault_kinds": kinds,
        "faults_by_kind": {k: sum(r["faults_by_kind"].get(k, 0) for r in every) for k in kinds},
        "samples_checked": sum(r["samples_checked"] for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "doubled": sum(r["doubled"] for r in runs),
        "off": sum(r["off"] for r in runs),
        "late_allowed": sum(r["late_allowed"] for r in runs),
        "late_unexplained": sum(r["late_unexplained"] for r in runs),
        "figures_checked": sum(r["figures_checked"] for r in runs),
        "figures_off": sum(r["figures_off"] for r in runs),
        "unvouched": sum(r["unvouched"] for r in runs),
        "federation_runs": len(federations),
        "requests_accepted": sum(f["requests_accepted"] for f in federations),
        "requests_completed": sum(f["requests_completed"] for f in federations),
        "requests_removed_by_design": sum(f["removed_allowed"] for f in federations),
        "requests_doubled": sum(f["doubled"] for f in federations),
        "requests_lost": sum(f["lost"] for f in federations),
        "zookeeper_rolled_back": sum(bool(f["zookeeper_rolled_back"]) for f in federations),
        "violations": sum(r["violations"] for r in every),
        "root": str(root),
    }
    print(json.dumps(summary), flush=True)
    return 1 if summary["violations"] else 0


def zookeeper_installed() -> bool:
    from tests.support.zookeeper import CLASSPATH

    return all(Path(p).exists() for p in CLASSPATH.split(":")[1:])


class Beside:
    """The federation's soak of one seed, in a thread beside the ledger's runs."""

    def __init__(self, root: Path, seed: int, seconds: float) -> None:
        self._out: dict[str, Any] = {}
        self._run: Any = None
        self._thread = threading.Thread(
            target=self._soak, args=(root, seed, seconds), daemon=True, name="federation-soak"
        )
        self._thread.start()

    def _soak(self, root: Path, seed: int, seconds: float) -> None:
        from tests.support.soak_federation import figures as fed_figures, soak_federation

        try:
            run = self._run = soak_federation(
                root, seed, seconds, say=lambda m: print(f"[federation] {m}", flush=True)
            )
            try:
                found = run.fed.check()
            finally:
                run.fed.teardown()
            self._out = {"part": "federation", **fed_figures(run, found)}
        except Exception as exc:  # the harness's own failure: one line, kept whole on disk
            root.mkdir(parents=True, exist_ok=True)
            (root / "harness-error.txt").write_text(traceback.format_exc())
            self._out = {"error": f"{type(exc).__name__}: {exc} (traceback in {root})"}

    def result(self) -> dict[str, Any]:
        self._thread.join()
        return self._out

    def abandon(self) -> None:
        """The ledger's run failed: wait for the federation's to end (it tears itself down)."""
        self._thread.join()


if __name__ == "__main__":
    sys.exit(main())
