"""gmd-admin builds its whole command line in every process (Typer reads every command's
signature, for ``--help`` and a mistyped option too), so what the command modules import at
module level every run pays for: the suite alone starts gmd-admin about 300 times. Building
the command line must load none of what only a command that runs needs: the ledger's
libraries, the daemon's configuration, the ORM, numpy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "sqlalchemy",
    "alembic",
    "pydantic",
    "numpy",
    "gmd.daemon.config",
    "gmd.ledger_schema.models",
    "gmd.ledger_schema.migrate",
)
"""What building gmd-admin's command line must not import (each taken with its submodules)."""

PROBE = """
import json, sys
{setup}
import typer.main
from gmd.admin.cli import app
typer.main.get_command(app)  # every command's options, as --help builds them
print(json.dumps(sorted(sys.modules)))
"""


def loaded(setup: str = "") -> set[str]:
    """The modules a fresh interpreter holds once it built gmd-admin's command line."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy_in(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(f"{name}.") for m in modules)


def test_building_the_command_line_imports_nothing_a_command_needs_only_when_it_runs() -> None:
    modules = loaded()
    assert "gmd.admin.commands.accounting" in modules  # the commands were built
    assert [name for name in HEAVY if heavy_in(modules, name)] == []


@pytest.mark.parametrize("name", HEAVY)
def test_the_probe_sees_each_heavy_module_when_it_is_imported(name: str) -> None:
    """The control: the same probe, with the module imported first, reports it."""
    assert heavy_in(loaded(f"import {name}"), name)
