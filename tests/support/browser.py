"""A real browser for the tests: Debian's chromium, headless, driven over the DevTools
protocol (a websocket), so a test can load a page at a phone's size, read its DOM after the
browser laid it out, and take a screenshot."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

from websockets.sync.client import connect

from tests.support import needs


class BrowserError(RuntimeError):
    pass


class Browser:
    """``with Browser() as page: page.open(url, width=390, height=844)``."""

    def __enter__(self) -> Browser:
        binary = needs.program("chromium", "tests/scripts/bootstrap.sh installs Debian's package")
        self._profile = tempfile.TemporaryDirectory()
        self._process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in CI
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile.name}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own group: its helper processes end with it
        )
        port_file = f"{self._profile.name}/DevToolsActivePort"
        deadline = time.monotonic() + 60
        while True:
            try:
                with open(port_file) as f:
                    port = int(f.readline())
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline or self._process.poll() is not None:
                    self.__exit__()
                    raise BrowserError("chromium did not start its DevTools endpoint") from None
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t["type"] == "page")
        self._socket = connect(page["webSocketDebuggerUrl"], max_size=2**26)
        self._id = 0
        self.call("Page.enable")
        return self

    def __exit__(self, *_exc: object) -> None:
        """Chromium's helpers (renderer, utilities, crash handler) outlive its main process
        for a moment and still write to the profile: the whole group is ended and waited for
        before the profile is removed (a removal racing them failed on a busy CI machine,
        "Directory not empty: 'Default'")."""
        if getattr(self, "_socket", None) is not None:
            self._socket.close()
        group = self._process.pid
        self._signal_group(group, signal.SIGTERM)
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        deadline = time.monotonic() + 10
        while self._signal_group(group, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal_group(group, signal.SIGKILL)
        for attempt in range(50):
            try:
                self._profile.cleanup()
                return
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)

    @staticmethod
    def _signal_group(group: int, sig: int) -> bool:
        """Send ``sig`` to the process group; whether any process of it was there."""
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return False
        return True

    def call(self, method: str, wait_for: str | None = None, **params: Any) -> Any:
        """Send one DevTools command; its result (and, with ``wait_for``, wait for that event
        after it)."""
        self._id += 1
        self._socket.send(json.dumps({"id": self._id, "method": method, "params": params}))
        result = None
        deadline = time.monotonic() + 60
        while True:
            message = json.loads(self._socket.recv(timeout=max(deadline - time.monotonic(), 1)))
            if message.get("id") == self._id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result = message["result"]
                if wait_for is None:
                    return result
            elif wait_for is not None and message.get("method") == wait_for and result is not None:
                return result

    def open(self, url: str, *, width: int, height: int) -> None:
        """Load ``url`` in a viewport of that size (a phone's, e.g. 390 × 844), to its load."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=2,
            mobile=width < 600,
        )
        self.call("Page.navigate", wait_for="Page.loadEventFired", url=url)

    def set_cookie(self, url: str, name: str, value: str) -> None:
        """A cookie the browser sends to ``url``'s site (as a portal that signed the user in
        would have set it)."""
        self.call("Network.setCookie", url=url, name=name, value=value)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
