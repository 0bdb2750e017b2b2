"""gmd-admin: the operators' command line.

This module is the entry point: the Typer ``app``, its global options (on the root context)
and the commands registered in the order ``--help`` lists them. Each family of commands is a
module of :mod:`gmd.admin.commands`; what they share (the configuration, the ledger opened for
reading or writing, the times operators type) is :mod:`gmd.admin.common`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gmd.admin.commands import (
    accounting,
    batches,
    check,
    database,
    enforcement,
    federation,
    hosts,
    simulation,
)
from gmd.admin.common import Options
from gmd.common.cli import exit_codes_help, run, version_option

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
    ctx.obj = Options(config, primary)


# The commands, in the order `gmd-admin --help` lists them (the groups come last).
app.command("gm")(simulation.gm_command)
app.command("standings")(accounting.standings_command)
app.command("whatif")(simulation.whatif_command)
app.command("actions")(enforcement.actions_command)
app.command("enforce")(enforcement.enforce_command)
app.command("hosts")(hosts.hosts_command)
app.command("report")(accounting.report_command)
app.command("reset")(enforcement.reset_command)
app.command("explain")(accounting.explain_command)
app.command("simulate")(simulation.simulate_command)
app.command("simulate-placement")(simulation.simulate_placement_command)
app.command("plot")(accounting.plot_command)
app.command("demo")(simulation.demo_command)
app.command("check")(check.check_command)
app.add_typer(database.db_app, name="db")
app.add_typer(batches.batches_app, name="batches")
app.add_typer(federation.federation_app, name="federation")


def main() -> None:
    run(app, "gmd-admin")


if __name__ == "__main__":
    main()
