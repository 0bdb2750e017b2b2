"""What a test needs from the machine, said one way: ``make test`` installs every program and
every extra, so there a missing one fails the test, saying how to get it; ``make test-fast``
(``GMD_FAST=1``) installs only what most tests import, and skips the others, saying what they
need, instead of failing or asking for root."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

FAST = os.environ.get("GMD_FAST") == "1"
"""``make test-fast``: what is missing is skipped, not failed"""

OPTIONAL_MODULES = {
    "libvirt": "gmd[agent] (libvirt-python, built against Debian's libvirt-dev as root)",
    "psycopg": "gmd[postgres]",
    "openstack": "gmd[openstack]",
    "keystoneauth1": "gmd[openstack] or gmd[nova]",
    "keystonemiddleware": "gmd[keystone]",
    "oslo_policy": "gmd[keystone]",
    "oslo_context": "gmd[keystone]",
    "osc_lib": "gmd[osc]",
    "openstackclient": "gmd[osc]",
    "cliff": "gmd[osc]",
    "kazoo": "gmd[broker]",
}
"""Python packages of gmd's extras that ``make test-fast`` does not install, and which."""


def program(name: str, how: str) -> str:
    """The path of program ``name`` (on PATH, or in /usr/bin); without it the test fails
    (``make test``) or is skipped (``make test-fast``), saying ``how`` to get it."""
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
    )
    if found is not None:
        return found
    message = f"{name} is missing: {how}"
    if FAST:
        pytest.skip(f"{message} (make test-fast skips what needs it; make test installs it)")
    pytest.fail(message, pytrace=False)


class _SkipMissing(importlib.abc.MetaPathFinder):
    """While pytest collects, an import of an optional extra's package that is not installed
    ends the test module's collection as skipped, naming the extra (only then: a skip raised
    in a test's threads would be no skip)."""

    collecting = False

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        top = name.partition(".")[0]
        if self.collecting and top in OPTIONAL_MODULES and top not in _present:
            pytest.skip(missing(top), allow_module_level=True)
        return None


def missing(module: str) -> str:
    return f"needs {OPTIONAL_MODULES[module]}, which make test-fast does not install"


_present = {m for m in OPTIONAL_MODULES if importlib.util.find_spec(m) is not None}
_finder = _SkipMissing()


def skip_missing_extras() -> None:
    """Under ``make test-fast`` only: a test that imports an extra not installed is skipped
    (:func:`collecting`, :func:`absent`)."""
    if FAST and any(m not in _present for m in OPTIONAL_MODULES):
        sys.meta_path.append(_finder)


def collecting(on: bool) -> None:
    """pytest collects (imports the test modules) while ``on``."""
    _finder.collecting = on


def absent(exc: BaseException) -> str | None:
    """Why a test that raised ``exc`` needs what make test-fast did not install, or None."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    return lacking(exc.name)


def extra(module: str) -> None:
    """A test that runs a program needing ``module`` (an extra's) in another process: skipped
    under make test-fast where it is not installed (an import in its own process would not
    be seen here)."""
    if (why := lacking(module)) is not None:
        pytest.skip(why)


def lacking(module: str) -> str | None:
    """Under make test-fast, why a test that uses ``module`` (dotted) is skipped, or None."""
    top = module.partition(".")[0]
    if FAST and top in OPTIONAL_MODULES and top not in _present:
        return missing(top)
    return None


def drop_warning_filters(item: pytest.Item) -> None:
    """Take the ``filterwarnings`` marks off the item and the nodes above it (for a test that
    is skipped: their categories cannot be imported here)."""
    for node in item.listchain():
        node.own_markers = [m for m in node.own_markers if m.name != "filterwarnings"]


def warning_modules(item: pytest.Item) -> list[str]:
    """The modules of the warning categories the item's ``filterwarnings`` marks name: pytest
    imports them before the test runs (``ignore::openstack.warnings.…``)."""
    out = []
    for mark in item.iter_markers("filterwarnings"):
        for spec in mark.args:
            parts = str(spec).split(":")
            if len(parts) > 2 and "." in parts[2]:
                out.append(parts[2].rsplit(".", 1)[0])
    return out
