"""gmd-admin in a real terminal: a tmux session 80 columns wide, typed into and read back
(send-keys, capture-pane), as an operator on a laptop's terminal sees it."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import needs
from tests.support.standings_ledger import ledger_config  # noqa: F401 - the fixture

ADMIN = Path(sys.executable).with_name("gmd-admin")
WIDTH = 80


class Tmux:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout

    def run(self, command: str, timeout_s: float = 60) -> list[str]:
        """Type ``command`` into the terminal and return the lines it printed, wrapped lines
        joined back (``capture-pane -J``): a line longer than the terminal is one that wrapped."""
        marker = f"done-{uuid.uuid4().hex[:8]}"
        self("send-keys", "-t", "t", "clear", "Enter")
        self("send-keys", "-t", "t", f"{command}; echo {marker}", "Enter")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self("capture-pane", "-t", "t", "-p", "-J", "-S", "-200").splitlines()
            if any(line.strip() == marker for line in lines):
                end = next(k for k, line in enumerate(lines) if line.strip() == marker)
                # The output starts after the last echo of the command: typed before bash
                # showed its prompt (a loaded machine), the command is echoed twice, once by
                # the terminal and once by bash's prompt line.
                start = max(k for k, line in enumerate(lines[:end]) if marker in line) + 1
                return lines[start:end]
            time.sleep(0.1)
        raise AssertionError(f"{command!r} did not finish in {timeout_s} s")


@pytest.fixture
def terminal() -> Iterator[Tmux]:
    needs.program("tmux", "`make test` installs it (tests/scripts/bootstrap.sh)")
    tmux = Tmux(f"gmd-test-{uuid.uuid4().hex[:8]}")
    tmux("new-session", "-d", "-s", "t", "-x", str(WIDTH), "-y", "60", "bash --norc --noprofile")
    tmux("set-option", "-t", "t", "history-limit", "5000")
    try:
        yield tmux
    finally:
        tmux("kill-server")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_standings_and_report_fit_80_columns(terminal: Tmux, ledger_config: Path) -> None:  # noqa: F811
    admin = f"{shlex.quote(str(ADMIN))} --config {shlex.quote(str(ledger_config))}"
    standings = terminal.run(f"{admin} standings")
    assert all(len(line) <= WIDTH for line in standings), standings
    rows = [line for line in standings if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in rows[1:]] == ["a", "b"]
    assert "Enforced" in rows[0]  # every column fits: nothing left out
    assert not any("Left out" in line for line in standings)

    report = terminal.run(f"{admin} report --from 0")
    assert all(len(line) <= WIDTH for line in report), report
    table = [line for line in report if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in table[1:]] == ["a", "b"]
    note = " ".join(report[report.index(next(x for x in report if "Left out" in x)) :])
    assert "Left out to fit 80 columns:" in note and "late_samples" in note

    # The same report, piped: plain columns, every one of them, for grep and awk.
    piped = terminal.run(f"{admin} report --from 0 | cat")
    assert not any("│" in line for line in piped)
    assert "late_samples" not in " ".join(piped)  # no footnote about columns left out
    assert any("Late samples" in line for line in piped)
