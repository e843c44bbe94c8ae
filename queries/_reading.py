"""What every log-server reader shares: time ranges, query windows and one retrying read.

The readers (:mod:`._loki`, :mod:`._victorialogs`, :mod:`._elasticsearch`) use these;
:mod:`._backends` chooses among the readers, so neither imports the other's module.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from jobtrace.config import parse_duration_s
from jobtrace.errors import BackendUnavailable, ConfigError, QueryError, ServerUnavailable
from jobtrace.redact import url_for_display

if TYPE_CHECKING:
    from jobtrace.http import Request, Response, Transport

__all__ = ["Progress", "TimeRange", "busy_windows", "even_windows", "parse_time", "rank_runs", "rank_slices", "read_request"]

_REL = re.compile(r"^\d+(?:\.\d+)?[smhdw]$")


def parse_time(value: str | None, now_ns: int) -> int | None:
    """``None``, a relative age (``90m``, ``7d``), RFC 3339, or epoch seconds/ns → Unix ns."""
    if value is None or value == "":
        return None
    if value == "now":
        return now_ns
    if _REL.match(value):
        return now_ns - int(parse_duration_s(value) * 1e9)
    if value.isdigit():
        n = int(value)
        return n if n > 10**15 else n * 10**9
    from datetime import datetime

    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"cannot read time {value!r}: use 90m, 7d, RFC 3339 or epoch seconds") from None
    return int(dt.timestamp() * 1e9)


@dataclass(frozen=True)
class TimeRange:
    start_ns: int
    end_ns: int

    @classmethod
    def parse(cls, since: str | None, until: str | None) -> TimeRange:
        now = time.time_ns()
        start = parse_time(since, now) or now - 7 * 86400 * 10**9
        end = parse_time(until, now) or now
        if start >= end:
            raise ConfigError("--since must be before --until")
        return cls(start, end)


def even_windows(start_ns: int, end_ns: int, pieces: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ``pieces`` equal, non-empty windows."""
    size = max(1, (end_ns - start_ns) // pieces)
    edges = [start_ns + i * size for i in range(pieces)] + [end_ns]
    return [(edges[i], edges[i + 1]) for i in range(pieces) if edges[i] < edges[i + 1]]


def busy_windows(intervals: Iterable[tuple[int, int, int]], window_lines: int) -> list[tuple[int, int]]:
    """Query windows for a server with a per-query line limit, from a histogram of the job.

    ``intervals`` are time-ordered ``(start, end, lines)`` from the server's counts; touching
    ones merge, empty stretches are skipped, and each busy span is cut into windows of about
    ``window_lines`` lines (never under 1 ms), like logcli's batch mode but sized by data.
    """
    spans: list[list[int]] = []
    for a, b, n in intervals:
        if a >= b:
            continue
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
            spans[-1][2] += n
        else:
            spans.append([a, b, n])
    out: list[tuple[int, int]] = []
    for a, b, n in spans:
        out += even_windows(a, b, max(1, min(math.ceil(n / window_lines), (b - a) // 1_000_000)))
    return out


def read_request(transport: Transport, request: Request, *, timeout_s: float, retries: int, backend: str,
                 base: str, credentials_hint: str, on_attempt: Callable[[], None] = lambda: None,
                 ok: tuple[int, ...] = (200,)) -> Response:
    """Send one read to a log server, retrying an unreachable server and 429/5xx with backoff.

    Returns the answer whose status is in ``ok`` (200); any other outcome is a :class:`QueryError` that names the
    server (without credentials) and, for 401/403, where the credentials come from.
    """
    from jobtrace.http import RetryPolicy

    policy = RetryPolicy(initial_s=0.5, max_s=8.0)
    where = url_for_display(base)
    for attempt in range(retries + 1):
        on_attempt()
        try:
            response = transport.send(request, timeout_s)
        except BackendUnavailable as exc:
            if attempt == retries:
                raise ServerUnavailable(f"cannot reach {backend} at {where}: {exc}") from None
            time.sleep(policy.delay(attempt))
            continue
        if response.status in ok:
            return response
        if policy.retryable(response.status):
            if attempt == retries:
                raise ServerUnavailable(f"{backend} at {where} kept answering HTTP {response.status}")
            time.sleep(policy.delay(attempt, response.header("Retry-After")))
            continue
        if response.status in (401, 403):
            raise QueryError(f"{backend} at {where} refused the credentials (HTTP {response.status}): "
                             f"check {credentials_hint}")
        text = " ".join(response.body[:1000].decode("utf-8", "replace").split())
        raise QueryError(f"{backend} query failed with HTTP {response.status}: {text}")
    raise QueryError("unreachable")  # pragma: no cover




class Progress:
    """``reading from VictoriaLogs: 12/40 queries, 31.2 MiB`` on one stderr line, for reads that take a while.

    Drawn only on a terminal and only once a read has run for ``after_s`` (a quick read stays silent,
    and a pipe or a CI log never gets carriage returns); the line is cleared when the read ends.
    Thread-safe: readers call :meth:`step` from their worker threads.
    """

    def __init__(self, what: str, total: int, *, after_s: float = 1.0, stream: TextIO | None = None) -> None:
        self.what, self.total, self.done, self.bytes = what, total, 0, 0
        self._stream = stream if stream is not None else sys.stderr
        self._t0 = time.monotonic()
        self._after_s = after_s
        self._drawn = False
        self._lock = threading.Lock()
        self._tty = self._stream.isatty()

    def step(self, nbytes: int = 0) -> None:
        with self._lock:
            self.done += 1
            self.bytes += nbytes
            if self._tty and time.monotonic() - self._t0 >= self._after_s:
                self._stream.write(f"\r{self.line()}")
                self._stream.flush()
                self._drawn = True

    def line(self) -> str:
        return f"{self.what}: {self.done}/{self.total} queries, {self.bytes / 2**20:.1f} MiB"

    def close(self) -> None:
        with self._lock:
            if self._drawn:
                self._stream.write("\r" + " " * len(self.line()) + "\r")
                self._stream.flush()
                self._drawn = False


def rank_runs(ranks: list[int]) -> list[tuple[int, int]]:
    """Sorted ``ranks`` as runs of consecutive ranks, each ``[lo, hi)``: a server filter names ranges, not lists."""
    runs: list[tuple[int, int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1]:
            runs[-1] = (runs[-1][0], rank + 1)
        else:
            runs.append((rank, rank + 1))
    return runs


def rank_slices(counts: dict[int, int], max_events: int, at_least: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` rank ranges of at most ``max_events`` events each (at least ``at_least`` of them).

    A server reader sends one query per slice, so no per-rank group straddles two answers and the
    slices can run side by side.
    """
    ranks = sorted(counts)
    if not ranks:
        return []
    total = sum(counts.values())
    size = max(1, min(max_events, -(-total // max(1, at_least))))
    out: list[tuple[int, int]] = []
    lo, acc = ranks[0], 0
    for r in ranks:
        if acc and acc + counts[r] > size:
            out.append((lo, r))
            lo, acc = r, 0
        acc += counts[r]
    out.append((lo, ranks[-1] + 1))
    return out
