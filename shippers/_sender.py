"""The spooling sender: one engine behind the Loki, Elasticsearch and any other HTTP shipper.

A backend only supplies an :class:`Encoder` (lines → one HTTP request; response →
which lines were accepted, which to retry, which were refused and why). Everything
else lives here once:

* ``write`` (export thread) appends to the disk :class:`Spool` and wakes the sender;
* one sender thread per shipper sends batches in spool order, so there is exactly
  one request in flight per shipper (Loki's ordering per stream is kept);
* connection errors, timeouts, 429 and 5xx are retried with exponential backoff and
  jitter, honouring ``Retry-After``; only the lines that failed are retried;
* lines refused for good (400-class: too old, too long, mapping error) go to the
  :class:`DeadLetter` file with the backend's reason and are counted;
* the spool position advances only after the backend accepted (or refused for good)
  every line of the batch, so a crash or an outage never loses a line.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from jobtrace.errors import BackendUnavailable
from jobtrace.http import Request, Response, RetryPolicy, Transport

from ._spool import DeadLetter, Spool

__all__ = ["Encoder", "Outcome", "SenderStats", "SpoolingSender"]

_log = logging.getLogger("jobtrace.export")


@dataclass
class Outcome:
    """What the backend did with a batch, by line index."""

    retry: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    retry_after: str | None = None
    status: int | None = None

    @classmethod
    def all_ok(cls) -> Outcome:
        return cls()


class Encoder(Protocol):
    """The backend-specific part of a shipper."""

    name: str
    max_batch_lines: int
    max_batch_bytes: int

    def request(self, lines: Sequence[bytes]) -> Request: ...

    def outcome(self, lines: Sequence[bytes], response: Response) -> Outcome: ...


@dataclass
class SenderStats:
    sent: int = 0
    requests: int = 0
    retries: int = 0
    rejected: int = 0
    last_error: str | None = None
    spooled_bytes: int = 0


class SpoolingSender:
    """A :class:`shippers.Sink` that ships lines losslessly through a disk spool."""

    takes_chunks = False
    """The spool and the encoders read one line per item."""

    takes_packs = False
    """Whether the backend keeps a rank's pack (:func:`jobtrace.store.pack_lines`) where ``trace-job`` reads it,
    so the embedded store sink and ``jobtrace export`` send it one (see :func:`shippers._local.connect_packs`).
    Off unless a shipper's reader uses packs: elsewhere they would only be stored as strange events."""

    def __init__(
        self,
        encoder: Encoder,
        transport: Transport,
        spool_dir: str | Path,
        *,
        dead_letter: str | Path | None = None,
        policy: RetryPolicy | None = None,
        timeout_s: float = 10.0,
        idle_wait_s: float = 0.2,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        self.encoder = encoder
        self.transport = transport
        self.spool = Spool(spool_dir)
        self.dead_letter = DeadLetter(dead_letter or Path(spool_dir) / "dead-letter.jsonl")
        self.policy = policy or RetryPolicy()
        self.timeout_s = timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._idle_wait_s = idle_wait_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._deadline: float | None = None
        self.stats = SenderStats()
        self._thread = threading.Thread(target=self._run, name=f"jobtrace-ship-{encoder.name}", daemon=True)
        self._thread.start()

    # ---- Sink protocol (export thread) ---------------------------------------------------------
    def write(self, lines: Sequence[bytes]) -> None:
        self.spool.append(lines)
        self._wake.set()

    def flush(self) -> None:
        """Lines are durable once spooled; sending continues in the background."""

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until the spool is empty (every line sent or dead-lettered); for tests and CLI tools."""
        deadline = time.monotonic() + timeout_s
        while self.spool.pending_bytes() > 0:
            if time.monotonic() > deadline:
                return False
            self._wake.set()
            time.sleep(0.02)
        return True

    def close(self) -> None:
        """Try to drain for ``shutdown_timeout_s``; what remains stays spooled for the next run."""
        self._deadline = time.monotonic() + self.shutdown_timeout_s
        self._stop.set()
        self._wake.set()
        self._thread.join(self.shutdown_timeout_s + self.timeout_s + 1)
        if not self._thread.is_alive():
            # Whatever ended the sender thread, its deadline is the caller's too: send what is
            # still spooled from here rather than leave it for the next run.
            self._drain()
        left = self.spool.pending_bytes()
        self.stats.spooled_bytes = left
        if left:
            sys.stderr.write(
                f"jobtrace: {self.encoder.name}: {left} bytes not yet accepted remain in {self.spool.dir}; "
                f"they are sent first by the next shipper using it (or: jobtrace replay {self.spool.dir} --to {self.encoder.name})\n"
            )
        self.spool.close()
        self.transport.close()

    # ---- sender thread ----------------------------------------------------------------------------
    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _run(self) -> None:
        while True:
            if self._drain():
                return  # shutdown deadline passed mid-retry: the batch stays spooled
            if self._stop.is_set():
                return
            self._wake.wait(self._idle_wait_s)
            self._wake.clear()

    def _drain(self) -> bool:
        """Send spooled batches until the spool is empty; True when the deadline stopped it first."""
        enc = self.encoder
        while True:
            batch = self.spool.read_batch(enc.max_batch_lines, enc.max_batch_bytes)
            if not batch.lines:
                return False
            if not self._deliver(batch.lines):
                return True
            self.spool.commit(batch.end)

    def _deliver(self, lines: list[bytes]) -> bool:
        pending = list(lines)
        attempt = 0
        while pending:
            if self._expired():
                return False
            outcome = self._send_once(pending)
            for index, reason in outcome.rejected:
                self.dead_letter.write(pending[index], outcome.status, reason, self.encoder.name)
                self.stats.rejected += 1
            accepted = len(pending) - len(outcome.retry) - len(outcome.rejected)
            self.stats.sent += accepted
            if not outcome.retry:
                return True
            pending = [pending[i] for i in outcome.retry]
            self.stats.retries += 1
            delay = self.policy.delay(attempt, outcome.retry_after)
            attempt += 1
            if self._deadline is not None:
                delay = min(delay, max(0.0, self._deadline - time.monotonic()))
            self._stop.wait(delay) if not self._stop.is_set() else time.sleep(min(delay, 0.05))
        return True

    def _send_once(self, lines: list[bytes]) -> Outcome:
        try:
            request = self.encoder.request(lines)
        except Exception:  # noqa: BLE001 - find the lines that cannot be encoded, keep the rest
            return self._isolate_unencodable(lines)
        self.stats.requests += 1
        try:
            response = self.transport.send(request, self.timeout_s)
        except BackendUnavailable as exc:
            self._note(str(exc))
            return Outcome(retry=list(range(len(lines))))
        if self.policy.retryable(response.status) and response.status >= 400:
            self._note(f"HTTP {response.status}")
            return Outcome(retry=list(range(len(lines))), retry_after=response.header("Retry-After"),
                           status=response.status)
        return self.encoder.outcome(lines, response)

    def _isolate_unencodable(self, lines: list[bytes]) -> Outcome:
        bad: list[tuple[int, str]] = []
        for i, line in enumerate(lines):
            try:
                self.encoder.request([line])
            except Exception as exc:  # noqa: BLE001
                bad.append((i, f"cannot encode: {type(exc).__name__}: {exc}"))
        bad_ids = {i for i, _ in bad}
        return Outcome(retry=[i for i in range(len(lines)) if i not in bad_ids], rejected=bad, retry_after="0")

    def _note(self, error: str) -> None:
        if error != self.stats.last_error:
            _log.warning("jobtrace: %s: %s; retrying (data is spooled, nothing is lost)", self.encoder.name, error)
        self.stats.last_error = error
