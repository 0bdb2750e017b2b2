"""What gmd's three programs (gmd-admin, gmd-daemon, gmd-agent) share on the command line: how
they end with an error, their exit codes, and the options they spell alike.

Every error that ends a program is one line on stderr, ``PROGRAM: error: WHAT (and where)``,
written by :func:`fail` (or by :func:`run` for the command line's own usage errors), and its
exit code is one of :class:`ExitCode`'s, whichever program and whichever part of it. A bad
option value is a usage error: one line naming the option and what it takes, exit 2, never a
traceback. A running service's log lines keep the log format (:mod:`gmd.common.logs`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from enum import IntEnum, StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

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


class ExitCode(IntEnum):
    """The exit codes of every gmd program, one meaning each (docs/cli.md has the table)."""

    OK = 0
    """Done (also when there is nothing to show); a service stopped cleanly."""
    UNAVAILABLE = 1
    """Something the program needs cannot be reached or used: the ledger database, a file to
    read or write, libvirt, the spool, the enforcement state. Trying again later may work."""
    USAGE = 2
    """A bad option, argument or configuration: the same command fails again until it is
    changed (systemd's units do not restart a service that exits 2)."""
    NOT_FOUND = 3
    """What the command asked about does not exist: a customer, host or batch, or an
    interval to explain."""
    CANNOT_LISTEN = 4
    """gmd-daemon cannot listen on its address (in use, or not on this host)."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C before it was done (128 + SIGINT, as shells count)."""


EXIT_CODES = {
    ExitCode.OK: "done (also when there is nothing to show)",
    ExitCode.UNAVAILABLE: "something needed cannot be reached or used (the database, a file,"
    " libvirt)",
    ExitCode.USAGE: "bad option, argument or configuration",
    ExitCode.NOT_FOUND: "what was asked about does not exist (a customer, host or batch)",
    ExitCode.CANNOT_LISTEN: "gmd-daemon cannot listen on its address",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}
"""Each exit code in a few words, for the programs' --help."""


def exit_codes_help(*codes: ExitCode) -> str:
    """``codes`` (default all but CANNOT_LISTEN's, which is the daemon's) as a --help sentence."""
    shown = codes or tuple(c for c in ExitCode if c is not ExitCode.CANNOT_LISTEN)
    return "Exit codes: " + ", ".join(f"{int(c)} {EXIT_CODES[c]}" for c in shown) + "."


_running: list[str] = []
"""The program :func:`run` runs (one per process), for :func:`fail`'s prefix."""


def _program() -> str:
    """The running program's name (gmd-admin, gmd-daemon, gmd-agent): the one :func:`run`
    runs, else the command line's own name for itself (a test's CliRunner), else argv[0]."""
    if _running:
        return _running[-1]
    current = getattr(typer.main, "get_current_context", None)
    ctx = current(silent=True) if current is not None else None
    name = ctx.find_root().info_name if ctx is not None else None
    return str(name or os.path.basename(sys.argv[0]) or "gmd")


_NOISE = re.compile(r"^\(Background on this error at: [^)]*\)$")


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined (SQLAlchemy's pointer to its web page left
    out), so that an error is one line whatever raised it."""
    lines = [line.strip() for line in str(message).splitlines()]
    return " ".join(line for line in lines if line and not _NOISE.match(line))


def error_line(message: str, program: str | None = None) -> str:
    """The one format of an error: ``PROGRAM: error: MESSAGE`` on one line."""
    return f"{program or _program()}: error: {one_line(message)}"


def notice(message: str) -> None:
    """A remark on stderr that is no error (the command still exits 0): ``PROGRAM: MESSAGE``,
    one line, so that stdout holds only what was asked for."""
    typer.echo(f"{_program()}: {one_line(message)}", err=True)


def fail(message: str, code: ExitCode = ExitCode.USAGE) -> typer.Exit:
    """Print ``message`` as the program's one error line on stderr and return the exit to
    raise (``raise fail(...) from None``): the one way a gmd program ends with an error.
    ``code`` defaults to USAGE, what most checks a command makes of its own input find."""
    typer.echo(error_line(message), err=True)
    return typer.Exit(int(code))


def _usage_message(exc: Exception) -> str:
    """click's message for a usage error, as the rest of our errors read: lower case first
    (``invalid value for '--x'``, ``no such option: --y``), with where to find help."""
    text = str(exc.format_message()).rstrip().removesuffix(".")  # type: ignore[attr-defined]
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, _USAGE_ERROR) and ctx is not None:
        text += f" (see {ctx.command_path} --help)"
    return text


_USAGE_ERROR: type[Exception] = typer.BadParameter.__base__  # type: ignore[assignment]
"""click's UsageError (unknown option or command, bad value, missing argument), found through
typer's public BadParameter: typer ≥ 0.20 carries its own copy of click, older ones use click."""
_CLICK_ERROR: type[Exception] = _USAGE_ERROR.__base__  # type: ignore[assignment]
"""click's ClickException, the base of every error click reports itself."""


def run(app: typer.Typer, program: str, args: Sequence[str] | None = None) -> NoReturn:
    """Run ``app`` as ``program`` and exit with its code; the command line's own usage errors
    (an unknown option, a bad value, a missing argument) become the one error line with exit
    2, instead of click's three-line usage message."""
    _running.append(program)
    command = typer.main.get_command(app)
    try:
        code = command.main(
            args=list(sys.argv[1:] if args is None else args),
            prog_name=program,
            standalone_mode=False,
        )
    except _CLICK_ERROR as exc:
        ctx = getattr(exc, "ctx", None)
        if ctx is not None and exc.format_message() == ctx.get_help():  # type: ignore[attr-defined]
            exc.show()  # type: ignore[attr-defined]  # the help, asked for by giving nothing
            code = ExitCode.USAGE
        else:
            typer.echo(error_line(_usage_message(exc), program), err=True)
            code = ExitCode.USAGE if isinstance(exc, _USAGE_ERROR) else ExitCode.UNAVAILABLE
    except typer.Abort:
        typer.echo(error_line("aborted", program), err=True)
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`gmd-admin report | head`): nothing more to say to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = ExitCode.UNAVAILABLE
    sys.exit(code if isinstance(code, int) else ExitCode.OK)
