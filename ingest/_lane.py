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
apart by position. :class:`LaneDriver` runs the lanes of one ingest: it feeds them
blocks, routes the lines they give back through the engine's stream router, and hands
streams to them and back.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Collection, Sequence
from typing import Any, Final, NamedTuple

from ._context import IngestContext
from ._prefix import PrefixMode
from ._router import ELSEWHERE, StreamRouter, label_prefix, stream_label
from ._streams import Src, Stream
from ._timestamps import TzSpec
from ._types import Parser, sync_parser

__all__ = ["LaneDriver", "LaneStream", "lane_module", "lane_stream", "new_lane"]

_SRUN_LABEL: Final = re.compile(rb" *(\d{1,6}): ")

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
    fallback_ts: int | None  # a neighbour's time for lines of a stream with none (None: Python decides)
    generic_state: dict[str, Any]  # the parsers' state of the stream, by parser
    deepspeed_state: dict[str, Any]
    megatron_state: dict[str, Any]
    huggingface_state: dict[str, Any]
    last_layout: str | None  # the head layout last read in it
    rank_guessed: bool


def lane_stream(label: int | None, stream: Stream, fallback_ts: int | None) -> LaneStream:
    """What the lane is given of ``stream`` (read by Python up to now) when it takes it (back)."""
    out = stream.out
    state = stream.state
    return LaneStream(label, out.index if out else None, stream.offset, out.head if out else b"", stream.last_ts,
                      stream.block is not None or bool(stream.pending), fallback_ts,
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


class LaneDriver:
    """Drives the compiled lanes of one ingest: one per file and pass, fed blocks, their given-back lines routed.

    A line the lane gives back is read by the :class:`~._router.StreamRouter` with the
    state of its stream, which the lane first hands over (:meth:`give_back`); the stream
    then goes back to the lane. The lanes of one prefix mode share their compiled
    triggers (:meth:`new_lane`), the alignment pass's too.

    Apart from the engine because it is the one place that knows both sides of the
    bridge: what Python holds of a stream and when the lane may take it.
    """

    def __init__(self, ctx: IngestContext, router: StreamRouter, enabled: bool) -> None:
        self.enabled = enabled  # False: no lanes made for this ingest (not built, or ``native=False``)
        self._ctx = ctx
        self._router = router
        self._output = ctx.output
        self._sync_ids = frozenset(i for i, p in enumerate(ctx.parsers) if sync_parser(p) is not None)
        self._first: dict[str, Any] = {}  # the first lane made for each prefix mode (see new_lane)

    def new_lane(self, mode: str) -> Any:
        """A lane for one file (in each pass); its compiled triggers are shared with the other files' lanes (compiling
        them costs milliseconds, and a job's logs are often one file per rank)."""
        first = self._first.get(mode)
        if first is not None:
            return first.fresh()
        cfg = self._ctx.cfg
        lane = new_lane(mode, self._ctx.tz, self._ctx.parsers, cfg.max_msg_chars, cfg.pending_cap, self._sync_ids)
        if lane is not None:
            self._first[mode] = lane
        return lane

    def release(self) -> None:
        """Let the lanes kept for new files go (the end of an ingest)."""
        self._first.clear()

    def block(self, src: Src, data: bytes, begin: int = 0, end: int | None = None) -> None:
        """The lane reads the lines of ``data[begin:end]`` (no copy of them); each line it gives back is read
        here, in order, with its stream's state."""
        lane = src.lane
        end = len(data) if end is None else end
        pos = begin
        while True:
            lane.next_span_id = self._ctx.span_ids.next  # one count of span ids, whichever engine makes them
            stop = lane.run(data, begin, pos, end)
            self._ctx.span_ids.next = lane.next_span_id
            self._drain(src)
            if stop is None:
                return
            start, stop_end, label, ids = stop
            self.give_back(src, data[start:stop_end], frozenset(ids), False, label)
            if stop_end >= end:
                return
            pos = stop_end + 1

    def give_back(self, src: Src, raw: bytes, ids: frozenset[int] | None, truncated: bool,
                  label: int | None = None) -> None:
        """Read a line the lane gave back (``ids`` None: a cut line) in Python, with its stream's state handed over
        first, then hand that stream (back) to the lane with Python's state of it."""
        if ids is None:  # a cut line: its label as the lane would read it
            m = _SRUN_LABEL.match(raw) if src.mode == PrefixMode.SRUN else None
            label = int(m.group(1)) if m else None
        label = stream_label(src.mode, raw, label)
        if label is ELSEWHERE:  # a stream the lane never holds
            self._router.lines(src, ((raw, ids),), truncated)
            return
        if label in src.lane_streams:
            self._export(src, label)
        self._router.lines(src, ((raw, ids),), truncated)
        stream = src.lane_streams.get(label)
        if stream is None:
            stream = src.streams.get(label_prefix(label))
            if stream is None:
                return
            src.lane_streams[label] = stream
        # The lane takes the stream (back) with Python's state of it. Until Python has made its output
        # (which fixes the world size written in its events), the lane takes only lines that wait for a time.
        out = stream.out
        if out is not None and out.chunked:
            src.lane.chunked_output(out.index)
        src.lane.add_stream(lane_stream(label, stream, self._output.neighbour_ts(stream)))
        if self._output.moments is not None:
            src.lane.set_domain(label, self._output.moments.domain_id(stream.domain), False)
        if stream.pending and stream.block is None and src.lane.adopt_pending(label, stream.pending):
            stream.pending = []  # the lane holds them now (a log whose lines carry no time)

    def _export(self, src: Src, label: int | None) -> None:
        """Hand what the lane holds of a stream (last time, head day, lines waiting for a time) to it."""
        got = src.lane.export(label)
        if got is None:
            return
        last_ts, head, pending = got
        stream = src.lane_streams[label]
        stream.last_ts = last_ts
        if head is not None:
            stream.head.note_layout(*head)
        if pending:
            stream.pending.extend(pending)

    def _drain(self, src: Src) -> None:
        """Append what the lane wrote to the outputs' buffers and add its counts to the summary."""
        outs, counts = src.lane.drain(self._output.moments)
        for index, lines in outs:  # a bytes chunk for a sink that takes chunks, else a list of lines
            if type(lines) is bytes:
                self._output.by_index[index].buf.append(lines)
            else:
                self._output.by_index[index].buf.extend(lines)
        s = self._ctx.summary
        s.lines += counts["lines"]
        s.parsed += counts["parsed"]
        s.estimated_ts += counts["estimated"]
        self._ctx.n_log += counts["log"]
        events = self._output.events
        for kind in ("metric", "span"):
            if counts[kind]:
                events[kind] = events.get(kind, 0) + counts[kind]
        by = s.lines_by_parser
        for name in ("generic-step", "nccl", "deepspeed", "megatron", "huggingface"):
            if counts[name]:
                by[name] = by.get(name, 0) + counts[name]
        for reason, n in counts["skipped"].items():
            s.skipped[reason] = s.skipped.get(reason, 0) + n

    def release_waiting(self, src: Src) -> None:
        """A followed file has nothing new: the lines the lane holds waiting for a time are written, as at its end
        (those of a stream without an output stay until it has one)."""
        src.lane.release_all()
        self._drain(src)

    def close(self, src: Src) -> None:
        """The end of ``src``: the lines still waiting for a time written by the lane where it can, else by
        Python (what the lane holds of each stream is handed back), and the lane let go."""
        # Only while no other stream writes at the end (its pending lines, its open block) and every
        # stream has its output (one without gets it only now, maybe one another stream writes to): where
        # two streams share an output, their last lines go out in the order Python releases them.
        held = {id(st) for st in src.lane_streams.values()}
        outs = [id(st.out) for st in src.streams.values() if st.out is not None]
        if len(outs) == len(src.streams) == len(set(outs)) and not any(
                st.pending or st.block is not None for st in src.streams.values() if id(st) not in held):
            src.lane.release_all()
            self._drain(src)
        for label in list(src.lane_streams):
            self._export(src, label)
        src.lane, src.lane_streams = None, {}
