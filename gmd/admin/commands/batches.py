"""The ``gmd-admin batches`` commands: the batches agents sent, listed (with the ones
accounting quarantined), and an operator's ``batches release`` or ``batches drop`` of a
quarantined one.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gmd.admin.common import database, reading, times
from gmd.admin.output import Listing, Output, View, emit, output_options
from gmd.common.cli import ExitCode, choice, fail
from gmd.common.timespec import iso as iso_time
from gmd.ledger_schema.kinds import BatchState

batches_app = typer.Typer(rich_markup_mode=None)


@batches_app.callback(invoke_without_command=True)
@output_options
def batches_command(
    ctx: typer.Context,
    quarantined: Annotated[
        bool,
        typer.Option(
            "--quarantined", help="Only batches accounting could not account and set aside."
        ),
    ] = False,
    state: Annotated[
        list[BatchState] | None,
        typer.Option(
            "--state",
            parser=choice(BatchState),
            metavar="STATE",
            help=f"Only batches in this state ({', '.join(BatchState)}; repeatable).",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Only this host's batches.")] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Intervals from: ISO date/time (UTC), now-7d, now-12h, Unix seconds.",
        ),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="Intervals before, same forms.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.", min=1)] = 100,
    *,
    out: Output,
) -> None:
    """List batches, newest interval first: their host, state (accepted, quarantined,
    released, dropped), whether they came late, and why accounting quarantined them.

    A quarantined batch made its interval fail to account (a number the engine cannot take,
    say); the interval was accounted without it. Decide with `gmd-admin batches release KEY`
    or `gmd-admin batches drop KEY`. Exit codes: 0 listed (also when none), 1 database
    unavailable, 2 bad option, 3 unknown host.
    """
    if ctx.invoked_subcommand is not None:
        return
    from gmd.admin.batches import COLUMNS as BATCH_COLUMNS, batch_rows

    states = tuple(state or ()) + ((BatchState.quarantined,) if quarantined else ())
    from_s, to_s = times(from_, to)
    from gmd.daemon.ledger.lookup import UnknownHost, require_host

    try:
        with reading(ctx) as engine, engine.connect() as conn:
            if host is not None:
                require_host(conn, host)
            rows = batch_rows(
                conn, states=states or None, host=host, from_s=from_s, to_s=to_s, limit=limit
            )
    except UnknownHost as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    what = "quarantined " if states == (BatchState.quarantined,) else ""
    caption = f"{len(rows)} {what}batch(es)" + (f" (at most {limit})" if len(rows) == limit else "")
    emit(
        Listing([View(rows, BATCH_COLUMNS, title="Batches", notes=[caption], name="batches")]),
        out,
    )


def _decide(ctx: typer.Context, key: str, reason: str, by: str | None, release: bool) -> None:
    import getpass

    from gmd.daemon.ledger import quarantine
    from gmd.ledger_schema import migrate

    if not reason.strip():
        raise fail("--reason must say why (it is kept in the enforcement log)")
    requester = by or getpass.getuser()
    decide = quarantine.release if release else quarantine.drop
    try:
        with database(ctx) as engine, migrate.writer(engine).begin() as conn:
            row = decide(conn, key, reason, requester)
    except quarantine.BatchDecisionError as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    done = (
        "released: its samples are kept as late ones (reports show them; no accounted interval"
        " changes)"
        if release
        else "dropped: its samples are deleted"
    )
    typer.echo(
        f"batch {key} ({row.samples} VMs from {row.host}, interval {iso_time(row.start_s)})"
        f" {done}; recorded in the enforcement log as by {requester}."
    )


_KEY = Annotated[str, typer.Argument(help="The batch key (gmd-admin batches --quarantined).")]
_REASON = Annotated[
    str, typer.Option("--reason", help="Why; kept in the enforcement log (required).")
]
_BY = Annotated[str | None, typer.Option("--by", help="Who decides (default: the login name).")]


@batches_app.command("release")
def batches_release(ctx: typer.Context, key: _KEY, reason: _REASON, by: _BY = None) -> None:
    """Release a quarantined batch: its samples come back as late samples, which reports
    count and no accounted interval is recomputed from (accounted intervals never change).
    Exit codes: 0 released, 1 database unavailable, 2 bad option, 3 no such quarantined
    batch."""
    _decide(ctx, key, reason, by, release=True)


@batches_app.command("drop")
def batches_drop(ctx: typer.Context, key: _KEY, reason: _REASON, by: _BY = None) -> None:
    """Drop a quarantined batch: its samples are deleted; the batch stays listed (dropped) so
    that an agent's retry of its key is not stored again. Exit codes: 0 dropped, 1 database
    unavailable, 2 bad option, 3 no such quarantined batch."""
    _decide(ctx, key, reason, by, release=False)
