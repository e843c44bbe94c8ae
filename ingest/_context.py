"""What the parts of one ingest share: its configuration, its summary, and the state they all read and count into.

The engine (:mod:`._engine`), the stream router (:mod:`._router`), the lane driver and
the alignment pass each hold the same :class:`IngestContext`, so what one of them
changes (the clock offsets the alignment pass found, the log lines written straight to an
output) the others see, without reaching into each other's attributes. The configuration
and summary records live here, not in the engine, so that the parts can name their types
without importing the engine that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ._align import ClockOffset
from ._output import Output
from ._plain import PlainLines
from ._timestamps import TzSpec
from ._types import Parser
from .parsers._util import SpanIds

__all__ = ["IngestConfig", "IngestContext", "IngestSummary", "ProgressFn"]


@dataclass(frozen=True)
class IngestConfig:
    """How to read the logs. Durations in seconds, sizes in bytes.

    Args:
        job: the job id every event gets (its trace id derives from it).
        tz: zone of timestamps that carry none: ``UTC`` (default), ``local``, ``+HH:MM`` or an IANA name.
        year: year for formats without one (glog, c10); default: from the stream's dated lines, else now.
        align: estimate and correct clock offsets between nodes (needs step ends logged by several nodes).
        follow: keep reading files as they grow (a running job) until ``idle_exit_s`` without new data
            (``None``: until interrupted).
        rank_from_filename: regex with groups ``rank``/``node``/``local_rank`` (or one group = rank).
        node, rank, world_size: force identity when the logs do not say.
        use_hyperscan: ``None`` = when installed.
        plain_fast_path: write strict plain log lines straight from bytes (see :mod:`._plain`); off only to
            compare with the general path.
        native: read the common lines with the compiled fast lane (see :mod:`._lane`): ``None`` = when
            installed, ``False`` = never (the reference), ``True`` = required.
    """

    job: str
    tz: str = "UTC"
    year: int | None = None
    align: bool = True
    follow: bool = False
    idle_exit_s: float | None = None
    poll_s: float = 0.5
    rank_from_filename: str | None = None
    node: str | None = None
    rank: int | None = None
    world_size: int | None = None
    chunk_bytes: int = 1 << 20  # read size; measured: 1 MiB beats 4 MiB (each fresh megabyte costs its pages)
    max_line_bytes: int = 1 << 20
    max_msg_chars: int = 64 * 1024
    pending_cap: int = 10_000
    batch_lines: int = 4096
    use_hyperscan: bool | None = None
    plain_fast_path: bool = True
    native: bool | None = None


@dataclass
class IngestSummary:
    """What an ingest read and produced; ``lines == parsed + sum(skipped.values())``."""

    job: str
    files: list[str] = field(default_factory=list)
    bytes_read: int = 0
    lines: int = 0
    parsed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    lines_by_parser: dict[str, int] = field(default_factory=dict)
    parser_errors: dict[str, int] = field(default_factory=dict)
    truncated_lines: int = 0
    """Lines longer than ``max_line_bytes``: each kept its head, the rest was dropped (counted once)."""
    cut_lines: list[dict[str, Any]] = field(default_factory=list)
    """The first of them: ``{"source", "bytes"}``, their whole length as read."""
    messages_cut: int = 0
    """Messages shortened to ``max_msg_chars`` (lines within the line limit)."""
    estimated_ts: int = 0
    mtime_ts: int = 0  # of those, timed by their file's mtime: the job had no stamped line to go by
    streams: list[dict[str, Any]] = field(default_factory=list)
    clock_offsets: list[ClockOffset] = field(default_factory=list)
    alignment_residual_ms: float | None = None
    matcher: str = ""
    fast_lane: bool = False
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the ingest ledger decided: files skipped as already ingested, or read on from where they stopped."""
    files_skipped: int = 0

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["skipped_total"] = self.skipped_total
        d["lines_per_s"] = round(self.lines / self.seconds) if self.seconds > 0 else None
        return d


ProgressFn = Callable[[int, int, int, int], None]
"""``(bytes_read, bytes_total, lines, events)``, called after every chunk."""


@dataclass
class IngestContext:
    """The state one ingest's parts share (built once by the engine, then only updated in place).

    ``n_log`` counts the ``log`` events written straight into an output's buffer (the
    router's fast paths and the lane); :class:`Output` counts only those it writes itself.
    ``offsets`` are the clock offsets by domain that the alignment pass found (empty
    without one); a stream made after it takes its domain's.
    """

    cfg: IngestConfig
    summary: IngestSummary
    output: Output
    parsers: list[Parser]
    tz: TzSpec
    plain: PlainLines
    span_ids: SpanIds
    offsets: dict[str, ClockOffset] = field(default_factory=dict)
    n_log: int = 0
