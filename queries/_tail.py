"""Following a running job in the embedded store: the lines its ranks append, as they append them.

Each process of the job appends JSON lines to its own file (``jobtrace.store``); new ranks add new
files. A :class:`LocalTail` keeps an offset per file and returns only the events written since the
last call: complete lines only (a line still being written stays for the next call), torn or corrupt
ones counted and skipped. It never reads a file twice, so following a job costs what the job writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from jobtrace.errors import JobNotFound
from jobtrace.store import job_dir

__all__ = ["LocalTail"]

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
