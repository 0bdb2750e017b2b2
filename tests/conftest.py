"""Shared fixtures: where the project's read-only reference data lives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GMD_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def test_vectors() -> dict:
    path = SHARED / "data" / "test_vectors.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: the tests need ../shared beside the repository")
    return json.loads(path.read_text())
