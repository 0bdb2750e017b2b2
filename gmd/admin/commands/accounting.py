"""The commands that read what accounting made of the ledger: ``standings`` (where every
customer stands), ``report`` (usage over a range, grouped), ``explain`` (why one customer
stands where it stands) and ``plot`` (standings over time, drawn).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from gmd import OptionError
from gmd.admin.common import NAMED, load_config, reading, times
from gmd.admin.output import Format, Listing, Output, View, emit, output_options
from gmd.common.cli import ExitCode, choice, fail, notice
from gmd.common.timespec import NotATime, iso as iso_time, parse_time
from gmd.daemon.reports.standings_columns import COLUMNS as STANDINGS_COLUMNS, SortKey
from gmd.render import json_text, yaml_text

# What reads the ledger (SQLAlchemy, the reports) is imported by the command that runs: every
# gmd-admin process imports this module to build its command line (gmd.admin.common says why).


@output_options
def standings_command(
    ctx: typer.Context,
    sort: Annotated[
        SortKey,
        typer.Option(
            "--sort",
            parser=choice(SortKey),
            metavar="KEY",
            help=f"Column to sort by: numbers greatest first ({', '.join(SortKey)}).",
        ),
    ] = SortKey.balance,
    reverse: Annotated[bool, typer.Option("--reverse", help="Reverse the order.")] = False,
    everyone: Annotated[
        bool, typer.Option("--all", help="Also list customers without a standing (zeros).")
    ] = False,
    customer: Annotated[
        list[str] | None,
        typer.Option(
            "--customer",
            help=f"Only this customer ({NAMED}); repeat for several.",
        ),
    ] = None,
    *,
    out: Output,
) -> None:
    """Where every customer stands, like Slurm's sshare: balance (decayed sum of greediness;
    positive = took more than its share), the last interval's GM, DirectContr utility and
    priority (contribution − utility), VMs, and the throttle level with what it does now as
    the hosts report it (Enforced: applied while a host reports one of its running VMs
    throttled, else not applied, dry-run or off), after the latest accounted interval.

    Exit codes: 0 shown, 1 database unavailable, 2 bad configuration or option, 3 a customer
    asked for has no standing (the others are shown).
    """
    from gmd.daemon.reports.standings import standings

    config = load_config(ctx)
    wanted = list(dict.fromkeys(customer or ()))
    with reading(ctx) as engine, engine.connect() as conn:
        result = standings(
            conn,
            sort=sort.value,
            reverse=reverse,
            everyone=everyone,
            customers=wanted,
            enforcement=config.enforcement,
        )
    missing = [
        c for c in wanted if not any(c in (r["customer"], r.get("name")) for r in result.rows)
    ]
    emit(
        Listing(
            [
                View(
                    result.rows,
                    STANDINGS_COLUMNS,
                    title="Standings",
                    notes=[result.caption()],
                    keep=("customer",),
                    hide_if_empty=("name", "enforced_why"),
                )
            ],
            document=lambda rows: {**result.document(), "customers": rows[0]},
        ),
        out,
    )
    if missing:
        listed = ", ".join(repr(c) for c in missing)
        raise fail(
            f"customer {listed} has no standing in the ledger"
            if len(missing) == 1
            else f"customers {listed} have no standing in the ledger (the others are shown)",
            ExitCode.NOT_FOUND,
        )


@output_options
def report_command(
    ctx: typer.Context,
    from_: Annotated[
        str,
        typer.Option("--from", help="Start: ISO date/time (UTC), now-7d, now-12h, Unix seconds."),
    ] = "now-7d",
    to: Annotated[str, typer.Option("--to", help="End (exclusive), same forms.")] = "now",
    group_by: Annotated[
        str,
        typer.Option(
            "--group-by",
            help="customer, organization, host, resource, day or week (UTC, from Monday).",
            metavar="GROUP",
        ),
    ] = "customer",
    customer: Annotated[
        str | None,
        typer.Option(
            "--customer",
            help=f"Only this customer ({NAMED}); with day or week, its rows per period.",
        ),
    ] = None,
    top: Annotated[
        int | None,
        typer.Option("--top", help="Keep the first N rows after sorting.", min=1, metavar="N"),
    ] = None,
    sort: Annotated[
        str | None,
        typer.Option(
            "--sort",
            help="Column key to sort by, numbers greatest first (default: see above).",
            metavar="COLUMN",
        ),
    ] = None,
    *,
    out: Output,
) -> None:
    """Usage over a range of time, like Slurm's sreport: the ledger's intervals whose start is
    in [--from, --to), grouped by --group-by. Every number is a sum, count or last value of
    ledger rows; CSV and JSON keep full precision.

    \b
    Columns (keys as in CSV and JSON), by --group-by:
      customer      gm_sum (sum of greediness), gm_mean (gm_sum / accounted intervals;
                    intervals without samples count as 0), balance, gm_<resource> (that
                    resource's terms of gm_sum), utility, priority, contribution (if it is
                    also an organization), throttled_s, throttle_mode, quota_changes,
                    late_samples; sorted by gm_sum
      organization  customer (if it is one), contribution, utility, priority, hosts,
                    customers (served), cpu_supplied_core_s, cpu_used_core_s,
                    late_samples; sorted by contribution
      host          organization, vms, customers, samples, cpu_core_s, memory_byte_s,
                    disk_bytes, network_bytes, late_samples; sorted by cpu_core_s
      resource      gm_sum (sum of terms), over (positive terms), under (negative terms:
                    ceded and credited), customers_over
      day, week     intervals, empty_intervals, active_customers, gm_positive, greediest,
                    greediest_gm, throttled_customers, actions, late_samples; with
                    --customer: intervals, gm_sum, gm_mean, balance, throttled_s,
                    throttle_mode, late_samples; in time order

    Balance, utility, priority and contribution are those after the last interval with
    ledger rows in the range (0 without a row there; a balance reset since shows 0).
    throttled_s is the length of the accounted intervals that began at throttle level 1 or
    more, dry-run decisions included (throttle_mode says which). quota_changes counts quota
    lowerings and restorations recorded in the range. Late samples are stored but not
    counted: tables mark rows that have some with *. Numbers sort greatest first.

    Exit codes: 0 shown (also for an empty range), 1 database unavailable, 2 bad option,
    3 unknown customer.
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations and its --help text, the report's columns by group; what it
    does is the lines below.
    """
    from contextlib import nullcontext

    from gmd.daemon.ledger.lookup import UnknownCustomer
    from gmd.daemon.reports.usage import GROUPS, report as usage_report

    if group_by not in GROUPS:
        raise fail(f"cannot group by {group_by!r}; choose one of {', '.join(GROUPS)}")
    now = time.time()
    try:
        from_s = parse_time(from_, now)
        to_s = parse_time(to, now)
    except NotATime as exc:
        raise fail(str(exc)) from None
    if to_s <= from_s:
        raise fail(f"--from {iso_time(from_s)} is not before --to {iso_time(to_s)}")
    bar = None
    if sys.stderr.isatty():  # a progress bar only for people watching, never into pipes
        from rich.console import Console
        from rich.progress import Progress

        bar = Progress(console=Console(stderr=True), transient=True)
    try:
        with reading(ctx) as engine, engine.connect() as conn, bar or nullcontext():
            task = None if bar is None else bar.add_task("report", total=None)

            def progress(done: int, total: int, what: str) -> None:
                if bar is not None and task is not None:
                    bar.update(task, completed=done, total=total, description=what)

            result = usage_report(
                conn,
                group_by,
                from_s,
                to_s,
                customer=customer,
                sort=sort,
                top=top,
                progress=None if bar is None else progress,
            )
    except UnknownCustomer as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    except OptionError as exc:
        # only what the report says the options got wrong: any other error is a bug
        raise fail(str(exc)) from None
    empty = result.emptiness()
    if empty is not None:
        notice(f"nothing to report: {empty}")
    # The report's own range (whole seconds), as its notes show it: one "now" per report.
    title = f"Usage by {group_by}, {iso_time(result.from_s)} to {iso_time(result.to_s)}"
    emit(
        Listing(
            [
                View(
                    result.rows,
                    result.columns,
                    title=title,
                    notes=result.notes,
                    table_rows=result.table_rows(),
                    keep=tuple(c.key for c in result.columns[:1]),
                )
            ],
            document=lambda views: {**result.document(), "rows": views[0]},
        ),
        out,
    )


def explain_command(
    ctx: typer.Context,
    customer: Annotated[str, typer.Argument(help=f"The customer ({NAMED}) to explain.")],
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="Explain the interval holding this time (ISO, now-2h, Unix seconds)."
            " Default: the customer's latest interval with VMs.",
        ),
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from", help="With --to: sum up this range and explain its greediest interval."
        ),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="End of the range (exclusive).")] = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "-f",
            "--format",
            parser=choice(Format),
            metavar="FORMAT",
            help="table (plain text), json or yaml (the same document).",
        ),
    ] = Format.table,
    noindent: Annotated[
        bool, typer.Option("--noindent", help="JSON on one line, not indented.")
    ] = False,
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="Only the five-line answer in plain words (who, level, why, what is done"
            " where, what would lift it); in JSON, only the customer and its summary lines.",
        ),
    ] = False,
) -> None:
    """Why a customer stands where it stands: first five lines in plain words (its level
    since when, why, what is done on which hosts, its quota, what would lift it), then the
    detail: on which hosts, VMs and resources it went over its endowment in an interval, what
    it left unused and was credited for, how that made its greediness and balance, which
    thresholds put it at which throttle level, whether the level's hard caps apply on each of
    its hosts (only where the host is contended) and what was enforced.

    The interval is recomputed from its stored samples and checked against the ledger. Exit
    codes: 0 explained, 1 database unavailable, 2 bad option, 3 unknown customer or nothing
    to explain.
    """
    from gmd.admin.explain_text import render_summary, render_text
    from gmd.daemon.ledger.lookup import UnknownCustomer
    from gmd.daemon.reports.explain import NothingToExplain, explain

    if fmt in (Format.csv, Format.value):
        raise fail(f"explain writes text, JSON or YAML (-f table|json|yaml), not {fmt.upper()}")
    if at is not None and (from_ is not None or to is not None):
        raise fail("give either --at or --from/--to, not both")
    at_s, from_s, to_s = times(at, from_, to)
    config = load_config(ctx)
    try:
        with reading(ctx) as engine, engine.connect() as conn:
            result = explain(conn, config, customer, at_s=at_s, from_s=from_s, to_s=to_s)
    except UnknownCustomer as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    except NothingToExplain as exc:
        raise fail(f"nothing to explain for {customer}: {exc}", ExitCode.NOT_FOUND) from None
    if fmt in (Format.json, Format.yaml):
        document = result.document()
        if summary:
            document = {k: document[k] for k in ("customer", "name", "summary")}
        text = json_text(document, indent=not noindent) if fmt is Format.json else None
        sys.stdout.write(text or yaml_text(document))
    elif summary:
        sys.stdout.write(render_summary(result))
    else:
        sys.stdout.write(render_text(result, config.accounting.endowment))


def plot_command(
    ctx: typer.Context,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="The picture to write: FILE.png or FILE.svg (the suffix picks the format).",
            metavar="FILE",
        ),
    ],
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Start: ISO date/time (UTC), now-7d, now-12h, Unix seconds (default: the first"
            " accounted interval). Intervals that start from then on are drawn.",
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="End (exclusive), same forms (default: the latest interval)."),
    ] = None,
    customer: Annotated[
        list[str] | None,
        typer.Option(
            "--customer",
            help=f"A customer ({NAMED}) to draw; repeat for several. Default: the --top N.",
            metavar="NAME",
        ),
    ] = None,
    top: Annotated[
        int | None,
        typer.Option(
            "--top",
            min=1,
            help="Without --customer: draw the N customers with the greatest balance at the end"
            " of the range (default 5).",
            metavar="N",
        ),
    ] = None,
) -> None:
    """Draw customers' standings over time into a PNG or SVG picture.

    Three panels on one UTC time axis: (1) each customer's balance after each interval, with
    the [enforcement] thresholds as lines ("level k enter" solid, "level k leave" dashed; with
    priority_weight set, the score they apply to is drawn too); (2) each customer's throttle
    level, rebuilt from the enforcement log (dry-run levels included, and marked); (3) the
    per-resource terms of the first customer's interval greediness (cpu, memory, disk,
    network), to see which resources made it greedy.

    Exit codes: 0 written, 1 database unavailable or the file cannot be written, 2 bad
    configuration or option (a suffix other than .png/.svg), 3 unknown customer or no
    accounted interval in the range.
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations, each with its help text; what it does is the lines below.
    """
    from gmd.daemon.ledger.lookup import UnknownCustomer
    from gmd.daemon.reports import plot as plotting
    from gmd.daemon.reports.series import EmptyRange, collect

    try:
        fmt = plotting.output_format(output)
    except OptionError as exc:
        raise fail(str(exc)) from None
    if customer and top is not None:
        raise fail("--top chooses customers when no --customer is given: give one or the other")
    from_s, to_s = times(from_, to)
    if from_s is not None and to_s is not None and from_s >= to_s:
        raise fail(
            f"--from {from_} ({iso_time(from_s)}) is not before --to {to} ({iso_time(to_s)})"
        )
    config = load_config(ctx)
    try:
        with reading(ctx) as engine, engine.connect() as conn:
            data = collect(
                conn,
                customers=customer or (),
                top=5 if top is None else top,
                from_s=from_s,
                to_s=to_s,
            )
    except (UnknownCustomer, EmptyRange) as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    figure = plotting.draw(data, config.enforcement.policy, config.enforcement.mode)
    try:
        plotting.save(figure, output, fmt)
    except OSError as exc:
        raise fail(f"cannot write {output}: {exc}", ExitCode.UNAVAILABLE) from None
    line = data.timeline
    # named as the legend names them
    drawn = [data.label(c) for c in data.customers]
    quiet = [drawn[i] for i in range(len(drawn)) if not data.balances.present[i].any()]
    typer.echo(
        f"{output}: {', '.join(drawn) or 'no customer'} over {len(line)} intervals,"
        f" {iso_time(float(line.start_s[0]))} to {iso_time(float(line.end_s[-1]))}"
        + (f"; no standing in the range (drawn as 0): {', '.join(quiet)}" if quiet else "")
    )
