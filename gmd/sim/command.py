"""``gmd-admin simulate`` and ``python -m gmd.sim``: options in, printable text out.

The CLI layers only parse arguments and print what ``run_simulate`` returns; every bad input
becomes a ``ValueError`` naming the option.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from gmd import OptionError
from gmd.render import FORMATS, Column, csv_text, json_text, table_text
from gmd.sim.experiment import ExperimentConfig, ExperimentResult, run_experiment
from gmd.sim.placement import PolicyResult, Scenario
from gmd.sim.workload import PROCESSOR_MODES, read_assignment

DEFAULT_POLICIES: tuple[str, ...] = (
    "Ref",
    "Rand:15",
    "ORIG_DIRECT",
    "REL_DIRECT",
    "SIMPL_DIRECT",
    "FairShare",
    "UtFairShare",
    "CurrFairShare",
    "RoundRobin",
    "RRDF",
)


@dataclasses.dataclass(frozen=True)
class SimulateOptions:
    """The simulator's options as its command lines take them (``gmd-admin simulate``,
    ``python -m gmd.sim``): one object from the command line to the experiment, checked once
    (:meth:`experiment`)."""

    trace: str | Path
    window_s: int = 86400
    samples: int = 10
    organizations: int = 5
    policies: Sequence[str] = ()
    """empty: :data:`DEFAULT_POLICIES`"""
    seed: int = 0
    processors: str = "equal"
    workers: int | None = None
    """processes; None: every core"""
    progress: bool = True
    """a progress bar on a terminal's stderr"""
    total_processors: int | None = None
    unit_s: int | None = None
    cloudshare: bool = False
    assignment: str | Path | None = None
    """a file of "USER ORGANIZATION" lines (else users are dealt at random per sample)"""
    reference: bool = True

    def experiment(self) -> ExperimentConfig:
        """The experiment these options describe; :class:`~gmd.OptionError` naming the option
        at fault."""
        trace = Path(self.trace)
        if not trace.is_file():
            raise OptionError(f"--trace {trace}: no such file")
        if self.processors not in PROCESSOR_MODES:
            raise OptionError(
                f"--processors {self.processors!r}: choose one of {', '.join(PROCESSOR_MODES)}"
            )
        for option, value in (
            ("--window", self.window_s),
            ("--samples", self.samples),
            ("--orgs", self.organizations),
        ):
            if value < 1:
                raise OptionError(f"{option} {value}: must be at least 1")
        if self.workers is not None and self.workers < 1:
            raise OptionError(f"--workers {self.workers}: must be at least 1")
        org_of_user = None
        if self.assignment is not None:
            org_of_user, names = read_assignment(self.assignment)
            if len(names) != self.organizations:
                raise OptionError(
                    f"--assignment {self.assignment} names {len(names)} organizations, --orgs is "
                    f"{self.organizations}"
                )
        return ExperimentConfig(
            trace=str(trace),
            window_s=int(self.window_s),
            samples=int(self.samples),
            n_orgs=int(self.organizations),
            policies=tuple(self.policies) or DEFAULT_POLICIES,
            seed=int(self.seed),
            processors=self.processors,
            total_processors=self.total_processors,
            unit_s=self.unit_s,
            cloudshare=self.cloudshare,
            org_of_user=org_of_user,
            reference=self.reference,
        )


def run_simulate(options: SimulateOptions, fmt: str = "table") -> str:
    """Simulate and return the results table (or CSV/JSON) as text."""
    if fmt not in FORMATS:
        raise OptionError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return render(simulate(options), fmt)


def simulate(options: SimulateOptions) -> ExperimentResult:
    """Check the options and simulate. Raises ValueError naming the option at fault (an
    :class:`~gmd.OptionError`, or the trace's or policy's own)."""
    config = options.experiment()
    with _progress_bar(options.progress and sys.stderr.isatty(), config.samples) as advance:
        return run_experiment(config, workers=options.workers, progress=advance)


def _progress_bar(enabled: bool, total: int):
    if not enabled:
        return nullcontext(None)
    from contextlib import contextmanager

    from rich.progress import Progress

    @contextmanager
    def bar():
        with Progress(transient=True) as prog:
            task = prog.add_task("samples", total=total)
            advance: Callable[[int, int], None] = lambda done, _n: prog.update(  # noqa: E731
                task, completed=done
            )
            yield advance

    return bar()


@dataclasses.dataclass(frozen=True)
class Shown:
    """A simulation's results as every format shows them."""

    rows: list[dict[str, Any]]
    columns: list[Column]
    caption: str
    document: dict[str, Any]
    """for JSON: the configuration, the per-policy rows (under "policies") and every sample"""


def shown(result: ExperimentResult) -> Shown:
    rows = result.summary()
    for row in rows:
        for key in ("wait_s_mean", "wait_s_std"):
            row[key.replace("_s_", "_h_")] = row[key] / 3600.0
    columns = [
        Column("policy", "policy", justify="left"),
        Column("unfairness_mean", "Δψ/p mean", 2),
        Column("unfairness_std", "Δψ/p std", 2),
        Column("wait_h_mean", "wait (h) mean", 1),
        Column("wait_h_std", "wait (h) std", 1),
        Column("utilization_mean", "utilization", 3),
    ]
    if result.config.cloudshare:
        columns += [Column("score", "score", None), Column("score_share", "score share", 3)]
    config = dataclasses.asdict(result.config)
    config["org_of_user"] = None if config["org_of_user"] is None else "file"
    document = {
        "config": config,
        "policies": [_finite(r) for r in rows],
        "samples": [_finite(dataclasses.asdict(s)) for s in result.samples],
    }
    c = result.config
    caption = (
        f"{Path(c.trace).name}: {c.samples} samples of {c.window_s} s, {c.n_orgs} organizations "
        f"({c.processors} processors), seed {c.seed}. Δψ/p: SPAA's unfairness against Ref"
        + ("; score: CloudShare's pairwise wins." if c.cloudshare else ".")
    )
    return Shown(rows, columns, caption, document)


def placement_shown(
    results: Sequence[PolicyResult], scenario: Scenario, seeds: int, jitter: float
) -> Shown:
    """FALB's experiment (:func:`gmd.sim.placement.falb_experiment`) as ``gmd-admin
    simulate-placement`` shows it: per policy, each figure's mean over the seeds and its 95 %
    interval's half-width."""
    figures = (
        ("makespan_s", "total execution time (s)", 0),
        ("mean_gap", "mean utilisation gap", 3),
        ("max_deviation", "largest deviation", 3),
        ("rrdf_spread", "tenants' RRDF spread", 3),
    )
    rows: list[dict[str, Any]] = []
    columns = [Column("policy", "policy", justify="left")]
    for key, header, digits in figures:
        columns += [Column(key, header, digits), Column(f"{key}_ci95", "±", digits)]
    for r in results:
        row: dict[str, Any] = {"policy": r.policy}
        for key, _header, _digits in figures:
            estimate = getattr(r, key)
            row[key], row[f"{key}_ci95"] = estimate.mean, estimate.half_width
        rows.append(row)
    caption = (
        f"FALB (Chen & Lai), {scenario.value} scenario: Table 3's 4 tenants × 50 applications on"
        f" Table 1's nine workers; {seeds} seeds, run times ±{jitter:.0%}. Mean ± 95 % interval."
    )
    config = {"scenario": scenario.value, "seeds": seeds, "jitter": jitter}
    return Shown(rows, columns, caption, {"config": config, "policies": _finite(rows)})


def render(result: ExperimentResult, fmt: str) -> str:
    out = shown(result)
    if fmt == "csv":
        return csv_text(out.rows, out.columns)
    if fmt == "json":
        return json_text(out.document)
    return table_text(out.rows, out.columns, title="gmd simulate", caption=out.caption)


def _finite(value: object) -> object:
    """JSON has no NaN: unmeasured numbers become null."""
    if isinstance(value, float):
        return None if value != value or value in (float("inf"), float("-inf")) else value
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
