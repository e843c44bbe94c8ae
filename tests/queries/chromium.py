"""A real headless Chromium for the timeline tests, driven over the DevTools protocol.

The HTML timeline is JavaScript that builds its DOM from a job's own text, so whether it renders
and whether that text stays text can only be checked by a browser running it: no DOM emulation.
Only what the tests need: navigate, evaluate, real mouse input, and console errors and exceptions
collected as they arrive.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.request
import zlib
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

    def screenshot(self, selector: str) -> Image:
        """What the browser shows of one element, as pixels (a real screenshot, clipped to the element)."""
        # Scrolled into view and shot within the viewport: capturing beyond it makes Chromium resize the
        # viewport for the shot, and a page that lays out by the window's height would move under the clip.
        box = self.eval(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: "start"}}); const r = e.getBoundingClientRect();
            return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height, window.innerHeight]; }})()""")
        assert box[3] <= box[4], f"{selector} is taller than the window"
        png = self.call("Page.captureScreenshot", format="png",
                        clip={"x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 1})["data"]
        return Image.from_png(base64.b64decode(png))


class Image:
    """An RGB(A) screenshot's pixels, decoded here (PNG is zlib plus five row filters: no imaging library)."""

    def __init__(self, width: int, height: int, channels: int, data: bytes) -> None:
        self.width, self.height, self.channels, self.data = width, height, channels, data

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        i = (y * self.width + x) * self.channels
        return self.data[i], self.data[i + 1], self.data[i + 2]

    @classmethod
    def from_png(cls, png: bytes) -> Image:
        assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
        pos, idat, head = 8, b"", None
        while pos < len(png):
            (length,) = struct.unpack(">I", png[pos:pos + 4])
            kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
            if kind == b"IHDR":
                head = struct.unpack(">IIBBBBB", body)
            elif kind == b"IDAT":
                idat += body
            pos += 12 + length
        assert head is not None
        width, height, depth, color, _, _, interlace = head
        assert depth == 8 and color in (2, 6) and interlace == 0, head
        ch = 4 if color == 6 else 3
        raw, stride = zlib.decompress(idat), width * ch
        out = bytearray(height * stride)
        prev = bytearray(stride)
        for y in range(height):
            kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
            if kind == 1:
                for i in range(ch, stride):
                    line[i] = (line[i] + line[i - ch]) & 255
            elif kind == 2:
                line = bytearray((a + b) & 255 for a, b in zip(line, prev))
            elif kind == 3:
                for i in range(stride):
                    line[i] = (line[i] + ((line[i - ch] if i >= ch else 0) + prev[i]) // 2) & 255
            elif kind == 4:
                for i in range(stride):
                    a = line[i - ch] if i >= ch else 0
                    b, c = prev[i], prev[i - ch] if i >= ch else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            out[y * stride:(y + 1) * stride] = line
            prev = line
        return cls(width, height, ch, bytes(out))


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
