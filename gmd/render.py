"""How one value and one list of rows look in each output format.

Tables round for reading and never wrap a row; CSV, JSON and YAML keep full precision so that a
number copied from a report is the number in the ledger. Every format agrees on the odd
values: no amount is ``-`` in a table and empty/null elsewhere, ``-0.0`` is 0, a boolean is
yes/no for people and true/false for tools.

Shared by gmd-admin (:mod:`gmd.admin.output`) and the simulator's own command line
(``python -m gmd.sim``), which gmd-admin also runs: it lives beside both, so that neither
package imports the other's rendering.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from gmd.columns import Column, Unit

FORMATS: tuple[str, ...] = ("table", "csv", "json")
"""What the simulator's --format takes (gmd-admin's commands take :class:`output.Format`)."""


_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def with_unit(value: float, unit: Unit) -> str:
    """An amount of ``unit`` for people: in binary multiples, one decimal from KiB on, the
    unit in the cell (``512 B``, ``1.5 GiB``, ``10.0 MiB/s``, ``3.2 TiB·s``), as ``ls -h``
    and ``df -h`` show sizes, so that no one counts digits."""
    size, step = abs(value), 0
    while size >= 1024 and step < len(_BINARY) - 1:
        size, step = size / 1024, step + 1
    sign = "-" if value < 0 and size else ""
    number = f"{size:.0f}" if step == 0 else f"{size:.1f}"
    return f"{sign}{number} {_BINARY[step]}{unit.value}"


def cell(value: object, digits: int | None, unit: Unit | None = None) -> str:
    """``value`` as a table shows it (in ``unit``'s binary multiples when it has one)."""
    if value is None:  # no host, no cap: a dash, not Python's "None"
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit is not None and isinstance(value, int | float):
        return "-" if not math.isfinite(value) else with_unit(value, unit)
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if digits is not None:
            text = f"{value:.{digits}f}"
            return text.removeprefix("-") if float(text) == 0 else text
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def plain(value: object) -> object:
    """``value`` as CSV, ``-P`` and ``value`` output write it: full precision, one line."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        return repr(value + 0.0)  # + 0.0 turns -0.0 into 0.0
    if isinstance(value, dict | list):
        return json.dumps(clean(value), separators=(",", ":"), allow_nan=False)
    return value


def clean(document: Any) -> Any:
    """``document`` with -0.0 as 0.0, NaN/infinities as null and enums as their values:
    valid JSON and safe YAML, and the same value whichever format carries it."""
    if isinstance(document, float):
        return document + 0.0 if math.isfinite(document) else None
    if isinstance(document, Mapping):
        return {k: clean(v) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [clean(v) for v in document]
    if isinstance(document, Enum):
        return clean(document.value)
    if isinstance(document, str):
        return str(document)  # a str subclass is a plain string to YAML too
    if isinstance(document, int) and not isinstance(document, bool):
        return int(document)
    return document


def table_text(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[Column],
    *,
    title: str | None = None,
    caption: str | None = None,
    width: int | None = None,
    framed: bool = True,
    header: bool = True,
) -> str:
    """A table as plain text, ``width`` characters at most (None: as wide as it needs).
    ``framed`` draws box characters (for a terminal); unframed it is columns of text that
    ``grep``/``awk`` read."""
    table = Table(
        title=title,
        caption=caption,
        caption_justify="left",
        box=box.SQUARE if framed else None,
        show_header=header,
        show_edge=framed,
        pad_edge=framed,
        title_justify="left",
    )
    for col in columns:
        table.add_column(col.header, justify=col.justify, no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*(cell(row.get(c.key), c.digits, c.unit) for c in columns))
    buffer = io.StringIO()
    # Wide enough that rich never folds a row when no width is asked for.
    Console(file=buffer, width=width or 100_000, color_system=None, highlight=False).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def csv_text(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[Column],
    *,
    header: bool = True,
    delimiter: str = ",",
) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n", delimiter=delimiter)
    if header:
        writer.writerow([c.key for c in columns])
    for row in rows:
        writer.writerow([plain(row.get(c.key)) for c in columns])
    return out.getvalue()


def value_text(rows: Sequence[Mapping[str, object]], columns: Sequence[Column]) -> str:
    """The values alone, space-separated, a row per line (``openstack … -f value``)."""
    return "".join(" ".join(str(plain(row.get(c.key))) for c in columns) + "\n" for row in rows)


def json_text(document: object, *, indent: bool = True) -> str:
    return json.dumps(clean(document), indent=2 if indent else None, allow_nan=False) + "\n"


def yaml_text(document: object) -> str:
    import yaml  # only for -f yaml: every gmd-admin process imports this module

    return yaml.safe_dump(clean(document), sort_keys=False, allow_unicode=True)
