"""Polling for a state instead of sleeping: what a test on a busy machine waits with."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    what: str,
    check: Callable[[], object],
    timeout_s: float = 60.0,
    seen: Callable[[], object] | None = None,
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout_s``, and saying what
    ``seen`` returns then (the state a failure seen once on CI has to be read from)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            said = f": {seen()!r}" if seen is not None else ""
            raise AssertionError(f"timed out waiting for {what}{said}")
        time.sleep(0.05)
