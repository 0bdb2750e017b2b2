"""Polling for a state instead of sleeping: what a test on a busy machine waits with."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
