"""The commands that compute rather than report: ``gm`` (the Greediness Metric calculator, one
host), ``whatif`` (the ledger's intervals replayed under other settings), ``simulate`` (job
traces through fairness policies) and ``demo`` (gmd end to end on this machine).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gmd.admin.common import load_config, reading, times
from gmd.admin.output import Listing, Output, View, emit, output_options
from gmd.common.cli import ExitCode, choice, fail
from gmd.common.units import DAY_S
from gmd.fairness.scenarios import SCENARIOS
from gmd.sim.placement_kinds import Arrival, FalbScenario, Tie

if TYPE_CHECKING:
    from gmd.sim.command import Shown


@output_options
def gm_command(
    supply: Annotated[
        str | None,
        typer.Option(
            help="Supply of each resource, comma-separated (e.g. 6,12).", metavar="AMOUNTS"
        ),
    ] = None,
    use: Annotated[
        list[str] | None,
        typer.Option(
            "--use",
            help="What one consumer took, NAME=AMOUNTS (e.g. c1=3,0); repeat per consumer.",
            metavar="NAME=AMOUNTS",
        ),
    ] = None,
    endowment: Annotated[
        list[str] | None,
        typer.Option(
            help="A consumer's endowment, NAME=AMOUNTS; default: equal shares of the supply.",
            metavar="NAME=AMOUNTS",
        ),
    ] = None,
    csv_file: Annotated[
        Path | None,
        typer.Option(
            "--csv",
            help="Read consumers from a CSV file: header consumer,<resource>,...; a row 'supply' "
            "gives the supply, rows 'endowment:NAME' give endowments.",
            metavar="FILE",
        ),
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            help=f"A situation from the GM paper: {', '.join(SCENARIOS)}.", metavar="NAME"
        ),
    ] = None,
    resources: Annotated[
        str | None,
        typer.Option(help="Names of the resources, comma-separated (default r1,r2,...)."),
    ] = None,
    gamma: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="How much ceded resources are credited, 0..1 (the paper recommends 0.5).",
        ),
    ] = 0.5,
    weights: Annotated[
        str | None, typer.Option(help="Resource weights, comma-separated (default all 1).")
    ] = None,
    *,
    out: Output,
) -> None:
    """Judge one host (pool) with the Greediness Metric, next to Price, P×S, P∩S and DRF.

    GM > 0: the consumer took more than its endowment where others had to cede; GM < 0: it
    ceded what others actually used; 0: exactly its share. Consumers are ranked greediest
    first; 'offset' columns are the per-resource offsets o(i,j) in the resources' units.

    Example: gmd-admin gm --supply 6,12 --use c1=3,0 --use c2=0,6 --use c3=3,6

    Exit codes: 0 judged, 2 bad option or a situation no host could be in (negative use, use
    beyond the supply).
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations, each with its help text; what it does is the lines below.
    """
    from gmd.admin.calculator import (
        Situation,
        judge,
        parse_amounts,
        situation_from_csv,
        situation_from_options,
    )

    sources = sum(x is not None for x in (scenario, csv_file)) + bool(use)
    if sources != 1:
        raise fail("give exactly one of --scenario, --csv or --use (with --supply)")
    if resources is not None and not use:
        raise fail(
            "--resources names the columns of --supply/--use; CSV files name them in the header"
        )
    try:
        if scenario is not None:
            if scenario not in SCENARIOS:
                raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
            situation = Situation.from_scenario(SCENARIOS[scenario])
        elif csv_file is not None:
            situation = situation_from_csv(csv_file, supply)
        else:
            if supply is None:
                raise ValueError("--use needs --supply")
            situation = situation_from_options(supply, use or [], endowment or [], resources)
        w = None if weights is None else parse_amounts(weights, "--weights")
        result = judge(situation, gamma=gamma, weights=w)
    except ValueError as exc:
        raise fail(str(exc)) from None

    credit = ", ".join(f"{r} {k:.3g}" for r, k in result.credit.items())
    emit(
        Listing(
            [
                View(
                    result.rows,
                    result.columns(),
                    title=f"{situation.title or 'Greediness'} (γ = {gamma:g})",
                    notes=[f"credit factor κ = min(1, α/β): {credit}"],
                    keep=("consumer",),
                )
            ],
            document=lambda views: {**result.document(), "consumers": views[0]},
        ),
        out,
    )


@output_options
def whatif_command(
    ctx: typer.Context,
    from_: Annotated[
        str,
        typer.Option(
            "--from",
            help="Start: ISO date/time (UTC), now-7d, now-12h, Unix seconds; within raw"
            " retention (retention.raw_days).",
        ),
    ],
    to: Annotated[str, typer.Option("--to", help="End (exclusive), same forms.")] = "now",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="A setting to replay with instead of the configuration's: accounting.gamma,"
            " .endowment, .consumer, .half_life_s, .utility, .weights.RESOURCE;"
            " enforcement.enter, .leave, .dwell_s, .max_step, .priority_weight (values as in"
            " gmd.toml: 0.3, [1, 3, 6], equal). Repeat for several.",
        ),
    ] = None,
    plot_file: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE",
            help="Also draw the balances and levels, recorded beside replayed, for the"
            " customers the change matters to most: FILE.png or FILE.svg.",
        ),
    ] = None,
    *,
    out: Output,
) -> None:
    """What would have happened: replay the ledger's recorded intervals in [--from, --to)
    under other settings, in memory, and compare with what was recorded — per customer its
    throttled hours, highest level, first and last level change, final balance, and the
    level changes added, removed, earlier or later than recorded; cloud-wide the customers
    throttled, the throttle-hours and the spread of balances. Never writes the ledger: with
    no --set it reproduces the record.

    Exit codes: 0 shown, 1 database unavailable, 2 bad option, a setting a what-if cannot
    change or a range beyond raw retention.
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations, each with its help text; what it does is the lines below.
    """
    from gmd.daemon.reports.whatif import (
        COLUMNS as WHATIF_COLUMNS,
        WhatIfRefused,
        document as whatif_document,
        read_recorded_balances,
        replay,
        rows_of,
        summary_lines,
        with_overrides,
    )

    from_s, to_s = times(from_, to)
    assert from_s is not None and to_s is not None
    sets = list(set_ or [])
    from gmd.daemon.reports.plot import output_format, save

    base = load_config(ctx)
    try:
        config = with_overrides(base, sets)
        picture = None if plot_file is None else output_format(plot_file)
    except (WhatIfRefused, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        with reading(ctx) as engine, engine.connect() as conn:
            result = replay(
                conn,
                config,
                from_s,
                to_s,
                sets,
                max_intervals=base.read_api.whatif_max_intervals,
            )
            if plot_file is not None:
                read_recorded_balances(conn, result)
    except WhatIfRefused as exc:
        raise fail(str(exc)) from None
    if plot_file is not None:
        from gmd.daemon.reports.whatif_plot import draw

        try:
            save(
                draw(result, base.enforcement.policy, config.enforcement.policy), plot_file, picture
            )
        except OSError as exc:
            raise fail(f"{plot_file}: cannot write: {exc.strerror}", ExitCode.UNAVAILABLE) from None
    rows = rows_of(result)
    notes = summary_lines(result)
    emit(
        Listing(
            [View(rows, WHATIF_COLUMNS, title="What-if", notes=notes, name="whatif")],
            document=lambda views: whatif_document(result, views[0]),
        ),
        out,
    )


class Processors(StrEnum):
    equal = "equal"
    zipf = "zipf"


@output_options
def simulate_command(
    trace: Annotated[
        Path,
        typer.Option(help="A Standard Workload Format job log (.swf or .swf.gz).", metavar="FILE"),
    ],
    window: Annotated[int, typer.Option(help="Length of each sample, in seconds.")] = DAY_S,
    samples: Annotated[int, typer.Option(help="Number of random windows of the trace.")] = 10,
    orgs: Annotated[int, typer.Option(help="Number of organizations.")] = 5,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="Repeatable: ORIG_DIRECT (DirectContr, ψ), REL_DIRECT (ψ′), SIMPL_DIRECT "
            "(ψ″), FairShare, UtFairShare, CurrFairShare, RoundRobin, RRDF, FCFS, Ref, Rand or "
            "Rand:N. Default: all of them.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random choice.")] = 0,
    processors: Annotated[
        Processors,
        typer.Option(
            parser=choice(Processors),
            metavar="equal|zipf",
            help="Processors per organization: equal, or Zipf-distributed.",
        ),
    ] = Processors.equal,
    total_processors: Annotated[
        int | None, typer.Option(help="Processors in all (default: the trace's MaxProcs).")
    ] = None,
    unit: Annotated[
        int | None, typer.Option(help="Cut jobs into pieces of this many seconds (CloudShare).")
    ] = None,
    cloudshare: Annotated[
        bool, typer.Option(help="Also score policies by CloudShare's pairwise fairness wins.")
    ] = False,
    ref: Annotated[
        bool, typer.Option("--ref/--no-ref", help="Simulate Ref, for the unfairness Δψ/p.")
    ] = True,
    assignment: Annotated[
        Path | None,
        typer.Option(
            help="File of 'USER ORGANIZATION' lines (default: random, seeded).", metavar="FILE"
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Processes (default: all cores).")] = None,
    background: Annotated[
        float,
        typer.Option(
            help="Share of each organization's users that are local: their jobs run only on its"
            " processors, before the federation's (CloudShare's Scenario 3; needs --no-ref).",
            metavar="SHARE",
        ),
    ] = 0.0,
    bootstrap: Annotated[
        int,
        typer.Option(
            help="Also order every pair of policies, with a 95 % bootstrap interval over the"
            " contended samples from N resamples (e.g. 2000).",
            metavar="N",
        ),
    ] = 0,
    contention: Annotated[
        float,
        typer.Option(
            help="A sample is contended when a federation job waited for a processor and its"
            " jobs, started at release, need more than the processors for more than SHARE of"
            " its window (0: at any moment).",
            metavar="SHARE",
        ),
    ] = 0.0,
    *,
    out: Output,
) -> None:
    """Replay a job trace through fairness policies and compare them, as the papers do.

    Organizations contribute processors and submit the trace's jobs (its users dealt to them);
    each policy schedules them greedily, FIFO per organization. Reports, per policy, the mean
    and standard deviation over the samples of the unfairness Δψ/p against the exact
    Shapley-fair Ref (Skowron & Rzadca), total wait and utilization. docs/reproduction.md has
    the papers' tables next to ours and the commands that produce them.
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations, each with its help text; what it does is the lines below.
    """
    from gmd.sim.command import SimulateOptions, shown, simulate

    try:
        result = simulate(
            SimulateOptions(
                trace,
                window,
                samples,
                orgs,
                policy or [],
                seed,
                processors.value,
                workers,
                True,
                total_processors=total_processors,
                unit_s=unit,
                cloudshare=cloudshare,
                assignment=assignment,
                reference=ref,
                background=background,
                bootstrap=bootstrap,
                contention=contention,
            )
        )
        table = shown(result, bootstrap, contention)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    emit_policies(table, "gmd simulate", out)


@output_options
def simulate_placement_command(
    scenario: Annotated[
        FalbScenario,
        typer.Option(
            parser=choice(FalbScenario),
            metavar="batch|stream",
            help="batch: every application submitted at once; stream: one after another,"
            " --gap seconds apart, in the --arrival order.",
        ),
    ] = FalbScenario.batch,
    seeds: Annotated[
        int, typer.Option(min=1, max=1000, help="Runs, each on its own random variation.")
    ] = 20,
    jitter: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.9,
            help="Each run time varied by up to this fraction (0: Table 3's exact times).",
        ),
    ] = 0.1,
    arrival: Annotated[
        Arrival,
        typer.Option(
            parser=choice(Arrival),
            metavar="interleaved|sequential",
            help="The stream's order: the tenants' applications shuffled together, or tenant"
            ' after tenant in Table 3\'s order (the paper says only "sequentially").',
        ),
    ] = Arrival.interleaved,
    gap: Annotated[
        float, typer.Option(min=0.0, max=3600.0, help="Seconds between two arrivals of the stream.")
    ] = 1.0,
    tie: Annotated[
        Tie,
        typer.Option(
            parser=choice(Tie),
            metavar="lowest|random",
            help="Which of equally scored nodes gets an application: the first of Table 1's, or"
            " one at random.",
        ),
    ] = Tie.lowest,
    *,
    out: Output,
) -> None:
    """Reproduce FALB's experiment (Chen & Lai, Fig. 2): placement strategies on a cluster.

    Table 3's four tenants × 50 applications on Table 1's nine workers, placed by YuniKorn
    (FIFO, least mean utilisation), FA-YK (RRDF order), FALB-2 and FALB-3 (RRDF order, TOPSIS
    over FALB's criteria) and Kubernetes' balanced allocation. Reports per strategy the total
    execution time, the mean utilisation gap, the largest deviation and the tenants' RRDF
    spread, each as a mean over the seeds with its 95 % interval. The criteria and TOPSIS are
    those of gmd's Nova weigher (docs/nova.md); docs/reproduction.md compares with the paper.
    """
    from gmd.sim.command import placement_shown
    from gmd.sim.placement import FalbInputs, falb_experiment

    inputs = FalbInputs(scenario, jitter, arrival, gap, tie)
    results = falb_experiment(inputs, seeds=seeds)
    emit_policies(placement_shown(results, inputs, seeds), "gmd simulate-placement", out)


def emit_policies(table: Shown, title: str, out: Output) -> None:
    """A simulation's per-policy rows, its caption as the table's note, and its document
    (configuration and rows) for JSON and YAML."""
    emit(
        Listing(
            [
                View(
                    table.rows,
                    table.columns,
                    title=title,
                    notes=[table.caption],
                    keep=("policy",),
                    name="policies",
                ),
                *(
                    View(more.rows, more.columns, title=f"{title}: orderings", notes=[more.caption])
                    for more in table.more
                ),
            ],
            document=lambda views: {**table.document, "policies": views[0]},
        ),
        out,
    )


def demo_command(
    directory: Annotated[
        Path,
        typer.Option(
            "--dir",
            help="Where the demo writes its configuration, ledger, logs and plot (emptied first"
            " if an earlier demo made it).",
            metavar="DIR",
        ),
    ] = Path("var/demo"),
    traces: Annotated[
        Path | None,
        typer.Option(
            "--traces",
            help="The Bitbrains GWA-T-12 Rnd traces (N.csv or N.csv.gz), e.g. the whole"
            " trace for more than 3 days. Default: the first 3 days of its 100-VM sample,"
            " shipped with gmd.",
            metavar="DIR",
        ),
    ] = None,
    vms: Annotated[
        str, typer.Option("--vms", help="Which traces to replay: 1-100, or 1-20,41-53.")
    ] = "1-100",
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=50, help="Simulated hosts.")] = 4,
    days: Annotated[
        float,
        typer.Option(
            "--days",
            min=0.05,
            max=7,
            help="Simulated days (at most 3 with the shipped traces).",
        ),
    ] = 3.0,
    cores: Annotated[
        float, typer.Option("--cores", min=1, help="Physical cores of each simulated host.")
    ] = 32.0,
) -> None:
    """Run gmd end to end on this machine: a gmd-daemon on SQLite, one gmd-agent per simulated
    host replaying real VM traces (Bitbrains) at full speed, the accountant deciding throttle
    levels in dry-run, then standings, reports, an explanation of the greediest customer, the
    enforcement it would do, and a plot.

    Six customers own blocks of the 100 traces; VMs are dealt round-robin over the hosts,
    which are overcommitted (--cores physical cores under many more vCPUs). Everything lands in
    --dir; afterwards `export GMD_CONFIG=DIR/gmd.toml` and every gmd-admin command works on the
    demo's ledger. Exit codes: 0 done, 1 a step failed (its log is named), 2 bad option.
    """
    from gmd.admin import demo

    try:
        found = demo.PACKAGED_TRACES if traces is None else traces
        demo.run(directory, found, vms=vms, hosts=hosts, days=days, cores_per_host=cores)
    except demo.DemoError as exc:
        raise fail(f"demo: {exc}", ExitCode.UNAVAILABLE) from None
