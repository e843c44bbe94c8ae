"""The output writer: per-rank output of one ingest, from partial events to canonical event lines in sinks.

One place owns what the engine writes: an output per ``(node, rank)`` with its sink and its
pre-encoded identity (the canonical line is that identity spliced into each event's JSON),
lines that wait for a timestamp (given one between their neighbours', marked ``est``), the
keys only the engine reads (``route_rank``, ``sync``, ``dt``, …) taken out, and batches
handed to the sinks. The reading side (engine, lane bridge) only appends ready lines to an
output's ``buf`` on its fast paths; everything else goes through :class:`Output`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import orjson

from jobtrace.events import SCHEMA_VERSION
from jobtrace.redact import RedactState, redactor_from_env
from shippers import Sink

from ._types import StreamState

__all__ = ["UNKNOWN_NODE", "Out", "Output"]

_DUMPS = orjson.dumps
_NL = orjson.OPT_APPEND_NEWLINE
_INTERNAL: Final = ("sync", "route_rank", "route_node", "dt", "start_dt")
_IDENT_KEYS: Final = ("job", "trace_id", "rank", "local_rank", "world", "node", "pid", "v")
_INTERNAL_KEYS: Final = frozenset(_INTERNAL)
_IDENT_SET: Final = frozenset(_IDENT_KEYS)
UNKNOWN_NODE: Final = "unknown"
"""The node of a stream whose logs do not say it."""


class Out:
    """One output stream: a (node, rank) and its sink, with pre-encoded identity."""

    __slots__ = ("node", "rank", "sink", "buf", "head", "open", "ident", "index", "chunked")

    def __init__(self, job: str, trace: str, node: str, rank: int, local_rank: int, world: int, sink: Sink,
                 index: int = 0, rank_est: bool = False) -> None:
        self.node, self.rank, self.sink, self.index = node, rank, sink, index
        self.chunked = bool(getattr(sink, "takes_chunks", False))  # buf items may hold several lines
        self.buf: list[bytes] = []
        self.ident = {"job": job, "trace_id": trace, "rank": rank, "local_rank": local_rank, "world": world,
                      "node": node, "pid": 0, "v": SCHEMA_VERSION}
        self.head = _DUMPS(self.ident)[1:-1]  # '"job":...,"v":1' to splice into templates
        if rank_est:  # the next key of FIELDS: a rank numbered in order of appearance says so on every line
            self.head += b',"rank_est":true'
        self.open = b"{%b," % self.head  # an encoded event after its own "{" completes the line


class _File(Protocol):
    mtime_ns: int | None

    @property
    def streams(self) -> Mapping[Any, Stream]: ...


class Stream(Protocol):
    """What the writer reads and updates of an input stream (``._streams.Stream``)."""

    state: StreamState
    pending: list[tuple[dict[str, Any], int]]
    last_ts: int | None
    offset: int
    domain: str
    out: Out | None

    @property
    def src(self) -> _File: ...


class Output:
    """All outputs of one ingest and the rules for writing events to them.

    ``events`` counts the events written here by kind; ``moments`` is where step ends
    marked ``sync`` go (the alignment pass's store, or ``None`` without alignment);
    ``rank_nodes`` is the node each known rank was first seen on.
    """

    def __init__(self, job: str, trace: str, sink_factory: Callable[[str, int], Sink], world_size: int | None,
                 max_msg_chars: int, pending_cap: int, summary: Any) -> None:
        self._job = job
        self._trace = trace
        self._sink_factory = sink_factory
        self._world_size = world_size or 0
        self._cap = max_msg_chars
        self._pending_cap = pending_cap
        self._summary = summary
        self.by_key: dict[tuple[str, int, bool], Out] = {}
        self._sinks: dict[tuple[str, int], Sink] = {}
        self.by_index: list[Out] = []  # by index, as the fast lane names them
        self.rank_nodes: dict[int, str] = {}
        self.max_rank = -1
        self.events: dict[str, int] = {}
        self.moments: Any = None
        self.latest_ts: int | None = None  # the latest stamp of a file read to its end (see neighbour_ts)
        self._redactor = redactor_from_env()  # secrets out of every line, both engines', before any sink
        self._redact_states: dict[int, RedactState] = {}  # per output: a key block a batch left open

    def out(self, node: str, rank: int, local: int, rank_est: bool = False) -> Out:
        key = (node, rank, rank_est)  # a guessed 0 and the rank 0 a prefix names are two writers
        out = self.by_key.get(key)
        if out is None:
            world = max(self._world_size, self.max_rank + 1, rank + 1)
            sink = self._sinks.get((node, rank))
            if sink is None:  # both writers of a (node, rank) share its one sink: the factory opens it once
                sink = self._sinks[(node, rank)] = self._sink_factory(node, rank)
            out = self.by_key[key] = Out(self._job, self._trace, node, rank, local, world, sink,
                                         len(self.by_index), rank_est)
            self.by_index.append(out)
        return out

    def stream_out(self, stream: Stream) -> Out:
        """The output of a stream's own lines (made when first needed)."""
        out = stream.out
        if out is None:
            st = stream.state
            out = stream.out = self.out(st.node, st.rank, st.local_rank, st.rank_guessed)
        return out

    def emit(self, stream: Stream, events: list[dict[str, Any]], ts: int | None) -> None:
        if ts is not None:
            if stream.pending:
                self.release_pending(stream, upto=ts)
            stream.last_ts = ts if stream.last_ts is None or ts > stream.last_ts else stream.last_ts
            for ev in events:
                self.write(stream, ev, ts, False)
            return
        for ev in events:
            if "ts" in ev:  # carries its own time (e.g. a torchelastic failure time)
                self.write(stream, ev, ev["ts"], False)
            else:
                stream.pending.append((ev, 0))
        if len(stream.pending) >= self._pending_cap:
            self.release_pending(stream, final=True)

    def neighbour_ts(self, stream: Stream) -> int | None:
        """The time to give a stream's waiting lines when it has none of its own: its file's latest stamp
        (another stream's), else the latest of the files already read; ``None`` when the job has none yet.

        Never the file's modification time while the job has a stamp: a copied or re-touched log's mtime
        can be years after its lines.
        """
        times = [st.last_ts for st in stream.src.streams.values() if st.last_ts is not None]
        return max(times) if times else self.latest_ts

    def note_file_end(self, streams: Mapping[Any, Stream]) -> None:
        """A file read to its end: its latest stamp is a neighbour for the files after it."""
        for st in streams.values():
            if st.last_ts is not None and (self.latest_ts is None or st.last_ts > self.latest_ts):
                self.latest_ts = st.last_ts

    def release_pending(self, stream: Stream, upto: int | None = None, final: bool = False) -> None:
        """Give lines without a timestamp one between their neighbours' (evenly spaced), marked ``est``.

        A stream with no time of its own takes its neighbours' (:meth:`neighbour_ts`); only a job with no
        stamped line at all falls back to the file's mtime (counted as ``mtime_ts``), then to now.
        """
        pending = stream.pending
        if not pending:
            return
        stream.pending = []
        lo = stream.last_ts
        if lo is None:
            lo = upto if upto is not None else self.neighbour_ts(stream)
        if lo is None:
            lo = stream.src.mtime_ns or time.time_ns()
            self._summary.mtime_ts += len(pending)
        hi = upto if upto is not None and upto >= lo else lo
        n = len(pending)
        self._summary.estimated_ts += n
        t = lo
        for i, (ev, _) in enumerate(pending):
            # Evenly spaced between the neighbours; with no room between them, a nanosecond apart after
            # ``lo``: no two lines share a time (a backend keeps one of two byte-identical events, and a
            # sort by time keeps the file's order).
            t = lo + (hi - lo) * (i + 1) // (n + 1) if hi > lo else lo + i + 1
            self.write(stream, ev, t, True)
        if final and upto is None:
            stream.last_ts = t

    def write(self, stream: Stream, ev: dict[str, Any], line_ts: int, est: bool) -> None:
        st = stream.state
        if _INTERNAL_KEYS.isdisjoint(ev):  # most events: nothing to take out (one look-up instead of five)
            rank = node = start_dt = None
            sync = False
            dt = 0
        else:
            rank = ev.pop("route_rank", None)
            node = ev.pop("route_node", None)
            sync = ev.pop("sync", False)
            dt = ev.pop("dt", 0)
            start_dt = ev.pop("start_dt", None)
        if not _IDENT_SET.isdisjoint(ev):
            for k in _IDENT_KEYS:  # identity comes from the output stream; parsers cannot override it
                ev.pop(k, None)
        off = stream.offset
        ts = ev.get("ts")
        if ts is None:
            ts = line_ts + dt
        elif not isinstance(ts, int):
            ts = line_ts
        if start_dt is not None:
            ev["start"] = line_ts + start_dt + off
        elif ev.get("kind") == "span" and "dur" in ev:
            ev["start"] = (ev["start"] + off) if "start" in ev else ts - int(ev["dur"]) + off
        ev["ts"] = ts + off
        if est:
            ev["est"] = True
        kind = ev.get("kind", "log")
        ev["kind"] = kind
        if kind == "log":
            ev.setdefault("level", "INFO")
            if "msg" in ev and isinstance(ev["msg"], str) and len(ev["msg"]) > self._cap:
                ev["msg"] = ev["msg"][: self._cap]
        if rank is None:
            out = stream.out
            if out is None:
                out = stream.out = self.out(st.node, st.rank, st.local_rank, st.rank_guessed)
        else:
            if node is None:
                # the same writer (or, for a host-prefixed stream, the same host) unless the rank is known elsewhere
                node = st.node if (rank == st.rank or st.rank_guessed) else self.rank_nodes.get(rank, UNKNOWN_NODE)
            out = self.out(node, rank, rank)
        if sync and self.moments is not None and not est and ev.get("step") is not None and rank is None:
            self.moments.add(stream.domain, ev["step"], ev["ts"])
        try:
            body = _DUMPS(ev, option=_NL)
        except TypeError:
            body = _DUMPS({k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                           for k, v in ev.items()}, option=_NL)
        out.buf.append(out.open + body[1:])
        self.events[kind] = self.events.get(kind, 0) + 1

    def flush(self) -> None:
        for out in self.by_key.values():
            if out.buf:
                buf, out.buf = out.buf, []
                if self._redactor is not None:
                    buf = self._redactor.redact_lines(buf, self._redact_states.setdefault(id(out), RedactState()))
                out.sink.write(buf)

    def flush_sinks(self) -> None:
        """Write the buffers and have every sink make them durable (a checkpoint of the ingest ledger follows)."""
        self.flush()
        for sink in self._sinks.values():
            sink.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            for sink in self._sinks.values():
                try:
                    sink.flush()
                finally:
                    sink.close()
