"""The whole job as a Perfetto protobuf trace: every span of every rank, flows, counters and findings.

The Perfetto UI and its trace processor read the protobuf ``Trace`` format natively. Unlike the
Chrome JSON format it streams (a file is a plain concatenation of ``TracePacket`` records), interns
repeated strings and holds a 1,024-rank × 1,000-step job without cutting anything, so nothing here
is truncated: all spans of all ranks are written, a batch of packets at a time, never the whole
trace in memory.

What the file holds:

* a **process per node** (``node node0003``) and a **thread track per rank** (``rank 5``, with its
  status when it is not ok); spans that overlap without nesting (async collectives, DDP buckets)
  go to extra tracks under the rank, as Perfetto requires that slices on one track nest;
* **slices** for steps, phases, collectives and user spans, with ``step`` and ``span_id`` (the
  key to the span's log lines) and, for a collective, its ``group``, ``seq`` and ``op``;
* **flows** that chain the same collective (same group and sequence number) across the ranks
  that ran it, in the order they entered it, so the last arrow points at the late rank;
* **counters** for every numeric value in the job's metric events (loss, grad norm, learning
  rate, memory...), one track per rank and metric; NaN and infinite values cannot be drawn as a
  counter, so they become instant events (``loss = nan``) on the rank's track;
* warning, error and traceback log lines as instant events on their rank's track;
* what a stalled rank is still inside, on a ``still inside`` track under the rank;
* **findings** as instant events on a process named ``jobtrace findings``, and each finding's
  time range as a slice on a track of its own under it; beside them, the job id, trace ids and verdict.

The encoder is written by hand (a few dozen lines) rather than building ``perfetto_trace_pb2``
messages: those cost ~8 µs a packet in Python, which for the ~20 million packets of a 1,024 ×
1,000 job is minutes; the packets here are byte templates with the changing values spliced in.
The field numbers are Perfetto's published ones (protos/perfetto/trace/trace.proto,
trace_packet.proto, track_event/track_event.proto, track_event/track_descriptor.proto,
track_event/process_descriptor.proto, track_event/thread_descriptor.proto,
track_event/counter_descriptor.proto, track_event/debug_annotation.proto,
interned_data/interned_data.proto); tests decode every file with the ``perfetto`` package's
compiled protos, which would fail on any wrong number or wire type.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Final

import orjson

from jobtrace.protowire import varint as _varint

from ._model import Report

__all__ = ["write_perfetto"]

# --- field numbers (tag bytes = field << 3 | wire type), from Perfetto's .proto files -------------------------
# trace.proto            Trace.packet = 1 (message)
_T_PACKET: Final = b"\x0a"
# trace_packet.proto     timestamp = 8 (uint64), trusted_packet_sequence_id = 10 (uint32), track_event = 11,
#                        interned_data = 12, sequence_flags = 13 (uint32), track_descriptor = 60,
#                        first_packet_on_sequence = 87 (bool)
_P_TS: Final = b"\x40"
_P_SEQ: Final = b"\x50"
_P_TRACK_EVENT: Final = b"\x5a"
_P_INTERNED: Final = b"\x62"
_P_FLAGS: Final = b"\x68"
_P_TRACK_DESCRIPTOR: Final = b"\xe2\x03"
_P_FIRST_ON_SEQ: Final = b"\xb8\x05"
_SEQ_INCREMENTAL_STATE_CLEARED: Final = 1
_SEQ_NEEDS_INCREMENTAL_STATE: Final = 2
# track_event.proto      category_iids = 3 (uint64), debug_annotations = 4, type = 9 (enum), name_iid = 10,
#                        track_uuid = 11, name = 23 (string), double_counter_value = 44 (double),
#                        flow_ids = 47 (fixed64)
_E_CAT_IID: Final = b"\x18"
_E_ANNOTATION: Final = b"\x22"
_E_TYPE: Final = b"\x48"
_E_NAME_IID: Final = b"\x50"
_E_TRACK: Final = b"\x58"
_E_NAME: Final = b"\xba\x01"
_E_DOUBLE_COUNTER: Final = b"\xe1\x02"
_E_FLOW: Final = b"\xf9\x02"
_SLICE_BEGIN, _SLICE_END, _INSTANT, _COUNTER = 1, 2, 3, 4
# debug_annotation.proto name_iid = 1, int_value = 4 (int64), double_value = 5, string_value = 6
_A_NAME_IID: Final = b"\x08"
_A_INT: Final = b"\x20"
_A_DOUBLE: Final = b"\x29"
_A_STRING: Final = b"\x32"
# track_descriptor.proto uuid = 1, name = 2, process = 3, thread = 4, parent_uuid = 5, counter = 8
# process_descriptor.proto pid = 1 (int32), process_name = 6; thread_descriptor.proto pid = 1, tid = 2,
# thread_name = 5
# interned_data.proto    event_categories = 1, event_names = 2, debug_annotation_names = 3 (each: iid = 1, name = 2)

_SEQ_ID: Final = 1
"""Every packet is on one sequence: the interned names are defined once, in its first packet."""

_ANNOTATIONS: Final = ("step", "span_id", "group", "seq", "op", "msg", "logger", "summary", "severity", "ranks",
                       "steps", "value", "doing", "kind", "trace_ids", "verdict")
_IID: Final = {name: i + 1 for i, name in enumerate(_ANNOTATIONS)}

_BATCH_PACKETS: Final = 20_000
"""Packets are written in batches of this many (a few MB): memory stays flat whatever the job's size."""

_FIXED64: Final = struct.Struct("<Q").pack
_DOUBLE: Final = struct.Struct("<d").pack

_TABLED: Final = 2048
"""TrackEvents shorter than this (every span's) take their packet's framing from a table."""

_STUCK_KINDS: Final = frozenset({"stalled_rank", "collective_mismatch", "hang"})


_SMALL: Final = [_varint(i) for i in range(1 << 14)]


def _v(n: int) -> bytes:
    """A varint, looked up for the small numbers (lengths, ids, steps) that make up most fields."""
    return _SMALL[n] if 0 <= n < 16384 else _varint(n)


_LOW14: Final = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(1 << 14)]
"""The low four 7-bit groups of a long varint, two at a time (continuation bits set)."""


def _high(hi: int) -> bytes:
    """The last five groups of a nine-byte varint: bits 28 to 62."""
    return bytes((hi & 0x7F | 0x80, hi >> 7 & 0x7F | 0x80, hi >> 14 & 0x7F | 0x80, hi >> 21 & 0x7F | 0x80, hi >> 28))


def _ld(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: tag, length, bytes."""
    return tag + _v(len(body)) + body


def _str(tag: bytes, text: str) -> bytes:
    return _ld(tag, text.encode("utf-8", "replace"))


def _annotation(name: str, value: Any) -> bytes:
    """A debug annotation (``args`` in the UI): ints as ints, floats as doubles, anything else as text."""
    head = _A_NAME_IID + _v(_IID[name])
    if isinstance(value, bool) or not isinstance(value, int | float):
        body = head + _str(_A_STRING, value if isinstance(value, str) else orjson.dumps(value).decode())
    elif isinstance(value, int):
        body = head + _A_INT + _varint(value)
    else:
        body = head + _A_DOUBLE + _DOUBLE(value)
    return _ld(_E_ANNOTATION, body)


class _Writer:
    """Packets onto one sequence of a file, in batches; track uuids handed out as tracks are declared."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.buf: list[bytes] = []
        self.pending = 0
        self.next_uuid = 1
        self.packets = 0
        self.te_head = _P_SEQ + _v(_SEQ_ID) + _P_FLAGS + _v(_SEQ_NEEDS_INCREMENTAL_STATE) + _P_TRACK_EVENT
        self.highs: dict[int, bytes] = {}
        # per TrackEvent length n: what precedes a nine-byte timestamp (packet tag, packet length, timestamp tag)
        # and what follows it (sequence id, flags, the event's tag and length)
        self.mid = [self.te_head + _v(n) for n in range(_TABLED)]
        self.pre = [_T_PACKET + _v(1 + 9 + len(self.mid[n]) + n) + _P_TS for n in range(_TABLED)]

    def ts(self, n: int) -> bytes:
        """A timestamp's varint. Unix nanoseconds (2^56 to 2^63) take nine bytes: two table look-ups for the
        low 28 bits and a cached tail for the rest, which changes only every 0.27 s."""
        if (1 << 56) <= n < (1 << 63):
            hi = n >> 28
            tail = self.highs.get(hi)
            if tail is None:
                tail = self.highs[hi] = _high(hi)
            return _LOW14[n & 0x3FFF] + _LOW14[n >> 14 & 0x3FFF] + tail
        return _varint(max(n, 0))

    def packet(self, body: bytes) -> None:
        self.buf += (_T_PACKET, _v(len(body)), body)
        self.count()

    def count(self) -> None:
        self.packets += 1
        self.pending += 1
        if self.pending >= _BATCH_PACKETS:
            self.flush()

    def flush(self) -> None:
        self.out.write(b"".join(self.buf))
        self.buf.clear()
        self.pending = 0

    def event(self, ts: int, event: bytes) -> None:
        """A track event packet: ``event`` is the encoded TrackEvent. Its pieces are joined only at flush.

        The hot path of the whole writer (two calls a span): for the usual nine-byte timestamp and an
        event under 2 KB, the bytes before and after the timestamp come from tables made once.
        """
        n = len(event)
        if n < _TABLED and (1 << 56) <= ts < (1 << 63):
            hi = ts >> 28
            tail = self.highs.get(hi)
            if tail is None:
                tail = self.highs[hi] = _high(hi)
            self.buf += (self.pre[n], _LOW14[ts & 0x3FFF], _LOW14[ts >> 14 & 0x3FFF], tail, self.mid[n], event)
        else:
            t = self.ts(ts)
            ln = _v(n)
            self.buf += (_T_PACKET, _v(1 + len(t) + len(self.te_head) + len(ln) + n), _P_TS, t, self.te_head, ln,
                         event)
        self.packets += 1
        self.pending += 1
        if self.pending >= _BATCH_PACKETS:
            self.flush()

    def first(self, ts: int, interned: bytes) -> None:
        """The sequence's first packet: it clears the incremental state and defines the interned names."""
        self.packet(_P_TS + self.ts(ts) + _P_SEQ + _v(_SEQ_ID) + _P_FLAGS
                    + _v(_SEQ_INCREMENTAL_STATE_CLEARED | _SEQ_NEEDS_INCREMENTAL_STATE) + _P_FIRST_ON_SEQ + b"\x01"
                    + _ld(_P_INTERNED, interned))

    def track(self, name: str, *, parent: int | None = None, process: tuple[int, str] | None = None,
              thread: tuple[int, int, str] | None = None, counter: bool = False) -> int:
        """Declare a track (a TrackDescriptor packet); returns its uuid."""
        uuid = self.next_uuid
        self.next_uuid += 1
        body = b"\x08" + _v(uuid)
        if parent is not None:
            body += b"\x28" + _v(parent)
        if process is not None:
            body += _ld(b"\x1a", b"\x08" + _varint(process[0]) + _str(b"\x32", process[1]))
        elif thread is not None:
            body += _ld(b"\x22", b"\x08" + _varint(thread[0]) + b"\x10" + _varint(thread[1]) + _str(b"\x2a", thread[2]))
        else:
            body += _str(b"\x12", name)
        if counter:
            body += b"\x42\x00"
        self.packet(_P_SEQ + _v(_SEQ_ID) + _ld(_P_TRACK_DESCRIPTOR, body))
        return uuid


def _interned(names: dict[str, int], cats: dict[str, int]) -> bytes:
    def entries(tag: bytes, table: Iterable[tuple[str, int]]) -> bytes:
        return b"".join(_ld(tag, b"\x08" + _v(iid) + _str(b"\x12", name)) for name, iid in table)

    return (entries(b"\x0a", cats.items()) + entries(b"\x12", names.items())
            + entries(b"\x1a", _IID.items()))


def _clock_offsets(job: Any, report: Report) -> dict[int, int]:
    """Each rank's clock offset (ns, subtracted) onto the reference node, as the report's clock check found them."""
    clocks = report.clocks or {}
    applied = {n: int(clocks["offsets_ns"][n]) for n in clocks.get("applied", [])}
    if not applied:
        return {}
    pairs = job.con.execute("SELECT DISTINCT rank, node FROM events WHERE rank IS NOT NULL").fetchall()
    return {int(r): applied.get(n, 0) for r, n in pairs}


def _rows(con: Any, sql: str, params: list[Any] | None = None, batch: int = 50_000) -> Iterator[tuple[Any, ...]]:
    """A query's rows a batch at a time, in its order: a large job's spans never all sit in Python.

    The caller runs no other statement on ``con`` until the rows are all read.
    """
    res = con.execute(sql, params or [])
    while chunk := res.fetchmany(batch):
        yield from chunk


_SPANS_SQL: Final = """
WITH s AS (
    SELECT coalesce(rank, -1) AS r, coalesce(start, ts - greatest(coalesce(dur, 0), 0)) AS s,
           greatest(coalesce(dur, 0), 0) AS d, coalesce(name, '') AS name, coalesce(cat, '') AS cat, step, span_id,
           CASE WHEN cat = 'collective' THEN coalesce(json_extract_string(attrs, '$.group'), 'default') END AS grp,
           CASE WHEN cat = 'collective' THEN TRY_CAST(json_extract_string(attrs, '$.seq') AS BIGINT) END AS seq,
           CASE WHEN cat = 'collective' THEN json_extract_string(attrs, '$.op') END AS op
    FROM events WHERE kind = 'span' AND coalesce(start, ts) IS NOT NULL)
SELECT s.r, s.s, s.d, n.iid, c.iid, s.step, s.span_id, s.grp, s.seq, s.op, f.fid
FROM s JOIN pf_names n ON s.name = n.name JOIN pf_cats c ON s.cat = c.name
LEFT JOIN pf_flows f ON s.grp = f.grp AND s.seq = f.seq
ORDER BY s.r, s.s, s.d DESC, s.span_id
"""

_NAMES_SQL: Final = """
CREATE OR REPLACE TEMP TABLE pf_{table} AS
SELECT name, CAST(row_number() OVER (ORDER BY name) AS INTEGER) AS iid
FROM (SELECT DISTINCT coalesce({column}, '') AS name FROM events WHERE kind = 'span')
"""
"""Span names and categories, each with its interned id: the span query returns the ids, not the strings."""

_FLOWS_SQL: Final = """
CREATE OR REPLACE TEMP TABLE pf_flows AS
SELECT grp, seq, row_number() OVER (ORDER BY grp, seq) AS fid FROM (
    SELECT coalesce(json_extract_string(attrs, '$.group'), 'default') AS grp,
           TRY_CAST(json_extract_string(attrs, '$.seq') AS BIGINT) AS seq
    FROM events WHERE kind = 'span' AND cat = 'collective' AND coalesce(start, ts) IS NOT NULL)
WHERE seq IS NOT NULL GROUP BY grp, seq HAVING count(*) > 1
"""


class _Ranks:
    """Each rank's thread track, and the extra tracks its overlapping spans, counters and stalls need."""

    def __init__(self, w: _Writer, job: Any, report: Report) -> None:
        self.w = w
        rows = job.con.execute("SELECT coalesce(rank, -1) AS r, any_value(node) FROM events GROUP BY r "
                               "ORDER BY r").fetchall()
        status = {p.rank: p.status for p in report.per_rank}
        self.node = {int(r): n or "" for r, n in rows}
        for p in report.per_rank:
            self.node.setdefault(p.rank, p.node)
        nodes = sorted(set(self.node.values()))
        self.pid = {n: i + 1 for i, n in enumerate(nodes)}
        self.findings_pid = len(nodes) + 1
        proc = {n: w.track(f"node {n}", process=(self.pid[n], f"node {n}" if n else "node ?")) for n in nodes}
        self.thread: dict[int, int] = {}
        for r in sorted(self.node):
            st = status.get(r, "ok")
            label = (f"rank {r}" if r >= 0 else "rank ?") + (f" ({st})" if st != "ok" else "")
            self.thread[r] = w.track(label, parent=proc[self.node[r]],
                                     thread=(self.pid[self.node[r]], r + 1 if r >= 0 else 1 << 30, label))
        self.lanes: dict[int, list[int]] = {}
        self.counters: dict[tuple[int, str], int] = {}

    def lane(self, r: int, i: int) -> int:
        """The uuid of rank ``r``'s ``i``-th track for spans (0: its thread track)."""
        lanes = self.lanes.setdefault(r, [self.thread_of(r)])
        while len(lanes) <= i:
            lanes.append(self.w.track(f"rank {r} (overlapping {len(lanes)})", parent=lanes[0]))
        return lanes[i]

    def thread_of(self, r: int) -> int:
        if r not in self.thread:  # an event of a rank first met here (a metric of a rank without spans)
            self.node.setdefault(r, "")
            self.thread[r] = self.w.track(f"rank {r}", thread=(self.pid.get(self.node[r], 0), r + 1, f"rank {r}"))
        return self.thread[r]

    def counter(self, r: int, key: str) -> int:
        uuid = self.counters.get((r, key))
        if uuid is None:
            uuid = self.counters[(r, key)] = self.w.track(f"{key} (rank {r})", parent=self.thread_of(r), counter=True)
        return uuid


def _write_spans(w: _Writer, job: Any, ranks: _Ranks, offsets: dict[int, int]) -> None:
    """Every span, begin and end, each on the first of its rank's tracks where it nests.

    Rows come sorted by rank, start and longest first, so a span either nests inside the open
    span on top of a track's stack or must go to another track. Ends are written when the
    track's next span begins (or at the rank's end), so on each track the events are in time
    order, and where times tie, ends come before the begins that follow them. The order in the
    file is what counts for ties: the trace processor sorts events by timestamp and then by where
    it read them (``TimestampedEvent::operator<`` in src/trace_processor/sorter/trace_sorter.h
    compares the timestamp, then the chunk index and offset of its in-order token buffer).
    """
    step_a: dict[int, bytes] = {}
    span_head = _A_NAME_IID + _v(_IID["span_id"]) + _A_STRING + _v(16)
    span16 = _E_ANNOTATION + _v(len(span_head) + 16) + span_head  # span ids are 16 hex digits
    heads: dict[tuple[int, int, int], bytes] = {}
    coll: dict[tuple[str, str | None], bytes] = {}
    seq_head = _A_NAME_IID + _v(_IID["seq"]) + _A_INT
    event = w.event
    cur_rank: int | None = None
    stacks: list[list[int]] = []
    uuids: list[int] = []
    ends: list[bytes] = []
    off = 0

    def close_all() -> None:
        for i, stack in enumerate(stacks):
            end = ends[i]
            while stack:
                event(stack.pop(), end)

    for r, s, d, name, cat, step, span_id, grp, seq, op, fid in _rows(job.con, _SPANS_SQL):
        if r != cur_rank:
            close_all()
            cur_rank, stacks, uuids, ends = r, [], [], []
            off = offsets.get(r, 0)
        s -= off
        e = s + d
        lane = -1
        for i, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                event(stack.pop(), ends[i])
            if not stack or e <= stack[-1]:
                lane = i
                break
        if lane < 0:
            lane = len(stacks)
            uuid = ranks.lane(r, lane)
            stacks.append([])
            uuids.append(uuid)
            ends.append(_E_TYPE + _v(_SLICE_END) + _E_TRACK + _v(uuid))
        stacks[lane].append(e)
        key = (uuids[lane], name, cat)
        ev = heads.get(key)
        if ev is None:
            ev = heads[key] = (_E_TYPE + _v(_SLICE_BEGIN) + _E_TRACK + _v(key[0]) + _E_NAME_IID + _v(name)
                               + _E_CAT_IID + _v(cat))
        if step is not None:
            a = step_a.get(step)
            if a is None:
                a = step_a[step] = _annotation("step", step)
            ev += a
        if span_id is not None:
            ev += span16 + span_id.encode() if len(span_id) == 16 and span_id.isascii() else _annotation("span_id", span_id)
        if grp is not None:
            a = coll.get((grp, op))
            if a is None:
                a = coll[(grp, op)] = _annotation("group", grp) + (_annotation("op", op) if op is not None else b"")
            ev += a
            if seq is not None:
                a = seq_head + _varint(seq)
                ev += _E_ANNOTATION + _v(len(a)) + a
        if fid is not None:
            ev += _E_FLOW + _FIXED64(fid)
        event(s, ev)
    close_all()


def _instant(w: _Writer, ts: int, track: int, name: str, args: dict[str, Any]) -> None:
    ev = _E_TYPE + _v(_INSTANT) + _E_TRACK + _v(track) + _str(_E_NAME, name)
    ev += b"".join(_annotation(k, v) for k, v in args.items() if v is not None)
    w.event(ts, ev)


def _write_metrics(w: _Writer, job: Any, ranks: _Ranks, offsets: dict[int, int]) -> None:
    """A counter per rank and numeric metric; non-finite values as instants, since a counter cannot show them."""
    sql = ("SELECT coalesce(rank, -1), ts, step, CAST(metrics AS VARCHAR) FROM events "
           "WHERE kind = 'metric' AND metrics IS NOT NULL AND ts IS NOT NULL")
    loads, event, isfinite = orjson.loads, w.event, math.isfinite
    heads: dict[tuple[int, str], bytes] = {}
    for r, ts, step, text in _rows(job.con, sql):
        try:
            values = loads(text)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(values, dict):
            continue
        ts -= offsets.get(r, 0)
        for key, value in values.items():
            if isinstance(value, bool):
                continue
            if isinstance(value, str):
                try:
                    value = float(value)  # "NaN", "inf": how JSON carries the values it cannot
                except ValueError:
                    continue
            if not isinstance(value, int | float):
                continue
            if isfinite(value):
                head = heads.get((r, key))
                if head is None:
                    head = heads[(r, key)] = (_E_TYPE + _v(_COUNTER) + _E_TRACK + _v(ranks.counter(r, key))
                                              + _E_DOUBLE_COUNTER)
                event(ts, head + _DOUBLE(value))
            else:
                _instant(w, ts, ranks.thread_of(r), f"{key} = {value}", {"step": step, "value": str(value)})


def _write_logs(w: _Writer, job: Any, ranks: _Ranks, offsets: dict[int, int]) -> None:
    """Warnings, errors and tracebacks as instants on their rank's track (every one: no cap)."""
    sql = ("SELECT coalesce(rank, -1), ts, level, logger, msg, step, span_id, exc FROM events "
           "WHERE kind = 'log' AND ts IS NOT NULL AND (level IN ('WARNING', 'ERROR', 'CRITICAL') OR exc IS NOT NULL) "
           "ORDER BY 1, 2")
    for r, ts, level, logger, msg, step, span_id, exc in _rows(job.con, sql):
        label = " ".join(x for x in (level or ("ERROR" if exc else None), logger) if x)
        _instant(w, ts - offsets.get(r, 0), ranks.thread_of(r), label or "log",
                 {"msg": msg, "logger": logger, "step": step, "span_id": span_id})


def _write_findings(w: _Writer, report: Report, ranks: _Ranks, t0: int) -> None:
    """Findings on a named process of their own; what stalled ranks are still inside, on those ranks."""
    proc = w.track("jobtrace findings", process=(ranks.findings_pid, "jobtrace findings"))
    about = w.track("job", parent=proc)
    _instant(w, t0, about, f"job {report.job_id}", {"trace_ids": ", ".join(report.trace_ids),
                                                     "verdict": "healthy" if report.healthy else "problem found"})
    markers = w.track("findings", parent=proc)
    for f in report.findings:
        start = f.time_range[0] if f.time_range else t0
        args = {"kind": f.kind, "severity": f.severity, "summary": f.summary, "ranks": f.ranks or None,
                "steps": f.steps or None}
        _instant(w, start, markers, f"{f.severity}: {f.kind}", args)
        if len(f.time_range) == 2 and f.time_range[1] > f.time_range[0]:
            own = w.track(f"{f.severity}: {f.kind}", parent=proc)
            w.event(f.time_range[0], _E_TYPE + _v(_SLICE_BEGIN) + _E_TRACK + _v(own) + _str(_E_NAME, f.kind)
                    + _annotation("summary", f.summary))
            w.event(f.time_range[1], _E_TYPE + _v(_SLICE_END) + _E_TRACK + _v(own))
        if f.kind in _STUCK_KINDS and len(f.time_range) == 2:
            doing = str(f.details.get("doing") or f.kind)
            for r in f.ranks:  # a track each: two findings' ranges on one rank may overlap without nesting
                track = w.track(f"rank {r} still inside ({f.kind})", parent=ranks.thread_of(r))
                w.event(f.time_range[0], _E_TYPE + _v(_SLICE_BEGIN) + _E_TRACK + _v(track)
                        + _str(_E_NAME, f"still: {doing}") + _annotation("doing", doing))
                w.event(max(f.time_range[1], f.time_range[0]), _E_TYPE + _v(_SLICE_END) + _E_TRACK + _v(track))


def write_perfetto(job: Any, report: Report, path: str | os.PathLike[str], **kw: Any) -> Path:
    """Write the job as a Perfetto protobuf trace (open it at ui.perfetto.dev); returns the path.

    Nothing is cut: every span of every rank is in the file, written in batches as it is read.
    ``max_lanes`` and ``max_spans``, the HTML timeline's limits, are accepted and ignored here.
    """
    unknown = set(kw) - {"max_lanes", "max_spans"}
    if unknown:
        raise TypeError(f"write_perfetto() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    con = job.con
    try:
        con.execute(_FLOWS_SQL)
        con.execute(_NAMES_SQL.format(table="names", column="name"))
        con.execute(_NAMES_SQL.format(table="cats", column="cat"))
        names = dict(con.execute("SELECT name, iid FROM pf_names").fetchall())
        cats = dict(con.execute("SELECT name, iid FROM pf_cats").fetchall())
        first = con.execute("SELECT min(coalesce(start, ts)) FROM events").fetchone()[0]
        known = [x for x in (first, report.t_min) if x]
        t0 = min(known) if known else 0
        offsets = _clock_offsets(job, report)
        target = Path(path)
        with open(target, "wb") as out:
            w = _Writer(out)
            w.first(t0, _interned(names, cats))
            ranks = _Ranks(w, job, report)
            _write_spans(w, job, ranks, offsets)
            _write_metrics(w, job, ranks, offsets)
            _write_logs(w, job, ranks, offsets)
            _write_findings(w, report, ranks, t0)
            w.flush()
    finally:
        for table in ("pf_flows", "pf_names", "pf_cats"):
            con.execute(f"DROP TABLE IF EXISTS {table}")
    return target
