"""The README is a newcomer's first page and docs/ holds the reference: the links between them
must lead somewhere, and the README must open with what a newcomer needs.

Links are checked as GitHub renders them: a relative path from the file that holds the link,
and a ``#fragment`` that is one of the target's headings, lowercased, with punctuation
dropped and spaces as hyphens.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "systemd" / "README.md"]
FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a ``# comment`` there is no heading)."""
    return FENCED.sub("", path.read_text())


def headings(path: Path) -> list[str]:
    return re.findall(r"^#+ (.+?)\s*$", prose(path), re.M)


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_reaches_a_file_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif fragment and fragment not in {anchor(h) for h in headings(dest)}:
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_opens_with_trying_and_installing_gmd() -> None:
    """The demo and the installation come before any reference material."""
    sections = re.findall(r"^## (.+?)\s*$", prose(REPO / "README.md"), re.M)
    first = sections[:5]
    assert "Try it" in first and "What the demo shows" in first, sections
    assert "Installation" in first, sections
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme[: readme.index("## Installation")]


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {
        (REPO / target.partition("#")[0]).resolve()
        for target in re.findall(r"\]\((docs/[^)\s]+)\)", prose(REPO / "README.md"))
    }
    orphans = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, orphans


def test_the_compute_hosts_install_lines_have_what_builds_libvirt_python() -> None:
    """libvirt-python has no wheel: pip compiles its C extension, which needs the libvirt and
    Python headers, gcc and pkg-config. Every install line that builds it (the one that
    installs libvirt-dev) says all four, in the README, docs/ and the development bootstrap."""
    needed = {"libvirt-dev", "python3-dev", "pkg-config", "gcc"}
    lines = [
        (path.relative_to(REPO), line)
        for path in [*PAGES, REPO / "tests" / "bootstrap.sh"]
        for line in path.read_text().splitlines()
        if "libvirt-dev" in line and ("apt-get install" in line or "need_apt" in line)
    ]
    assert {str(p) for p, _ in lines} >= {"README.md", "docs/install.md", "tests/bootstrap.sh"}
    missing = [(str(p), sorted(needed - set(line.split()))) for p, line in lines]
    assert all(not m for _, m in missing), missing
