"""The stream router: which stream (rank) each line of a file belongs to, and what becomes of it there.

A line's stream is named by its launcher prefix (``srun -l`` label, torchrun's
``[rank3]:``), else by the file; the router makes a stream the first time one is named
(with its rank from the prefix, the file name, the configuration, or a guess), keeps it
in the file's ``Src.streams``, and hands the line to that stream's open multi-line block,
to the parsers its triggers name, or writes it as a plain ``log`` event. It is the Python
engine's per-line loop, the hot path where no compiled lane reads the file: the strict
Python ``logging`` lines are written straight from bytes (see :mod:`._plain`), the rest
is decoded once, and the counters are added to the summary once per block.

Kept apart from the engine, which only opens, reads, drains and closes the inputs,
because the lane driver hands the lines the compiled lane gives back to the same router:
there is one set of routing rules, whichever engine read the neighbouring lines.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any, Final

import orjson

from ._context import IngestContext
from ._match import NO_HITS, Matcher, hit_lines, make_matcher
from ._output import UNKNOWN_NODE
from ._plain import frac_ns, level_bytes, level_name, msg_json
from ._prefix import Prefix, PrefixMode, make_prefix, may_have_prefix, split_prefix
from ._streams import Src, Stream
from ._timestamps import Head, HeadParser
from ._types import FEED_DONE, FEED_MORE, FEED_REJECT, Line, Skip, StreamState

__all__ = ["ELSEWHERE", "StreamRouter", "label_prefix", "stream_label"]

_DUMPS = orjson.dumps
_LEVEL_BYTES: Final = {None: b"INFO", "INFO": b"INFO", "WARNING": b"WARNING", "ERROR": b"ERROR", "DEBUG": b"DEBUG",
                       "CRITICAL": b"CRITICAL"}


class StreamRouter:
    """Routes the lines of one ingest's files to their streams, parsers and outputs.

    It owns the rules that make a stream (rank numbering, guessed ranks, clock offsets)
    and the parsers' trigger matcher; the engine and the lane driver only hand it lines
    (:meth:`block`, :meth:`lines`) and end the streams' blocks (:meth:`end_block`).
    """

    def __init__(self, ctx: IngestContext) -> None:
        self._ctx = ctx
        self.cfg = ctx.cfg
        self.summary = ctx.summary
        self._output = ctx.output
        self._parsers = ctx.parsers
        self._plain = ctx.plain
        self._tz = ctx.tz
        # The trigger matcher is compiled when first used: the fast lane matches triggers itself.
        self._triggers = [tuple(p.triggers) for p in ctx.parsers]
        self._used_ranks: set[int] = set()
        self._next_guess = 0

    @functools.cached_property
    def matcher(self) -> Matcher:
        """The parsers' trigger matcher (compiled on first use)."""
        return make_matcher(self._triggers, self.cfg.use_hyperscan)

    @property
    def compiled_engine(self) -> str | None:
        """The engine the matcher really uses (a fallback to ``re`` included); None while it is not compiled."""
        matcher: Matcher | None = self.__dict__.get("matcher")
        return matcher.engine if matcher is not None else None

    def block(self, src: Src, block: bytes, truncated: bool = False) -> None:
        """Read the whole lines of ``block`` (triggers matched for the whole block where the matcher can)."""
        hits = self.matcher.scan(block)
        if hits is not None:
            if not hits:
                it: Iterable[tuple[bytes, frozenset[int] | None]] = ((raw, NO_HITS) for raw in block.split(b"\n"))
            else:
                it = hit_lines(block, hits, all_lines=True)
        else:
            it = ((raw, None) for raw in block.split(b"\n"))
        self.lines(src, it, truncated)

    def _stream(self, src: Src, pfx: Prefix | None) -> Stream:
        """Make the stream ``pfx`` names in ``src`` (its rank, node, clock domain and offset) and note it."""
        cfg = self.cfg
        ident = src.ident
        host = pfx.host if pfx else None
        node = cfg.node or host or ident.node or UNKNOWN_NODE
        rank = pfx.rank if pfx and pfx.rank is not None else None
        local = pfx.local_rank if pfx else None
        guessed = False
        if rank is None and local is not None and host is None and ident.node is None and ident.rank is None:
            rank = local
        if rank is None and local is None:
            rank = ident.rank
        if rank is None and cfg.rank is not None and not src.streams:
            rank = cfg.rank
        if rank is None:
            while self._next_guess in self._used_ranks:
                self._next_guess += 1
            rank = self._next_guess
            self._next_guess += 1
            guessed = True
        if local is None:
            local = ident.local_rank if ident.local_rank is not None else rank
        self._used_ranks.add(rank)
        self._output.max_rank = max(self._output.max_rank, rank)
        if not guessed:
            self._output.rank_nodes.setdefault(rank, node)
        key = f"{src.source.display}" + (f"[{pfx.host or ''}:{pfx.rank if pfx.rank is not None else ''}:"
                                         f"{pfx.local_rank if pfx.local_rank is not None else ''}]" if pfx else "")
        domain = node if node != UNKNOWN_NODE else key
        state = StreamState(key, node, rank, local, guessed)
        stream = Stream(state, HeadParser(self._tz, src.default_day, self.cfg.year), domain, src)
        off = self._ctx.offsets.get(domain)
        if off is not None and off.applied:
            stream.offset = -off.offset_ns
        src.streams[pfx] = stream
        self.summary.streams.append({"source": src.source.display, "node": node, "rank": rank, "local_rank": local,
                                     "rank_guessed": guessed, "domain": domain})
        return stream

    def lines(self, src: Src, it: Iterable[tuple[bytes, frozenset[int] | None]], truncated: bool) -> None:
        """Route each ``(line, parser ids)`` of ``it`` (ids None: not matched yet); ``truncated``: the last one was cut."""
        summary = self.summary
        skipped = summary.skipped
        mode = src.mode
        streams = src.streams
        cap = self.cfg.max_msg_chars
        n_lines = 0
        n_parsed = 0
        n_log = 0
        levels = _LEVEL_BYTES
        dumps = _DUMPS
        plain = self._plain.pattern(mode) if self.cfg.plain_fast_path else None
        stream: Stream | None
        head: Head | None
        for raw, ids in it:
            n_lines += 1
            m = plain.match(raw) if plain is not None else None
            strict = None
            if m is not None:
                # no trigger in it (as far as the chunk scan saw): written straight away
                if ids is not None and not ids and self._plain_line(src, m, raw):
                    n_parsed += 1
                    n_log += 1
                    continue
                strict = self._strict_head(src, m, raw)
            if strict is not None:  # prefix and head already read: the rest as below
                stream, text, head, day = strict
            elif not raw or raw.isspace():
                n_parsed += self._blank(streams.get(None))
                continue
            else:
                if b"\x00" in raw:
                    skipped["not text (binary data)"] = skipped.get("not text (binary data)", 0) + 1
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = raw.decode("utf-8", "replace")
                    if text.count("\ufffd") * 4 > len(text):
                        skipped["not text (undecodable bytes)"] = skipped.get("not text (undecodable bytes)", 0) + 1
                        continue
                if mode != "none" or may_have_prefix(text):
                    pfx, text = split_prefix(text, mode)  # type: ignore[arg-type]
                    if not text or text.isspace():
                        n_parsed += self._blank(streams.get(pfx))
                        continue
                else:
                    pfx = None
                stream = streams.get(pfx)
                if stream is None:
                    stream = self._stream(src, pfx)
            if stream.block is not None and self._feed_block(stream, text):
                n_parsed += 1
                continue
            if ids is None:
                ids = self.matcher.line(text)
            if strict is None:
                head = stream.head.parse(text)
            else:
                stream.head.note_iso(day)
            if head is not None:
                ts = head.ts
                body = text[head.body_at:]
                level = head.level
                logger = head.logger
            else:
                ts = None
                body = text
                level = logger = None
            if ids:
                line = Line(text, body, ts, level, logger, stream.state, n_lines, src.source.display, ids)
                if self._parse(stream, line, ids):
                    n_parsed += 1
                    continue
            n_parsed += 1
            if len(body) > cap:
                body = body[:cap]
                if not truncated:  # a line cut at the line limit is counted once, as that (by the engine)
                    summary.messages_cut += 1
            if ts is None or stream.pending:
                ev: dict[str, Any] = {"kind": "log", "level": level or "INFO", "msg": body}
                if logger:
                    ev["logger"] = logger
                self._output.emit(stream, [ev], ts)
                continue
            stream.last_ts = ts
            out = stream.out or self._output.stream_out(stream)
            lb = levels.get(level) or b"INFO"
            if logger:
                out.buf.append(b'{"ts":%d,"kind":"log",%b,"level":"%b","logger":%b,"msg":%b}\n'
                               % (ts + stream.offset, out.head, lb, dumps(logger), dumps(body)))
            else:
                out.buf.append(b'{"ts":%d,"kind":"log",%b,"level":"%b","msg":%b}\n'
                               % (ts + stream.offset, out.head, lb, dumps(body)))
            n_log += 1
        summary.lines += n_lines
        summary.parsed += n_parsed
        self._ctx.n_log += n_log

    @staticmethod
    def _label_stream(src: Src, label: bytes) -> Stream | None:
        """The stream of a strict line's ``srun`` label (``b""``: no prefix); None while it has none yet."""
        stream = src.by_label.get(label)
        if stream is None:
            stream = src.streams.get(make_prefix(None, int(label), None, None) if label else None)
            if stream is not None:
                src.by_label[label] = stream
        return stream

    def _strict_head(self, src: Src, m: re.Match[bytes], raw: bytes) -> tuple[Stream, str, Head, int] | None:
        """Stream, text after the prefix, head and epoch day of a strict line (:mod:`._plain`) that the general
        path must still see (a trigger hit it, or its stream is busy), read without ``split_prefix`` and the
        head layouts; None: read it the general way (new stream, bad bytes, bad date)."""
        stream = self._label_stream(src, m.group(1))
        if stream is None or b"\x00" in raw:
            return None
        stamp = self._plain.stamp(m.group(2), m.group(3))
        if stamp is None:
            return None
        at = m.start(2)
        try:
            text = raw[at:].decode("utf-8")
        except UnicodeDecodeError:
            return None
        base, day = stamp
        head = Head(base + frac_ns(m.group(4)), level_name(m.group(5)), m.group(6).decode("ascii"), m.end() - at)
        return stream, text, head, day

    def _plain_line(self, src: Src, m: re.Match[bytes], raw: bytes) -> bool:
        """Write a strict plain log line (:mod:`._plain`) exactly as the general path would.

        False when that path has to see it after all: the stream is new, in a multi-line
        block or holding lines that wait for a timestamp, or the line is not clean text.
        """
        label, date, tod, frac, level, logger = m.groups()
        stream = self._label_stream(src, label)
        if stream is None or stream.block is not None or stream.pending:
            return False
        body = raw[m.end():]
        if len(body) > self.cfg.max_msg_chars:  # bytes ≥ characters: the general path truncates and counts
            return False
        stamp = self._plain.stamp(date, tod)
        msg = msg_json(body)
        if stamp is None or msg is None:
            return False
        base, day = stamp
        ts = base + frac_ns(frac)
        stream.head.note_iso(day)
        stream.last_ts = ts
        out = stream.out or self._output.stream_out(stream)
        out.buf.append(b'{"ts":%d,"kind":"log",%b,"level":"%b","logger":"%b","msg":%b}\n'
                       % (ts + stream.offset, out.head, level_bytes(level), logger, msg))
        return True

    def _blank(self, stream: Stream | None) -> bool:
        """A blank line: True when it continues the stream's open block (a traceback), else counted as skipped."""
        if stream is not None and stream.block is not None and self._feed_block(stream, ""):
            return True
        skipped = self.summary.skipped
        skipped["blank line"] = skipped.get("blank line", 0) + 1
        return False

    def _parse(self, stream: Stream, line: Line, ids: frozenset[int]) -> bool:
        """Run the triggered parsers in order; True when one of them took the line."""
        by = self.summary.lines_by_parser
        for i in (ids if len(ids) == 1 else sorted(ids)):
            parser = self._parsers[i]
            try:
                res = parser.parse(line)
            except Exception:  # noqa: BLE001 - a parser bug must not lose the line or stop the ingest
                errs = self.summary.parser_errors
                errs[parser.name] = errs.get(parser.name, 0) + 1
                continue
            if res is None:
                continue
            name = parser.name
            if isinstance(res, Skip):
                self.summary.skipped[res.reason] = self.summary.skipped.get(res.reason, 0) + 1
                self.summary.parsed -= 1  # the caller counts it as parsed
                by[name] = by.get(name, 0) + 1
                return True
            if isinstance(res, list):
                by[name] = by.get(name, 0) + 1
                if not _has_log(res):
                    base: dict[str, Any] = {"kind": "log", "level": line.level or "INFO",
                                            "msg": line.text[: self.cfg.max_msg_chars]}
                    if line.logger:
                        base["logger"] = line.logger
                    res = [base, *res]
                self._output.emit(stream, res, line.ts)
                return True
            # a Block: the following lines of this stream go to it
            by[name] = by.get(name, 0) + 1
            stream.block = res
            stream.block_line = line
            stream.block_parser = name
            return True
        return False

    def _feed_block(self, stream: Stream, text: str) -> bool:
        """Offer a line to the stream's open block; False when the block ended without it (route it anew)."""
        block = stream.block
        assert block is not None and stream.block_line is not None
        try:
            r = block.feed(text, stream.block_line)
        except Exception:  # noqa: BLE001
            errs = self.summary.parser_errors
            errs[stream.block_parser] = errs.get(stream.block_parser, 0) + 1
            r = FEED_REJECT
        if r == FEED_MORE:
            by = self.summary.lines_by_parser
            by[stream.block_parser] = by.get(stream.block_parser, 0) + 1
            return True
        if r == FEED_DONE:
            by = self.summary.lines_by_parser
            by[stream.block_parser] = by.get(stream.block_parser, 0) + 1
            self.end_block(stream)
            return True
        self.end_block(stream)
        return False

    def end_block(self, stream: Stream) -> None:
        """Close the stream's open multi-line block, if any, and write its events."""
        block, line = stream.block, stream.block_line
        if block is None or line is None:
            return
        stream.block = None
        stream.block_line = None
        try:
            events = block.finish()
        except Exception:  # noqa: BLE001
            errs = self.summary.parser_errors
            errs[stream.block_parser] = errs.get(stream.block_parser, 0) + 1
            events = [{"kind": "log", "level": line.level or "INFO", "msg": line.text}]
        self._output.emit(stream, events, line.ts)


ELSEWHERE: Final = -1
"""The lane label of a line whose stream the lane never holds (a torchrun prefix with a local rank or a role)."""


def stream_label(mode: str | None, raw: bytes, label: int | None) -> int | None:
    """The lane label of the stream Python reads a given-back line into: its ``srun`` label, unless a torchrun
    prefix after it (``[rank3]:``, which the lane gives back) names the writer another way."""
    at = raw.find(b"[", 0, 16)
    if (at < 0 or raw[:at].strip(b" 0123456789:")) and b"]<std" not in raw[:48]:
        return label  # no bracket where a prefix could be, nor an mpirun tag
    pfx, _ = split_prefix(raw.decode("utf-8", "replace"), mode or PrefixMode.NONE)
    if pfx is None:
        return None
    if pfx.host is None and pfx.local_rank is None and pfx.role is None and mode == PrefixMode.SRUN:
        return pfx.rank  # what an srun label of that rank names
    return label if pfx == label_prefix(label) else ELSEWHERE


def label_prefix(label: int | None) -> Prefix | None:
    """The prefix of an ``srun`` label as the fast lane reports it (``None``: a line without one)."""
    return make_prefix(None, label, None, None) if label is not None else None


def _has_log(events: list[dict[str, Any]]) -> bool:
    """Whether a parser kept the line itself as a ``log`` event (a plain loop: cheaper than ``any`` on a generator)."""
    for ev in events:  # noqa: SIM110
        if ev.get("kind") == "log":
            return True
    return False
