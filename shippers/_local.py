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
* That compaction also writes the rank's *rollup* (its rows of the derived tables). The
  rank's *pack* (:func:`jobtrace.store.pack_lines`: the rollup as a few JSON lines) then goes
  to the network shippers that take packs (:attr:`LocalStoreSink.pack_consumers`), so a log
  server can answer ``trace-job`` from one pack per rank instead of summing millions of events
  (docs/server-scale.md). It is sent here, at close, because only here does the rollup exist:
  the sinks closed after this one are still open, so the pack is spooled before they drain.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Protocol

from jobtrace import config
from jobtrace.errors import StoreError
from jobtrace.store import compact, job_dir, pack_lines, process_file_name

from ._batch import Sink

__all__ = ["LocalStoreSink", "PackConsumer", "connect_packs", "takes_packs"]

_log = logging.getLogger("jobtrace.export")


class PackConsumer(Protocol):
    """A sink that takes a rank's pack lines (``write``), like its event lines."""

    def write(self, lines: Sequence[bytes]) -> None: ...


def takes_packs(sink: object) -> bool:
    """Whether ``sink`` ships packs: its class says ``takes_packs = True`` (the Loki/VictoriaLogs and
    Elasticsearch shippers). Default False: a sink that stores or forwards events only (a file, OTLP spans)
    would store the packs as if they were events."""
    return bool(getattr(sink, "takes_packs", False))


def connect_packs(sinks: Sequence[Sink]) -> None:
    """Have each embedded-store sink in ``sinks`` send its rank's pack, when it closes, to the sinks after it
    that take packs.

    Only the sinks *after* it: :class:`~shippers.BatchWorker` closes its sinks in list order, so those are
    still open (and drain what was spooled) when the store sink compacts at its close; a shipper listed
    before it is closed already and could not take the pack.
    """
    for i, sink in enumerate(sinks):
        if isinstance(sink, LocalStoreSink):
            consumers: list[PackConsumer] = [s for s in sinks[i + 1:] if takes_packs(s)]
            sink.pack_consumers = consumers


class LocalStoreSink:
    """Appends encoded event lines to this process's file in the job directory."""

    takes_chunks = True
    """Items may hold several lines: they are written as they are (see :class:`shippers.Sink`)."""

    pack_consumers: list[PackConsumer]
    """Where this rank's pack goes when :meth:`close` has compacted the file (see the module docstring);
    set by :func:`connect_packs`. Empty: no pack is made (nothing would read it)."""

    def __init__(self, data_dir: str | os.PathLike[str], job_id: str, node: str, rank: int, pid: int,
                 *, compact: bool | None = None) -> None:
        # JOBTRACE_COMPACT=0 keeps a job's directory to JSON lines only (e.g. a tool that reads them itself).
        self.compact = config.get_bool(config.COMPACT, default=True) if compact is None else compact
        self.dir = job_dir(data_dir, job_id)
        self.pack_consumers = []
        self.packed = 0
        """Pack lines handed to the consumers at close (0 when no pack was made)."""
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
                segment = compact(self.path)  # imports DuckDB only now: not worth its import time at startup
                if segment is not None and self.pack_consumers:
                    self._send_pack(segment)

    def _send_pack(self, segment: os.PathLike[str]) -> None:
        """This rank's pack to every consumer; best effort: the process is exiting, and a rank without a pack
        costs a reader only time (it sums the rank's events instead), so nothing here may raise."""
        try:
            lines = pack_lines(segment)
        except Exception as exc:  # noqa: BLE001 - never break shutdown
            _log.warning("jobtrace: could not pack %s: %s (readers use its events)", segment, exc)
            return
        if not lines:
            return  # the rollup is missing or of another version
        for consumer in self.pack_consumers:
            try:
                consumer.write(lines)
            except Exception as exc:  # noqa: BLE001 - one shipper failing must not keep the pack from the others
                _log.warning("jobtrace: %s did not take the pack of %s: %s", type(consumer).__name__, segment, exc)
        self.packed = len(lines)
