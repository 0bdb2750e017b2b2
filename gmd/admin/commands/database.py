"""The ``gmd-admin db`` commands, the ledger database: ``db upgrade`` (create it or bring its
schema up to date), ``db current`` (its schema revision), ``db usage`` (what each table
holds and what retention drops next), ``db purge`` (retention's run, now) and ``db backup``
(a SQLite ledger's online copy).
"""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer

from gmd.admin.common import database, load_config, reading, shown_url, sqlite_file
from gmd.admin.output import Listing, Output, View, emit, output_options
from gmd.common.cli import ExitCode, fail

db_app = typer.Typer(
    help="The ledger database: create it and upgrade its schema.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Option(help="Target schema revision.")] = "head",
) -> None:
    """Create the ledger or bring its schema up to date (safe to run again)."""
    from gmd.ledger_schema import migrate

    with database(ctx) as engine:
        before = migrate.current(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current(engine)
    url = shown_url(str(engine.url))
    if before == after:
        typer.echo(f"{url}: already at schema revision {after}")
    else:
        typer.echo(f"{url}: schema upgraded from {before or 'empty'} to {after}")


@db_app.command("purge")
def db_purge(
    ctx: typer.Context,
    max_run_s: Annotated[
        float | None,
        typer.Option(min=1, help="Stop a run after this long (default: [retention] max_run_s)."),
    ] = None,
    until_done: Annotated[
        bool,
        typer.Option("--until-done", help="Run again until nothing due is left."),
    ] = False,
    unseen: Annotated[
        bool,
        typer.Option(
            "--unseen",
            help="Also the VMs and customers unseen past raw retention: only with no"
            " gmd-daemon running on this ledger (a running daemon remembers their ids; its own"
            " hourly run removes them).",
        ),
    ] = False,
) -> None:
    """Remove now what [retention] says is due, as the daemon's hourly run does: whole days of
    raw data (partitions dropped on PostgreSQL), then ledger rows and rollups past their
    days, in chunks of [retention] delete_chunk, each its own transaction, so that the
    daemon's writes go on beside it. Each run stops after max_run_s (the next goes on where it
    stopped); one line per run says what went.

    Exit codes: 0 done (also when nothing was due), 1 the database cannot be used (or is at
    another schema), 2 bad configuration or option.
    """
    import dataclasses

    from gmd.common.timespec import iso
    from gmd.daemon.ledger.retention import purge
    from gmd.ledger_schema import migrate

    config = load_config(ctx)
    retention = config.retention
    if max_run_s is not None:
        retention = dataclasses.replace(retention, max_run_s=max_run_s)
    with database(ctx) as engine:
        revision = migrate.current(engine)
        if revision != migrate.SCHEMA:
            raise fail(
                f"{shown_url(str(engine.url))} is at schema {revision or 'none'}, this gmd"
                f" needs {migrate.SCHEMA}: run `gmd-admin db upgrade`",
                ExitCode.UNAVAILABLE,
            )
        runs = 0
        while True:
            report = purge(engine, retention, unseen=unseen)
            runs += 1
            gone = [f"{n} {t}" for t, n in sorted(report.rows.items())]
            if report.partitions:
                gone.append(f"{len(report.partitions)} partition(s)")
            cutoffs = [
                f"{what} before {iso(at)}"
                for what, at in (("raw", report.raw_before_s), ("ledger", report.ledger_before_s))
                if at is not None
            ]
            typer.echo(
                f"run {runs}: removed {', '.join(gone) or 'nothing'}"
                f" ({'; '.join(cutoffs) or 'nothing is due: every kind is kept for ever'})"
                f" in {sum(report.seconds.values()):.1f} s"
                + ("; more is due" if report.unfinished else "")
            )
            if not (until_done and report.unfinished):
                break


@db_app.command("backup")
def db_backup(
    ctx: typer.Context,
    target: Annotated[Path, typer.Argument(help="The backup's file (must not exist).")],
) -> None:
    """Copy a SQLite ledger to TARGET while the daemon runs: SQLite's online backup, a
    consistent copy of one moment, page by page (a file copy of a ledger being written may
    not be). Restore by stopping the daemon and putting the copy in the ledger's place.
    A PostgreSQL ledger is backed up with PostgreSQL's own tools (docs/operations.md):
    `pg_dump -Fc`, restored with `pg_restore` into an empty database.

    Exit codes: 0 copied, 1 the ledger or the target cannot be used, 2 a PostgreSQL ledger,
    a target that exists, bad configuration.
    """
    import sqlite3

    config = load_config(ctx)
    file = sqlite_file(config.database_url)
    if file is None:
        raise fail(
            "the ledger is not a SQLite file: back PostgreSQL up with pg_dump -Fc"
            " (docs/operations.md, Backups)"
        )
    if target.exists():
        raise fail(f"{target} exists: give a new file (a backup never overwrites)")
    if not file.exists():
        raise fail(f"{file}: no ledger there", ExitCode.UNAVAILABLE)
    started = time.monotonic()
    try:
        with (
            closing(sqlite3.connect(f"file:{file}?mode=ro", uri=True, timeout=30)) as source,
            closing(sqlite3.connect(target)) as copy,
        ):
            source.backup(copy, pages=4096)
    except sqlite3.Error as exc:
        target.unlink(missing_ok=True)
        raise fail(f"backup of {file} to {target}: {exc}", ExitCode.UNAVAILABLE) from None
    typer.echo(
        f"{file} copied to {target} ({target.stat().st_size / 1e6:.1f} MB) in"
        f" {time.monotonic() - started:.1f} s"
    )


@db_app.command("current")
def db_current(ctx: typer.Context) -> None:
    """Show the ledger's schema revision: the newest ("(head)"), an older or newer one, or
    none (an empty database), with what to do.

    What the schema is at is an answer, not a failure: exit 0 whenever the database could be
    read (an empty one included), 1 when it cannot be reached or a SQLite ledger file is not
    there, 2 bad configuration.
    """
    from gmd.ledger_schema import migrate

    with reading(ctx, schema=False) as engine:
        rev = migrate.current(engine)
        head = migrate.SCHEMA
    if rev == head:
        typer.echo(f"{rev} (head)")
    elif rev is None:
        typer.echo(
            f"no schema (empty database {shown_url(str(engine.url))}): run `gmd-admin db upgrade`"
        )
    else:
        typer.echo(
            f"{rev} (this gmd's newest is {head}: run `gmd-admin db upgrade`, or if the ledger"
            " is newer, upgrade gmd)"
        )


@db_app.command("usage")
@output_options
def db_usage(
    ctx: typer.Context,
    exact: Annotated[
        bool,
        typer.Option("--exact", help="Count rows (slow on a big PostgreSQL ledger)."),
    ] = False,
    *,
    out: Output,
) -> None:
    """Rows and bytes per ledger table, the oldest interval each holds, how long [retention]
    keeps it and when its oldest rows are due.

    On PostgreSQL rows are the planner's estimates unless --exact, and the raw tables' bytes
    add up their daily partitions; on SQLite rows are counted and bytes come from dbstat.
    Exit codes: 0 shown, 1 database unavailable, 2 bad configuration or option.
    """
    from gmd.admin.db_usage import COLUMNS as USAGE_COLUMNS, usage as ledger_usage

    config = load_config(ctx)
    with reading(ctx) as engine, engine.connect() as conn:
        result = ledger_usage(conn, config.retention, exact=exact)
    emit(
        Listing(
            [
                View(
                    result.rows,
                    USAGE_COLUMNS,
                    title="Ledger",
                    notes=[f"{result.partitions} partition(s)", *result.notes],
                    keep=("table",),
                    name="tables",
                )
            ],
            document=lambda views: {**result.document(), "tables": views[0]},
        ),
        out,
    )
