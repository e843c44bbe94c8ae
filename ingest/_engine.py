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

The engine itself only opens, reads, drains, follows and closes the inputs, and picks
the reader of each block. Its parts: the stream router (:mod:`._router`: which stream a
line belongs to and what it becomes), the lane driver (:class:`~._lane.LaneDriver`: the
compiled lane, whose given-back lines go through the same router), and the alignment
pass (:mod:`._align_pass`). They share one :class:`~._context.IngestContext` rather
than each other's attributes.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable

from jobtrace.identity import trace_id_for_job

from ._align import offsets_from_medians
from ._align_pass import AlignPass
from ._context import IngestConfig, IngestContext, IngestSummary, ProgressFn
from ._lane import LaneDriver, lane_module
from ._match import matcher_engine
from ._output import Output
from ._plain import PlainLines
from ._prefix import detect_mode
from ._resume import SourceBook, SourcePlan
from ._router import StreamRouter
from ._sinks import SinkFactory
from ._sources import FileIdentity, Source, expand_paths, identity_from_name, spool_stdin
from ._streams import Src
from ._timestamps import TzSpec, parse_tz
from ._types import Parser, ParserRegistry, TakesZone
from .parsers._util import SpanIds, using_span_ids

__all__ = ["IngestConfig", "IngestSummary", "Ingestor", "default_registry", "register_parser"]


class Ingestor:
    """Reads log files of one job and writes canonical events through sinks.

    ::

        summary = Ingestor(IngestConfig(job="run-42"), open_sink("local", "run-42")).run(["logs/"])
    """

    def __init__(self, config: IngestConfig, sink_factory: SinkFactory, registry: ParserRegistry | None = None,
                 progress: ProgressFn | None = None, book: SourceBook | None = None) -> None:
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
        self._rank_rx = re.compile(config.rank_from_filename) if config.rank_from_filename else None
        self._trace = trace_id_for_job(config.job)
        self.summary = IngestSummary(job=config.job, matcher=matcher_engine(config.use_hyperscan))
        # where events go; its ``moments``: SyncMoments or the lane's MomentStore (see ._align_pass)
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
        self._lanes = LaneDriver(self._ctx, self._router, self._use_lane)
        self._alignment = AlignPass(self._ctx, self._lanes, self._file_identity)
        self._bytes_total = 0
        self._stop = False
        # the job's ingest ledger (see ._resume): None reads every source whole, whatever was read before
        self._book = book

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
        plans = self._book.plan(sources) if self._book is not None else [SourcePlan(s) for s in sources]
        for plan in plans:
            if plan.note:
                self.summary.notes.append(plan.note)
            if plan.error:
                self.summary.errors.append(plan.error)
        reading = [p for p in plans if p.read]
        self.summary.files_skipped = len(plans) - len(reading)
        # ids depend on the inputs' names (a repeated ingest repeats its lines exactly); a file read on from
        # an offset is another input: its ids must not repeat those of the lines read before it
        self._span_ids.next = SpanIds.for_inputs(
            self.cfg.job, [p.source.display + (f"@{p.start}" if p.start else "") for p in plans]).next
        self._bytes_total = sum(max(0, p.source.size - p.start) for p in reading)
        srcs: list[Src] = []
        try:
            if self.cfg.align and reading:
                self._alignment.run([p.source for p in plans if p.error is None])
            for i, plan in enumerate(reading):
                src = Src(plan.source, i, self._file_identity(plan.source), self.cfg.max_line_bytes)
                src.record, src.fed = plan.record, plan.start
                srcs.append(src)
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
            if self._book is not None:  # what did not reach its end (an interruption, an error) stays incomplete
                self._book.stopped([src.record for src in srcs if src.record is not None and src.record.started])
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
        # The compiled lanes and moment store are bound to this thread: let them go here, not in whichever
        # thread's garbage collection finds this ingest's cycles later (pyo3 would refuse, and leak them).
        self._lanes.release()
        self._output.moments = None
        return s

    # ---- identity ---------------------------------------------------------------
    def _file_identity(self, source: Source) -> FileIdentity:
        if source.is_stdin or source.temp:
            return FileIdentity()
        return identity_from_name(source.path, self._rank_rx)

    def _open(self, src: Src) -> None:
        try:
            src.fh = src.source.open()
            if src.fed:  # read on from the ledger's checkpoint (a plain file: compressed ones start over)
                src.fh.seek(src.fed)
        except Exception as exc:  # noqa: BLE001 - reported in the summary, the other files go on
            src.fh = None
            src.done = True
            self.summary.errors.append(f"{src.source.display}: {exc}")
            return
        if self._book is not None and src.record is not None:
            self._book.begin(src.record)

    def _close_src(self, src: Src) -> None:
        tail = src.reader.finish()
        if tail is not None:
            self._block(src, tail[0], last=True, truncated=tail[3])
        self._count_cut(src)
        if src.lane is not None:
            self._lanes.close(src)
        for stream in src.streams.values():
            self._router.end_block(stream)
            self._output.release_pending(stream, final=True)
        self._output.note_file_end(src.streams)
        reached_end = src.fh is not None and not src.done  # a followed file: as far as it is written
        if src.fh is not None and not src.source.is_stdin:
            try:
                src.fh.close()
            except OSError:
                pass
        src.fh = None
        self._output.flush()
        if self._book is not None and src.record is not None and src.record.state == "running":
            self._output.flush_sinks()
            if reached_end:
                self._book.checkpoint([(src.record, src.fed)], [src.record])
            else:
                self._book.stopped([src.record])

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
            src.fed += len(data)
            self._output.flush()
            if self._book is not None and src.record is not None:
                src.record.read = src.fed
                self._book.progress([src.record])
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
                self._lanes.block(src, buf, begin, end)
            else:
                self._block(src, buf if begin == 0 and end == len(buf) else buf[begin:end], last=False)
        if src.reader.cut:
            self._count_cut(src)

    def _count_cut(self, src: Src) -> None:
        """Count the over-long lines the reader has seen end, once each, with their length."""
        s = self.summary
        for n in src.reader.cut:
            s.truncated_lines += 1
            if len(s.cut_lines) < 20:
                s.cut_lines.append({"source": src.source.display, "bytes": n})
        src.reader.cut.clear()

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
                            plan = self._book.plan_more(Source(f)) if self._book is not None else SourcePlan(Source(f))
                            self.summary.files.append(f)
                            if not plan.read:
                                self.summary.notes += [plan.note] if plan.note else []
                                self.summary.errors += [plan.error] if plan.error else []
                                continue
                            src = Src(plan.source, len(srcs), self._file_identity(plan.source), self.cfg.max_line_bytes)
                            src.record, src.fed = plan.record, plan.start
                            srcs.append(src)
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
                    # as at a file's end: a followed log without stamps is written as it comes, not at the cap
                    self._output.release_pending(stream, final=True)
                if src.lane is not None:
                    self._lanes.release_waiting(src)
            self._output.flush()
            self._checkpoint_followed(srcs)
            if self.cfg.idle_exit_s is not None and now - idle_since >= self.cfg.idle_exit_s:
                return
            time.sleep(self.cfg.poll_s)

    def _checkpoint_followed(self, srcs: list[Src]) -> None:
        """Followed files with nothing new: record how far they are written, where no line read is held back
        (waiting for a time, or the rest of an over-long line) and the file is plain (an offset to seek to)."""
        if self._book is None:
            return
        live = [s for s in srcs if s.record is not None and s.record.state == "running" and not s.done]
        if not live or any(s.source.compressed or s.reader.discard or _holding(s) for s in live):
            return
        self._output.flush_sinks()
        self._book.checkpoint([(s.record, s.fed - len(s.reader.carry)) for s in live if s.record is not None])

    # ---- the main pass ----------------------------------------------------------------
    def _block(self, src: Src, block: bytes, last: bool, truncated: bool = False) -> None:
        """Read a block of whole lines: the file's prefix mode (and lane) from its first, then to its lane, if it
        has one, else to the router."""
        if src.mode is None:
            src.mode = detect_mode(block[:65536].decode("utf-8", "replace").split("\n")[:200])
            if self._use_lane:
                src.lane = self._lanes.new_lane(src.mode)
                self.summary.fast_lane = self.summary.fast_lane or src.lane is not None
        if src.lane is not None:
            if truncated:
                self._lanes.give_back(src, block, None, True)
            else:
                self._lanes.block(src, block)
            return
        self._router.block(src, block, truncated)


def _holding(src: Src) -> bool:
    """Whether lines of ``src`` that were read are not written yet (pending, or in an open block)."""
    if src.lane is not None and src.lane.holding():
        return True
    return any(st.pending or st.block is not None for st in src.streams.values())


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
