"""Logging for the services: one line per event on stderr (journald adds the time again, but
a terminal or a file does not), libraries' routine chatter kept at warning."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum


class LogLevel(StrEnum):
    """The levels the services' ``--log-level`` takes (a typo is an option error, exit 2)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def setup(level: str, quiet: tuple[str, ...] = ()) -> None:
    """``level`` for gmd's own loggers; ``quiet`` loggers only say warnings and worse."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
