"""The alignment pass: a first quick read of every file for the moments all ranks share, to estimate clocks.

Step ends logged by several nodes are the same moment seen through each node's clock;
the medians of their differences give each node's offset (:mod:`._align`), which the
main pass then subtracts from every time it writes. This pass reads only the lines whose
triggers the moment-giving parsers (:func:`~._types.sync_parser`) declare, keeps no
output and no ranks, only a light stream per writer for its head layouts and clock
domain, and lets the compiled lane read the moments it can (its store is then the
lane's). It is a part of its own because it shares nothing with the main pass but the
configuration, the lanes' compiled triggers and what it leaves behind: the offsets (in
the :class:`~._context.IngestContext`) and the main pass's store of moments.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from . import _align
from ._align import SyncMoments, offsets_from_medians
from ._chunks import ChunkReader
from ._context import IngestContext
from ._lane import LaneDriver, lane_module
from ._match import Matcher, hit_lines, make_matcher
from ._output import UNKNOWN_NODE
from ._plain import frac_ns
from ._prefix import Prefix, PrefixMode, detect_mode, make_prefix, may_have_prefix, split_prefix
from ._router import label_prefix
from ._sources import FileIdentity, Source
from ._streams import Src
from ._timestamps import HeadParser
from ._types import StreamState, sync_parser

__all__ = ["AlignPass"]


class AlignPass:
    """The alignment pass of one ingest (:meth:`run` once, before the main pass).

    ``identity`` names a file's rank and node from its name (the engine's rule, so that
    both passes put a file's lines in the same clock domain).
    """

    def __init__(self, ctx: IngestContext, lanes: LaneDriver, identity: Callable[[Source], FileIdentity]) -> None:
        self._ctx = ctx
        self._cfg = ctx.cfg
        self._tz = ctx.tz
        self._plain = ctx.plain
        self._lanes = lanes
        self._identity = identity
        self._sync_parsers = [sync_parser(p) for p in ctx.parsers]  # None: not a source of moments
        self._sync_triggers = [tuple(p.triggers) if sp is not None else () for p, sp in zip(ctx.parsers,
                                                                                           self._sync_parsers)]

    @functools.cached_property
    def _sync_matcher(self) -> Matcher:
        """The moment-giving parsers' triggers (compiled when first used: the fast lane matches them itself)."""
        return make_matcher(self._sync_triggers, self._cfg.use_hyperscan)

    def _new_moments(self) -> Any:
        """Where the moments go: the lane's compiled store (it adds its moments there itself) or ``SyncMoments``."""
        native = lane_module()
        return native.MomentStore(_align.MAX_MOMENTS) if self._lanes.enabled and native is not None else SyncMoments()

    def run(self, sources: list[Source]) -> None:
        """Read the moments of every file (stdin excepted), then set the clock offsets and the main pass's store."""
        points = self._new_moments()
        for i, source in enumerate(sources):
            if source.is_stdin:
                continue
            src = Src(source, i, self._identity(source), self._cfg.max_line_bytes)
            try:
                fh = source.open()
            except Exception:  # noqa: BLE001 - the main pass reports it
                continue
            streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]] = {}
            reader = ChunkReader(self._cfg.max_line_bytes)
            try:
                while True:
                    data = fh.read(self._cfg.chunk_bytes)
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
        self._ctx.summary.clock_offsets = sorted(self._ctx.offsets.values(), key=lambda o: o.domain)
        self._ctx.output.moments = self._new_moments()

    def _sync_block(self, src: Src, block: bytes, streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]],
                    points: Any, begin: int = 0, end: int | None = None) -> None:
        """The moments of the lines of ``block[begin:end]``."""
        end = len(block) if end is None else end
        if src.mode is None:
            src.mode = detect_mode(block[begin:begin + 65536].decode("utf-8", "replace").split("\n")[:200])
            if self._lanes.enabled:
                src.lane = self._lanes.new_lane(src.mode)
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
        """This pass's light stream of ``pfx`` (state, head parser, clock domain): no rank, no output."""
        entry = streams.get(pfx)
        if entry is None:
            node = self._cfg.node or (pfx.host if pfx else None) or src.ident.node or UNKNOWN_NODE
            key = f"{src.source.display}" + (f"[{pfx.host or ''}:{pfx.rank if pfx.rank is not None else ''}:"
                                             f"{pfx.local_rank if pfx.local_rank is not None else ''}]" if pfx else "")
            entry = streams[pfx] = (StreamState(key, node, -1, -1, True),
                                    HeadParser(self._tz, src.default_day, self._cfg.year),
                                    node if node != UNKNOWN_NODE else key)
        return entry

    def _sync_lines(self, src: Src, lines: Iterable[tuple[bytes, frozenset[int] | None]],
                    streams: dict[Prefix | None, tuple[StreamState, HeadParser, str]], points: Any) -> None:
        """Add the moments of ``lines`` (with their parser ids; None: not matched yet) to ``points``."""
        mode = src.mode or PrefixMode.NONE
        plain = self._plain.pattern(mode) if self._cfg.plain_fast_path else None
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
                pfx, text = (split_prefix(text, mode) if (mode != PrefixMode.NONE or may_have_prefix(text))
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
