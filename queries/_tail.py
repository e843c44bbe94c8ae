"""Following a running job: the events its ranks write, as they write them, from the store or a server.

* :class:`LocalTail`, the embedded store: each process of the job appends JSON lines to its own file
  (``jobtrace.store``); new ranks add new files. It keeps an offset per file and returns only the
  events written since the last call: complete lines only (a line still being written stays for the
  next call), torn or corrupt ones counted and skipped. It never reads a file twice, so following a
  job costs what the job writes.
* :class:`VictoriaLogsTail`: each call asks for the job's events of the last ``lookback_s`` seconds
  (ranks ship on their own clocks and batches, so an event can arrive after a later one of another
  rank) and returns those not seen before; one query a call, bounded by the lookback, never by the
  job's length. An event that arrives more than ``lookback_s`` late is not seen (counted as none:
  raise the lookback where shipping lags that much).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from jobtrace.errors import JobNotFound
from jobtrace.store import job_dir

__all__ = ["LocalTail", "VictoriaLogsTail"]

_MAX_READ = 64 << 20
"""Bytes read from one file per call at most: a job that writes faster is caught up with over several calls."""


class LocalTail:
    """The new events of ``job_id`` in the store at ``data_dir``, a batch per :meth:`read`."""

    def __init__(self, data_dir: str | os.PathLike[str], job_id: str) -> None:
        self.directory = job_dir(data_dir, job_id)
        self.job_id = job_id
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.skipped = 0
        """Lines that were not events (torn, corrupt, another schema)."""
        self.bytes_read = 0

    def exists(self) -> bool:
        return self.directory.is_dir() and any(self.directory.glob("*.jsonl"))

    def read(self) -> list[dict[str, Any]]:
        """The events appended since the last call (every event of the job on the first)."""
        if not self.directory.is_dir():
            raise JobNotFound(f"no job {self.job_id!r} in the embedded store at {self.directory.parent}")
        out: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                size = path.stat().st_size
            except OSError:  # removed meanwhile (compacted): its segment holds the same lines
                continue
            if size < offset:  # rewritten from the start: read it again
                offset, self._partial[path] = 0, b""
            if size == offset:
                continue
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(min(size - offset, _MAX_READ))
            self._offsets[path] = offset + len(data)
            self.bytes_read += len(data)
            data = self._partial.pop(path, b"") + data
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                self._partial[path] = data[cut:]
            for line in data[:cut].splitlines():
                if not line.strip():
                    continue
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self.skipped += 1
                    continue
                if isinstance(event, dict) and "kind" in event and "ts" in event:
                    out.append(event)
                else:
                    self.skipped += 1
        return out


class VictoriaLogsTail:
    """The new events of ``job_id`` in VictoriaLogs at ``url`` (``JOBTRACE_VL_*`` credentials), a batch per call."""

    def __init__(self, job_id: str, url: str | None = None, *, lookback_s: float = 30.0, transport: Any = None) -> None:
        from jobtrace import config
        from jobtrace.http import HttpConfig, RequestsTransport
        from loki import logsql_quote

        from ._victorialogs import VictoriaLogsReader

        http = HttpConfig.from_env(config.VL.prefix, url)
        self.reader = VictoriaLogsReader(http.url, transport or RequestsTransport(http), tenant=http.tenant,
                                         timeout_s=30.0, retries=1)
        self.job_id = job_id
        self.selector = "{job=" + logsql_quote(job_id) + "} | fields _msg"
        self.lookback_ns = int(lookback_s * 1e9)
        self._seen: dict[bytes, int] = {}  # a line's hash -> its ts, for the lines still inside the lookback
        self.skipped = 0
        self.bytes_read = 0

    def exists(self) -> bool:
        import time

        now = time.time_ns()
        return bool(self.reader.query(self.selector + " | limit 1", now - self.lookback_ns, now + 10**9))

    def read(self) -> list[dict[str, Any]]:
        import hashlib
        import time

        now = time.time_ns()
        rows = self.reader.query(self.selector, now - self.lookback_ns, now + 10**9)
        out: list[dict[str, Any]] = []
        for row in rows:
            raw = row.get("_msg", "")
            self.bytes_read += len(raw)
            key = hashlib.blake2b(raw.encode(), digest_size=16).digest()
            if key in self._seen:
                continue
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError:
                self.skipped += 1
                continue
            if not isinstance(event, dict) or event.get("job") != self.job_id or "ts" not in event:
                self.skipped += 1
                continue
            self._seen[key] = int(event["ts"])
            out.append(event)
        horizon = now - 2 * self.lookback_ns
        if len(self._seen) > 100_000 or out:
            self._seen = {k: ts for k, ts in self._seen.items() if ts >= horizon}
        return out
