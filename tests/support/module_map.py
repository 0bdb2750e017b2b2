"""The map of gmd's modules in docs/development.md, made from the tree itself.

Every module of ``gmd/`` with the first sentence of its docstring, grouped by package: where a
successor finds the code for a fact. The docstrings own the words; the page holds a copy between
two markers, which ``tests/repository/test_docs.py`` compares with what this makes, so that a module
added, moved or described anew shows up as a difference to regenerate:

    python tests/support/module_map.py --write    # (make module-map) rewrite the page's copy
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "development.md"
BEGIN = "<!-- module map: made by tests/support/module_map.py, do not edit by hand -->"
END = "<!-- end of the module map -->"


def first_sentence(path: Path) -> str:
    """The docstring's first sentence, on one line (up to the first ". " or blank line)."""
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    match = re.match(r"(.+?\.)(\s|$)", paragraph)
    sentence = match.group(1) if match else paragraph
    return sentence.rstrip(".") if sentence else "(no docstring)"


def module_map(root: Path = REPO) -> str:
    """The map as markdown: a table per package, a row per module."""
    package_dirs = sorted(
        {p.parent for p in (root / "gmd").rglob("*.py") if "__pycache__" not in p.parts}
    )
    parts = []
    for directory in package_dirs:
        name = directory.relative_to(root).as_posix() + "/"
        rows = []
        for path in sorted(directory.glob("*.py")):
            shown = path.name
            what = first_sentence(path).replace("|", "\\|")
            rows.append(f"| `{shown}` | {what} |")
        parts.append(f"**`{name}`**\n\n| module | what it holds |\n|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts)


def page_copy(text: str) -> str | None:
    """What the page holds between the markers (None: no markers)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write(page: Path = PAGE) -> bool:
    """Rewrite the page's copy; whether it changed."""
    text = page.read_text()
    old = page_copy(text)
    if old is None:
        raise SystemExit(f"{page}: no markers {BEGIN!r} … {END!r}")
    new = module_map()
    if old == new:
        return False
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(f"{head}{BEGIN}\n\n{new}\n\n{END}{tail}")
    return True


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(f"{PAGE}: {'rewritten' if write() else 'already the tree'}")
    else:
        print(module_map())
