"""Every error gmd raises on purpose has one root, :class:`gmd.GmdError`, so that a command
line or a service can tell "what was given cannot be used" (a one-line error, a 4xx) from a bug
(a traceback, a 5xx), and a new edge's error cannot be forgotten in that split."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import sqlalchemy as sa

import gmd
from gmd import GmdError, OptionError
from gmd.daemon.reports.usage import report


def gmd_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages(gmd.__path__, "gmd.") if "__main__" not in m.name
    )


NOVA_ONLY = frozenset({"gmd.nova.weigher"})
"""Modules that run inside nova-scheduler's environment (they import Nova, not a dependency of
gmd): read where Nova is importable, skipped elsewhere."""


def test_every_exception_class_of_gmd_derives_from_the_root() -> None:
    found, rootless = [], []
    for name in gmd_modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if name in NOVA_ONLY and exc.name == "nova":
                continue
            raise
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            found.append(cls)
            if not issubclass(cls, GmdError):
                rootless.append(f"{name}.{cls.__qualname__}")
    assert len(found) > 30, found
    assert not rootless, f"not a GmdError: {', '.join(rootless)}"


def test_a_usage_reports_bad_options_are_option_errors() -> None:
    """gmd-admin report turns only these into its exit 2 (any other error is a bug)."""
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn, pytest.raises(OptionError, match="cannot group by 'planet'"):
        report(conn, "planet", 0, 3600)
    with engine.connect() as conn, pytest.raises(OptionError, match="is not before --to"):
        report(conn, "customer", 3600, 0)
