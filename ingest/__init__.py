"""Ingest existing training logs: raw text from any rank of any framework → canonical events.

    from ingest import IngestConfig, Ingestor, open_sink
    summary = Ingestor(IngestConfig(job="run-42"), open_sink("local", "run-42")).run(["logs/"])

Then ``trace-job run-42`` reports on the job as for an instrumented one. The command
line is ``jobtrace ingest PATH... --job ID`` (:mod:`jobtrace.cli`; this package holds the
library only). Parsers for Megatron-LM, DeepSpeed,
Hugging Face, torch.distributed/NCCL failures and plain ``step N loss x`` lines are
built in; :func:`register_parser` adds one of your own (see :class:`Parser`).
"""

from __future__ import annotations

from ._align import ClockOffset, estimate_offsets
from ._allocator import keep_freed_memory
from ._context import IngestConfig, IngestSummary
from ._engine import Ingestor, default_registry, register_parser
from ._resume import Reuse, SourceBook
from ._sinks import SINK_KINDS, MemorySink, local_files, open_sink
from ._timestamps import parse_timestamp
from ._types import FEED_DONE, FEED_MORE, FEED_REJECT, Block, Line, Parser, ParserRegistry, Skip, StreamState

__all__ = [
    "Block",
    "ClockOffset",
    "FEED_DONE",
    "FEED_MORE",
    "FEED_REJECT",
    "IngestConfig",
    "IngestSummary",
    "Ingestor",
    "Line",
    "MemorySink",
    "Parser",
    "ParserRegistry",
    "Reuse",
    "SINK_KINDS",
    "Skip",
    "SourceBook",
    "StreamState",
    "default_registry",
    "estimate_offsets",
    "keep_freed_memory",
    "local_files",
    "open_sink",
    "parse_timestamp",
    "register_parser",
]
