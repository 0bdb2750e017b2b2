"""`make test`'s `--dist loadgroup` really keeps an `xdist_group` on one worker.

tests/conftest.py puts every test of the one small cloud (and of the one replica) in a group in
``pytest_collection_modifyitems``, because they share a cloud that one session starts. Grouping
fails silently in two ways, and both happened: a conftest hook that runs after xdist's own (which
turns the marks into the node ids its scheduler groups by) adds marks nobody reads, hence
``tryfirst``; and pytest 9.2 keeps node ids where xdist 3.8 does not write them (pytest-xdist
issue 1386), hence the pin below 9.2 in pyproject.toml. Either way the cloud's tests ran on two
workers, and the second waited half an hour for the first to finish with its cloud before
starting the cloud again. This test runs a tiny suite grouped as tests/conftest.py groups on two
workers and asks which worker ran each test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name.startswith("test_grouped"):
            item.add_marker(pytest.mark.xdist_group("cloud"))
"""

TESTS = """
import os
from pathlib import Path

def ran(name):
    Path(name).write_text(os.environ["PYTEST_XDIST_WORKER"])

def test_grouped_1(): ran("grouped_1")
def test_grouped_2(): ran("grouped_2")
def test_grouped_3(): ran("grouped_3")
def test_grouped_4(): ran("grouped_4")
def test_free_1(): ran("free_1")
def test_free_2(): ran("free_2")
"""

PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")


def test_tests_grouped_in_conftest_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(TESTS)
    done = subprocess.run(
        [*PYTEST, "-n", "2", "--dist", "loadgroup", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers = {p.name: p.read_text() for p in tmp_path.glob("grouped_*")}
    assert len(workers) == 4
    assert len(set(workers.values())) == 1, f"one group ran on several workers: {workers}"
