"""The repository runs and tests from itself: nothing in it reads data beside the checkout.

A plain clone, or a wheel, has no sibling directories: the demo replays the traces shipped in
the package (gmd/admin/demo_data), the tests read tests/data, and the docs name data the
repository holds or say where the public traces come from. This test reads every text file of
the places a user runs or reads (gmd/, tests/, bench/, docs/, the Makefile, .ci/, README.md,
pyproject.toml) for a path that leaves the repository, and names each file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLACES = ("gmd", "tests", "bench", "docs", ".ci", "Makefile", "README.md", "pyproject.toml")
SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})

# Built from pieces, so that this file does not match itself.
SIBLING = "shared"
FORBIDDEN = (
    (re.compile(re.escape("../" + SIBLING)), "a directory beside the checkout"),
    (re.compile(re.escape("GMD_" + SIBLING.upper())), "the variable that pointed there"),
    (re.compile(re.escape(SIBLING + "/data")), "the data directory beside the checkout"),
    (re.compile(r"\b(?:REPO|ROOT|repo|root)\.parent\b"), "the directory above the repository"),
    (re.compile(r"/work/[A-Za-z]"), "an absolute path of one machine"),
)
PARENTS = re.compile(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")
"""``Path(__file__).resolve().parents[k]``: outside the repository when ``k`` is at least the
file's depth below the repository's root (``parents[1]`` of tests/x.py is the root)."""


def text_files() -> list[Path]:
    files = []
    for place in PLACES:
        path = REPO / place
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(REPO).parts)
            ]
    return files


def outside_references(path: Path) -> list[str]:
    """``file:line: what`` for each reference out of the repository in ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, ValueError):
        return []  # not text (compressed traces, images)
    where = path.relative_to(REPO).as_posix()
    depth = len(path.relative_to(REPO).parts) - 1
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, what in FORBIDDEN:
            if pattern.search(line):
                found.append(f"{where}:{number}: {what}: {line.strip()}")
        for match in PARENTS.finditer(line):
            if int(match.group(1)) > depth:
                found.append(
                    f"{where}:{number}: the directory above the repository: {line.strip()}"
                )
    return found


def test_nothing_reads_beside_the_repository() -> None:
    files = text_files()
    assert len(files) > 100 and REPO / "Makefile" in files  # the places were found
    found = [hit for path in files for hit in outside_references(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pattern trips on a line that has it, and only there: a grep that never matches
    would keep the rule by accident."""
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "bench").mkdir()
    lines = [
        "fine = 1",
        'TRACES = "../' + SIBLING + '/data/pwa"',
        'os.environ["GMD_' + SIBLING.upper() + '"]',
        "x = REPO" + ".parent / 'other'",
        "y = '/work/" + SIBLING + "/docs'",
        "z = Path(__file__).resolve().parents[1] / 'tests'",  # the repository itself: fine
        "w = Path(__file__).resolve().parents[" + "2] / 'elsewhere'",
    ]
    (tmp_path / "bench" / "b.py").write_text("\n".join(lines) + "\n")
    hits = outside_references(tmp_path / "bench" / "b.py")
    assert [h.split(":")[1] for h in hits] == ["2", "2", "3", "4", "5", "7"], hits
    assert hits[0].startswith("bench/b.py:2: a directory beside the checkout: ")
