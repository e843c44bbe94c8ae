"""The one batching engine behind every sink: hot-path append, background export.

Constraints that shape it:

* ``emit`` runs on the training thread. It appends to a deque (atomic under the
  GIL), maybe sets an Event, and returns: no lock, no I/O, no logging.
* The queue is bounded. When it is full (the sinks cannot keep up) the item is
  encoded and appended to an *overflow spill file* by the caller: a page-cache
  write, the only rare path that costs a syscall, chosen over dropping events
  (nothing may be lost) and over blocking (training must not stall). The worker
  drains the spill file back in order after the queue.
* One named daemon thread exports batches to every sink when a batch is full or
  ``flush_interval_s`` elapsed. A sink that raises is counted and logged once per
  kind of error; it never takes the worker down.
* ``force_flush`` and ``shutdown`` share the export lock with the worker, so a
  flush returns only after everything emitted before it reached the sinks.
* Secrets are redacted here, once for every sink, before any of them (the embedded
  store too): each batch of lines, and the compiled recorder's buffers as they are,
  goes through a :class:`~jobtrace.redact.Redactor` on the export thread. The spill
  file gets redacted lines too, so no secret reaches the disk.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from jobtrace.redact import Redactor, RedactState, redactor_from_env

__all__ = ["BatchWorker", "Sink", "WorkerStats"]

T = TypeVar("T")

_log = logging.getLogger("jobtrace.export")


class Sink(Protocol):
    """Where encoded event lines go. Runs on the export thread only.

    Each item of ``write`` is one event line, ending in ``\n``, unless the sink says ``takes_chunks``.
    """

    takes_chunks: bool
    """Whether an item of ``write`` may hold several whole lines (the embedded store, which writes items
    as they are): the compiled recorder's and the ingest lane's buffers then go out as one bytes object
    instead of a bytes object per event. False: :class:`BatchWorker` splits such a buffer into lines."""

    def write(self, lines: Sequence[bytes]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class WorkerStats:
    """Counters a user can read (``Tracing.stats()``) to see that nothing was lost."""

    exported: int = 0
    spilled: int = 0
    encode_errors: int = 0
    redact_errors: int = 0
    """Lines dropped because redacting them failed (never sent unredacted)."""
    sink_errors: dict[str, int] = field(default_factory=dict)


class BatchWorker(Generic[T]):
    """Moves items from the calling thread to sinks in batches, on one thread."""

    def __init__(
        self,
        encode_batch: Callable[[list[T]], list[bytes]],
        sinks: Sequence[Sink],
        *,
        max_queue: int = 200_000,
        batch_size: int = 16384,
        flush_interval_s: float = 1.0,
        spill_path: str | None = None,
        name: str = "jobtrace-export",
        redact: Redactor | bool | None = None,
    ) -> None:
        """``redact``: the :class:`Redactor` to apply, ``False`` for none, ``None`` (or ``True``) for the one
        the environment asks for (``JOBTRACE_REDACT``, ``JOBTRACE_REDACT_PATTERNS``; ``True``: even when
        ``JOBTRACE_REDACT=0``)."""
        self._encode_batch = encode_batch
        self._sinks = list(sinks)
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._queue: collections.deque[T] = collections.deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._spill_lock = threading.Lock()
        self._spill_path = spill_path
        self._spill_fd: int | None = None
        self._shutdown = False
        self._reported: set[str] = set()
        self._sources: list[Callable[[], tuple[bytes, int, int]]] = []
        self._before: list[Callable[[], object]] = []
        self.redactor: Redactor | None = (redact if isinstance(redact, Redactor) else None if redact is False
                                          else redactor_from_env(force=redact is True))
        self._redact_state = RedactState()  # the export thread's stream: a key block left open by a batch
        self.stats = WorkerStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- calling thread -------------------------------------------------------
    def emit(self, item: T) -> None:
        q = self._queue
        n = len(q)
        if n < self._max_queue:
            q.append(item)
            # Wake the exporter once per full batch: Event.set takes a lock and notifies,
            # which would cost every call while a burst keeps the queue above a batch.
            if n >= self._batch_size and not self._wake.is_set():
                self._wake.set()
        else:
            self._spill(item)

    def direct_queue(self) -> tuple[collections.deque[T], int]:
        """The queue and the length below which :meth:`emit` does nothing but append.

        A producer on a hot path may check ``len(queue) < room`` itself and append
        directly, calling :meth:`emit` otherwise: the same behaviour without a Python
        call, which in a training step (cold caches after the model's kernels) costs
        about a microsecond.
        """
        return self._queue, self._batch_size

    def add_source(self, drain: Callable[[], tuple[bytes, int, int]]) -> None:
        """A producer that keeps its own queue of encoded lines (the compiled recorder).

        ``drain()`` returns ``(lines, how many, how many could not be encoded)``; the
        worker calls it on the export thread before its own queue, every time it exports.
        """
        self._sources.append(drain)

    def limits(self) -> tuple[int, int]:
        """``(batch size, queue bound)``: a source wakes the worker at the first and spills at the second."""
        return self._batch_size, self._max_queue

    def wake(self) -> None:
        """Export now rather than at the next interval (a batch is waiting)."""
        self._wake.set()

    def spill_lines(self, data: bytes, n: int, errors: int = 0) -> None:
        """Encoded lines a full source could not keep: to the spill file, exported after the queue."""
        self.stats.encode_errors += errors
        data = self._redacted(data, n, None)
        if data:
            self._spill_write(data, n)

    def _spill(self, item: T) -> None:
        try:
            lines = self._encode_batch([item])
        except Exception:  # noqa: BLE001 - counted, never raised into training code
            self.stats.encode_errors += 1
            return
        data = self._redacted(b"".join(lines), 1, None)
        if data:
            self._spill_write(data, 1)

    def _redacted(self, data: bytes, n: int, state: RedactState | None) -> bytes:
        """``data`` redacted; empty (its ``n`` lines counted as dropped) when redacting failed."""
        if self.redactor is None:
            return data
        try:
            return self.redactor.redact(data, state)
        except Exception as exc:  # noqa: BLE001 - never unredacted, never raised into training code
            self.stats.redact_errors += n
            self._report_once("redact", RuntimeError(type(exc).__name__))  # the type only: a message may quote a line
            return b""

    def _spill_write(self, data: bytes, n: int) -> None:
        with self._spill_lock:
            if self._spill_fd is None:
                path = self._spill_path or f"/tmp/jobtrace-spill-{os.getpid()}.jsonl"
                self._spill_path = path
                self._spill_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self._spill_fd, data)
            self.stats.spilled += n
        self._wake.set()

    # ---- export thread ----------------------------------------------------------
    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self._interval)
            self._wake.clear()
            self._export_all()
        self._export_all()

    def before_export(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the export thread before each export, so that what it emits goes out in the same batch
        (the compiled process-group hooks' records, kept in C++ until then)."""
        self._before.append(fn)

    def _export_all(self) -> None:
        with self._export_lock:
            for before in self._before:
                try:
                    before()
                except Exception as exc:  # noqa: BLE001 - it must never kill the worker
                    self._report_once("before_export", exc)
            for drain in self._sources:
                try:
                    data, n, errors = drain()
                except Exception as exc:  # noqa: BLE001 - a source must never kill the worker
                    self._report_once("source", exc)
                    continue
                self.stats.encode_errors += errors
                if data:
                    self._write_chunk(data, n)
            q = self._queue
            while q:
                n = min(len(q), self._batch_size)
                batch = [q.popleft() for _ in range(n)]
                self._export(batch)
            self._drain_spill()
            for sink in self._sinks:
                self._guard(sink, "flush", sink.flush)

    def _export(self, batch: list[T]) -> None:
        try:
            lines = self._encode_batch(batch)
        except Exception as exc:  # noqa: BLE001
            self.stats.encode_errors += len(batch)
            self._report_once("encode", exc)
            return
        self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        if self.redactor is not None and lines:
            try:
                lines = self.redactor.redact_lines(lines, self._redact_state)
            except Exception as exc:  # noqa: BLE001 - dropped, counted: never sent unredacted
                self.stats.redact_errors += len(lines)
                self._report_once("redact", RuntimeError(type(exc).__name__))
                return
        for sink in self._sinks:
            self._guard(sink, "write", functools.partial(sink.write, lines))
        self.stats.exported += len(lines)

    def _write_chunk(self, data: bytes, n: int) -> None:
        """``n`` whole lines in one bytes object: as they are to sinks that take chunks, split for the rest."""
        data = self._redacted(data, n, self._redact_state)
        if not data:
            return
        split: list[bytes] | None = None
        for sink in self._sinks:
            if sink.takes_chunks:
                lines = [data]
            else:
                split = split if split is not None else data.splitlines(keepends=True)
                lines = split
            self._guard(sink, "write", functools.partial(sink.write, lines))
        self.stats.exported += n

    def _drain_spill(self) -> None:
        with self._spill_lock:
            if self._spill_fd is None or self._spill_path is None:
                return
            with open(self._spill_path, "rb") as fh:
                data = fh.read()
            os.ftruncate(self._spill_fd, 0)
        if data:
            self._write_chunk(data, data.count(b"\n"))

    def _guard(self, sink: Sink, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a sink must never kill the worker
            key = f"{type(sink).__name__}.{what}"
            self.stats.sink_errors[key] = self.stats.sink_errors.get(key, 0) + 1
            self._report_once(key, exc)

    def _report_once(self, key: str, exc: BaseException) -> None:
        if key not in self._reported:
            self._reported.add(key)
            _log.warning("jobtrace: %s failed: %s (further errors counted, not logged)", key, exc)

    # ---- control ------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export everything emitted so far; True when it finished within the timeout."""
        if self._shutdown and not self._thread.is_alive():
            return True
        done = self._export_lock.acquire(timeout=timeout_s)
        if done:
            self._export_lock.release()
            self._export_all()
        return done

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            # The worker is stuck in a slow sink; still make our own attempt.
            self.force_flush(max(0.0, deadline - time.monotonic()))
        for sink in self._sinks:
            self._guard(sink, "close", sink.close)
        if self._spill_fd is not None:
            os.close(self._spill_fd)
            self._spill_fd = None
            if self._spill_path and os.path.exists(self._spill_path) and os.path.getsize(self._spill_path) == 0:
                os.unlink(self._spill_path)

    @property
    def queued(self) -> int:
        return len(self._queue)
