"""The version of the installed gmd, for ``--version``, logs and ``gmd_build_info``.

Read from the package's metadata rather than written in the code, so that what a program
reports is what pip installed; a source tree run without installing has no metadata, and says
so instead of claiming a version it may not be.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _installed

UNKNOWN = "0+unknown"
"""What a checkout that was never installed reports (PEP 440's "0, local build unknown")."""


def version() -> str:
    try:
        return _installed("gmd")
    except PackageNotFoundError:
        return UNKNOWN
