"""Shared fixtures: where the project's read-only reference data lives."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The PostgreSQL server `make test` started; a test that needs it fails without it."""
    url = os.environ.get("GMD_TEST_POSTGRES_URL")
    if not url:
        pytest.fail("GMD_TEST_POSTGRES_URL is not set: run the tests with `make test`")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database of each kind: a SQLite file, or a new PostgreSQL db."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    import sqlalchemy as sa

    server = request.getfixturevalue("postgres_server_url")
    name = f"gmd_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
