"""The compiled fast lane (``jobtrace_native``, built from ``native/``): whether and how to use it.

The Python engine reads every line at ~10 µs whatever is optimised in it (its time is
spread over decoding, routing, parsing and encoding alike), so the 500,000 lines/s goal
needs compiled code. The lane reads the common kinds of line (strict Python ``logging``
lines, generic step lines, ``print`` and NCCL lines, DeepSpeed progress and timers,
Megatron-LM iterations, tqdm refreshes, Hugging Face Trainer metric dicts, and the alignment
pass's moments) and gives every other line back to the engine in order, with the state of the
stream it belongs to; its output is byte for byte the engine's (``tests/ingest/test_native.py``).
It is optional: without the compiled module, or for inputs it does not cover, the Python engine
does all the work.

The bridge: a stream Python has read a line of goes (back) to the lane as one
:class:`LaneStream`, built here by :func:`lane_stream` and read by field name on the Rust
side (``native/src/lane/mod.rs``, ``struct LaneStream``), so the two sides cannot drift
apart by position.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from ._prefix import PrefixMode
from ._streams import Stream
from ._timestamps import TzSpec
from ._types import Parser

__all__ = ["LaneStream", "lane_module", "lane_stream", "new_lane"]

_native: Any
try:  # by name: an optional compiled module, typed here as Any
    _native = importlib.import_module("jobtrace_native")
except ImportError:  # not built: the Python engine does everything
    _native = None


class LaneStream(NamedTuple):
    """Python's state of one stream as the lane takes it over (fields as in Rust's ``LaneStream``)."""

    label: int | None  # its srun label (None: lines without one)
    out: int | None  # its output's index (None while Python has made none)
    offset: int  # clock offset added to its times (ns)
    ident: bytes  # its output's encoded identity (b"" without output)
    last_ts: int | None
    busy: bool  # Python holds a multi-line block or lines waiting for a time of it
    mtime_ns: int | None  # the file's, for lines that never get a time
    generic_state: dict[str, Any]  # the parsers' state of the stream, by parser
    deepspeed_state: dict[str, Any]
    megatron_state: dict[str, Any]
    huggingface_state: dict[str, Any]
    last_layout: str | None  # the head layout last read in it
    rank_guessed: bool


def lane_stream(label: int | None, stream: Stream) -> LaneStream:
    """What the lane is given of ``stream`` (read by Python up to now) when it takes it (back)."""
    out = stream.out
    state = stream.state
    return LaneStream(label, out.index if out else None, stream.offset, out.head if out else b"", stream.last_ts,
                      stream.block is not None or bool(stream.pending), stream.src.mtime_ns or None,
                      state.state("generic-step"), state.state("deepspeed"), state.state("megatron"),
                      state.state("huggingface"), stream.head.last_layout, state.rank_guessed)


def lane_module() -> Any | None:
    """The compiled module, or ``None`` when it is not installed."""
    return _native


def new_lane(mode: str | None, tz: TzSpec, parsers: Sequence[Parser], max_msg_chars: int, pending_cap: int,
             sync_ids: Collection[int] = ()) -> Any | None:
    """A fast lane for one input file, or ``None`` where it does not apply.

    It applies to files without a launcher prefix or with ``srun -l`` labels, naive
    times in a fixed zone, and the built-in generic step and NCCL parsers (other parsers,
    the user's included, keep their lines: the lane gives back every line they trigger on).
    ``sync_ids``: the parsers whose step lines are clock-alignment moments.
    """
    from .parsers.generic import GenericStepParser, _role
    from .parsers.torch_distributed import NcclParser

    if _native is None or mode not in (PrefixMode.NONE, PrefixMode.SRUN) or tz.fixed_offset_s is None:
        return None
    for p in parsers:
        if p.name == "generic-step" and type(p) is not GenericStepParser:
            return None
        if p.name == "nccl" and type(p) is not NcclParser:
            return None
    try:
        return _native.FastLane(mode, tz.fixed_offset_s, max_msg_chars, pending_cap,
                                [list(p.triggers) for p in parsers], [p.name for p in parsers], _role,
                                sorted(sync_ids))
    except ValueError:  # a trigger the Rust regex engine does not take: the Python engine reads the file
        return None
