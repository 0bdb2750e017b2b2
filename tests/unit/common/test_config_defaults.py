"""Each configuration option has one owner: its declaration (an
:class:`~gmd.common.options.Option`, a field of its table's configuration class), which
holds its default, its bounds and its help. What gmd.toml leaves out is what the configuration
classes declare; every option the parsers read is declared and every declared option is read;
the example file (etc/gmd.toml) shows every option with its declared default; and
docs/configuration.md holds the declarations' tables.

The options read are found by parsing files that set nothing and recording every key the
parsers ask their :class:`~gmd.common.config.Reader` for, so a new option is covered without
being listed here.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gmd.agent.config import AgentConfig, parse_agent
from gmd.broker.config import parse_broker
from gmd.common import config as common
from gmd.common.options import Option
from gmd.common.settings import Table
from gmd.daemon.config import Config, parse
from tests.support import config_reference
from tests.support.config_reference import TABLES, toml

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "etc" / "gmd.toml"
NOTHING = {"database": {"url": "sqlite://"}, "agent": {"host": "cmp-001"}}
"""A file that sets nothing but what has no default: the ledger and this host's name."""
NOTHING_ELSE: list[dict[str, Any]] = [
    NOTHING,
    {**NOTHING, "accounting": {"split_io": True}},
    {**NOTHING, "hosts": {"cmp-001": {}}},
]
"""Files that between them make the parsers read every key: the weights of the split
resources are read only with split_io, a host's keys only for a host."""

DECLARED: dict[str, Option[Any]] = {f"{t.name}.{o.key}": o for t in TABLES for o in t.options}
"""Every declared option by its full key (``enforcement.quota.cloud``, ``hosts.NAME.owner``)."""
FREE_TABLES = {k for k, o in DECLARED.items() if isinstance(o.default, dict)}
"""The options that are tables of keys the operator names (``organizations.customers``)."""


def generic(key: str) -> str:
    """A key as declared: ``hosts.cmp-001.owner`` is ``hosts.NAME.owner``."""
    return re.sub(r"^hosts\.[^.]+(?=\.|$)", "hosts.NAME", key)


def options_read(monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], set[str]]:
    """Every key (``accounting.gamma``, ``enforcement.quota.cloud``) the daemon's and the
    agent's parsers read from :data:`NOTHING_ELSE`, and which of them are tables the parsers
    read key by key (``daemon.limits``, ``organizations.customers``)."""
    readers: list[common.Reader] = []
    original = common.Reader.__init__

    def recording(self: common.Reader, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        readers.append(self)

    monkeypatch.setattr(common.Reader, "__init__", recording)
    for document in NOTHING_ELSE:
        parse(document, "test.toml")
        parse_agent(document, "test.toml")
        parse_broker(document, "test.toml")
    monkeypatch.undo()
    tables = {generic(r.prefix.rstrip(".")) for r in readers}
    keys = {generic(r.prefix + k) for r in readers for k in r.used}
    return keys, tables & keys


def test_a_file_that_sets_nothing_gives_the_declared_defaults() -> None:
    config = parse(NOTHING, "test.toml")
    differ = []
    for f in dataclasses.fields(Config):
        section = getattr(config, f.name)
        if not dataclasses.is_dataclass(section):
            continue
        declared = type(section)()
        differ += [
            f"{f.name}.{g.name}: parsed {getattr(section, g.name)!r}, declared"
            f" {getattr(declared, g.name)!r}"
            for g in dataclasses.fields(section)
            if getattr(section, g.name) != getattr(declared, g.name)
        ]
    agent = parse_agent(NOTHING, "test.toml")
    # The three without a declared default: the file it was read from, the host's name (the
    # FQDN) and the spool, which lives in the state directory.
    declared_agent = AgentConfig(path=agent.path, host=agent.host, spool_path=agent.spool_path)
    differ += [
        f"agent.{g.name}: parsed {getattr(agent, g.name)!r}, declared"
        f" {getattr(declared_agent, g.name)!r}"
        for g in dataclasses.fields(AgentConfig)
        if getattr(agent, g.name) != getattr(declared_agent, g.name)
    ]
    assert not differ, "\n".join(differ)
    # the sections really were compared: a default changed in the class shows
    assert dataclasses.is_dataclass(config.accounting) and config.accounting.gamma == 0.5


def test_every_option_read_is_declared_and_every_declared_option_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key the parsers read is an option of its table, or a table (a declared one, or one
    of free keys declared as an option); each declared option and table is read."""
    keys, tables = options_read(monkeypatch)
    assert len(keys) > 100 and "enforcement.quota.cloud" in keys and "agent.tick_s" in keys
    names = {t.name for t in TABLES}
    undeclared = [k for k in sorted(keys - tables) if k not in DECLARED]
    undeclared += [
        k
        for k in sorted(tables)
        if k not in names and k not in DECLARED and not any(n.startswith(f"{k}.") for n in names)
    ]
    assert not undeclared, f"read but not declared: {', '.join(undeclared)}"
    unread = [k for k in [*DECLARED, *names] if k not in keys]
    assert not unread, f"declared but never read: {', '.join(unread)}"


def test_declarations_are_whole() -> None:
    """Every table has a name and options with keys, once each; a default that TOML cannot
    write (None, a table) is said in words, and words for a default TOML can write hold it."""
    names = [t.name for t in TABLES]
    assert len(names) == len(set(names)) and all(isinstance(t, Table) for t in TABLES)
    problems = []
    for t in TABLES:
        keys = [o.key for o in t.options]
        if not keys or "" in keys or len(keys) != len(set(keys)):
            problems.append(f"[{t.name}]: keys {keys}")
        if not t.about.strip():
            problems.append(f"[{t.name}]: no docstring to say what it is for")
    for key, o in DECLARED.items():
        literal = toml(o.default)
        if not o.help.strip():
            problems.append(f"{key}: no help")
        if literal is None and not o.shown:
            problems.append(f"{key}: default {o.default!r} is no TOML value: say it in `shown`")
        if literal is not None and o.shown and f"``{literal}``" not in o.shown:
            problems.append(f"{key}: shown {o.shown!r} does not hold the default ``{literal}``")
    assert not problems, "\n".join(problems)


def example_lines() -> tuple[list[tuple[str, str, str]], set[str]]:
    """etc/gmd.toml's ``key = value`` lines, set or commented out (``# key = value``), each as
    (its table, its key, the line uncommented); and its tables' headers, commented or not."""
    lines, headers, table = [], set(), ""
    for line in EXAMPLE.read_text().splitlines():
        header = re.match(r"^(?:# ?)?\[([\w.-]+)\]\s*$", line)
        if header:
            table = generic(header.group(1))
            headers.add(table)
            continue
        key = re.match(r"^(?:# ?)?([a-z_][a-z0-9_]*)\s*=", line)
        if key:
            lines.append((table, key.group(1), re.sub(r"^# ?", "", line)))
    return lines, headers


def as_declared(value: Any) -> Any:
    """A TOML value as a declaration holds it: arrays are tuples."""
    return tuple(as_declared(v) for v in value) if isinstance(value, list) else value


def test_the_example_file_shows_every_option_with_its_default() -> None:
    """etc/gmd.toml has a line for every declared option (set, or commented out: ``# key =
    …``) in its table, or the option's own table; where the declared default is a value TOML
    can write, the line shows exactly it; and each line's key is a declared option."""
    lines, headers = example_lines()
    shown = {f"{table}.{key}" for table, key, _ in lines}
    missing = [k for k in DECLARED if k not in shown and not (k in FREE_TABLES and k in headers)]
    assert not missing, f"etc/gmd.toml does not show: {', '.join(missing)}"
    problems = []
    for table, key, line in lines:
        option = DECLARED.get(f"{table}.{key}")
        if option is None:
            if table not in FREE_TABLES:
                problems.append(f"[{table}] {key}: not a declared option")
            continue
        if toml(option.default) is None:
            continue
        try:
            value = as_declared(tomllib.loads(line)[key])
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"[{table}] {line!r}: not one TOML key = value ({exc})")
            continue
        if value != option.default or isinstance(value, bool) != isinstance(option.default, bool):
            problems.append(f"[{table}] {line!r}: the declared default is {toml(option.default)}")
    assert not problems, "\n".join(problems)
    assert len(lines) > 100


def test_the_configuration_page_holds_every_declared_option() -> None:
    """docs/configuration.md's tables of every key are the declarations' (regenerate with
    ``python tests/support/config_reference.py --write``), and its table of sections names each."""
    page = (REPO / "docs" / "configuration.md").read_text()
    copy = config_reference.page_copy(page)
    assert copy is not None, "docs/configuration.md lost its markers"
    assert copy == config_reference.reference(), (
        "docs/configuration.md's keys differ from the declarations:"
        " python tests/support/config_reference.py --write"
    )
    sections = page.split("## Every key")[0]
    unnamed = [t.name for t in TABLES if f"`[{t.name}]`" not in sections]
    assert not unnamed, f"docs/configuration.md's table of sections lacks {unnamed}"


def test_defaults_written_in_other_pages_tables_are_the_declared_ones() -> None:
    """A hand-written table row elsewhere in the docs that names a declared option and gives
    a number first (docs/api.md's bounds of one host: ``| `daemon.limits.max_error_chars` |
    500 characters …``) gives its declared default."""
    rows = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text()
        copy = config_reference.page_copy(text)
        if copy is not None:
            text = text.replace(copy, "")
        for key, number in re.findall(r"^\| `([a-z_.]+)` \| (\d[\d,_]*(?:\.\d+)?)\b", text, re.M):
            if key in DECLARED:
                rows.append((page.name, key, float(number.replace(",", "").replace("_", ""))))
    wrong = [(p, k, n) for p, k, n in rows if n != DECLARED[k].default]
    assert not wrong, f"pages state other defaults than declared: {wrong}"
    assert rows, "no page's table names a declared option: the check reads nothing"
