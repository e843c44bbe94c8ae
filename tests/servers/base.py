"""Shared plumbing for the test servers: cache dir, ports, build lock, process lifecycle.

Why a hand-written harness: the servers we test against (VictoriaLogs, OpenSearch, Jaeger)
cannot be downloaded as release binaries here, only built from the Go module proxy
and Maven Central. Building takes minutes, so builds are cached per version under
``$JOBTRACE_SERVERS_CACHE`` (default ``~/.cache/jobtrace-servers``); a start takes
well under a few seconds once built.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, TypeVar

import requests

S = TypeVar("S", bound="ManagedServer")

#: Every server process this interpreter started; stopped at exit so that a crashed
#: or interrupted test run does not leave servers behind.
_LIVE: weakref.WeakSet[ManagedServer] = weakref.WeakSet()


class ServerError(RuntimeError):
    """A server could not be built, started or stopped; the message has the log tail."""


def cache_dir() -> Path:
    """Where built servers live between runs (``$JOBTRACE_SERVERS_CACHE``)."""
    env = os.environ.get("JOBTRACE_SERVERS_CACHE")
    path = Path(env) if env else Path.home() / ".cache" / "jobtrace-servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out; racy in theory, fine on a dev box or CI."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``port`` and we may bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def build_lock(name: str) -> Iterator[None]:
    """Serialise builds of one server across processes (pytest-xdist, parallel CI steps)."""
    lock_path = cache_dir() / f".{name}.lock"
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_logged(cmd: list[str], log: Path, *, cwd: Path | None = None,
               env: dict[str, str] | None = None, timeout: float = 1800) -> None:
    """Run a build step; on failure raise ServerError with the end of its output."""
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServerError(f"{cmd[0]} failed: {exc}\n--- {log}\n{tail(log)}") from exc
    if rc != 0:
        raise ServerError(f"{' '.join(cmd)} exited {rc}\n--- {log}\n{tail(log)}")


def tail(path: Path, n: int = 40) -> str:
    """Last ``n`` lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               alive: Callable[[], bool] = lambda: True, interval: float = 0.05) -> None:
    """Poll ``check`` until it is true; fail early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise ServerError(f"{what}: process exited before it was ready")
        time.sleep(interval)
    raise ServerError(f"{what}: not ready after {timeout:.0f}s")


class ManagedServer:
    """One server process on 127.0.0.1 with its data in a (temp) directory.

    Subclasses say how to build (``build``), which command to run (``_command``) and how
    to tell it is ready (``_wait_ready``). ``stop()`` keeps the data so that ``start``
    again on the same ``data_dir`` (or ``restart()``) exercises recovery; ``close()``
    also removes a temp data dir that this object created.
    """

    name = "server"
    start_timeout = 60.0
    stop_timeout = 30.0

    def __init__(self, port: int | None = None) -> None:
        self.host = "127.0.0.1"
        self.port: int | None = port
        self.data_dir: Path | None = None
        self._owned_data: Path | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix=f"jobtrace-{self.name}-logs-"))
        self.log_path = self._log_dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self._log_offset = 0
        self.started_in: float | None = None  # seconds of the last start, for the README numbers

    # --- subclass hooks -------------------------------------------------------------
    @classmethod
    def build(cls) -> Path:
        """Build (or find cached) and return the artifact path; idempotent."""
        raise NotImplementedError

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self) -> None:
        raise NotImplementedError

    def _stdin(self) -> int:
        return subprocess.DEVNULL

    # --- lifecycle ------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT`` (no trailing slash)."""
        if self.port is None:
            raise ServerError(f"{self.name} was never started")
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        """(host, port); FaultProxy reads it on every request, so restarts are followed."""
        if self.port is None:
            raise ServerError(f"{self.name} was never started")
        return (self.host, self.port)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self: S, data_dir: Path | str | None = None) -> S:
        """Start on a free port (the previous one if it is still free), data in ``data_dir``.

        Without ``data_dir`` the previous data dir is reused, or a fresh temp dir made.
        """
        if self.is_running():
            raise ServerError(f"{self.name} is already running at {self.url}")
        artifact = self.build()
        if data_dir is not None:
            self.data_dir = Path(data_dir)
        elif self.data_dir is None:
            self._owned_data = Path(tempfile.mkdtemp(prefix=f"jobtrace-{self.name}-data-"))
            self.data_dir = self._owned_data
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None or not port_is_free(self.port):
            self.port = free_port()
        self._log_fh = open(self.log_path, "ab")
        self._log_fh.write(f"\n=== start {self.name} port={self.port} data={self.data_dir}\n".encode())
        self._log_fh.flush()
        self._log_offset = self._log_fh.tell()
        t0 = time.monotonic()
        cmd = self._command(artifact, self.data_dir)
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=self._stdin(), stdout=self._log_fh, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal goes to us, and we stop it cleanly
            )
        except OSError as exc:
            self._log_fh.close()
            self._log_fh = None
            raise ServerError(f"{self.name}: cannot run {cmd[0]}: {exc}") from exc
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException as exc:
            self.stop()
            if isinstance(exc, ServerError):
                raise ServerError(f"{self.name}: {exc}\n--- {self.log_path}\n{tail(self.log_path)}") from exc
            raise
        self.started_in = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """SIGTERM and wait (graceful: data flushed); SIGKILL after ``stop_timeout``."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown. Unflushed data may be lost (that is the point)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.stop()

    def restart(self: S) -> S:
        """Stop and start again on the same data dir and, if still free, the same port."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and delete what this object created (temp data dir, log dir)."""
        self.stop()
        if self._owned_data is not None:
            shutil.rmtree(self._owned_data, ignore_errors=True)
            self._owned_data = None
            self.data_dir = None
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self: S) -> S:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<{type(self).__name__} {state} port={self.port} data={self.data_dir}>"

    # --- readiness helpers ----------------------------------------------------------
    def _http_ok(self, path: str, timeout: float = 2.0) -> bool:
        try:
            return requests.get(self.url + path, timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def _log_text(self) -> str:
        """Output of the current run only (the log file is appended across restarts)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_offset)
            return fh.read().decode(errors="replace")


def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all)
