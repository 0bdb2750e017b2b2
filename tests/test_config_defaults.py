"""Each configuration default has one owner: what gmd.toml leaves out is what the configuration
classes declare, and the example file (etc/gmd.toml) shows every option the parsers read.

The options are found by parsing a file that sets nothing and recording every key the parsers
ask their :class:`~gmd.common.config.Reader` for, so a new option is covered without being
listed here.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from gmd.agent.config import AgentConfig, parse_agent
from gmd.common import config as common
from gmd.daemon.config import Config, parse

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "etc" / "gmd.toml"
NOTHING = {"database": {"url": "sqlite://"}, "agent": {"host": "cmp-001"}}
"""A file that sets nothing but what has no default: the ledger and this host's name."""


def options_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every option key (``accounting.gamma``, ``enforcement.quota.cloud``) the daemon's and
    the agent's parsers read from a file that sets nothing."""
    readers: list[common.Reader] = []
    original = common.Reader.__init__

    def recording(self: common.Reader, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        readers.append(self)

    monkeypatch.setattr(common.Reader, "__init__", recording)
    parse(NOTHING, "test.toml")
    parse_agent(NOTHING, "test.toml")
    monkeypatch.undo()
    tables = {r.prefix for r in readers}
    keys = {r.prefix + k for r in readers for k in r.used}
    # a key that is itself a table read (accounting.weights) is its keys; the daemon's parser
    # names the agent's section only to leave it alone
    return sorted(k for k in keys if f"{k}." not in tables and k != "agent")


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


def test_the_example_file_shows_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """etc/gmd.toml has a line for every option (set, or commented out: ``# key = …``) in
    its section."""
    keys = options_read(monkeypatch)
    assert len(keys) > 100 and "enforcement.quota.cloud" in keys and "agent.tick_s" in keys
    listed, section = set(), ""
    for line in EXAMPLE.read_text().splitlines():
        header = re.match(r"^\[([\w.-]+)\]\s*$", line)
        if header:
            section = header.group(1)
            continue
        key = re.match(r"^#? ?([a-z_]+)\s*=", line)
        if key:
            listed.add(f"{section}.{key.group(1)}")
    missing = [k for k in keys if k not in listed]
    assert not missing, f"etc/gmd.toml does not show: {', '.join(missing)}"
