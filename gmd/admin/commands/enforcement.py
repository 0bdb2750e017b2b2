"""The commands about what gmd does to greedy customers: ``actions`` (the enforcement log),
``enforce`` (the throttle levels and every host's plan now) and ``reset`` (an operator's
reset of a customer's balance).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gmd.admin.common import NAMED, database, load_config, reading, times
from gmd.admin.output import Listing, Output, View, emit, output_options
from gmd.common.cli import ExitCode, fail, notice
from gmd.common.timespec import iso as iso_time

# What reads the ledger is imported by the command that runs (gmd.admin.common says why).


@output_options
def actions_command(
    ctx: typer.Context,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Start: ISO date/time (UTC), now-7d, now-12h, Unix seconds. Actions tied to"
            " an interval count by the interval's start (as reports do), others by when they"
            " were recorded.",
        ),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="End (exclusive), same forms.")] = None,
    customer: Annotated[
        str | None,
        typer.Option("--customer", help=f"Only this customer ({NAMED})."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="The newest N actions only (shown oldest first).", min=1)
    ] = None,
    *,
    out: Output,
) -> None:
    """The enforcement log: every level change, plan, host report and quota change gmd made
    or, in dry-run, would have made — with the balance and thresholds that caused it.

    Exit codes: 0 shown (also when none), 1 database unavailable, 2 bad option, 3 unknown
    customer.
    """
    from gmd.daemon.ledger.lookup import UnknownCustomer, customer_uuid
    from gmd.daemon.reports.actions import (
        COLUMNS as ACTION_COLUMNS,
        actions as list_actions,
        knobs_words,
    )

    from_s, to_s = times(from_, to)
    try:
        with reading(ctx) as engine, engine.connect() as conn:
            uuid = None if customer is None else customer_uuid(conn, customer)
            rows = list_actions(conn, from_s=from_s, to_s=to_s, customer=uuid, limit=limit)
    except UnknownCustomer as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    caption = f"{len(rows)} action(s)" + (" — none recorded" if not rows else "")
    if limit is not None and len(rows) == limit:
        caption += f" (the newest {limit})"
    # a table says each knob's outcome in words; every other format keeps the document
    shown = [{**r, "knobs": knobs_words(r["knobs"])} for r in rows]
    view = View(
        rows,
        ACTION_COLUMNS,
        title="Enforcement log",
        notes=[caption],
        name="actions",
        table_rows=shown,
    )
    emit(Listing([view]), out)


@output_options
def enforce_command(
    ctx: typer.Context,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="What enforce shows anyway (levels, and every host's plan); kept so that"
            " scripts written for it still run.",
        ),
    ] = True,
    host: Annotated[str | None, typer.Option(help="Only this host's plan.")] = None,
    *,
    out: Output,
) -> None:
    """Throttling as the daemon decided it after the latest accounted interval: which
    customers are at which level, and what each host's agent is told to set on which VM.
    Read-only; enforcement.mode says whether it is applied ("on") or only recorded.

    Three tables: levels, plans, and for each host with a throttled VM whether its hard caps
    apply (work-conserving caps: only where the host is contended) and the figures that
    decided it. CSV, -P and value print them in turn, each with its heading line, separated
    by an empty line; JSON and YAML hold them as "levels", "plans" and "caps".

    Exit codes: 0 shown, 1 database unavailable, 2 bad option, 3 unknown host.
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations, its --help text and the reports it imports when it runs (the
    command line is built without them: gmd/admin/common.py says why); what it does is the
    three tables below.
    """
    from gmd.daemon.ledger.lookup import UnknownHost
    from gmd.daemon.reports.enforcement import (
        CAPS_COLUMNS,
        LEVEL_COLUMNS,
        PLAN_COLUMNS,
        levels as enforcement_levels,
        plans as enforcement_plans,
    )
    from gmd.wire import PlanMode

    del plan  # accepted for compatibility: the plan is what enforce shows
    config = load_config(ctx)
    try:
        with reading(ctx) as engine, engine.connect() as conn:
            level_rows = enforcement_levels(conn, config.enforcement)
            plan_rows, cap_rows = enforcement_plans(conn, config.enforcement, host)
    except UnknownHost as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    mode = config.enforcement.mode
    emit(
        Listing(
            [
                View(
                    level_rows,
                    LEVEL_COLUMNS,
                    title=f"Throttle levels (enforcement.mode = {mode})",
                    notes=[
                        PlanMode(mode).words
                        + (" (gmd-admin standings: Enforced)" if mode == PlanMode.on else "")
                    ],
                    keep=("customer",),
                    name="levels",
                ),
                View(
                    plan_rows,
                    PLAN_COLUMNS,
                    title="Host plans",
                    notes=[f"{len(plan_rows)} throttled VM(s)"],
                    keep=("host", "uuid"),
                    name="plans",
                ),
                View(
                    cap_rows,
                    CAPS_COLUMNS,
                    title="Hard caps by host",
                    notes=[
                        "utilisation: what the host's VMs used of its capacity over its last"
                        " accounted intervals; caps apply from the threshold on"
                    ],
                    keep=("host", "resource"),
                    name="caps",
                ),
            ],
            document=lambda views: {
                "mode": mode,
                "levels": views[0],
                "plans": views[1],
                "caps": views[2],
            },
        ),
        out,
    )


def reset_command(
    ctx: typer.Context,
    customer: Annotated[str, typer.Argument(help=f"The customer ({NAMED}) to reset.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why; kept in the enforcement log (required).")
    ],
    by: Annotated[
        str | None,
        typer.Option("--by", help="Who asks for it (default: the login name)."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Reset a customer's balance to zero, like sacctmgr's RawUsage=0.

    The ledger keeps every past row; the reset is recorded (who, when, why, the balance
    dropped) and the next interval accounted starts the customer from zero. Standings show 0
    at once; the throttle level follows at the next decision (hysteresis and dwell still
    apply). Exit codes: 0 reset, 1 database unavailable, 2 bad option or not confirmed,
    3 unknown customer.
    """
    import getpass

    from gmd.daemon.ledger.lookup import UnknownCustomer
    from gmd.daemon.ledger.resets import reset_balance

    if not reason.strip():
        raise fail("--reason must say why (it is kept in the enforcement log)")
    if not yes:
        if not sys.stdin.isatty():
            raise fail("not on a terminal: confirm the reset with --yes")
        if not typer.confirm(f"Reset the balance of {customer} to zero?"):
            raise fail("not reset")
    requester = by or getpass.getuser()
    try:
        with database(ctx) as engine:
            result = reset_balance(engine, customer, reason, requester)
    except UnknownCustomer as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    if not result.recorded:
        typer.echo(
            f"{customer}: already reset (balance {result.previous_balance:.6g} dropped; accounting"
            f" starts it from 0 at the interval of {iso_time(result.effective_start_s)})"
            if result.previous_balance
            else f"{customer}: the balance is already 0",
        )
        notice("nothing recorded")
        return
    typer.echo(
        f"{customer}: balance {result.previous_balance:.6g} reset to 0 by {requester};"
        f" accounting starts it from 0 at the interval of"
        f" {iso_time(result.effective_start_s)}."
    )
