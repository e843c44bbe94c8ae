"""FaultProxy: a loopback HTTP proxy that injects the failures shippers must survive.

Why HTTP-aware and not a byte pipe: shippers keep connections alive, and faults such
as "429 for the next 3 requests" or "delay every request by 2 s" act per request, so
the proxy parses each request (stdlib ``http.server``), counts it, then applies the
current mode. Modes:

* ``pass_through()``                     forward to the upstream server;
* ``refuse()``                           stop listening: clients get ECONNREFUSED;
* ``drop()``                             read the request, close without an answer;
* ``delay(seconds, count=None)``         wait, then forward;
* ``respond(status, body, headers, count=None)``  answer without forwarding
  (e.g. 429 + ``Retry-After: 1``, 500, 400 with a body).

``count=K`` applies the mode to the next K requests, then goes back to pass-through;
``count=None`` keeps it until changed. ``drop``, ``delay`` and ``respond`` also take
``after=N``: the next N requests still pass through untouched, and the mode starts with
the one after them, so a fault can land in the middle of a client's sequence of requests
(``respond(429, headers={"Retry-After": "1"}, count=2, after=3)``: requests 1-3 pass,
4-5 get 429, then pass-through again); ``after=0`` (the default) starts at once. If the
upstream is down the proxy answers 502.
Bounded: at most ``max_connections`` client connections, request bodies up to 64 MiB,
idle connections closed after 30 s, and the proxy stops by itself after ``lifetime``
seconds (daemon threads, so it can never hold the interpreter open).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Protocol

from .base import free_port

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "content-length", "host"}
MAX_BODY = 64 << 20


class HasAddress(Protocol):
    @property
    def address(self) -> tuple[str, int]: ...


@dataclass
class Mode:
    kind: str = "pass"  # pass | refuse | drop | delay | respond
    delay: float = 0.0
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    remaining: int | None = None  # None: until changed
    skip: int = 0  # requests still to pass through before this mode starts (``after=``)


@dataclass
class SeenRequest:
    """One request as the proxy saw it; recorded on arrival, ``status`` set when answered."""

    method: str
    path: str
    action: str  # what the proxy did: pass | drop | delay | respond | error (413)
    body_len: int
    status: int | None = None  # status sent to the client (None when dropped or not yet answered)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.proxy._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: refuse this connection
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (timed out, was cut by ``refuse()``) is normal here, not an error."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.proxy._slots.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like real clients
    timeout = 30  # idle keep-alive connections end, so threads end
    server: _Server
    _seen: SeenRequest | None = None

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.proxy._track(self.connection, add=False)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                total += size
                if total > MAX_BODY:
                    raise ValueError("request body too large")
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        if self._seen is not None:
            self._seen.status = status
        self.send_response(status)
        for k, v in headers.items():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        proxy = self.server.proxy
        self._seen = None
        try:
            body = self._read_body()
        except ValueError as exc:
            self._seen = proxy._record(SeenRequest(self.command, self.path, "error", 0))
            self.close_connection = True
            self._reply(413, str(exc).encode(), {})
            return
        mode = proxy._take()
        kind = "drop" if mode.kind == "refuse" else mode.kind  # refuse: a request that raced the close
        self._seen = proxy._record(SeenRequest(self.command, self.path, kind, len(body)))
        if kind == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode.kind == "respond":
            self._reply(mode.status, mode.body, mode.headers)
            return
        if mode.kind == "delay":
            time.sleep(mode.delay)
        self._forward(body)

    def _forward(self, body: bytes) -> None:
        host, port = self.server.proxy.upstream_address()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = f"{host}:{port}"
        conn = http.client.HTTPConnection(host, port, timeout=self.server.proxy.upstream_timeout)
        try:
            try:
                conn.request(self.command, self.path,
                             body=body if body or self.command in ("POST", "PUT") else None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except OSError as exc:  # upstream down or reset: what a real gateway says
                self._reply(502, f"FaultProxy: upstream {host}:{port}: {exc}".encode(), {})
                return
            self._reply(resp.status, data, dict(resp.getheaders()))
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _handle


def _after(n: int) -> int:
    if n < 0:
        raise ValueError(f"after must be >= 0, not {n}")
    return n


class FaultProxy:
    """Loopback HTTP proxy in front of ``upstream`` (a server object or ``(host, port)``)."""

    def __init__(self, upstream: HasAddress | tuple[str, int], port: int | None = None,
                 lifetime: float = 3600.0, max_connections: int = 64,
                 upstream_timeout: float = 60.0) -> None:
        self.upstream = upstream
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.lifetime = lifetime
        self.upstream_timeout = upstream_timeout
        self.seen: deque[SeenRequest] = deque(maxlen=10_000)
        self.requests_seen = 0
        self._mode = Mode()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._conns: set[socket.socket] = set()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # --- lifecycle ------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def upstream_address(self) -> tuple[str, int]:
        """Read on every request, so a restarted server on a new port is followed."""
        if isinstance(self.upstream, tuple):
            return self.upstream
        return self.upstream.address

    def start(self) -> FaultProxy:
        self._listen()
        if self._timer is None:
            self._timer = threading.Timer(self.lifetime, self.stop)
            self._timer.daemon = True
            self._timer.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection; idempotent."""
        self._unlisten()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- modes ----------------------------------------------------------------------
    def pass_through(self) -> None:
        self._set(Mode())

    def refuse(self) -> None:
        """Not listening at all: connects fail with ECONNREFUSED; open connections are cut."""
        self._set(Mode(kind="refuse"))

    def drop(self, count: int | None = None, after: int = 0) -> None:
        """Accept and read the request, then close the connection without an answer."""
        self._set(Mode(kind="drop", remaining=count, skip=_after(after)))

    def delay(self, seconds: float, count: int | None = None, after: int = 0) -> None:
        self._set(Mode(kind="delay", delay=seconds, remaining=count, skip=_after(after)))

    def respond(self, status: int, body: bytes | str = b"", headers: dict[str, str] | None = None,
                count: int | None = None, after: int = 0) -> None:
        """Answer ``status`` without forwarding, e.g. ``respond(429, headers={"Retry-After": "1"}, count=2)``;
        with ``after=N`` only from the (N+1)th request on (the first N pass through)."""
        data = body.encode() if isinstance(body, str) else body
        self._set(Mode(kind="respond", status=status, body=data, headers=dict(headers or {}),
                       remaining=count, skip=_after(after)))

    @property
    def mode(self) -> str:
        with self._lock:
            return self._mode.kind

    def reset_counts(self) -> None:
        with self._lock:
            self.requests_seen = 0
            self.seen.clear()

    # --- internals ------------------------------------------------------------------
    def _set(self, mode: Mode) -> None:
        with self._lock:
            self._mode = mode
        if mode.kind == "refuse":
            self._unlisten()
        elif self._timer is not None:  # started and not stopped
            self._listen()

    def _take(self) -> Mode:
        """The mode for this request; counts down ``after``, then ``count``, and reverts to pass-through."""
        with self._lock:
            mode = self._mode
            if mode.skip > 0:  # not started yet: this request passes
                mode.skip -= 1
                return Mode()
            if mode.remaining is not None:
                mode.remaining -= 1
                if mode.remaining <= 0:
                    self._mode = Mode()
            return mode

    def _record(self, req: SeenRequest) -> SeenRequest:
        with self._lock:
            self.requests_seen += 1
            self.seen.append(req)
        return req

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def _listen(self) -> None:
        with self._lock:
            if self._httpd is not None or self._mode.kind == "refuse":
                return
            httpd = _Server((self.host, self.port), _Handler)
            httpd.proxy = self
            self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"FaultProxy:{self.port}", daemon=True)
        self._thread.start()

    def _unlisten(self) -> None:
        with self._lock:
            httpd, self._httpd = self._httpd, None
            conns = list(self._conns)
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
