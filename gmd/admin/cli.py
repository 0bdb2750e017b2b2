"""gmd-admin: the operators' command line."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from gmd import OptionError
from gmd.admin.calculator import (
    Situation,
    judge,
    parse_amounts,
    situation_from_csv,
    situation_from_options,
)
from gmd.admin.output import Format, Listing, Output, View, emit, output_options
from gmd.common.cli import (
    ExitCode,
    choice,
    exit_codes_help,
    fail,
    notice,
    run,
    version_option,
)
from gmd.common.config import DEFAULT_PATH, ConfigError
from gmd.common.timespec import iso as iso_time, parse_time
from gmd.daemon.config import Config, load as load_config
from gmd.daemon.ledger import migrate
from gmd.daemon.ledger.lookup import UnknownCustomer
from gmd.daemon.ledger.models import BatchState
from gmd.daemon.reports.actions import COLUMNS as ACTION_COLUMNS, actions as list_actions
from gmd.daemon.reports.enforcement import (
    CAPS_COLUMNS,
    LEVEL_COLUMNS,
    PLAN_COLUMNS,
    levels as enforcement_levels,
    plans as enforcement_plans,
)
from gmd.daemon.reports.standings import COLUMNS as STANDINGS_COLUMNS, SortKey, standings
from gmd.fairness.scenarios import SCENARIOS
from gmd.render import json_text, yaml_text
from gmd.wire import PlanMode

app = typer.Typer(
    name="gmd-admin",
    help="Operate gmd: standings, reports, explanations and plots of the ledger, the"
    " enforcement log, balance resets, the ledger database, the Greediness Metric calculator,"
    " the fairness simulator, and an end-to-end demo.\n\n"
    "The commands that only read (standings, report, explain, plot, actions, enforce --plan,"
    " batches, db usage, db current) do so in read-only transactions and, with [database]"
    " read_url set, from that streaming replica, so that heavy reports do not load the"
    " primary: what they show may then trail the primary by the replication lag (--primary"
    " reads the primary). Commands that write (db upgrade, reset, batches release and drop)"
    " always use url. Reading creates nothing: a ledger that is not there is an error.\n\n"
    "Listing commands take the openstack client's output options (-f table|csv|json|value|yaml,"
    " -c COLUMN, --sort-column, --noheader, --max-width, --noindent) and Slurm's -P (pipe-"
    "separated). Tables fit the terminal and are plain columns when piped.\n\n"
    + exit_codes_help()
    + " Every error is one line on stderr: gmd-admin: error: WHAT.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

NAMED = "project uuid or project name"
"""How every command that takes a customer says it may be named: the ledger's lookup
(:mod:`gmd.daemon.ledger.lookup`) takes either, so every help says so in these words."""


@dataclass(frozen=True)
class _Options:
    """The global options, kept on the root context for every command to find."""

    config: Path | None
    primary: bool


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="GMD_CONFIG",
            help="Configuration file (default /etc/gmd/gmd.toml).",
            metavar="FILE",
        ),
    ] = None,
    version: Annotated[bool, version_option("gmd-admin")] = False,
    primary: Annotated[
        bool,
        typer.Option(
            "--primary",
            help="Read from the primary ([database] url) even when read_url names a replica:"
            " for figures that must include the last seconds, or when the replica is down.",
        ),
    ] = False,
) -> None:
    """Operate gmd."""
    ctx.obj = _Options(config, primary)


def _options(ctx: typer.Context) -> _Options:
    options = ctx.obj
    assert isinstance(options, _Options), "the root callback sets ctx.obj"
    return options


def _load_config(ctx: typer.Context) -> Config:
    try:
        return load_config(_options(ctx).config)
    except ConfigError as exc:
        raise fail(str(exc)) from None


db_app = typer.Typer(
    help="The ledger database: create it and upgrade its schema.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(db_app, name="db")


def _shown(url: str) -> str:
    """The database URL with its password masked, for messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _engine(ctx: typer.Context, *, replica: bool = False) -> Engine:
    """The ledger's engine: the primary's ([database] url), or with ``replica`` the read
    replica's (read_url); a bad URL names the key it came from."""
    config = _load_config(ctx)
    key, url = ("read_url", config.read_url) if replica else ("url", config.database_url)
    assert url is not None, "replica only when read_url is set"
    try:
        return migrate.engine_for(url)
    except (SQLAlchemyError, OSError) as exc:
        raise fail(f"database {key} {_shown(url)!r}: {exc}") from None


def _read_only(engine: Engine) -> Engine:
    """The engine with every transaction read-only, so that a read command that writes by
    mistake fails at once, on the primary too, instead of writing there or failing only
    where a replica is set.

    PostgreSQL begins READ ONLY transactions (a hot standby refuses writes anyway); SQLite
    gets ``PRAGMA query_only``, after engine_for's own pragmas, which must still write.
    """
    if engine.dialect.name == "postgresql":
        return engine.execution_options(postgresql_readonly=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _query_only(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA query_only = ON")

    return engine


def _db_error(engine: Engine, exc: Exception, hint: str = "") -> typer.Exit:
    return fail(f"database {_shown(str(engine.url))}: {exc}{hint}", ExitCode.UNAVAILABLE)


@contextmanager
def _database(ctx: typer.Context, *, replica: bool = False) -> Iterator[Engine]:
    """The ledger for one command: a database that cannot be reached or read ends the command
    with exit 1 and its URL (password masked), and the engine is disposed whatever happens."""
    engine = _engine(ctx, replica=replica)
    # The replica is a second thing that can be down: say how to go on without it.
    hint = " (the read replica, [database] read_url; --primary reads url)" if replica else ""
    try:
        yield engine
    except (SQLAlchemyError, OSError) as exc:
        raise _db_error(engine, exc, hint) from None
    finally:
        engine.dispose()


@contextmanager
def _reading(ctx: typer.Context, *, schema: bool = True) -> Iterator[Engine]:
    """The ledger for a command that only reads: the replica in [database] read_url when one
    is set and --primary is not given, else the primary; read-only transactions either way.
    Commands that write use :func:`_database`, which is always the primary.

    Reading creates nothing: a SQLite ledger that is not there, or a database without the
    ledger's schema (or with another version of it, unless ``schema`` is False), ends the
    command with exit 1 and what to do, instead of an empty file or an SQL error."""
    config = _load_config(ctx)
    replica = config.read_url is not None and not _options(ctx).primary
    url = config.read_url if replica and config.read_url else config.database_url
    file = _sqlite_file(url)
    if file is not None and not file.exists():
        where = (
            f"[database] url in {config.path}"
            if config.path is not None
            else f"the default ledger: there is no configuration at {DEFAULT_PATH}; give"
            " --config FILE or set GMD_CONFIG"
        )
        raise fail(
            f"no ledger at {file} ({where}); gmd-daemon creates it when it starts, or run"
            " `gmd-admin db upgrade`",
            ExitCode.UNAVAILABLE,
        )
    with _database(ctx, replica=replica) as engine:
        reading = _read_only(engine)
        if schema:
            _check_schema(reading)
        yield reading


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for other databases and for memory)."""
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return None
    return Path(url.removeprefix("sqlite:///").split("?", 1)[0])


def _check_schema(engine: Engine) -> None:
    revision = migrate.current(engine)
    if revision == migrate.head():
        return
    url = _shown(str(engine.url))
    if revision is None:
        raise fail(f"no ledger schema in {url}: run `gmd-admin db upgrade`", ExitCode.UNAVAILABLE)
    raise fail(
        f"the ledger in {url} is at schema {revision}, this gmd reads {migrate.head()}: run"
        " `gmd-admin db upgrade` (or, if the ledger is newer, upgrade gmd)",
        ExitCode.UNAVAILABLE,
    )


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Option(help="Target schema revision.")] = "head",
) -> None:
    """Create the ledger or bring its schema up to date (safe to run again)."""
    with _database(ctx) as engine:
        before = migrate.current(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current(engine)
    url = _shown(str(engine.url))
    if before == after:
        typer.echo(f"{url}: already at schema revision {after}")
    else:
        typer.echo(f"{url}: schema upgraded from {before or 'empty'} to {after}")


@db_app.command("current")
def db_current(ctx: typer.Context) -> None:
    """Show the ledger's schema revision: the newest ("(head)"), an older or newer one, or
    none (an empty database), with what to do.

    What the schema is at is an answer, not a failure: exit 0 whenever the database could be
    read (an empty one included), 1 when it cannot be reached or a SQLite ledger file is not
    there, 2 bad configuration.
    """
    with _reading(ctx, schema=False) as engine:
        rev = migrate.current(engine)
        head = migrate.head()
    if rev == head:
        typer.echo(f"{rev} (head)")
    elif rev is None:
        typer.echo(
            f"no schema (empty database {_shown(str(engine.url))}): run `gmd-admin db upgrade`"
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

    config = _load_config(ctx)
    with _reading(ctx) as engine, engine.connect() as conn:
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


def _times(*given: str | None) -> tuple[float | None, ...]:
    """Each of the ``--at/--from/--to`` options given, as Unix seconds (None where absent);
    a time gmd cannot read ends the command with exit 2 and what it can read."""
    now = time.time()
    try:
        return tuple(None if t is None else parse_time(t, now) for t in given)
    except ValueError as exc:
        raise fail(str(exc)) from None


@app.command("gm")
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
    """
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


@app.command("standings")
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
    config = _load_config(ctx)
    wanted = list(dict.fromkeys(customer or ()))
    with _reading(ctx) as engine, engine.connect() as conn:
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


@app.command("whatif")
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

    from_s, to_s = _times(from_, to)
    assert from_s is not None and to_s is not None
    sets = list(set_ or [])
    from gmd.daemon.reports.plot import output_format, save

    base = _load_config(ctx)
    try:
        config = with_overrides(base, sets)
        picture = None if plot_file is None else output_format(plot_file)
    except (WhatIfRefused, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        with _reading(ctx) as engine, engine.connect() as conn:
            result = replay(conn, config, from_s, to_s, sets)
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


@app.command("actions")
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
    from gmd.daemon.ledger.lookup import customer_uuid

    from_s, to_s = _times(from_, to)
    try:
        with _reading(ctx) as engine, engine.connect() as conn:
            uuid = None if customer is None else customer_uuid(conn, customer)
            rows = list_actions(conn, from_s=from_s, to_s=to_s, customer=uuid, limit=limit)
    except UnknownCustomer as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    caption = f"{len(rows)} action(s)" + (" — none recorded" if not rows else "")
    if limit is not None and len(rows) == limit:
        caption += f" (the newest {limit})"
    emit(
        Listing(
            [View(rows, ACTION_COLUMNS, title="Enforcement log", notes=[caption], name="actions")]
        ),
        out,
    )


@app.command("enforce")
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
    """
    from gmd.daemon.ledger.lookup import UnknownHost

    del plan  # accepted for compatibility: the plan is what enforce shows
    config = _load_config(ctx)
    try:
        with _reading(ctx) as engine, engine.connect() as conn:
            level_rows = enforcement_levels(conn, config.enforcement)
            plan_rows, cap_rows = enforcement_plans(conn, config.enforcement, host)
    except UnknownHost as exc:
        raise fail(str(exc), ExitCode.NOT_FOUND) from None
    mode = config.enforcement.mode
    note = {
        PlanMode.off: "off: nothing is decided",
        PlanMode.dry_run: "dry-run: recorded, not applied",
    }
    emit(
        Listing(
            [
                View(
                    level_rows,
                    LEVEL_COLUMNS,
                    title=f"Throttle levels (enforcement.mode = {mode})",
                    notes=[
                        note.get(
                            mode,
                            "on: applied where the hosts report it (gmd-admin standings: Enforced)",
                        )
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


@app.command("report")
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
    """
    from contextlib import nullcontext

    from gmd.daemon.reports.usage import GROUPS, report as usage_report

    if group_by not in GROUPS:
        raise fail(f"cannot group by {group_by!r}; choose one of {', '.join(GROUPS)}")
    now = time.time()
    try:
        from_s = parse_time(from_, now)
        to_s = parse_time(to, now)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if to_s <= from_s:
        raise fail(f"--from {iso_time(from_s)} is not before --to {iso_time(to_s)}")
    bar = None
    if sys.stderr.isatty():  # a progress bar only for people watching, never into pipes
        from rich.console import Console
        from rich.progress import Progress

        bar = Progress(console=Console(stderr=True), transient=True)
    try:
        with _reading(ctx) as engine, engine.connect() as conn, bar or nullcontext():
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


@app.command("reset")
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
        with _database(ctx) as engine:
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


batches_app = typer.Typer(rich_markup_mode=None)
app.add_typer(batches_app, name="batches")


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
    from_s, to_s = _times(from_, to)
    from gmd.daemon.ledger.lookup import UnknownHost, require_host

    try:
        with _reading(ctx) as engine, engine.connect() as conn:
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

    if not reason.strip():
        raise fail("--reason must say why (it is kept in the enforcement log)")
    requester = by or getpass.getuser()
    decide = quarantine.release if release else quarantine.drop
    try:
        with _database(ctx) as engine, migrate.writer(engine).begin() as conn:
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


@app.command("explain")
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
    from gmd.daemon.reports.explain import NothingToExplain, explain, render_summary, render_text

    if fmt in (Format.csv, Format.value):
        raise fail(f"explain writes text, JSON or YAML (-f table|json|yaml), not {fmt.upper()}")
    if at is not None and (from_ is not None or to is not None):
        raise fail("give either --at or --from/--to, not both")
    at_s, from_s, to_s = _times(at, from_, to)
    config = _load_config(ctx)
    try:
        with _reading(ctx) as engine, engine.connect() as conn:
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


class Processors(StrEnum):
    equal = "equal"
    zipf = "zipf"


@app.command("simulate")
@output_options
def simulate_command(
    trace: Annotated[
        Path,
        typer.Option(help="A Standard Workload Format job log (.swf or .swf.gz).", metavar="FILE"),
    ],
    window: Annotated[int, typer.Option(help="Length of each sample, in seconds.")] = 86400,
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
    *,
    out: Output,
) -> None:
    """Replay a job trace through fairness policies and compare them, as the papers do.

    Organizations contribute processors and submit the trace's jobs (its users dealt to them);
    each policy schedules them greedily, FIFO per organization. Reports, per policy, the mean
    and standard deviation over the samples of the unfairness Δψ/p against the exact
    Shapley-fair Ref (Skowron & Rzadca), total wait and utilization. docs/reproduction.md has
    the papers' tables next to ours and the commands that produce them.
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
            )
        )
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    table = shown(result)
    emit(
        Listing(
            [
                View(
                    table.rows,
                    table.columns,
                    title="gmd simulate",
                    notes=[table.caption],
                    keep=("policy",),
                    name="policies",
                )
            ],
            document=lambda views: {**table.document, "policies": views[0]},
        ),
        out,
    )


@app.command("plot")
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
    """
    from gmd.daemon.reports import plot as plotting
    from gmd.daemon.reports.series import EmptyRange, collect

    try:
        fmt = plotting.output_format(output)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if customer and top is not None:
        raise fail("--top chooses customers when no --customer is given: give one or the other")
    from_s, to_s = _times(from_, to)
    if from_s is not None and to_s is not None and from_s >= to_s:
        raise fail(
            f"--from {from_} ({iso_time(from_s)}) is not before --to {to} ({iso_time(to_s)})"
        )
    config = _load_config(ctx)
    try:
        with _reading(ctx) as engine, engine.connect() as conn:
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


@app.command("demo")
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


def main() -> None:
    run(app, "gmd-admin")


if __name__ == "__main__":
    main()
