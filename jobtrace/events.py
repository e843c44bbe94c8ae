"""The one event model shared by instrumentation, shippers, parsers and queries.

Every piece of evidence jobtrace handles is an :class:`Event`: a log record, a span
(step, phase, collective or user span), a metric point or a heartbeat. Each event
carries the job's identity (job id, trace id, rank, local rank, world size, node,
pid) so that a single line, read on its own from any store, says where it came from.

The canonical encoding is one JSON object per line (``encode`` / ``decode``) with
short, flat, stable keys; it is what the embedded store writes, what Loki lines
contain and what the Elasticsearch mapping is derived from. Keys with a ``None``
value are left out, so a log line does not pay for span fields.

Timestamps are integer nanoseconds since the Unix epoch (UTC) because every backend
we target accepts them losslessly and step times are sub-millisecond.

:data:`FIELDS` is the one table of those keys, in the order every line writes them: the
typed columns (:data:`COLUMNS`), the identity block (:func:`identity_block`), the key
order of :meth:`Event.to_dict` and the recorder's pre-built line templates are read
from it, so a new key is one new row (and the :class:`Event` attribute it fills).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = [
    "SCHEMA_VERSION",
    "FIELDS",
    "IDENTITY_KEYS",
    "Event",
    "Field",
    "IdentityBlock",
    "Kind",
    "SpanCategory",
    "PHASES",
    "COLLECTIVE_OPS",
    "DL_METRICS",
    "DL_IDENTITY",
    "decode",
    "encode",
    "encode_lines",
    "json_default",
    "DecodeError",
    "COLUMNS",
    "identity_block",
]

SCHEMA_VERSION: Final = 1
"""Bumped whenever a key changes meaning; readers refuse versions newer than theirs."""

class Kind:
    """Values of ``Event.kind``. Plain strings (not an Enum) so that decoding stays free."""

    LOG: Final = "log"
    SPAN: Final = "span"
    METRIC: Final = "metric"
    HEARTBEAT: Final = "heartbeat"
    ALL: Final = frozenset({"log", "span", "metric", "heartbeat"})


class SpanCategory:
    """Values of ``Event.cat`` for spans: what the analysis does with the time."""

    STEP: Final = "step"
    PHASE: Final = "phase"
    COLLECTIVE: Final = "collective"
    USER: Final = "user"


@dataclass(frozen=True, slots=True)
class Field:
    """One key of the canonical encoding: one row of :data:`FIELDS`."""

    key: str
    column: str
    """Its DuckDB column type in the ``events`` table."""
    kinds: frozenset[str]
    """The kinds of event that may carry it (a writer may leave an optional key out)."""
    meaning: str
    identity: bool = False
    """Part of the identity block every line of a process carries, encoded once per process."""


_ALL_KINDS: Final = Kind.ALL
_SPAN_ONLY: Final = frozenset({Kind.SPAN})
_LOG_ONLY: Final = frozenset({Kind.LOG})

FIELDS: Final[tuple[Field, ...]] = (
    Field("ts", "BIGINT", _ALL_KINDS, "when it happened, ns since the Unix epoch (UTC); for a span, its end"),
    Field("kind", "VARCHAR", _ALL_KINDS, "log, span, metric or heartbeat (Kind)"),
    Field("job", "VARCHAR", _ALL_KINDS, "the job id, the same on every rank", identity=True),
    Field("trace_id", "VARCHAR", _ALL_KINDS, "the job's TraceID (32 hex digits), derived from the job id", identity=True),
    Field("rank", "INTEGER", _ALL_KINDS, "the global rank", identity=True),
    Field("local_rank", "INTEGER", _ALL_KINDS, "the rank on its node", identity=True),
    Field("world", "INTEGER", _ALL_KINDS, "the job's world size", identity=True),
    Field("node", "VARCHAR", _ALL_KINDS, "the host name", identity=True),
    Field("pid", "BIGINT", _ALL_KINDS, "the process (a forked child writes its own)", identity=True),
    Field("v", "INTEGER", _ALL_KINDS, "SCHEMA_VERSION of the writer", identity=True),
    Field("rank_est", "BOOLEAN", _ALL_KINDS,
          "ingest: true when the log never said the writer's rank (the stream was numbered in order of appearance)"),
    Field("span_id", "VARCHAR", frozenset({Kind.LOG, Kind.SPAN, Kind.METRIC}),
          "16 hex digits: the span itself for a span, the active span for a log record or metric point"),
    Field("parent_id", "VARCHAR", _SPAN_ONLY, "the enclosing span (a step's: the job's root span)"),
    Field("name", "VARCHAR", _SPAN_ONLY, "the span's name (a phase, a collective's op, a user span's name)"),
    Field("cat", "VARCHAR", _SPAN_ONLY, "step, phase, collective or user (SpanCategory)"),
    Field("start", "BIGINT", _SPAN_ONLY, "the span's start, ns since the Unix epoch"),
    Field("dur", "BIGINT", _SPAN_ONLY, "the span's duration in ns"),
    Field("level", "VARCHAR", _LOG_ONLY, "the logging level's name"),
    Field("logger", "VARCHAR", _LOG_ONLY, "the logger's name"),
    Field("msg", "VARCHAR", _LOG_ONLY, "the formatted message"),
    Field("exc", "VARCHAR", _LOG_ONLY, "an exception's traceback, or a stalled main thread's stack"),
    Field("metrics", "JSON", frozenset({Kind.METRIC}), "{name: value}; NaN and infinities as strings"),
    Field("step", "BIGINT", _ALL_KINDS, "the training step it belongs to"),
    Field("attrs", "JSON", _ALL_KINDS,
          "more about it: a collective's op, group, group_size, seq, bytes; a heartbeat's in_span, in_op…"),
    Field("est", "BOOLEAN", _ALL_KINDS, "ingest: true when ts was estimated from neighbouring lines"),
)
"""Every key of the canonical encoding, in the order lines write them.

The order is the one the recorders write (the Python encoder builds its templates from it; the
compiled recorder, ``jobtrace_native``, writes the same bytes and is tested against it): ``ts`` and
``kind`` first, so a line says what it is at its start, then the identity block, then what each
kind adds. The identity fields are one run, so that run can be spliced in pre-encoded.
"""

COLUMNS: Final[dict[str, str]] = {f.key: f.column for f in FIELDS}
"""Every key of the canonical encoding as a typed column: the schema every columnar reader and writer uses."""

IDENTITY_KEYS: Final[tuple[str, ...]] = tuple(f.key for f in FIELDS if f.identity)
"""The keys of the identity block, in order: ``job, trace_id, rank, local_rank, world, node, pid, v``."""


DL_METRICS: Final = {"loss": "dl.loss", "grad_norm": "dl.grad_norm", "lr": "dl.learning_rate",
                     "learning_rate": "dl.learning_rate", "tflops": "dl.throughput_tflops",
                     "tokens_per_sec": "dl.throughput_tokens_per_sec", "batch_size": "dl.batch_size"}
"""jobtrace's metric names -> the ``dl.*`` span attributes NVIDIA's NeMo Lens and NVRx give them (their
semconv): written on our OTLP spans, read back from theirs."""

DL_IDENTITY: Final = {"job": ("nemo.run.id", "nv.dl.job.uuid", "jobtrace.job.id"),
                      "rank": ("dl.rank", "nv.dl.rank", "jobtrace.rank"),
                      "local_rank": ("dl.local_rank", "nv.dl.local_rank", "jobtrace.local_rank"),
                      "world": ("dl.world_size", "nv.dl.world_size", "jobtrace.world_size"),
                      "node": ("host.name", "k8s.node.name")}
"""Our identity keys -> the OTel resource attributes that carry them: NeMo Lens' current names first, then
NVRx's ``nv.dl.*``, then ours (an OTLP reader takes the first present)."""


PHASES: Final = ("data", "forward", "backward", "optimizer", "checkpoint", "eval")
"""Phase names the analysis knows; any other name is accepted and counted as compute."""

COLLECTIVE_OPS: Final = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
)


class DecodeError(ValueError):
    """A line is not a canonical event (torn, corrupt or from a newer schema)."""


@dataclass(slots=True)
class Event:
    """One piece of evidence from one rank.

    Fields that do not apply to a kind stay ``None`` and are not encoded.
    ``ts`` is when the event happened (for a span: its end), ``start``/``dur``
    describe a span's extent, ``span_id`` is the span itself for a span event and the
    active span for any other event. Each attribute is a row of :data:`FIELDS`, which says what it
    means and orders the encoding (the attributes keep their older order for positional callers).
    """

    ts: int
    kind: str
    job: str
    trace_id: str
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    node: str = ""
    pid: int = 0
    # ingest: True when ``rank`` is a number given in order of appearance, not read from the log
    rank_est: bool | None = None
    span_id: str | None = None
    parent_id: str | None = None
    step: int | None = None
    # log
    level: str | None = None
    logger: str | None = None
    msg: str | None = None
    exc: str | None = None
    # span
    name: str | None = None
    cat: str | None = None
    start: int | None = None
    dur: int | None = None
    # collective spans: op, group, group_size, seq, bytes, async
    # heartbeat: in_span, in_cat, in_op, in_seq, span_age_ns
    attrs: dict[str, Any] | None = None
    # metric points
    metrics: dict[str, float] | None = None
    # ingest: True when ``ts`` was estimated from neighbouring lines
    est: bool | None = None
    v: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The canonical flat mapping, without the keys that are ``None``."""
        return {k: v for k, v in _astuple_items(self) if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Event:
        try:
            version = int(d.get("v", SCHEMA_VERSION))
            if version > SCHEMA_VERSION:
                raise DecodeError(f"schema version {version} is newer than {SCHEMA_VERSION}")
            kw = {k: d[k] for k in _FIELD_NAMES if k in d}
            return cls(**kw)
        except TypeError as exc:  # a required key is missing
            raise DecodeError(str(exc)) from exc


_FIELD_NAMES: Final = tuple(f.key for f in FIELDS)
"""``Event``'s attributes in the table's order: the order of :meth:`Event.to_dict` and so of ``encode``."""

_unmatched = {f.name for f in dataclasses.fields(Event)} ^ set(_FIELD_NAMES)
if _unmatched:  # a row of FIELDS without its attribute, or an attribute without its row
    raise TypeError(f"Event's attributes and FIELDS differ: {sorted(_unmatched)}")


def _astuple_items(ev: Event) -> Iterator[tuple[str, Any]]:
    for name in _FIELD_NAMES:
        yield name, getattr(ev, name)


_DUMPS = orjson.dumps
_OPTS: Final = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True, slots=True)
class IdentityBlock:
    """The identity fields that every line of one process carries, made once per process."""

    fields: dict[str, Any]
    """``{job, trace_id, rank, local_rank, world, node, pid, v}`` in :data:`IDENTITY_KEYS` order (``**`` it into an event dict)."""
    json: bytes
    """The same fields as JSON without the braces (``"job":…,"v":1``), to splice into a line between ``kind`` and the rest."""


def identity_block(*, job: str, trace_id: str, rank: int, local_rank: int, world: int, node: str, pid: int) -> IdentityBlock:
    """The identity block of a process, for the writers that encode it once (the recorder, the Loki logging handler)."""
    given = {"job": job, "trace_id": trace_id, "rank": rank, "local_rank": local_rank, "world": world, "node": node,
             "pid": pid, "v": SCHEMA_VERSION}
    fields = {k: given[k] for k in IDENTITY_KEYS}
    return IdentityBlock(fields, _DUMPS(fields)[1:-1])


def json_default(obj: Any) -> Any:
    """Serialise what orjson cannot: torch scalars, sets, arbitrary objects as text."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # noqa: BLE001, S110 - a non-scalar tensor falls back to text
            pass
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def encode(ev: Event | Mapping[str, Any]) -> bytes:
    """One canonical JSON line, newline-terminated.

    Mappings are accepted as-is so the export thread can encode the plain dicts it
    builds without going through the dataclass.
    """
    d = ev.to_dict() if isinstance(ev, Event) else ev
    return _DUMPS(d, default=json_default, option=_OPTS)


def encode_lines(dicts: Iterable[Mapping[str, Any]]) -> list[bytes]:
    """Canonical lines for a batch of event dicts, to be kept (e.g. until a sink writes them).

    Measured: keeping tens of thousands of the bytes objects orjson returns costs ~4 µs
    each (its over-allocated buffers are shrunk by ``realloc`` outside Python's small-object
    allocator), while a detour through ``str`` costs ~0.3 µs and yields exact-size bytes.
    """
    dumps, opts, default = _DUMPS, _OPTS, json_default
    return [dumps(d, default=default, option=opts).decode().encode() for d in dicts]


def decode(line: bytes | str) -> Event:
    """Parse one canonical line; raises :class:`DecodeError` for anything else."""
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
    if not isinstance(d, dict) or d.get("kind") not in Kind.ALL:
        raise DecodeError("not a jobtrace event")
    return Event.from_dict(d)
