"""The per-input state of one ingest: a file being read (``Src``) and the streams of lines in it (``Stream``).

Kept apart from the engine because three parts read and write it: the engine routes
lines to streams, the output writer (:mod:`._output`) releases a stream's pending lines
and writes its events, and the lane bridge (:mod:`._lane`) hands a stream's state to the
compiled lane and back. Plain slotted records: they are touched on every line.
"""

from __future__ import annotations

from typing import Any

from jobtrace.store import SourceRecord

from ._chunks import ChunkReader
from ._output import Out
from ._prefix import Prefix
from ._sources import FileIdentity, Source
from ._timestamps import HeadParser
from ._types import Block, Line, StreamState

__all__ = ["Src", "Stream"]


class Stream:
    """One input stream: a file, or one writer's lines of an interleaved file."""

    __slots__ = ("state", "head", "pending", "block", "block_line", "block_parser", "last_ts", "offset",
                 "domain", "out", "src")

    def __init__(self, state: StreamState, head: HeadParser, domain: str, src: Src) -> None:
        self.state = state
        self.head = head
        self.pending: list[tuple[dict[str, Any], int]] = []
        self.block: Block | None = None
        self.block_line: Line | None = None
        self.block_parser = ""
        self.last_ts: int | None = None
        self.offset = 0
        self.domain = domain
        self.out: Out | None = None
        self.src = src


class Src:
    """One input file of the main pass: its chunk reader, prefix mode, streams and (if any) its compiled lane."""

    __slots__ = ("source", "fid", "ident", "mode", "streams", "reader", "order", "fh", "mtime_ns",
                 "done", "default_day", "by_label", "lane", "lane_streams", "record", "fed")

    def __init__(self, source: Source, fid: int, ident: FileIdentity, max_line_bytes: int) -> None:
        self.source = source
        self.fid = fid
        self.ident = ident
        self.mode: str | None = None
        self.streams: dict[Prefix | None, Stream] = {}
        self.reader = ChunkReader(max_line_bytes)  # its carried partial line (see ._chunks)
        self.order = 0
        self.fh: Any = None
        self.mtime_ns = source.mtime_ns()
        self.done = False
        self.default_day: int | None = (self.mtime_ns // 86_400_000_000_000) if self.mtime_ns else None
        self.by_label: dict[bytes, Stream] = {}  # srun label as written (b"" without prefix) → its stream
        self.lane: Any = None  # the compiled fast lane reading this file (see ._lane), if any
        self.lane_streams: dict[int | None, Stream] = {}  # streams the lane holds, by srun label (None: none)
        self.record: SourceRecord | None = None  # its entry in the ingest ledger, where one is kept (see ._resume)
        self.fed = 0  # bytes of it read into the reader, counted from the file's start
