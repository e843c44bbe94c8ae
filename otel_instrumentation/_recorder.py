"""The hot path: what the training thread pays for a span, a log record, a metric.

The training thread only builds a small tuple and appends it to the export queue;
the export thread turns tuples into canonical event dicts and bytes. Span ids are
random 64-bit ints formatted to hex later, timestamps are ``time.time_ns()``, and the
per-thread span stack is a plain list, so a step span costs a few microseconds where
an OpenTelemetry SDK span costs tens (measured in ``benchmarks/bench_overhead.py``).
Where ``jobtrace_native`` is installed, ``_native.NativeRecorder`` does the training thread's
part in compiled code (about half the CPU per training step); this recorder is its reference
(the two write the same lines, byte for byte) and its fallback.

Item layouts (first element is the kind tag):

* ``(_SPAN, span_id, parent_id, name, cat, start_ns, end_ns, step, attrs)``
* ``(_LOG, created_s, level, logger, msg, args, exc_text, span_id, step)``: the record's
  fields, not the ``LogRecord`` itself: tens of thousands of queued records (each with a
  ``__dict__``) would make every garbage collection of the training process slower, while
  a tuple of strings and numbers drops out of the collector's view.
* ``(_METRIC, ts_ns, step, {name: value}, span_id)``
* ``(_BEAT, ts_ns, step, attrs)``
* ``(_COLLECTIVE, span_id, parent_id, op, start_ns, end_ns, step, [group, group_size, _], seq, bytes, extra)``:
  a collective's span (``_torch``), its attributes built on the export thread (:func:`_as_span`).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from random import getrandbits
from threading import get_ident
from time import time_ns
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from jobtrace.events import FIELDS, Field, Kind, SpanCategory, encode_lines, identity_block, json_default
from jobtrace.identity import Identity

if TYPE_CHECKING:
    from shippers import BatchWorker

__all__ = ["LineEncoder", "LogRecordFn", "NewSpan", "Recorder", "Span", "TraceRecorder", "line_template", "log_fields",
           "prepare_metric_values"]

_SPAN, _LOG, _METRIC, _BEAT, _COLLECTIVE = 0, 1, 2, 3, 4
_STEP = SpanCategory.STEP
_COLLECTIVE_CAT = SpanCategory.COLLECTIVE
_DUMPS = orjson.dumps
_NUMPY = orjson.OPT_SERIALIZE_NUMPY  # as events.encode: the fast path's bytes equal the general path's


def _scrubbed(value: Any) -> Any:
    """``value`` with every string made valid UTF-8 (lone surrogates escaped), recursively."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_scrubbed(k if isinstance(k, str) else str(k)): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v) for v in value]
    return value
_IMMUTABLE = frozenset({int, float, str, bool, type(None), bytes, complex})
_ASYNC: Final[dict[str, Any]] = {"async": True}
_PLAIN_VALUES = frozenset({int, float, str, bool, type(None)})


def _as_span(item: tuple[Any, ...]) -> tuple[Any, ...]:
    """A ``_COLLECTIVE`` item as the span item it stands for."""
    _, sid, parent, op, start, end, step, group, seq, nbytes, extra = item
    attrs = {"op": op, "group": group[0], "group_size": group[1], "seq": seq, "bytes": nbytes}
    if extra:
        attrs.update(extra)
    return (_SPAN, sid, parent, op, _COLLECTIVE_CAT, start, end, step, attrs)


# ---- the fast path's lines, built from the field table -----------------------------------------------------
# Which keys a kind's line has, and in what order, is the field table's (jobtrace.events.FIELDS); a kind's
# parts below say only how each key's value reaches the line:
#   "int" an int, "hex" a span id (16 hex digits), "json" JSON the encoder made (a cached string, a message),
#   "kind" the kind itself, "identity" the identity block (encoded once per process, its keys one run),
#   "optional" the whole ``,"key":…`` part made by the encoder, or b"" for a key left out,
#   "follows" written by the optional part before it (a span's cached ``,"name":…,"cat":…``).
_PIECES: Final = {"int": b'"%s":%%d', "hex": b'"%s":"%%016x"', "json": b'"%s":%%b'}
_IDENTITY_KEYS: Final = tuple(f.key for f in FIELDS if f.identity)


def _part(mode: str, key: str) -> bytes:
    """``key``'s piece of a line (``mode`` as above), as a %-format: ``"step":%d``."""
    return _PIECES[mode] % key.encode()


def _optional(*parts: tuple[str, str]) -> bytes:
    """An optional part's %-format, with its comma: ``,"span_id":"%016x"``."""
    return b"".join(b"," + _part(mode, key) for mode, key in parts)


def line_template(kind: str, parts: Mapping[str, str], fields: tuple[Field, ...] = FIELDS) -> tuple[bytes, tuple[str, ...]]:
    """The %-template of ``kind``'s fast-path line, and the key each of its slots fills, in order (the
    identity block's slot is named by its first key).

    Every key of ``parts`` must be one the table lets ``kind`` carry; a key the table has but ``parts``
    does not name is left to the general path. ``ValueError`` for parts that cannot be one template.
    """
    carried = {f.key for f in fields if kind in f.kinds}
    if set(parts) - carried:
        raise ValueError(f"the field table has no {sorted(set(parts) - carried)} for a {kind} event")
    identity = [f.key for f in fields if f.identity]
    written = [f.key for f in fields if f.key in parts]
    pieces: list[bytes] = []
    slots: list[str] = []
    i = 0
    while i < len(written):
        key, mode = written[i], parts[written[i]]
        i += 1
        if (key in identity) != (mode == "identity"):
            raise ValueError(f"{key!r}: the identity keys, and only they, are written as the identity block")
        if mode == "identity":
            if written[i - 1:i - 1 + len(identity)] != identity:
                raise ValueError("the identity block is every identity key, one run in the field table")
            i += len(identity) - 1
            pieces.append(b",%b")
        elif mode == "follows":
            if i < 2 or parts[written[i - 2]] != "optional":
                raise ValueError(f"{key!r} follows a key whose optional part writes it")
            continue
        elif mode == "optional":
            pieces.append(b"%b")
        elif mode == "kind":
            pieces.append(b',"kind":"%s"' % kind.encode())
            continue
        else:
            pieces.append(b"," + _part(mode, key))
        slots.append(key)
    if not pieces or not pieces[0].startswith(b","):
        raise ValueError("a line starts with a key of its own, not an optional part")
    return b"{" + b"".join(pieces)[1:] + b"}\n", tuple(slots)


def _fast_line(kind: str, parts: Mapping[str, str], arguments: tuple[str, ...], encoder: str) -> bytes:
    """``kind``'s template, checked against the order in which ``encoder`` gives its values."""
    template, slots = line_template(kind, parts)
    if slots != arguments:
        raise RuntimeError(f"the field table orders a {kind} line's values {slots}, {encoder} gives them as {arguments}: "
                           "change one of them (and jobtrace_native's recorder, which writes the same bytes)")
    return template


_IDENTITY_PARTS: Final = dict.fromkeys(_IDENTITY_KEYS, "identity")
_LOG_LINE: Final = _fast_line(Kind.LOG, {
    "ts": "int", "kind": "kind", **_IDENTITY_PARTS, "span_id": "optional", "level": "json", "logger": "json",
    "msg": "json", "exc": "optional", "step": "optional",
}, ("ts", "job", "span_id", "level", "logger", "msg", "exc", "step"), "_encode_log")
_SPAN_LINE: Final = _fast_line(Kind.SPAN, {
    "ts": "int", "kind": "kind", **_IDENTITY_PARTS, "span_id": "hex", "parent_id": "optional", "name": "optional",
    "cat": "follows", "start": "int", "dur": "int", "step": "optional", "attrs": "optional",
}, ("ts", "job", "span_id", "parent_id", "name", "start", "dur", "step", "attrs"), "_encode_span")
_METRIC_LINE: Final = _fast_line(Kind.METRIC, {
    "ts": "int", "kind": "kind", **_IDENTITY_PARTS, "span_id": "optional", "metrics": "json", "step": "optional",
}, ("ts", "job", "span_id", "metrics", "step"), "_encode_metric")
# The optional parts, as the templates' slots take them.
_SPAN_ID_PART: Final = _optional(("hex", "span_id"))
_PARENT_PART: Final = _optional(("hex", "parent_id"))
_STEP_PART: Final = _optional(("int", "step"))
_EXC_PART: Final = _optional(("json", "exc"))
_ATTRS_PART: Final = _optional(("json", "attrs"))
_NAMED_PART: Final = _optional(("json", "name"), ("json", "cat"))


def _hex64(x: int | None) -> str | None:
    return None if x is None else f"{x:016x}"


def _number(value: Any) -> float | int | str:
    """A metric value as JSON can carry it; NaN/Inf are kept as strings, not lost as null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if -(2**63) <= value < 2**64:
            return value
        return float(value) if abs(value) < 2**1023 else str(value)  # beyond JSON's (orjson's) 64-bit ints
    x = float(value)
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def log_fields(record: logging.LogRecord) -> tuple[Any, Any, str | None]:
    """A record's ``(msg, args, exception text)`` as queued: the arguments formatted now only when
    one could change before the export thread runs (exact type checks: ``isinstance`` against
    typing/abc classes costs microseconds), the exception's traceback as text."""
    msg, args = record.msg, record.args
    if args and (type(args) is not tuple or not _IMMUTABLE.issuperset(map(type, args))):
        try:
            msg, args = record.getMessage(), None
        except Exception as exc_:  # noqa: BLE001 - written as the export thread writes a bad format
            msg, args = f"{str(msg)!r} % {args!r} (format error: {exc_})", None
    exc = record.exc_text
    if record.exc_info and record.exc_info[0] is not None and not exc:
        exc = "".join(traceback.format_exception(*record.exc_info))  # rare: an exception is logged
    return msg, args, exc


def prepare_metric_values(values: dict[str, Any]) -> None:
    """Tensors in ``values`` (the caller's fresh ``**kwargs`` dict: ours to change) made safe to queue.

    On the CPU a tensor's value is read now (no device to wait for; the export thread would pay more
    for it later, and the tensor could change in place meanwhile). Elsewhere it is read by the export
    thread, so keep the value, not its autograd graph: ``.data``, the same storage like ``detach()``
    but without the dispatcher (~3 µs in a cold training step, not 6).
    """
    for k, v in values.items():
        if type(v) in _PLAIN_VALUES:
            continue
        if getattr(v, "is_cpu", False):
            try:
                values[k] = v.item()
                continue
            except (RuntimeError, ValueError):  # not one element: the export thread writes it as text
                pass
        if getattr(v, "requires_grad", False):
            values[k] = v.data


class Span:
    """A span context manager: ``with rec.span("forward", "phase"):``.

    Reusable objects with ``__slots__`` instead of ``contextlib.contextmanager``
    because a generator-based manager costs several microseconds more per use.
    """

    __slots__ = ("_rec", "name", "cat", "attrs", "step", "span_id", "parent_id", "start", "_stack")
    span_id: int
    parent_id: int | None
    start: int
    _stack: list[Span]

    def __init__(self, rec: Recorder, name: str, cat: str, step: int | None, attrs: dict[str, Any] | None) -> None:
        self._rec = rec
        self.name = name
        self.cat = cat
        self.step = step
        self.attrs = attrs
        # span_id, parent_id, start and _stack are set by __enter__ (each store here costs in a cold step)

    def __enter__(self) -> Span:
        rec = self._rec
        self._stack = stack = rec.main_stack if get_ident() == rec.main_ident else rec.stack()
        self.parent_id = stack[-1].span_id if stack else rec.root_span_id
        self.span_id = getrandbits(64) or 1
        if self.step is None:
            self.step = rec.step
        elif self.cat == _STEP and type(self.step) is int:  # an odd step is written on its span, not carried
            rec.step = self.step
        stack.append(self)
        self.start = time_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        end = time_ns()
        rec = self._rec
        stack = self._stack
        if stack and stack[-1] is self:
            stack.pop()
        elif self in stack:  # exited out of order (a generator span); keep the stack sane
            stack.remove(self)
        attrs = self.attrs
        if exc_type is not None:
            attrs = dict(attrs or ())
            attrs["error"] = f"{exc_type.__name__}: {exc}"
        item = (_SPAN, self.span_id, self.parent_id, self.name, self.cat, self.start, end, self.step, attrs)
        q = rec.queue
        if q is not None and len(q) < rec.queue_room:
            q.append(item)  # what emit does at this length, without its call (BatchWorker.direct_queue)
        else:
            rec.emit(item)
        rec.last_progress_ns = end
        if self.cat == _STEP:
            for hook in rec.step_end_hooks:
                hook(self.step)


class LogRecordFn(Protocol):
    """``log_record(record, progress=True)``: a stdlib record queued as a log event."""

    def __call__(self, record: logging.LogRecord, progress: bool = True) -> None: ...


NewSpan = Callable[[str, str, int | None, dict[str, Any] | None], AbstractContextManager[Any]]
"""``new_span(name, cat, step, attrs)``: the span the package's ``step()``/``phase()``/``span()`` enter."""


class TraceRecorder(Protocol):
    """What tracing uses of a recorder: :class:`Recorder` (Python) and ``_native.NativeRecorder`` (compiled).

    ``Tracing``, the logging and OpenTelemetry bridges, the heartbeat thread and the torch hooks call
    these and nothing else, so either recorder serves them without asking which one it is. Members
    the training thread calls (``new_span``, ``log_record``, ``metrics``, ``emit``…) may be plain
    attributes holding a compiled function: that is what keeps a call one C call.
    """

    identity: Identity
    step_end_hooks: list[Callable[[int | None], None]]
    """Called with the step at each step span's end (the memory hook)."""
    step: int | None
    """The current training step, as the last step span set it."""
    last_progress_ns: int
    """When the training thread last did something (a span's end, a log record): the stall clock."""
    root_span_id: int | None
    """The parent of top-level spans (the job's root span)."""
    new_span: NewSpan
    emit: Callable[[tuple[Any, ...]], None]
    """Queue an item (a tuple of the layouts in this module's docstring)."""

    @property
    def in_collective(self) -> tuple[str, str, int, int, int] | None:
        """``(op, group, seq, t0_ns, bytes)`` of the collective the training thread is in, for heartbeats."""

    @property
    def pending(self) -> int:
        """Events queued in the recorder itself and not yet taken by the worker (its own queue is counted there)."""

    def log_record(self, record: logging.LogRecord, progress: bool = True) -> None: ...

    def metrics(self, step: int | None, values: dict[str, Any], /) -> None:
        """``values``: the caller's fresh ``**kwargs`` dict, the recorder's to keep."""

    def heartbeat(self, attrs: dict[str, Any]) -> None: ...

    def current_span_id(self) -> int | None: ...

    def current_step_span_id(self) -> int | None: ...

    def top(self) -> tuple[str, str, int] | None:
        """The main thread's innermost span as ``(name, cat, start_ns)``; read by the heartbeat thread."""

    def span(self, name: str, cat: str = SpanCategory.USER, step: int | None = None,
             **attrs: Any) -> AbstractContextManager[Any]: ...

    def encode_batch(self, items: list[tuple[Any, ...]]) -> list[bytes]: ...

    def bind(self, worker: BatchWorker[tuple[Any, ...]]) -> None:
        """Queue on ``worker`` from now on."""

    def set_identity(self, identity: Identity) -> None:
        """A forked child's identity: every line written from now on carries it."""

    def entry_points(self) -> dict[str, Callable[..., Any]]:
        """Callables that stand in for the package's ``step``/``phase``/``span``/``log_metrics`` while tracing runs."""

    def retire(self, null_span: Any) -> None:
        """Tracing stopped: the entry points a script may still hold return ``null_span`` from now on."""

    def wrap_collective(self, fn: Callable[..., Any], op: str, describe: Callable[[Any], tuple[str, int]],
                        group_type: Any, payload_bytes: Callable[[Any], int]) -> Callable[..., Any]:
        """``fn`` (a ``torch.distributed`` collective named ``op``) recorded as a span on every call.

        ``describe(group)`` gives a process group's ``(name, size)``, asked once per group;
        ``group_type`` is what a positional process group argument is an instance of;
        ``payload_bytes(obj)`` sizes a payload without ``nbytes`` of its own (a list of tensors).
        """

    def sample_rss(self, interval_s: float, page_size: int) -> bool:
        """Read host RSS at step ends, at most once per ``interval_s``; False where the recorder cannot
        (the memory hook reads it then)."""


class LineEncoder:
    """The export thread's half of a recorder: this process's identity block, and queued items → event lines.

    Both recorders are one: the compiled one hands what it cannot write itself to :meth:`encode_batch`.
    """

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.step_end_hooks: list[Callable[[int | None], None]] = []
        self._strings: dict[str, bytes] = {}
        self._names: dict[tuple[str, str], bytes] = {}  # a span's name and category, encoded once
        self._set_base(identity)

    def _set_base(self, identity: Identity) -> None:
        block = identity_block(job=identity.job_id, trace_id=identity.trace_id, rank=identity.rank,
                               local_rank=identity.local_rank, world=identity.world_size, node=identity.node,
                               pid=identity.pid)
        self._base: dict[str, Any] = block.fields
        self._base_json = block.json  # the identity fields, encoded once for every line

    def set_identity(self, identity: Identity) -> None:
        """A forked child's identity (its own pid): every line written from now on carries it."""
        self.identity = identity
        self._set_base(identity)

    # ---- export thread ------------------------------------------------------------------
    def to_dict(self, item: tuple[Any, ...]) -> dict[str, Any]:
        if item[0] == _COLLECTIVE:
            item = _as_span(item)
        tag = item[0]
        if tag == _SPAN:
            _, sid, parent, name, cat, start, end, step, attrs = item
            d: dict[str, Any] = {"ts": end, "kind": Kind.SPAN, **self._base, "span_id": _hex64(sid)}
            if parent is not None:
                d["parent_id"] = _hex64(parent)
            d.update(name=name, cat=cat, start=start, dur=end - start)
        elif tag == _LOG:
            _, created, level, logger, msg, args, exc, sid, step = item
            d = {"ts": int(created * 1e9), "kind": Kind.LOG, **self._base}
            if sid is not None:
                d["span_id"] = _hex64(sid)
            msg = msg if type(msg) is str else str(msg)
            if args:
                try:
                    msg = msg % args
                except Exception as exc_:  # noqa: BLE001 - a bad format string is still evidence
                    msg = f"{msg!r} % {args!r} (format error: {exc_})"
            d.update(level=level, logger=logger, msg=msg)
            if exc:
                d["exc"] = exc
            attrs = None
        elif tag == _METRIC:
            _, ts, step, values, sid = item
            d = {"ts": ts, "kind": Kind.METRIC, **self._base}
            if sid is not None:
                d["span_id"] = _hex64(sid)
            metrics = {}
            for k, v in values.items():
                try:
                    metrics[k] = _number(v)
                except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor without a readable value
                    metrics[k] = str(v)
            d["metrics"] = metrics
            attrs = None
        else:
            _, ts, step, attrs = item
            d = {"ts": ts, "kind": Kind.HEARTBEAT, **self._base}
        if step is not None:
            d["step"] = step
        if attrs:
            d["attrs"] = attrs
        return d

    def encode_batch(self, items: list[tuple[Any, ...]]) -> list[bytes]:
        """Canonical lines for a batch; log records and spans (nearly all items) skip the dict.

        Those two and metric points are spliced from pre-encoded parts (the identity fields are encoded
        once, logger/level/span names once per distinct value), which halves the export
        thread's CPU per record and so the GIL time it takes from training. The output
        is byte-for-byte what ``encode(to_dict(item))`` gives (tested); anything
        unusual (a non-int step, odd attributes) takes that general path. One item that
        cannot be encoded never costs its batch: it becomes a log event saying so.
        """
        out: list[bytes] = []
        append = out.append
        log, span, metric, general = self._encode_log, self._encode_span, self._encode_metric, self._encode_general
        for item in items:
            tag = item[0]
            if tag == _COLLECTIVE:
                tag, item = _SPAN, _as_span(item)
            line = log(item) if tag == _LOG else span(item) if tag == _SPAN else metric(item) if tag == _METRIC else None
            append(line if line is not None else general(item))
        return out

    def _encode_general(self, item: tuple[Any, ...]) -> bytes:
        try:
            d = self.to_dict(item)
            try:
                return encode_lines([d])[0]
            except TypeError:  # e.g. a lone surrogate from a surrogateescape-decoded file name
                return encode_lines([_scrubbed(d)])[0]
        except Exception as exc:  # noqa: BLE001 - say so in the store rather than lose the batch
            return encode_lines([_scrubbed({
                "ts": time_ns(), "kind": Kind.LOG, **self._base, "level": "ERROR",
                "logger": "jobtrace.export", "msg": f"an event could not be encoded ({exc}): {item!r:.2000}"})])[0]

    def _encode_log(self, item: tuple[Any, ...]) -> bytes | None:
        _, created, level, logger, msg, args, exc, sid, step = item
        if (type(msg) is not str or type(created) is not float or (step is not None and type(step) is not int)
                or (sid is not None and type(sid) is not int)):
            return None
        if args:
            try:
                msg = msg % args
            except Exception:  # noqa: BLE001 - the general path writes the format error
                return None
        try:
            m = _DUMPS(msg)
            x = b"" if not exc else _EXC_PART % _DUMPS(exc)
            level_json, logger_json = self._cached(level), self._cached(logger)
        except TypeError:  # as in _encode_span
            return None
        return _LOG_LINE % (
            int(created * 1e9), self._base_json, b"" if sid is None else _SPAN_ID_PART % sid,
            level_json, logger_json, m, x, b"" if step is None else _STEP_PART % step)

    def _encode_span(self, item: tuple[Any, ...]) -> bytes | None:
        _, sid, parent, name, cat, start, end, step, attrs = item
        if (type(sid) is not int or type(start) is not int or type(end) is not int or type(name) is not str
                or (step is not None and type(step) is not int) or (parent is not None and type(parent) is not int)):
            return None
        try:
            a = b"" if not attrs else _ATTRS_PART % _DUMPS(attrs, default=json_default, option=_NUMPY)
            named = self._names.get((name, cat))
            if named is None:
                named = _NAMED_PART % (self._cached(name), self._cached(cat))
                if len(self._names) < 4096:
                    self._names[(name, cat)] = named
        except TypeError:  # not valid UTF-8 (a lone surrogate), say: the general path escapes it
            return None
        return _SPAN_LINE % (
            end, self._base_json, sid, b"" if parent is None else _PARENT_PART % parent,
            named, start, end - start, b"" if step is None else _STEP_PART % step, a)

    def _encode_metric(self, item: tuple[Any, ...]) -> bytes | None:
        _, ts, step, values, sid = item
        if (type(ts) is not int or (step is not None and type(step) is not int)
                or (sid is not None and type(sid) is not int)):
            return None
        metrics: dict[str, float | int | str] = {}
        for k, v in values.items():
            if type(k) is not str:
                return None
            if type(v) is float and math.isfinite(v) or type(v) is int:
                metrics[k] = v
                continue
            try:
                metrics[k] = _number(v)  # a tensor's value, NaN as text
            except (TypeError, ValueError, RuntimeError):
                return None  # the general path writes it as text
        try:
            m = _DUMPS(metrics)
        except TypeError:
            return None
        return _METRIC_LINE % (
            ts, self._base_json, b"" if sid is None else _SPAN_ID_PART % sid, m,
            b"" if step is None else _STEP_PART % step)

    def _cached(self, value: str) -> bytes:
        """JSON of a string that repeats (level, logger, span name), encoded once; bounded."""
        enc = self._strings.get(value)
        if enc is None:
            enc = _DUMPS(value)  # TypeError (surrogates) sends the item to the general path
            if len(self._strings) < 4096:
                self._strings[value] = enc
        return enc


class Recorder(LineEncoder):
    """Turns calls on the training thread into queued items (a :class:`TraceRecorder` in Python)."""

    pending = 0
    """Items wait on the worker's queue, which counts them itself."""

    def __init__(self, identity: Identity, emit: Callable[[tuple[Any, ...]], None] | None = None) -> None:
        super().__init__(identity)
        self.emit: Callable[[tuple[Any, ...]], None] = emit or (lambda item: None)
        # Set by bind(): the export queue that spans append to directly while it is short.
        self.queue: deque[tuple[Any, ...]] | None = None
        self.queue_room = 0
        self.step: int | None = None
        ident = self.identity
        self.root_span_id: int | None = int(ident.parent_span_id, 16) if ident.parent_span_id else None
        self.last_progress_ns = time_ns()
        # What the rank is blocked in, for heartbeats: (op, group, seq, t0, bytes) or None.
        self.in_collective: tuple[str, str, int, int, int] | None = None
        self._local = threading.local()
        self.main_stack: list[Span] = []
        self._local.stack = self.main_stack
        self.main_ident = threading.get_ident()
        # Per process group ``[name, size, last seq]``, shared by all ops: the sequence number counts per
        # group, across ops (the compiled recorder keeps the same table).
        self._groups: dict[int | None, list[Any]] = {}
        # ``new_span(name, cat, step, attrs)``: what the module's ``step()``/``phase()`` call, one call deep.
        self.new_span: NewSpan = functools.partial(Span, self)

    def bind(self, worker: BatchWorker[tuple[Any, ...]]) -> None:
        """Queue items on ``worker``: through ``emit``, or (spans, log records) straight onto its queue."""
        self.emit = worker.emit
        self.queue, self.queue_room = worker.direct_queue()

    def entry_points(self) -> dict[str, Callable[..., Any]]:
        """Callables that stand in for the package's ``step``/``phase``/``span``/``log_metrics`` while
        this recorder traces; none here, where those functions are already the shortest Python path."""
        return {}

    def retire(self, null_span: Any) -> None:
        """Tracing stopped: the entry points a script may still hold return ``null_span`` from now on."""

    def sample_rss(self, interval_s: float, page_size: int) -> bool:
        """Not here: the memory hook reads RSS (a Python call at step ends)."""
        return False

    # ---- training thread ------------------------------------------------------------
    def stack(self) -> list[Span]:
        try:
            return self._local.stack  # type: ignore[no-any-return]
        except AttributeError:
            self._local.stack = []
            return self._local.stack  # type: ignore[no-any-return]

    def current_span_id(self) -> int | None:
        stack = self.main_stack if get_ident() == self.main_ident else self.stack()
        return stack[-1].span_id if stack else self.root_span_id

    def span(self, name: str, cat: str = SpanCategory.USER, step: int | None = None, **attrs: Any) -> AbstractContextManager[Any]:
        """``with rec.span("load", "user", key=value):``; a :class:`Span` (or the compiled recorder's)."""
        return self.new_span(name, cat, step, attrs or None)

    def current_step_span_id(self) -> int | None:
        """The innermost step span of the calling thread (``otel_context="step"``)."""
        stack = self.main_stack if get_ident() == self.main_ident else self.stack()
        for s in reversed(stack):
            if s.cat == _STEP:
                return s.span_id
        return self.root_span_id

    def top(self) -> tuple[str, str, int] | None:
        """The main thread's innermost span as ``(name, cat, start_ns)``; read by the heartbeat thread."""
        try:
            s = self.main_stack[-1]
            return (s.name, s.cat, s.start)
        except (IndexError, AttributeError):  # popped meanwhile, or not entered yet
            return None

    def log_record(self, record: logging.LogRecord, progress: bool = True) -> None:
        # The hottest path of all (every logging call of the process): one thread-id
        # check picks the main thread's stack and progress clock, and the common record
        # (immutable arguments, no exception) goes straight to the queue.
        if record.name.startswith("jobtrace.export"):
            return  # the exporter's own warnings must not loop back into its queue
        msg, args, exc = record.msg, record.args, record.exc_text
        if (args and (type(args) is not tuple or not _IMMUTABLE.issuperset(map(type, args)))) or record.exc_info:
            msg, args, exc = log_fields(record)  # rare: arguments that could change, or an exception
        if get_ident() == self.main_ident:
            stack = self.main_stack
            if progress:
                self.last_progress_ns = time_ns()
        else:
            stack = self.stack()
        item = (_LOG, record.created, record.levelname, record.name, msg, args, exc,
                stack[-1].span_id if stack else self.root_span_id, self.step)
        q = self.queue
        if q is not None and len(q) < self.queue_room:
            q.append(item)  # as in Span.__exit__
        else:
            self.emit(item)

    def metrics(self, step: int | None, values: dict[str, Any]) -> None:
        """``values`` is the caller's fresh ``**kwargs`` dict, queued as it is unless it holds tensors."""
        if not _PLAIN_VALUES.issuperset(map(type, values.values())):
            prepare_metric_values(values)
        stack = self.main_stack if get_ident() == self.main_ident else self.stack()
        item = (_METRIC, time_ns(), self.step if step is None else step, values,
                stack[-1].span_id if stack else self.root_span_id)
        q = self.queue
        if q is not None and len(q) < self.queue_room:
            q.append(item)  # as in Span.__exit__
        else:
            self.emit(item)

    def heartbeat(self, attrs: dict[str, Any]) -> None:
        self.emit((_BEAT, time_ns(), self.step, attrs))

    def wrap_collective(self, fn: Callable[..., Any], op: str, describe: Callable[[Any], tuple[str, int]],
                        group_type: Any, payload_bytes: Callable[[Any], int]) -> Callable[..., Any]:
        """``fn`` recorded as a collective span on every call (see :meth:`TraceRecorder.wrap_collective`).

        The wrapper runs once per collective inside the training step, where every line costs
        about a microsecond (cold caches after the step's kernels): it does one dict lookup,
        reads the payload size, and queues a flat tuple; the export thread builds the span's
        attributes from it (:func:`_as_span`).
        """
        rec, groups = self, self._groups

        def new_group(group: Any, key: int | None) -> list[Any]:
            state = groups[key] = [*describe(group), 0]
            return state

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group") if kwargs else None
            if group is None and len(args) > 1:
                group = next((a for a in args[1:] if isinstance(a, group_type)), None)
            key = id(group) if group is not None else None
            state = groups.get(key) or new_group(group, key)
            seq = state[2] = state[2] + 1
            first = args[0] if args else kwargs.get("tensor", kwargs.get("tensor_list"))
            payload = getattr(first, "nbytes", None)  # a tensor's; lists of tensors are summed
            if type(payload) is not int:
                payload = payload_bytes(first)
            stack = rec.main_stack if get_ident() == rec.main_ident else rec.stack()
            parent = stack[-1].span_id if stack else rec.root_span_id
            step = rec.step
            extra = _ASYNC if kwargs and kwargs.get("async_op") else None
            t0 = time_ns()
            rec.in_collective = (op, state[0], seq, t0, payload)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                extra = {**(extra or {}), "error": f"{type(exc).__name__}: {exc}"}
                raise
            finally:
                t1 = time_ns()
                rec.in_collective = None
                rec.emit((_COLLECTIVE, getrandbits(64) or 1, parent, op, t0, t1, step, state, seq, payload, extra))
                rec.last_progress_ns = t1

        wrapper.__jobtrace_wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

