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
    """Imports of an optional extra's package that is not installed end the test (or its
    module's collection) as skipped, naming the extra."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        top = name.partition(".")[0]
        if top in OPTIONAL_MODULES and top not in _present:
            pytest.skip(
                f"needs {OPTIONAL_MODULES[top]}, which make test-fast does not install",
                allow_module_level=True,
            )
        return None


_present = {m for m in OPTIONAL_MODULES if importlib.util.find_spec(m) is not None}


def skip_missing_extras() -> None:
    """Under ``make test-fast`` only: a test that imports an extra not installed is skipped."""
    if FAST and any(m not in _present for m in OPTIONAL_MODULES):
        sys.meta_path.append(_SkipMissing())
