"""A real headless Chromium for the timeline tests, driven over the DevTools protocol.

The HTML timeline is JavaScript that builds its DOM from a job's own text, so whether it renders
and whether that text stays text can only be checked by a browser running it: no DOM emulation.
Only what the tests need: navigate, evaluate, real mouse input, and console errors and exceptions
collected as they arrive.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def chromium_binary() -> str:
    """The Chromium to run; a missing one fails the test (it is required, not optional)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is required for the timeline test: apt-get install -y chromium")


class Page:
    """Just enough of the DevTools protocol: navigate, evaluate, collect console errors and exceptions."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0
        self.errors: list[str] = []
        self.loaded = False

    def _on_event(self, msg: dict[str, Any]) -> None:
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Runtime.exceptionThrown":
            self.errors.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console.error: " + json.dumps(p.get("args", []))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + p["entry"].get("text", ""))
        elif m == "Page.loadEventFired":
            self.loaded = True

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self._on_event(msg)

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.ws.settimeout(0.2)
        while time.monotonic() < end:
            try:
                self._on_event(json.loads(self.ws.recv()))
            except Exception:  # a receive timeout: nothing more yet
                pass
        self.ws.settimeout(15)

    def eval(self, expr: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise AssertionError(f"{expr}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def open(self, path: Path, timeout_s: float = 20) -> None:
        """Load a local page and wait until the timeline says it has rendered (``body[data-ready=1]``)."""
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + timeout_s
        while not self.eval("document.body && document.body.dataset.ready === '1'"):
            assert time.monotonic() < deadline, "the page never finished rendering"
            self.pump(0.2)

    def mouse(self, kind: str, x: float, y: float, clicks: int = 0) -> None:
        """A real input event at viewport coordinates (``mouseMoved``, ``mousePressed``, ``mouseReleased``)."""
        extra: dict[str, Any] = {"button": "left", "clickCount": clicks} if kind != "mouseMoved" else {}
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def click(self, x: float, y: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, clicks=1)
        self.mouse("mouseReleased", x, y, clicks=1)


@contextmanager
def open_browser() -> Iterator[Page]:
    """A fresh headless Chromium (its own profile, a free DevTools port) and its one page; closed afterwards."""
    websocket = pytest.importorskip("websocket", reason="websocket-client is in the dev extra")
    profile = Path(tempfile.mkdtemp(prefix="jt-chromium-"))
    proc = subprocess.Popen(
        [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
         "--window-size=1400,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=15, suppress_origin=True)
        p = Page(ws)
        for domain in ("Runtime", "Log", "Page"):
            p.call(f"{domain}.enable")
        try:
            yield p
        finally:
            ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
