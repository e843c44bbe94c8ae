"""Where ingested events go: one :class:`shippers.Sink` per (node, rank), opened on first use.

The embedded store gets one file per (node, rank) with pid 0 (``<node>.r<rank>.p0.jsonl``),
the layout ``trace-job`` reads for an instrumented job. The Loki and Elasticsearch
shippers plug in through :func:`open_sink` once they exist.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from jobtrace.errors import ConfigError
from jobtrace.store import job_dir, spool_root
from shippers import LocalStoreSink, Sink

__all__ = ["SINK_KINDS", "MemorySink", "SinkFactory", "local_files", "open_sink"]

SINK_KINDS: Final = ("local", "loki", "victorialogs", "elasticsearch")

SinkFactory = Callable[[str, int], Sink]
"""``(node, rank) -> Sink``: called once per (node, rank) the ingest writes for."""


class MemorySink:
    """Keeps written lines in memory; for tests and for callers that post-process events."""

    takes_chunks = False
    """One line per item, as a caller reading ``lines`` expects (see :class:`shippers.Sink`)."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.closed = False

    def write(self, lines: Sequence[bytes]) -> None:
        self.lines.extend(lines)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def open_sink(kind: str, job: str, *, data_dir: str | os.PathLike[str] = "jobtrace-data", overwrite: bool = False,
              **options: object) -> SinkFactory:
    """A factory of sinks of ``kind`` (``local``, ``loki``, ``victorialogs`` or ``elasticsearch``) for ``job``.

    ``overwrite`` (local only) first removes the job's earlier ingested files
    (``*.p0.jsonl``), so ingesting the same logs twice does not double the events.
    Raises :class:`ConfigError` for an unknown kind or one that is not available yet.
    """
    if kind == "local":
        directory = job_dir(data_dir, job)
        if overwrite and directory.is_dir():
            for old in [*directory.glob("*.p0.jsonl"), *directory.glob("*.p0.jsonl.*.parquet")]:
                old.unlink()

        def local(node: str, rank: int) -> Sink:
            return LocalStoreSink(data_dir, job, node or "unknown", rank, 0)

        return local
    if kind in ("loki", "victorialogs", "elasticsearch"):
        return _network(kind, job, data_dir, options.get("url"))  # type: ignore[arg-type]
    raise ConfigError(f"unknown sink {kind!r}; expected one of {', '.join(SINK_KINDS)}")


class _SharedSink:
    """One network shipper for every (node, rank) of an ingest: its labels come from each line.

    Closed when the last (node, rank) user closes it, so the ingest waits for the spool
    to drain exactly once.
    """

    takes_chunks = False
    """As the network shipper it shares."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self.users = 0

    def write(self, lines: Sequence[bytes]) -> None:
        self._sink.write(lines)

    def flush(self) -> None:
        self._sink.flush()

    def close(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self._sink.close()


def _network(kind: str, job: str, data_dir: str | os.PathLike[str], url: str | None) -> SinkFactory:
    from shippers import ProcessInfo, open_shipper

    info = ProcessInfo(job, "ingest", 0, os.getpid(), spool_root(data_dir, job) / f"ingest-{os.getpid()}")
    sink: Sink = open_shipper(kind, info, url)
    shared = _SharedSink(sink)

    def factory(node: str, rank: int) -> Sink:
        shared.users += 1
        return shared

    return factory


def local_files(data_dir: str | os.PathLike[str], job: str) -> list[Path]:
    """The job's files in the embedded store that ingests write (``*.p0.jsonl``; see :func:`open_sink`)."""
    return sorted(job_dir(data_dir, job).glob("*.p0.jsonl"))
