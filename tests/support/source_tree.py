"""The source tree as ``pip install PATH`` reads it, for the tests that install gmd into a fresh
virtualenv."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_source(dest: Path) -> Path:
    """What `pip install PATH` reads, without the working tree's build/ and *.egg-info."""
    dest.mkdir(parents=True)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for item in ("gmd", "migrations"):
        shutil.copytree(REPO / item, dest / item, ignore=junk)
    for path in REPO.iterdir():
        if path.is_file() and (
            path.name == "pyproject.toml" or path.name.startswith(("README", "LICENSE"))
        ):
            shutil.copy2(path, dest / path.name)
    return dest
