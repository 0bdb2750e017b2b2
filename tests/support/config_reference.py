"""The reference of every gmd.toml key in docs/configuration.md, made from the declarations.

Each key is declared once, as an :class:`~gmd.common.options.Option` of a field of its
table's configuration class (:mod:`gmd.common.settings`; the tables:
:data:`gmd.daemon.config.TABLES`, :data:`gmd.agent.config.TABLES`,
:data:`gmd.broker.config.TABLES`): its default, its bounds and what it means. The page holds a
copy of them as tables between two markers, which ``tests/unit/common/test_config_defaults.py``
compares with what this makes, so that an option added, changed or described anew shows up as a
difference to regenerate:

    python tests/support/config_reference.py --write    # rewrite the page's copy
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from gmd.agent import config as agent_config
from gmd.broker import config as broker_config
from gmd.common.config import _bound
from gmd.common.options import Choice, Count, Flag, Kind, Number, Option
from gmd.common.settings import Table
from gmd.daemon import config as daemon_config

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"
BEGIN = "<!-- every key: made by tests/support/config_reference.py, do not edit by hand -->"
END = "<!-- end of every key -->"
TABLES: tuple[Table, ...] = (
    *daemon_config.TABLES,
    *agent_config.TABLES,
    *broker_config.TABLES,
)
"""Every table of gmd.toml, in etc/gmd.toml's order."""


def toml(value: Any) -> str | None:
    """``value`` as TOML writes it (``10``, ``"dry-run"``, ``[1, 2]``), or None when TOML
    cannot: None, a table, a list holding None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a StrEnum member too: its value
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    if isinstance(value, tuple | list):
        items = [toml(v) for v in value]
        return None if None in items else f"[{', '.join(i for i in items if i is not None)}]"
    return None


def markdown(text: str) -> str:
    """A docstring's reStructuredText as the page's markdown: ````x```` and ``:mod:`x``` are
    ```x```, and a table cell keeps to one line."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return " ".join(text.split()).replace("|", "\\|")


def values(option: Option[Any]) -> str:
    """What the key takes, where its declaration says (a custom one's help says it)."""
    if isinstance(option, Number | Count):
        whole = "integer " if isinstance(option, Count) else ""
        if math.isinf(option.high):
            return f"{whole}≥ {_bound(option.low)}"
        return f"{whole}{_bound(option.low)} to {_bound(option.high)}"
    if isinstance(option, Choice):
        return ", ".join(f"`{c}`" for c in option.choices)
    if isinstance(option, Kind):
        return ", ".join(f"`{k.value}`" for k in type(option.default))
    if isinstance(option, Flag):
        return "`true`, `false`"
    return ""


def default(option: Option[Any]) -> str:
    if option.shown:
        return markdown(option.shown)
    literal = toml(option.default)
    if (
        literal is None
    ):  # tests/unit/common/test_config_defaults.py: such a default is shown in words
        raise ValueError(f"{option.key}: default {option.default!r} needs `shown`")
    return f"`{literal}`"


def table(t: Table) -> str:
    rows = [f"| `{o.key}` | {default(o)} | {values(o)} | {markdown(o.help)} |" for o in t.options]
    about = markdown(t.about)
    return (
        f"### `[{t.name}]`\n\n{about}\n\n| key | default | takes | meaning |\n|---|---|---|---|\n"
        + "\n".join(rows)
    )


def reference() -> str:
    """Every table's keys, as markdown."""
    return "\n\n".join(table(t) for t in TABLES)


def page_copy(text: str) -> str | None:
    """What the page holds between the markers (None: no markers)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write(page: Path = PAGE) -> bool:
    """Rewrite the page's copy; whether it changed."""
    text = page.read_text()
    if page_copy(text) is None:
        raise SystemExit(f"{page}: no {BEGIN!r} ... {END!r} markers")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    new = f"{before}{BEGIN}\n\n{reference()}\n\n{END}{after}"
    page.write_text(new)
    return new != text


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    print(f"{PAGE.relative_to(REPO)}: {'rewritten' if write() else 'already up to date'}")
