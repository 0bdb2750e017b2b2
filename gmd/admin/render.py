"""One way to print rows as a table (for people), CSV (for spreadsheets) or JSON (for tools).

Tables round for reading; CSV and JSON keep full precision so that a number copied from a
report is the number in the ledger.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, JustifyMethod
from rich.table import Table

FORMATS: tuple[str, ...] = ("table", "csv", "json")


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    digits: int | None = 4
    justify: JustifyMethod = "right"


PROJECT = Column("name", "Project", None, "left")
"""A customer's project name beside its uuid (the key), where the ledger knows it."""


def without_empty(columns: Sequence[Column], rows: Sequence[Mapping[str, object]]) -> list[Column]:
    """A table's columns without the project name when no row has one: a cloud without
    Keystone names shows no empty column. CSV and JSON keep every column, for scripts."""
    if any(row.get(PROJECT.key) for row in rows):
        return list(columns)
    return [c for c in columns if c.key != PROJECT.key]


def _cell(value: object, digits: int | None) -> str:
    if value is None:  # no host, no cap: a dash, not Python's "None"
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if digits is not None:
            text = f"{value:.{digits}f}"
            return "0." + "0" * digits if text == "-0." + "0" * digits else text
    return str(value)


def table_text(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[Column],
    *,
    title: str | None = None,
    caption: str | None = None,
    width: int | None = None,
) -> str:
    """A rich table rendered to plain text (colour only when ``width`` is None and a tty)."""
    table = Table(title=title, caption=caption, caption_justify="left")
    for col in columns:
        table.add_column(col.header, justify=col.justify)
    for row in rows:
        table.add_row(*(_cell(row.get(c.key, ""), c.digits) for c in columns))
    buffer = io.StringIO()
    Console(file=buffer, width=width or 160, color_system=None).print(table)
    return buffer.getvalue()


def csv_text(rows: Sequence[Mapping[str, object]], columns: Sequence[Column]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.key for c in columns])
    for row in rows:
        writer.writerow([_plain(row.get(c.key, "")) for c in columns])
    return out.getvalue()


def _plain(value: object) -> object:
    return repr(value) if isinstance(value, float) else value


def json_text(document: object) -> str:
    return json.dumps(document, indent=2, allow_nan=False) + "\n"
