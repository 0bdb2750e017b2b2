"""gmd-admin: the operators' command line."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gmd.fairness.scenarios import SCENARIOS
from gmd.report.calculator import (
    Situation,
    judge,
    parse_amounts,
    situation_from_csv,
    situation_from_options,
)
from gmd.report.render import csv_text, json_text, table_text

app = typer.Typer(
    name="gmd-admin",
    help="Operate gmd: judge situations with the Greediness Metric (more commands to come).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

EXIT_BAD_INPUT = 2


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


@app.callback()
def _root() -> None:
    """Operate gmd."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"gmd-admin: error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


@app.command("gm")
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
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Judge one host (pool) with the Greediness Metric, next to Price, P×S, P∩S and DRF.

    GM > 0: the consumer took more than its endowment where others had to cede; GM < 0: it
    ceded what others actually used; 0: exactly its share. Consumers are ranked greediest
    first; 'offset' columns are the per-resource offsets o(i,j) in the resources' units.

    Example: gmd-admin gm --supply 6,12 --use c1=3,0 --use c2=0,6 --use c3=3,6
    """
    sources = sum(x is not None for x in (scenario, csv_file)) + bool(use)
    if sources != 1:
        raise _fail("give exactly one of --scenario, --csv or --use (with --supply)")
    if resources is not None and not use:
        raise _fail(
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
        raise _fail(str(exc)) from None

    if fmt is Format.json:
        sys.stdout.write(json_text(result.document()))
    elif fmt is Format.csv:
        sys.stdout.write(csv_text(result.rows, result.columns()))
    else:
        credit = ", ".join(f"{r} {k:.3g}" for r, k in result.credit.items())
        title = f"{situation.title or 'Greediness'} (γ = {gamma:g})"
        caption = f"credit factor κ = min(1, α/β): {credit}"
        sys.stdout.write(table_text(result.rows, result.columns(), title=title, caption=caption))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
