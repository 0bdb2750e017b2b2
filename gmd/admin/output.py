"""gmd-admin's one output layer: the options every listing command takes, and how a command's
rows reach the terminal, a pipe or a file in the format asked for.

The options follow the ``openstack`` client (``-f table|csv|json|value|yaml``, ``-c COLUMN``,
``--sort-column``, ``--noheader``, ``--max-width``, ``--noindent``) and Slurm's ``sshare``/
``sreport`` (``-P`` pipe-separated, ``-n`` no header), so that an operator's habits and
scripts carry over. A table on a terminal fits its width (columns that do not fit are left
out and named, never wrapped); piped, it is plain columns of text without box characters.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import IO, Annotated, Any, TypeVar

import typer

from gmd import GmdError
from gmd.common.cli import ExitCode, choice, fail
from gmd.render import (
    Column,
    cell,
    csv_text,
    json_text,
    table_text,
    value_text,
    yaml_text,
)


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    value = "value"
    yaml = "yaml"


class OutputError(GmdError, ValueError):
    """An output option that cannot be honoured (an unknown column, a format the command does
    not write): the command ends with exit 2 and this message."""


@dataclass(frozen=True)
class Output:
    """The output options of one command line."""

    format: Format = Format.table
    columns: tuple[str, ...] = ()
    sort_columns: tuple[str, ...] = ()
    sort_descending: bool = False
    noheader: bool = False
    max_width: int | None = None
    parsable: bool = False
    noindent: bool = False

    @property
    def structured(self) -> bool:
        """JSON or YAML: a document rather than rows of text."""
        return self.format in (Format.json, Format.yaml)


@dataclass
class View:
    """One list of rows a command shows.

    ``table_rows`` are the rows as a table shows them (marks such as ``*`` for late samples);
    ``notes`` are the table's footnotes.
    """

    rows: Sequence[Mapping[str, object]]
    columns: Sequence[Column]
    title: str | None = None
    notes: Sequence[str] = ()
    table_rows: Sequence[Mapping[str, object]] | None = None
    keep: Sequence[str] = ()
    """Columns a narrow terminal never drops (what says which row this is)."""
    hide_if_empty: Sequence[str] = ("name",)
    """Columns a table leaves out when no row has a value there (the project name, in a cloud
    without names); every other format keeps them, for scripts."""
    name: str = "rows"
    """The document's key for these rows, when the command has no document of its own."""


@dataclass
class Listing:
    """What a command prints: its views, and for JSON/YAML the document that holds them
    (``document`` gets each view's rows, reduced to the columns asked for)."""

    views: list[View]
    document: Callable[[list[list[dict[str, object]]]], object] | None = None


def _choose(view: View, wanted: Sequence[str]) -> list[Column]:
    if not wanted:
        return list(view.columns)
    by_name = {}
    for c in view.columns:
        by_name[c.key.lower()] = c
        by_name[c.header.lower()] = c
    return [by_name[w.lower()] for w in wanted if w.lower() in by_name]


def _check_columns(listing: Listing, wanted: Sequence[str]) -> None:
    known = {n.lower() for v in listing.views for c in v.columns for n in (c.key, c.header)}
    unknown = [w for w in wanted if w.lower() not in known]
    if unknown:
        keys = ", ".join(dict.fromkeys(c.key for v in listing.views for c in v.columns))
        raise OutputError(f"no column {unknown[0]!r} here; the columns are: {keys}")


def _sort_key(value: object) -> tuple[int, Any]:
    """Numbers by value, text A→Z, nothing (None, NaN) last whichever the direction."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, 0)
    if isinstance(value, bool | int | float):
        return (0, float(value))
    return (1, str(value).lower())


def _sorted(
    rows: Sequence[Mapping[str, object]], columns: Sequence[Column], out: Output
) -> list[Mapping[str, object]]:
    ordered = list(rows)
    if not out.sort_columns:
        return ordered
    keys = [c.key for c in _choose(View(rows, columns), out.sort_columns)]
    for key in reversed(keys):
        present = [r for r in ordered if _sort_key(r.get(key))[0] < 2]
        absent = [r for r in ordered if _sort_key(r.get(key))[0] == 2]
        present.sort(key=lambda r: _sort_key(r.get(key)), reverse=out.sort_descending)
        ordered = present + absent
    return ordered


def terminal_width(stream: IO[str]) -> int | None:
    """The terminal's width, or None when ``stream`` is not a terminal (a pipe, a file)."""
    if not stream.isatty():
        return None
    return shutil.get_terminal_size((80, 24)).columns


def _needed(column: Column, rows: Sequence[Mapping[str, object]]) -> int:
    cells = [len(cell(r.get(column.key), column.digits, column.unit)) for r in rows]
    return max([len(column.header), *cells])


def fit(
    columns: Sequence[Column],
    rows: Sequence[Mapping[str, object]],
    width: int,
    keep: Sequence[str] = (),
    framed: bool = True,
) -> tuple[list[Column], list[Column]]:
    """The columns that fit ``width`` without wrapping or cutting a number, and those left out
    (from the right, never one of ``keep``)."""
    shown = list(columns)
    dropped: list[Column] = []

    def total() -> int:
        cells = sum(_needed(c, rows) for c in shown)
        # framed: "│ " before each cell, " " after, "│" at the end; plain: two spaces between
        return cells + (3 * len(shown) + 1 if framed else 2 * (len(shown) - 1))

    while total() > width:
        candidates = [c for c in shown if c.key not in keep]
        if len(shown) <= 1 or not candidates:
            break
        victim = candidates[-1]
        shown.remove(victim)
        dropped.insert(0, victim)
    return shown, dropped


def _notes(view: View, shown: Sequence[Column]) -> list[str]:
    """The view's footnotes that speak of a shown column, or of none: a note that names only
    columns the table leaves out would explain what the reader cannot see."""
    shown_keys = {c.key for c in shown}
    out = []
    for note in view.notes:
        named = {c.key for c in view.columns if _names(note, c.key)}
        if not named or named & shown_keys:
            out.append(note)
    return out


def _names(note: str, key: str) -> bool:
    return re.search(rf"(?<![\w<]){re.escape(key)}(?![\w>])", note) is not None


def render(listing: Listing, out: Output, stream: IO[str] | None = None) -> str:
    """The text of ``listing`` in the format ``out`` asks for. Raises :class:`OutputError`."""
    stream = stream or sys.stdout
    fmt = out.format
    if out.parsable and fmt not in (Format.table, Format.csv):
        raise OutputError(f"-P/--parsable writes pipe-separated rows; it cannot be -f {fmt}")
    _check_columns(listing, out.columns)
    _check_columns(listing, out.sort_columns)
    chosen = []
    for view in listing.views:
        columns = _choose(view, out.columns)
        rows = _sorted(view.rows, view.columns, out)
        chosen.append((view, columns, rows))
    if out.structured:
        reduced = [[{c.key: r.get(c.key) for c in cols} for r in rows] for _, cols, rows in chosen]
        if listing.document is not None:
            document = listing.document(reduced)
        elif len(reduced) == 1:
            document = {listing.views[0].name: reduced[0]}
        else:
            document = {v.name: rows for v, rows in zip(listing.views, reduced, strict=True)}
        if fmt is Format.json:
            return json_text(document, indent=not out.noindent)
        return yaml_text(document)
    parts = []
    several = len(chosen) > 1
    for view, columns, rows in chosen:
        if not columns:
            continue
        if out.parsable or fmt is Format.csv:
            text = csv_text(
                rows, columns, header=not out.noheader, delimiter="|" if out.parsable else ","
            )
        elif fmt is Format.value:
            text = value_text(rows, columns)
        else:
            text = _table(view, columns, rows, out, stream)
        parts.append(text)
    # Several tables in CSV-like formats are separated by an empty line, each with its header.
    return ("\n" if several else "").join(parts)


def _table(
    view: View,
    columns: list[Column],
    rows: list[Mapping[str, object]],
    out: Output,
    stream: IO[str],
) -> str:
    shown_rows = rows
    if view.table_rows is not None:
        # The marked rows, in the order the options sorted the plain ones into.
        marked = {id(r): t for r, t in zip(view.rows, view.table_rows, strict=True)}
        shown_rows = [marked[id(r)] for r in rows]
    if not out.columns:
        columns = [
            c
            for c in columns
            if c.key not in view.hide_if_empty or any(r.get(c.key) for r in shown_rows)
        ]
    tty_width = terminal_width(stream)
    width = out.max_width if out.max_width is not None else tty_width
    framed = tty_width is not None
    dropped: list[Column] = []
    if width:  # 0: as wide as it needs
        columns, dropped = fit(columns, shown_rows, width, view.keep, framed)
    notes = _notes(view, columns)
    if dropped:
        notes.append(
            f"Left out to fit {width} columns: {', '.join(c.key for c in dropped)}"
            " (-c COLUMN picks columns, --max-width 0 shows all, -f csv or json has all)."
        )
    text = table_text(
        shown_rows,
        columns,
        title=None if out.noheader else view.title,
        width=width or None,
        framed=framed,
        header=not out.noheader,
    )
    if out.noheader:
        return text
    # Footnotes are prose: wrapped to the terminal, not to the table's width.
    for note in notes:
        text += (textwrap.fill(note, width) if width else note) + "\n"
    return text


def emit(listing: Listing, out: Output) -> None:
    """Print ``listing``; an option it cannot honour ends the command with exit 2."""
    try:
        text = render(listing, out)
    except OutputError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    sys.stdout.write(text)


_F = TypeVar("_F", bound=Callable[..., Any])

_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    (
        "format",
        Annotated[
            Format,
            typer.Option(
                "-f",
                "--format",
                parser=choice(Format),
                metavar="FORMAT",
                help="Output format: table (for people), csv, json, value (values alone,"
                " space-separated) or yaml.",
                show_default=False,
            ),
        ],
        Format.table,
    ),
    (
        "columns",
        Annotated[
            list[str] | None,
            typer.Option(
                "-c",
                "--column",
                help="Show this column (key or heading); repeat for several, in that order.",
                metavar="COLUMN",
            ),
        ],
        None,
    ),
    (
        "sort_columns",
        Annotated[
            list[str] | None,
            typer.Option(
                "--sort-column",
                help="Sort rows by this column (repeatable; the first given sorts first),"
                " ascending unless --sort-descending.",
                metavar="COLUMN",
            ),
        ],
        None,
    ),
    (
        "sort_descending",
        Annotated[bool, typer.Option("--sort-descending", help="--sort-column greatest first.")],
        False,
    ),
    (
        "noheader",
        Annotated[
            bool,
            typer.Option(
                "-n", "--noheader", help="No column headings (nor table title and footnotes)."
            ),
        ],
        False,
    ),
    (
        "max_width",
        Annotated[
            int | None,
            typer.Option(
                "--max-width",
                min=0,
                help="Fit tables to this many characters (default: the terminal's width;"
                " piped, no limit); 0 for no limit.",
                metavar="N",
            ),
        ],
        None,
    ),
    (
        "parsable",
        Annotated[
            bool,
            typer.Option(
                "-P",
                "--parsable",
                help="Pipe-separated rows with a heading line and no trailing '|', as"
                " Slurm's sshare -P.",
            ),
        ],
        False,
    ),
    (
        "noindent",
        Annotated[bool, typer.Option("--noindent", help="JSON on one line, not indented.")],
        False,
    ),
)


def output_options(func: _F) -> _F:
    """Give a command the output options: Typer sees them in the wrapper's signature, and the
    command gets them as one :class:`Output` in its ``out`` parameter."""
    signature = inspect.signature(func, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "out"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
        for name, kind, default in _OPTIONS
    ]
    names = [name for name, _, _ in _OPTIONS]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in names}
        out = Output(
            format=given["format"],
            columns=tuple(given["columns"] or ()),
            sort_columns=tuple(given["sort_columns"] or ()),
            sort_descending=given["sort_descending"],
            noheader=given["noheader"],
            max_width=given["max_width"],
            parsable=given["parsable"],
            noindent=given["noindent"],
        )
        return func(*args, out=out, **kwargs)

    parameters = own + added
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    return wrapper  # type: ignore[return-value]
