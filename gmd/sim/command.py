"""``gmd-admin simulate`` and ``python -m gmd.sim``: options in, printable text out.

The CLI layers only parse arguments and print what ``run_simulate`` returns; every bad input
becomes a ``ValueError`` naming the option.

``--bootstrap N`` adds, per fairness measure the run has (Δψ/p with Ref, CloudShare's
unfairness with ``--cloudshare``), every pair of policies with a bootstrap interval over the
*contended* samples (:mod:`gmd.sim.bootstrap`). A sample is contended when some federation job
waited for a processor (so all of them were busy) under the policies compared, and its jobs,
each started at its release, need more than the processors for more than ``--contention`` of
its window (default 0: at any moment; :func:`gmd.sim.measures.overload_s`). Without background
load the two halves say the same, and then of every greedy policy; with it, the first leaves
out samples where only local jobs waited. In an uncontended sample every policy makes the same
schedule and every difference is 0 (CloudShare's unit pieces make each coalition's total wait
the same under every policy too), so counting it would only dilute the differences, never
change their sign. :func:`pooled_text` does the same over the samples of several runs' JSON
(several traces, CloudShare's totals).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from gmd import OptionError
from gmd.common.units import DAY_S
from gmd.render import FORMATS, Column, csv_text, json_text, table_text
from gmd.sim.bootstrap import DEFAULT_CONFIDENCE, Ordering, Statistic, orderings
from gmd.sim.experiment import ExperimentConfig, ExperimentResult, run_experiment
from gmd.sim.placement import FalbInputs, PolicyResult
from gmd.sim.placement_kinds import FalbScenario
from gmd.sim.policies import parse_policy
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
    window_s: int = DAY_S
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
    background: float = 0.0
    """the share of each organization's users that are local (CloudShare's Scenario 3)"""
    bootstrap: int = 0
    """resamples of the orderings' intervals; 0: no orderings"""
    contention: float = 0.0
    """a contended sample must also be overloaded for more than this share of its window"""

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
        check_bootstrap(self.bootstrap, self.contention)
        if not 0.0 <= self.background < 1.0:
            raise OptionError(
                f"--background {self.background}: the share of local users must be in [0, 1)"
            )
        coalitional = [p for p in self.policies or DEFAULT_POLICIES if _is_coalitional(p)]
        if self.background and (self.reference or coalitional):
            fixes = (["add --no-ref"] if self.reference else []) + (
                [f"leave out {', '.join(coalitional)}"] if coalitional else []
            )
            raise OptionError(
                f"--background {self.background}: Ref and Rand do not model background load; "
                + " and ".join(fixes)
            )
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
            background=float(self.background),
        )


def check_bootstrap(resamples: int, contention: float) -> None:
    """:class:`~gmd.OptionError` for a ``--bootstrap`` or ``--contention`` out of range."""
    if resamples < 0:
        raise OptionError(f"--bootstrap {resamples}: must be 0 (none) or more resamples")
    if contention < 0:
        raise OptionError(f"--contention {contention}: a share of the window, at least 0")


def _is_coalitional(name: str) -> bool:
    try:
        return parse_policy(name).is_coalitional
    except ValueError:
        return False  # an unknown name is reported where the policies are resolved


def run_simulate(options: SimulateOptions, fmt: str = "table") -> str:
    """Simulate and return the results table (or CSV/JSON) as text, with the orderings'
    intervals when ``options.bootstrap`` asks for them."""
    if fmt not in FORMATS:
        raise OptionError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    result = simulate(options)
    return render(result, fmt, options.bootstrap, options.contention)


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
    more: tuple[Shown, ...] = ()
    """further tables after this one (the orderings), already in ``document``"""


def shown(result: ExperimentResult, resamples: int = 0, contention: float = 0.0) -> Shown:
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
    if result.config.background:
        for row in rows:
            row["background_work"] = float(np.mean([s.background_work for s in result.samples]))
        columns.append(Column("background_work", "local work", 3))
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
        + ("; score: CloudShare's pairwise wins" if c.cloudshare else "")
        + (
            f"; {c.background:.0%} of each organization's users local (background load; local "
            "work: its share of all work)."
            if c.background
            else "."
        )
    )
    more: tuple[Shown, ...] = ()
    if resamples:
        more = tuple(ordering_tables([document], resamples, contention, c.seed))
        document["orderings"] = [t.document for t in more]
    return Shown(rows, columns, caption, document, more)


def placement_shown(results: Sequence[PolicyResult], inputs: FalbInputs, seeds: int) -> Shown:
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
    stream = (
        f", arriving {inputs.arrival.value} {inputs.gap_s:g} s apart"
        if inputs.scenario == FalbScenario.stream
        else ""
    )
    caption = (
        f"FALB (Chen & Lai), {inputs.scenario.value} scenario{stream}: Table 3's 4 tenants × 50"
        f" applications on Table 1's nine workers; {seeds} seeds, run times ±{inputs.jitter:.0%},"
        f" ties to the {inputs.tie.value} node. Mean ± 95 % interval."
    )
    config = {
        "scenario": inputs.scenario.value,
        "seeds": seeds,
        "jitter": inputs.jitter,
        "arrival": inputs.arrival.value,
        "gap_s": inputs.gap_s,
        "tie": inputs.tie.value,
    }
    return Shown(rows, columns, caption, {"config": config, "policies": _finite(rows)})


def render(result: ExperimentResult, fmt: str, resamples: int = 0, contention: float = 0.0) -> str:
    out = shown(result, resamples, contention)
    if fmt == "json":
        return json_text(out.document)
    return _text(out, fmt, "gmd simulate")


def _text(out: Shown, fmt: str, title: str) -> str:
    """A table (or CSV) and the ones after it, a blank line between them."""
    parts = []
    for i, part in enumerate((out, *out.more)):
        if fmt == "csv":
            parts.append(csv_text(part.rows, part.columns))
        else:
            name = title if i == 0 else f"{title}: orderings"
            parts.append(table_text(part.rows, part.columns, title=name, caption=part.caption))
    return "\n".join(parts)


class Measure(StrEnum):
    """A fairness measure a run may have, with how its orderings are judged."""

    spaa = "Δψ/p"
    cloudshare = "CloudShare unfairness"

    @property
    def key(self) -> str:
        """The outcome's field in a sample's JSON."""
        return "unfairness" if self == Measure.spaa else "cloudshare_unfairness"

    @property
    def statistic(self) -> Statistic:
        # SPAA's table compares means; CloudShare's counts pairwise wins (gmd.sim.bootstrap).
        return Statistic.mean_difference if self == Measure.spaa else Statistic.win_difference


FEW_SAMPLES = 10
"""Below this many samples a percentile bootstrap interval undercovers markedly (it cannot be
wider than the samples' own spread), so the caption warns."""

ORDERING_COLUMNS = [
    Column("fairer", "fairer", justify="left"),
    Column("other", "than", justify="left"),
    Column("advantage", "advantage", 3),
    Column("low", "CI low", 3),
    Column("high", "CI high", 3),
    Column("resolved", "resolved", None),
]


def ordering_tables(
    documents: Sequence[dict[str, Any]], resamples: int, contention: float, seed: int
) -> list[Shown]:
    """Per measure the runs share, every pair of policies with its bootstrap interval over the
    contended samples of all ``documents`` (runs' JSON documents; several are pooled, each
    resampled on its own).

    A measure whose runs have fewer than two contended samples gets a table with no rows and a
    caption that says so.
    """
    check_bootstrap(resamples, contention)
    if not documents:
        raise OptionError("no results to bootstrap")
    measures = [m for m in Measure if all(_has(d, m) for d in documents)]
    tables = []
    for measure in measures:
        names = _policies(documents, measure)
        values: list[list[float]] = []
        strata: list[int] = []
        total = 0
        for run, doc in enumerate(documents):
            window = float(doc["config"]["window_s"])
            for sample in doc["samples"]:
                total += 1
                if is_contended(sample, contention * window):
                    values.append([sample["outcomes"][n][measure.key] for n in names])
                    strata.append(run)
        matrix = np.array(values, dtype=np.float64).reshape(len(values), len(names))
        found: list[Ordering] = []
        if len(values) >= 2:
            order = _ranking(matrix, measure)
            names = [names[i] for i in order]
            matrix = matrix[:, order]
            found = orderings(
                matrix, names, measure.statistic, resamples=resamples, seed=seed, strata=strata
            )
        counts = (len(values), total, len(documents))
        tables.append(_ordering_shown(measure, found, counts, resamples, contention, seed))
    return tables


def is_contended(sample: dict[str, Any], overload_s: float = 0.0) -> bool:
    """Whether a sample (as its JSON has it) is contended: some federation job waited under a
    policy compared, and its jobs need more than the processors for more than ``overload_s``."""
    waited = any((o.get("wait_s") or 0) > 0 for o in sample["outcomes"].values())
    return waited and sample.get("overload_s", 0) > overload_s


def _has(document: dict[str, Any], measure: Measure) -> bool:
    config = document["config"]
    return bool(config.get("reference" if measure == Measure.spaa else "cloudshare"))


def _policies(documents: Sequence[dict[str, Any]], measure: Measure) -> list[str]:
    """The policies with the measure on every sample (Ref, Δψ/p's 0, excepted); the same in
    every run."""
    found: list[str] | None = None
    for doc in documents:
        samples = doc["samples"]
        names = [
            n
            for n in samples[0]["outcomes"]
            if n != "Ref" and all(s["outcomes"][n][measure.key] is not None for s in samples)
        ]
        if found is not None and names != found:
            raise OptionError(
                f"the runs compare different policies ({', '.join(found)} and {', '.join(names)})"
            )
        found = names
    return found or []


def _ranking(matrix: np.ndarray, measure: Measure) -> list[int]:
    """Columns fairest first: by mean for Δψ/p, by pairwise wins for CloudShare's points."""
    if measure.statistic == Statistic.mean_difference:
        key = matrix.mean(axis=0)
    else:
        key = -(matrix[:, None, :] > matrix[:, :, None]).sum(axis=(0, 2)).astype(np.float64)
    return [int(i) for i in np.argsort(key, kind="stable")]


def _ordering_shown(
    measure: Measure,
    found: Sequence[Ordering],
    counts: tuple[int, int, int],
    resamples: int,
    contention: float,
    seed: int,
) -> Shown:
    rows: list[dict[str, Any]] = [
        {
            "fairer": o.fairer,
            "other": o.other,
            "advantage": o.advantage,
            "low": o.low,
            "high": o.high,
            "resolved": o.resolved,
        }
        for o in found
    ]
    contended, total, runs = counts
    unit = (
        "advantage: the other's mean Δψ/p less the fairer's"
        if measure == Measure.spaa
        else "advantage: share of samples where the fairer is strictly fairer less the share "
        "where the other is"
    )
    rule = (
        ""
        if contention == 0
        else f", and its jobs need more than the processors for over {contention:.1%} of it"
    )
    pooled = f", pooled over {runs} runs (resampled within each)" if runs > 1 else ""
    caption = (
        f"{measure.value}: {contended} of {total} samples contended (a federation job waited "
        f"for a processor{rule}){pooled}; {unit}; "
        f"{DEFAULT_CONFIDENCE:.0%} percentile bootstrap interval, {resamples} resamples, seed "
        f"{seed}. Resolved: the interval excludes 0."
    )
    if contended < 2:
        caption += " Fewer than 2 contended samples: nothing to resolve."
    elif contended < FEW_SAMPLES:
        caption += (
            f" Fewer than {FEW_SAMPLES} contended samples: percentile intervals are too narrow"
            " there, read them as indicative."
        )
    document = {
        "measure": measure.value,
        "statistic": measure.statistic.value,
        "samples": total,
        "contended": contended,
        "contention": contention,
        "resamples": resamples,
        "seed": seed,
        "orderings": rows,
    }
    return Shown(rows, ORDERING_COLUMNS, caption, document)


def pooled_text(
    paths: Sequence[str | Path], resamples: int, contention: float, seed: int, fmt: str
) -> str:
    """The orderings over the samples of several runs' JSON (``--format json`` output), pooled:
    e.g. CloudShare's three traces, as its Table 1 sums them."""
    if fmt not in FORMATS:
        raise OptionError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if resamples < 1:
        raise OptionError("--pool needs --bootstrap N, N ≥ 1 resamples")
    documents = []
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
            if not (doc["config"]["window_s"] and doc["samples"][0]["outcomes"]):
                raise ValueError("no samples")
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise OptionError(f"--pool {path}: not a run's JSON ({exc})") from None
        documents.append(doc)
    tables = ordering_tables(documents, resamples, contention, seed)
    if not tables:
        raise OptionError("--pool: the runs share no fairness measure (Δψ/p or --cloudshare)")
    if fmt == "json":
        runs = [str(p) for p in paths]
        return json_text({"runs": runs, "orderings": [t.document for t in tables]})
    return "\n".join(
        csv_text(t.rows, t.columns)
        if fmt == "csv"
        else table_text(t.rows, t.columns, title="gmd simulate: orderings", caption=t.caption)
        for t in tables
    )


def _finite(value: object) -> object:
    """JSON has no NaN: unmeasured numbers become null."""
    if isinstance(value, float):
        return None if value != value or value in (float("inf"), float("-inf")) else value
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
