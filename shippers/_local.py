"""The embedded store: one append-only JSON-lines file per process under the job directory.

Why this shape:

* One file per process (``<node>.r<rank>.p<pid>.jsonl``) means ranks never share a
  file, so no locking is needed even on NFS/Lustre where ``O_APPEND`` is not
  atomic across clients, and a restarted rank (new pid) never interleaves with its
  earlier life.
* Each batch goes out as whole lines in ``os.write`` calls on an ``O_APPEND``
  descriptor. A crash can only tear the *last* line of a file; readers skip a line
  that does not end in a newline and count it (see :mod:`queries`).
* ``fsync`` is not called per batch (that would cost milliseconds on shared file
  systems); it is called on flush at shutdown so a clean exit is durable.
* On a clean close the file also gets its columnar segment (:func:`jobtrace.store.compact`),
  so reading a finished job does not have to parse every rank's JSON again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from jobtrace import config
from jobtrace.errors import StoreError
from jobtrace.store import compact, job_dir, process_file_name

__all__ = ["LocalStoreSink"]


class LocalStoreSink:
    """Appends encoded event lines to this process's file in the job directory."""

    takes_chunks = True
    """Items may hold several lines: they are written as they are (see :class:`shippers.Sink`)."""

    def __init__(self, data_dir: str | os.PathLike[str], job_id: str, node: str, rank: int, pid: int,
                 *, compact: bool | None = None) -> None:
        # JOBTRACE_COMPACT=0 keeps a job's directory to JSON lines only (e.g. a tool that reads them itself).
        self.compact = config.get_bool(config.COMPACT, default=True) if compact is None else compact
        self.dir = job_dir(data_dir, job_id)
        self.path = self.dir / process_file_name(node, rank, pid)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot write the embedded store at {self.path}: {exc.strerror}") from exc

    def write(self, lines: Sequence[bytes]) -> None:
        view = memoryview(b"".join(lines))
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def flush(self) -> None:
        """Data is in the page cache after ``write``; nothing is buffered in Python."""

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = -1
            if self.compact:
                compact(self.path)  # imports DuckDB only now: not worth its import time at training startup
