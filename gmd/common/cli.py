"""The options gmd-agent and gmd-daemon share, so that both spell, check and refuse them alike.

A bad value is an option error: click's usage message, one ``Error:`` line naming the option
and what it takes, exit 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import typer

from gmd.common.logs import LogLevel
from gmd.common.version import version


def parse_log_level(given: str) -> LogLevel:
    """``--log-level``'s value, any case. A parser rather than typer's own handling of enums,
    whose message (newer typers validate through pydantic) begins with "Value error, "."""
    try:
        return LogLevel(str(given).lower())
    except ValueError:
        raise typer.BadParameter(f"{given!r} is not one of {', '.join(LogLevel)}") from None


E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E]) -> Callable[[str], E]:
    """A parser for an option taking one of ``kind``'s values: any case, and a bad value is one
    line naming the choices (typer's own enum handling starts it with "Value error, ")."""

    def parse(given: str) -> E:
        if isinstance(given, kind):
            return given
        try:
            return kind(str(given).lower())
        except ValueError:
            raise typer.BadParameter(
                f"{given!r} is not one of {', '.join(k.value for k in kind)}"
            ) from None

    return parse


LogLevelOption = Annotated[
    LogLevel,
    typer.Option(
        "--log-level",
        parser=parse_log_level,
        metavar="LEVEL",
        help=f"One of {', '.join(LogLevel)}.",
    ),
]


def version_option(program: str) -> Any:
    """``--version``: print ``PROGRAM X.Y.Z`` and exit 0, before the configuration is read (an
    operator asking which version runs may be doing so because the configuration is bad)."""

    def show(wanted: bool) -> None:
        if wanted:
            typer.echo(f"{program} {version()}")
            raise typer.Exit()

    return typer.Option(
        "--version", callback=show, is_eager=True, help="Print the version and exit."
    )
