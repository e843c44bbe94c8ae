"""Where ingested events go: one :class:`shippers.Sink` per (node, rank), opened on first use.

The embedded store gets one file per (node, rank) with pid 0 (``<node>.r<rank>.p0.jsonl``),
the layout ``trace-job`` reads for an instrumented job. The Loki and Elasticsearch
shippers plug in through :func:`open_sink` once they exist.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Final, Sequence

from jobtrace.errors import ConfigError
from shippers import LocalStoreSink, Sink, job_dir

__all__ = ["SINK_KINDS", "MemorySink", "SinkFactory", "open_sink"]

SINK_KINDS: Final = ("local", "loki", "elasticsearch")

SinkFactory = Callable[[str, int], Sink]
"""``(node, rank) -> Sink``: called once per (node, rank) the ingest writes for."""


class MemorySink:
    """Keeps written lines in memory; for tests and for callers that post-process events."""

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
    """A factory of sinks of ``kind`` (``local``, ``loki`` or ``elasticsearch``) for ``job``.

    ``overwrite`` (local only) first removes the job's earlier ingested files
    (``*.p0.jsonl``), so ingesting the same logs twice does not double the events.
    Raises :class:`ConfigError` for an unknown kind or one that is not available yet.
    """
    if kind == "local":
        directory = job_dir(data_dir, job)
        if overwrite and directory.is_dir():
            for old in directory.glob("*.p0.jsonl"):
                old.unlink()

        def local(node: str, rank: int) -> Sink:
            return LocalStoreSink(data_dir, job, node or "unknown", rank, 0)

        return local
    if kind in ("loki", "elasticsearch"):
        raise ConfigError(f"--to {kind} is not available yet: the {kind} shipper is still being built; "
                          "ingest with --to local for now")
    raise ConfigError(f"unknown sink {kind!r}; expected one of {', '.join(SINK_KINDS)}")


def local_files(data_dir: str | os.PathLike[str], job: str) -> list[Path]:
    return sorted(job_dir(data_dir, job).glob("*.p0.jsonl"))
