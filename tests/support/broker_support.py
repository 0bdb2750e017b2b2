"""Reading the journal the federation's local process handler
(gmd.broker.handlers.LocalProcesses) writes, as the broker tests do."""

from __future__ import annotations

from pathlib import Path


def journal_lines(path: Path) -> list[tuple[str, str, str]]:
    """The journal's ``(site, request id, start|end)`` lines, in the order written."""
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]
