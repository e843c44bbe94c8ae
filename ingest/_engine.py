"""The ingest engine: raw log text in, canonical events out, one pass per input (two with alignment).

Constraints that shape it:

* Throughput: a line that no parser wants (most lines of a real log) costs one
  anchored regex for its head and one pre-encoded ``bytes`` template for its log
  event; in the strict Python ``logging`` form it is written straight from bytes
  (see :mod:`._plain`). Parser triggers are matched for a whole chunk at once (see
  :mod:`._match`). Where time still goes: parsers and their events (a step line
  gives eight), one Python dict and one ``orjson`` call per event.
* Memory is bounded whatever the input size: input is read in chunks, a line is cut at
  ``max_line_bytes``, output is written in batches, a multi-line block stops at a
  fixed size, and lines waiting for a timestamp are released after ``pending_cap``.
* Nothing is lost silently: every line read is either parsed (it produced or joined
  an event) or skipped with a reason, and ``lines == parsed + sum(skipped)``. A
  parser that raises is counted and the line is kept as a plain log event.
* Clocks: timestamps are converted to UTC at parse time; with alignment on, a first
  quick pass reads only the lines that mark moments shared by all ranks (step ends),
  estimates each node's clock offset, and the second pass writes corrected times.

The engine itself only opens, reads, drains, follows and closes the inputs; which
stream a line belongs to and what it becomes is the stream router's (:mod:`._router`),
which the lines the compiled lane gives back go through too. The parts share one
:class:`~._context.IngestContext` rather than each other's attributes.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterable
from typing import Any, Final

from jobtrace.identity import trace_id_for_job

from . import _align
from ._align import SyncMoments, offsets_from_medians
from ._chunks import ChunkReader
from ._context import IngestConfig, IngestContext, IngestSummary, ProgressFn
from ._lane import lane_module, lane_stream, new_lane
from ._match import Matcher, hit_lines, make_matcher, matcher_engine
from ._output import UNKNOWN_NODE, Output
from ._plain import PlainLines, frac_ns
from ._prefix import Prefix, PrefixMode, detect_mode, make_prefix, split_prefix
from ._router import ELSEWHERE, StreamRouter, label_prefix, stream_label
from ._sinks import SinkFactory
from ._sources import FileIdentity, Source, expand_paths, identity_from_name, spool_stdin
from ._streams import Src
from ._timestamps import HeadParser, TzSpec, parse_tz
from ._types import Parser, ParserRegistry, StreamState, TakesZone, sync_parser
from .parsers._util import SpanIds, using_span_ids

__all__ = ["IngestConfig", "IngestSummary", "Ingestor", "default_registry", "register_parser"]


class Ingestor:
    """Reads log files of one job and writes canonical events through sinks.

    ::

        summary = Ingestor(IngestConfig(job="run-42"), open_sink("local", "run-42")).run(["logs/"])
    """

    def __init__(self, config: IngestConfig, sink_factory: SinkFactory, registry: ParserRegistry | None = None,
                 progress: ProgressFn | None = None) -> None:
        from .parsers import builtin_registry

        self.cfg = config
        self._sink_factory = sink_factory
        self._registry = registry if registry is not None else default_registry()
        self._parsers: list[Parser] = self._registry.parsers() or builtin_registry().parsers()
        self._progress = progress
        self._tz: TzSpec = parse_tz(config.tz)
        self._plain = PlainLines(self._tz)
        for p in self._parsers:
            if isinstance(p, TakesZone):
                p.tz = self._tz
        # The sync matcher is compiled when first used: the fast lane matches triggers itself.
        self._sync_parsers = [sync_parser(p) for p in self._parsers]  # None: not a source of moments
        self._sync_triggers = [tuple(p.triggers) if sp is not None else () for p, sp in zip(self._parsers,
                                                                                           self._sync_parsers)]
        self._lanes: dict[str, Any] = {}  # the first lane made for each prefix mode (see _new_lane)
        self._sync_ids = frozenset(i for i, sp in enumerate(self._sync_parsers) if sp is not None)
        self._rank_rx = re.compile(config.rank_from_filename) if config.rank_from_filename else None
        self._trace = trace_id_for_job(config.job)
        self.summary = IngestSummary(job=config.job, matcher=matcher_engine(config.use_hyperscan))
        # where events go; its ``moments``: SyncMoments or the lane's MomentStore (see _new_moments)
        self._output = Output(config.job, self._trace, sink_factory, config.world_size, config.max_msg_chars,
                              config.pending_cap, self.summary)
        # this ingest's count of span ids, shared by its parsers and its lanes
        self._ctx = IngestContext(config, self.summary, self._output, self._parsers, self._tz, self._plain, SpanIds())
        self._span_ids = self._ctx.span_ids
        self._router = StreamRouter(self._ctx)
        if config.use_hyperscan:
            self._router.matcher  # noqa: B018 - required: say now, not mid-ingest, that Hyperscan is missing
        built = lane_module() is not None
        if config.native and not built:
            from jobtrace.errors import ConfigError

            raise ConfigError("the compiled ingest lane is not installed: install the package again with a Rust "
                              "toolchain (cargo) on PATH")
        self._use_lane = config.native is not False and built
        self._bytes_total = 0
        self._stop = False

    @functools.cached_property
    def _sync_matcher(self) -> Matcher:
        return make_matcher(self._sync_triggers, self.cfg.use_hyperscan)

    # ---- public ------------------------------------------------------------------
    def stop(self) -> None:
        """Ask a running (follow mode) ingest to finish after the current chunk."""
        self._stop = True

    def run(self, paths: Iterable[str]) -> IngestSummary:
        with using_span_ids(self._span_ids):  # the parsers' span ids: this ingest's count
            return self._run(paths)

    def _run(self, paths: Iterable[str]) -> IngestSummary:
        t0 = time.perf_counter()
        files = expand_paths(list(paths))
        temp: list[str] = []
        sources: list[Source] = []
        for f in files:
            if f == "-" and not self.cfg.follow:
                spooled = spool_stdin()
                temp.append(spooled)
                sources.append(Source(spooled, display="<stdin>", temp=True))
            else:
                sources.append(Source(f, display="<stdin>" if f == "-" else f))
        self.summary.files = [s.display for s in sources]
        self._span_ids.next = SpanIds.for_inputs(self.cfg.job, self.summary.files).next
        self._bytes_total = sum(s.size for s in sources)
        try:
            if self.cfg.align and len(sources) > 0:
                self._align_pass(sources)
            srcs = [Src(s, i, self._file_identity(s), self.cfg.max_line_bytes) for i, s in enumerate(sources)]
            for src in srcs:
                self._open(src)
                self._drain(src)
                if not self.cfg.follow:
                    self._close_src(src)
            if self.cfg.follow:
                self._follow(srcs, list(paths))
            for src in srcs:
                self._close_src(src)
        finally:
            self._output.close()
            for path in temp:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        s = self.summary
        engine = self._router.compiled_engine
        if engine is not None:  # compiled: the engine it really uses (a fallback to re included)
            s.matcher = engine
        s.events = dict(self._output.events)
        if self._ctx.n_log:
            s.events["log"] = s.events.get("log", 0) + self._ctx.n_log
        s.seconds = time.perf_counter() - t0
        s.streams = sorted(s.streams, key=lambda d: (d["rank"], d["node"], d["source"]))
        if self._output.moments:
            residual = offsets_from_medians(self._output.moments.medians())
            applied = [abs(o.offset_ms) for o in residual.values() if o.applied]
            if applied and any(o.applied for o in self._ctx.offsets.values()):
                s.alignment_residual_ms = round(max(applied), 3)
        return s

    # ---- identity ---------------------------------------------------------------
    def _file_identity(self, source: Source) -> FileIdentity:
        if source.is_stdin or source.temp:
            return FileIdentity()
        return identity_from_name(source.path, self._rank_rx)

    def _open(self, src: Src) -> None:
        try:
            src.fh = src.source.open()
        except Exception as exc:  # noqa: BLE001 - reported in the summary, the other files go on
            src.fh = None
            src.done = True
            self.summary.errors.append(f"{src.source.display}: {exc}")

    def _close_src(self, src: Src) -> None:
        tail = src.reader.finish()
        if tail is not None:
            self._block(src, tail[0], last=True, truncated=tail[3])
        if src.lane is not None:  # lines still waiting for a time: written by the lane where it can, else Python's
            # Only while no other stream writes at the end (its pending lines, its open block) and every
            # stream has its output (one without gets it only now, maybe one another stream writes to): where
            # two streams share an output, their last lines go out in the order Python releases them.
            held = {id(st) for st in src.lane_streams.values()}
            outs = [id(st.out) for st in src.streams.values() if st.out is not None]
            if len(outs) == len(src.streams) == len(set(outs)) and not any(
                    st.pending or st.block is not None for st in src.streams.values() if id(st) not in held):
                src.lane.release_all()
                self._lane_drain(src)
            for label in list(src.lane_streams):
                self._lane_export(src, label)
            src.lane, src.lane_streams = None, {}
        for stream in src.streams.values():
            self._router.end_block(stream)
            self._output.release_pending(stream, final=True)
        if src.fh is not None and not src.source.is_stdin:
            try:
                src.fh.close()
            except OSError:
                pass
        src.fh = None
        self._output.flush()

    def _drain(self, src: Src) -> bool:
        """Read what the source has now; True if anything was read."""
        if src.fh is None:
            return False
        got = False
        cb = self.cfg.chunk_bytes
        while not self._stop:
            try:
                data = src.fh.read(cb)
            except (OSError, EOFError, ValueError) as exc:  # corrupt gzip/zstd: keep what was read
                self.summary.errors.append(f"{src.source.display}: read error after {self.summary.bytes_read} bytes: {exc}")
                src.done = True
                break
            if not data:
                break
            got = True
            self.summary.bytes_read += len(data)
            self._feed(src, data)
            self._output.flush()
            if self._progress is not None:
                self._progress(self.summary.bytes_read, self._bytes_total, self.summary.lines,
                               self._ctx.n_log + sum(self._output.events.values()))
        return got

    def _feed(self, src: Src, data: bytes) -> None:
        """The whole lines of a chunk (see :mod:`._chunks`): to the lane where it reads the file, without copying
        them where they lie in the chunk, else to the Python engine as one block."""
        lane = src.lane is not None
        for buf, begin, end, truncated in src.reader.feed(data, joined=not lane):
            if truncated:
                self._block(src, buf[begin:end], last=True, truncated=True)
            elif src.lane is not None:
                self._lane_block(src, buf, begin, end)
            else:
                self._block(src, buf if begin == 0 and end == len(buf) else buf[begin:end], last=False)

    def _follow(self, srcs: list[Src], patterns: list[str]) -> None:
        idle_since = time.monotonic()
        known = {s.source.path for s in srcs}
        last_scan = time.monotonic()
        while not self._stop:
            got = False
            for src in srcs:
                if not src.done and self._drain(src):
                    got = True
            now = time.monotonic()
            if now - last_scan > 2.0:  # new files under the given directories/globs
                last_scan = now
                try:
                    for f in expand_paths(patterns):
                        if f != "-" and f not in known:
                            known.add(f)
                            src = Src(Source(f), len(srcs), self._file_identity(Source(f)), self.cfg.max_line_bytes)
                            srcs.append(src)
                            self.summary.files.append(f)
                            self._open(src)
                            got = self._drain(src) or got
                except Exception:  # noqa: BLE001, S110 - a vanished path: keep following the others
                    pass
            if got:
                idle_since = now
                continue
            for src in srcs:  # nothing new: close blocks and release lines waiting for a timestamp
                for stream in src.streams.values():
                    self._router.end_block(stream)
            self._output.flush()
            if self.cfg.idle_exit_s is not None and now - idle_since >= self.cfg.idle_exit_s:
                return
            time.sleep(self.cfg.poll_s)

    # ---- alignment pass ---------------------------------------------------------------
    def _new_moments(self) -> Any:
        """Where the moments go: the lane's compiled store (it adds its moments there itself) or ``SyncMoments``."""
        native = lane_module()
        return native.MomentStore(_align.MAX_MOMENTS) if self._use_lane and native is not None else SyncMoments()

    def _align_pass(self, sources: list[Source]) -> None:
        points = self._new_moments()
        for i, source in enumerate(sources):
            if source.is_stdin:
                continue
            src = Src(source, i, self._file_identity(source), self.cfg.max_line_bytes)
            try:
                fh = source.open()
            except Exception:  # noqa: BLE001 - the main pass reports it
                continue
            streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]] = {}
            reader = ChunkReader(self.cfg.max_line_bytes)
            try:
                while True:
                    data = fh.read(self.cfg.chunk_bytes)
                    if not data:
                        break
                    for buf, begin, end, _ in reader.feed(data):
                        self._sync_block(src, buf, streams, points, begin, end)
                tail = reader.finish()
                if tail is not None and tail[0]:
                    self._sync_block(src, tail[0], streams, points)
            except (OSError, EOFError, ValueError):
                pass
            finally:
                fh.close()
        self._ctx.offsets = offsets_from_medians(points.medians())
        self.summary.clock_offsets = sorted(self._ctx.offsets.values(), key=lambda o: o.domain)
        self._output.moments = self._new_moments()

    def _sync_block(self, src: Src, block: bytes, streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]],
                    points: Any, begin: int = 0, end: int | None = None) -> None:
        """The moments of the lines of ``block[begin:end]``."""
        end = len(block) if end is None else end
        if src.mode is None:
            src.mode = detect_mode(block[begin:begin + 65536].decode("utf-8", "replace").split("\n")[:200])
            if self._use_lane:
                src.lane = self._new_lane(src.mode)
        if src.lane is not None:
            self._sync_lane(src, block, begin, end, streams, points)
            return
        if begin or end != len(block):
            block = block[begin:end]
        hits = self._sync_matcher.scan(block)
        if hits is not None:
            if not hits:
                return
            lines: Iterable[tuple[bytes, frozenset[int] | None]] = hit_lines(block, hits)
        else:
            lines = ((raw, None) for raw in block.split(b"\n"))
        self._sync_lines(src, lines, streams, points)

    def _sync_lane(self, src: Src, block: bytes, begin: int, end: int,
                   streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]], points: Any) -> None:
        """The lane adds the moments of ``block[begin:end]`` to ``points``; the lines it gives back are read here,
        in order."""
        pos = begin
        while True:
            stop = src.lane.sync_run(block, begin, pos, end, points)
            if stop is None:
                return
            start, stop_end, label, ids, head = stop
            if ids is None:  # a label the lane has not met: its clock domain, then the lane reads on
                domain = self._sync_stream(src, streams, label_prefix(label))[2]
                src.lane.set_domain(label, points.domain_id(domain), True)
                pos = start
                continue
            if head is not None:  # the heads the lane read since: as the Python path notes them
                self._sync_stream(src, streams, label_prefix(label))[1].note_layout(*head)
            self._sync_lines(src, ((block[start:stop_end], frozenset(ids)),), streams, points)
            entry = streams.get(label_prefix(label))
            src.lane.sync_layout(label, entry[1].last_layout if entry is not None else None)
            if stop_end >= end:
                return
            pos = stop_end + 1

    def _sync_stream(self, src: Src, streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]],
                     pfx: Prefix | None) -> tuple[StreamState, HeadParser, str]:
        entry = streams.get(pfx)
        if entry is None:
            node = self.cfg.node or (pfx.host if pfx else None) or src.ident.node or UNKNOWN_NODE
            key = f"{src.source.display}" + (f"[{pfx.host or ''}:{pfx.rank if pfx.rank is not None else ''}:"
                                             f"{pfx.local_rank if pfx.local_rank is not None else ''}]" if pfx else "")
            entry = streams[pfx] = (StreamState(key, node, -1, -1, True),
                                    HeadParser(self._tz, src.default_day, self.cfg.year),
                                    node if node != UNKNOWN_NODE else key)
        return entry

    def _sync_lines(self, src: Src, lines: Iterable[tuple[bytes, frozenset[int] | None]],
                    streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]], points: Any) -> None:
        mode = src.mode or PrefixMode.NONE
        plain = self._plain.pattern(mode) if self.cfg.plain_fast_path else None
        for raw, ids in lines:
            if not raw or b"\x00" in raw:
                continue
            m = plain.match(raw) if plain is not None else None
            stamp = self._plain.stamp(m.group(2), m.group(3)) if m is not None else None
            if m is not None and stamp is not None:  # a strict line: prefix and head read at once (see _plain)
                label = m.group(1)
                pfx = make_prefix(None, int(label), None, None) if label else None
                text = raw[m.start(2):].decode("utf-8", "replace")
            else:
                text = raw.decode("utf-8", "replace")
                pfx, text = (split_prefix(text, mode) if (mode != PrefixMode.NONE or text[:1] == "[")
                             else (None, text))
            if ids is None:
                ids = self._sync_matcher.line(text)
                if not ids:
                    continue
            state, headp, domain = self._sync_stream(src, streams, pfx)
            if m is not None and stamp is not None:
                headp.note_iso(stamp[1])
                ts = stamp[0] + frac_ns(m.group(4))
                body = text[m.end() - m.start(2):]
            else:
                head = headp.parse(text)
                if head is None or head.ts is None:
                    continue
                ts = head.ts
                body = text[head.body_at:]
            for i in sorted(ids):
                parser = self._sync_parsers[i]
                if parser is None:
                    continue
                try:
                    step = parser.sync_step(body)
                except Exception:  # noqa: BLE001 - counted in the main pass
                    continue
                if step is not None:
                    points.add(domain, step, ts)
                    break

    # ---- the main pass ----------------------------------------------------------------
    def _block(self, src: Src, block: bytes, last: bool, truncated: bool = False) -> None:
        if src.mode is None:
            src.mode = detect_mode(block[:65536].decode("utf-8", "replace").split("\n")[:200])
            if self._use_lane:
                src.lane = self._new_lane(src.mode)
                self.summary.fast_lane = self.summary.fast_lane or src.lane is not None
        if src.lane is not None:
            if truncated:
                self._lane_give_back(src, block, None, True)
            else:
                self._lane_block(src, block)
            return
        self._router.block(src, block, truncated)

    # ---- the compiled fast lane (see ._lane) --------------------------------------------
    def _new_lane(self, mode: str) -> Any:
        """A lane for one file (in each pass); its compiled triggers are shared with the other files' lanes (compiling
        them costs milliseconds, and a job's logs are often one file per rank)."""
        first = self._lanes.get(mode)
        if first is not None:
            return first.fresh()
        lane = new_lane(mode, self._tz, self._parsers, self.cfg.max_msg_chars, self.cfg.pending_cap, self._sync_ids)
        if lane is not None:
            self._lanes[mode] = lane
        return lane

    def _lane_block(self, src: Src, data: bytes, begin: int = 0, end: int | None = None) -> None:
        """The lane reads the lines of ``data[begin:end]`` (no copy of them); each line it gives back is read
        here, in order, with its stream's state."""
        lane = src.lane
        end = len(data) if end is None else end
        pos = begin
        while True:
            lane.next_span_id = self._span_ids.next  # one count of span ids, whichever engine makes them
            stop = lane.run(data, begin, pos, end)
            self._span_ids.next = lane.next_span_id
            self._lane_drain(src)
            if stop is None:
                return
            start, stop_end, label, ids = stop
            self._lane_give_back(src, data[start:stop_end], frozenset(ids), False, label)
            if stop_end >= end:
                return
            pos = stop_end + 1

    def _lane_give_back(self, src: Src, raw: bytes, ids: frozenset[int] | None, truncated: bool,
                        label: int | None = None) -> None:
        if ids is None:  # a cut line: its label as the lane would read it
            m = _SRUN_LABEL.match(raw) if src.mode == PrefixMode.SRUN else None
            label = int(m.group(1)) if m else None
        label = stream_label(src.mode, raw, label)
        if label is ELSEWHERE:  # a stream the lane never holds
            self._router.lines(src, ((raw, ids),), truncated)
            return
        if label in src.lane_streams:
            self._lane_export(src, label)
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
        src.lane.add_stream(lane_stream(label, stream))
        if self._output.moments is not None:
            src.lane.set_domain(label, self._output.moments.domain_id(stream.domain), False)
        if stream.pending and stream.block is None and src.lane.adopt_pending(label, stream.pending):
            stream.pending = []  # the lane holds them now (a log whose lines carry no time)

    def _lane_export(self, src: Src, label: int | None) -> None:
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

    def _lane_drain(self, src: Src) -> None:
        outs, counts = src.lane.drain(self._output.moments)
        for index, lines in outs:  # a bytes chunk for a sink that takes chunks, else a list of lines
            if type(lines) is bytes:
                self._output.by_index[index].buf.append(lines)
            else:
                self._output.by_index[index].buf.extend(lines)
        s = self.summary
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

_SRUN_LABEL: Final = re.compile(rb" *(\d{1,6}): ")


_DEFAULT: ParserRegistry | None = None


def default_registry() -> ParserRegistry:
    """The process-wide registry used when none is given: the built-in parsers plus any registered."""
    global _DEFAULT
    if _DEFAULT is None:
        from .parsers import builtin_registry

        _DEFAULT = builtin_registry()
    return _DEFAULT


def register_parser(parser: Parser, *, first: bool = False) -> Parser:
    """Add a parser to the default registry (``first=True``: before the built-in ones)."""
    return default_registry().register(parser, first=first)
