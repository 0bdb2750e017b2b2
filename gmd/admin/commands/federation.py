"""The ``gmd-admin federation`` commands: the federation's standings and this cloud's broker's
decisions, from the ledger (gmd-broker files them there: docs/federation.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from gmd.admin.common import reading, times
from gmd.admin.output import Listing, Output, View, emit, output_options

# What reads the ledger is imported by the command that runs (gmd.admin.common says why).

federation_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True)


@federation_app.command("standings")
@output_options
def standings_command(ctx: typer.Context, *, out: Output) -> None:
    """The federation's organisations by priority (DirectContr: what their sites lent to other
    organisations' requests less what their requests borrowed, in core-seconds), with their
    requests queued, running, lent and borrowed now, as this cloud's gmd-broker last read them
    from ZooKeeper.

    Exit codes: 0 shown (also when none), 1 database unavailable, 2 bad option.
    """
    from gmd.daemon.reports.federation import (
        STANDING_COLUMNS,
        standings as federation_standings,
    )

    with reading(ctx) as engine, engine.connect() as conn:
        document = federation_standings(conn)
    rows = document["organizations"]
    caption = (
        f"{len(rows)} organisation(s), as of {document['as_of']} (read by {document['observer']})"
        if rows
        else "none: no gmd-broker has filed the federation's standings in this ledger"
    )
    view = View(rows, STANDING_COLUMNS, title="Federation", notes=[caption], name="organizations")
    emit(Listing([view], lambda views: {**document, "organizations": views[0]}), out)


@federation_app.command("log")
@output_options
def log_command(
    ctx: typer.Context,
    from_: Annotated[
        str | None,
        typer.Option("--from", help="Start: ISO date/time (UTC), now-7d, now-12h, Unix seconds."),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="End (exclusive), same forms.")] = None,
    org: Annotated[
        str | None, typer.Option("--org", help="Only this organisation's requests.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="The newest N decisions only (shown oldest first).", min=1)
    ] = None,
    *,
    out: Output,
) -> None:
    """This cloud's broker's decisions, oldest first: requests it ran locally, published,
    took, completed (Counted: whether ZooKeeper counted the completion), requeued, removed
    and stopped; 'behind' marks completions ZooKeeper counted that this ledger lacks.

    Exit codes: 0 shown (also when none), 1 database unavailable, 2 bad option.
    """
    from gmd.daemon.reports.federation import EVENT_COLUMNS, events as federation_events

    from_s, to_s = times(from_, to)
    with reading(ctx) as engine, engine.connect() as conn:
        rows = federation_events(conn, from_s=from_s, to_s=to_s, org=org, limit=limit)
    caption = f"{len(rows)} decision(s)" + (" — none recorded" if not rows else "")
    if limit is not None and len(rows) == limit:
        caption += f" (the newest {limit})"
    view = View(rows, EVENT_COLUMNS, title="Federation log", notes=[caption], name="events")
    emit(Listing([view]), out)
