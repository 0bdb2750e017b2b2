"""``make reproduce``: run the protocol's studies, keep their per-draw values, write the tables.

``python -m gmd.sim.reproduce run --pwa DIR`` runs every study of
``docs/reproduction-protocol.toml`` on the Parallel Workloads Archive's logs in ``DIR``
(their SHA-256 checked against the protocol), each (study, seed, trace) run cached under
``--cache`` so that an interrupted reproduction resumes where it stopped, and writes
``docs/reproduction-results.json``: per run, every draw's value for every policy, and whether
the draw was contended. ``render`` rewrites the tables of ``docs/reproduction.md`` between
their markers from the results alone; ``check`` says whether the document, the results and
the protocol agree (exit 1 when not). Runs use every core through
:func:`gmd.sim.experiment.run_experiment`; one line per run on stderr says how far it is.

Exit codes: 0 done (``check``: in step), 1 ``check`` found a difference, 2 a bad option, a
missing trace or a digest that does not match.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gmd import GmdError
from gmd.sim.command import is_contended
from gmd.sim.experiment import ExperimentConfig, ExperimentResult, run_experiment
from gmd.sim.placement import falb_runs
from gmd.sim.protocol import SHIPPED, Protocol, Study, StudyKind, load_protocol
from gmd.sim.swf import SwfLog, peak_processors, read_swf

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "docs" / "reproduction-protocol.toml"
RESULTS = REPO / "docs" / "reproduction-results.json"
DOCUMENT = REPO / "docs" / "reproduction.md"
SHIPPED_DIR = REPO / "tests" / "data" / "pwa"
RUN_FORMAT = 3
"""the cached runs' layout (3: FALB's with each policy's last start, keys of plain values); a
run cached in another is run again"""
DIGITS = 9
"""significant digits kept per value: the tables are computed from the values as stored"""


class TraceProblem(GmdError, ValueError):
    """A log the protocol needs is missing or is not the archive's."""


def trace_path(name: str, pwa: Path | None, protocol: Protocol) -> Path:
    """Where a study's trace is, checked against the protocol's digest."""
    if name.startswith(SHIPPED):
        return SHIPPED_DIR / name.removeprefix(SHIPPED)
    if pwa is None:
        raise TraceProblem(
            f"{name}: give the directory of the Parallel Workloads Archive's logs (PWA=DIR);"
            " they are at https://www.cs.huji.ac.il/labs/parallel/workload/"
        )
    path = pwa / name
    if not path.is_file():
        raise TraceProblem(
            f"{path}: no such file (download it from the Parallel Workloads Archive)"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != protocol.traces[name]:
        raise TraceProblem(f"{path}: SHA-256 {digest[:12]}… is not the protocol's")
    return path


def _rounded(value: float | None) -> float | None:
    if value is None or value != value:
        return None
    return float(f"{value:.{DIGITS}g}")


def experiment_run(result: ExperimentResult, key: str) -> dict[str, Any]:
    """One run's draws as the results keep them: per draw, each policy's value of ``key``
    (``unfairness`` or ``cloudshare_unfairness``) and whether it was contended."""
    policies = [p for p in result.policies if p != "Ref"]
    values, contended, background = [], [], []
    for sample in result.samples:
        outcomes = {n: {"wait_s": o.wait_s} for n, o in sample.outcomes.items()}
        values.append([_rounded(getattr(sample.outcomes[p], key)) for p in policies])
        contended.append(is_contended({"outcomes": outcomes, "overload_s": sample.overload_s}))
        background.append(_rounded(sample.background_work))
    run: dict[str, Any] = {"policies": policies, "values": values, "contended": contended}
    if result.config.background:
        run["background_work"] = background
    return run


def run_study(
    study: Study,
    protocol: Protocol,
    pwa: Path | None,
    cache: Path,
    workers: int | None,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Every (seed, trace) run of one study, from the cache where it has them."""
    runs = []
    traces: dict[str, SwfLog] = {}
    plan = [(seed, trace) for seed in study.seeds for trace in study.traces or ("",)]
    for n, (seed, trace) in enumerate(plan, 1):
        key = json.dumps([study.id, seed, trace, _fingerprint(study)], sort_keys=True)
        cached = cache / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
        label = f"{study.id} seed {seed}" + (f" {trace}" if trace else "")
        if cached.is_file():
            runs.append(json.loads(cached.read_text()))
            say(f"[{n}/{len(plan)}] {label}: cached")
            continue
        began = time.monotonic()
        if study.kind == StudyKind.falb:
            assert study.falb is not None
            found = falb_runs(study.falb, seed)
            run: dict[str, Any] = {
                "policies": list(found),
                "values": [[_rounded(r.makespan_s) for r in found.values()]],
                "contended": [True],
                "last_start": [_rounded(r.last_start_s) for r in found.values()],
            }
        else:
            if trace not in traces:
                traces[trace] = read_swf(trace_path(trace, pwa, protocol))
            result = run_experiment(
                _config(study, seed, trace, traces[trace]), workers=workers, trace=traces[trace]
            )
            run = experiment_run(
                result, "unfairness" if study.kind == StudyKind.spaa else "cloudshare_unfairness"
            )
        run.update({"seed": seed, "trace": trace})
        cache.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(run))
        runs.append(run)
        say(f"[{n}/{len(plan)}] {label}: {time.monotonic() - began:.0f} s")
    return runs


def _fingerprint(study: Study) -> str:
    """What a cached run depends on, as plain values (not the title, not the paper's figures;
    no class name, so that renaming one in the code keeps the cache)."""
    f = study.falb
    return json.dumps(
        {
            "kind": study.kind.value,
            "policies": list(study.policies),
            "windows": study.windows,
            "window_s": study.window_s,
            "orgs": study.orgs,
            "total_processors": study.total_processors,
            "processors": study.processors,
            "unit_s": study.unit_s,
            "background": study.background,
            "deal": study.deal.value,
            "processor_scale": study.processor_scale,
            "falb": None
            if f is None
            else [f.scenario.value, f.jitter, f.arrival.value, f.gap_s, f.tie.value],
            "format": RUN_FORMAT,
        },
        sort_keys=True,
    )


def _config(study: Study, seed: int, trace: str, log: SwfLog) -> ExperimentConfig:
    cloudshare = study.kind == StudyKind.cloudshare
    total = study.total_processors
    if total is None and study.processor_scale != 1.0:
        total = round(study.processor_scale * (log.max_procs or peak_processors(log)))
    return ExperimentConfig(
        trace=trace,
        window_s=study.window_s,
        samples=study.windows,
        n_orgs=study.orgs,
        policies=study.policies if cloudshare else ("Ref", *study.policies),
        seed=seed,
        processors=study.processors,
        total_processors=total,
        unit_s=study.unit_s,
        cloudshare=cloudshare,
        reference=not cloudshare,
        background=study.background,
        deal=study.deal,
    )


def run_protocol(
    protocol: Protocol,
    pwa: Path | None,
    cache: Path,
    workers: int | None,
    only: set[str] | None = None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """The results document: the protocol's digest and every study's runs."""
    studies = {}
    for study in protocol.studies:
        if only and study.id not in only:
            continue
        studies[study.id] = {"runs": run_study(study, protocol, pwa, cache, workers, say)}
    return {"protocol": protocol.digest, "studies": studies}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gmd.sim.reproduce",
        description="Run the reproductions' protocol and write docs/reproduction.md's tables.",
        epilog="exit codes: 0 done or in step, 1 check found a difference, 2 bad input",
    )
    parser.add_argument("action", choices=("run", "render", "check"))
    parser.add_argument("--pwa", type=Path, default=None, help="directory of the PWA's logs")
    parser.add_argument("--cache", type=Path, default=REPO / "var" / "reproduce")
    parser.add_argument("--workers", type=int, default=None, help="default: every core")
    parser.add_argument("--only", action="append", default=None, help="a study id (repeatable)")
    parser.add_argument("--protocol", type=Path, default=PROTOCOL)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--document", type=Path, default=DOCUMENT)
    args = parser.parse_args(argv)
    from gmd.sim.report import check_document, write_document

    try:
        protocol = load_protocol(args.protocol)
        if args.action == "run":
            results = run_protocol(
                protocol, args.pwa, args.cache, args.workers, set(args.only or ())
            )
            if args.only:  # keep the other studies' runs
                old = json.loads(args.results.read_text()) if args.results.is_file() else {}
                kept = old.get("studies", {}) if old.get("protocol") == protocol.digest else {}
                results["studies"] = {**kept, **results["studies"]}
            args.results.write_text(json.dumps(results, indent=None, separators=(",", ":")) + "\n")
            print(f"wrote {args.results}", file=sys.stderr)
        results = json.loads(args.results.read_text())
        if args.action == "check":
            problems = check_document(protocol, results, args.document.read_text())
            for line in problems:
                print(line, file=sys.stderr)
            return 1 if problems else 0
        write_document(protocol, results, args.document)
        print(f"wrote {args.document}", file=sys.stderr)
    except (OSError, ValueError, KeyError) as exc:
        print(f"gmd.sim.reproduce: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
