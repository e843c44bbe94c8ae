"""The canonical event as an Elasticsearch/OpenSearch document (Elastic Common Schema + ``jobtrace.*``).

One mapping, both directions, so that what ``trace-job`` reads back from a cluster is
the canonical event that was shipped (property-tested in ``tests/elasticsearch``):

====================  ==========================  ===========================================
canonical key         document field              type (see ``kibana/templates``)
====================  ==========================  ===========================================
``ts``                ``@timestamp``              date_nanos (RFC 3339, 9 fraction digits)
``kind``              ``jobtrace.kind``           keyword: log, span, metric, heartbeat
``job``               ``jobtrace.job``            keyword
``trace_id``          ``trace.id``                keyword (ECS)
``rank``              ``jobtrace.rank``           integer
``local_rank``        ``jobtrace.local_rank``     integer
``world``             ``jobtrace.world_size``     integer
``node``              ``host.name``               keyword (ECS)
``pid``               ``process.pid``             long (ECS)
``span_id``           ``span.id``                 keyword (ECS): the span, or the active span
``parent_id``         ``jobtrace.parent_id``      keyword
``step``              ``jobtrace.step``           long
``level``             ``log.level``               keyword (ECS)
``logger``            ``log.logger``              keyword (ECS)
``msg``               ``message``                 text (ECS)
``exc``               ``error.stack_trace``       text (ECS)
``name`` / ``cat``    ``jobtrace.span.name`` /    keyword
                      ``jobtrace.span.category``
``start``             ``event.start``             date_nanos (ECS)
``dur``               ``event.duration``          long, nanoseconds (ECS)
``est``               ``jobtrace.ts_estimated``   boolean
``v``                 ``jobtrace.schema_version`` short
``attrs``             collectives: ``jobtrace.collective.*`` (op, group, group_size, seq, bytes,
                      async, error); heartbeats: ``jobtrace.heartbeat.*`` (progress_age_ms,
                      in_span, in_cat, span_age_ms, in_op, in_group, in_seq, op_age_ms); any
                      other attribute, or one of an unexpected type: ``jobtrace.attrs``
                      (stored, not indexed)
``metrics``           finite numbers: ``jobtrace.metrics.<name>`` (double; ``*_bytes`` long);
                      NaN/Infinity/-Infinity: ``jobtrace.nonfinite.<name>`` = that word
                      (keyword), because numeric fields refuse them; other text:
                      ``jobtrace.metrics_text.<name>`` (keyword)
====================  ==========================  ===========================================

Derived fields that are written but not read back: ``event.id`` (the document id),
``event.kind``, ``event.dataset``, ``event.outcome`` (``failure`` for a failed
collective), ``jobtrace.phase`` (the phase name of a phase span), ``service.name``,
``ecs.version`` and ``data_stream.*``. Keys the mapping does not know (a newer schema)
are kept in ``jobtrace.extra``; metric names that are not safe as field names (dots,
say) are indexed under a sanitised name and kept verbatim in ``jobtrace.raw.metrics``.

Which data stream an event goes to (``<type>-jobtrace-<namespace>``): logs and
heartbeats to ``logs`` (short retention), metric points and the per-step ``step``
spans to ``metrics`` (long retention: a year later loss, grad norm and per-rank step
time are still there), every other span to ``traces`` (short retention).

A rank's *pack* (``kind`` ``rollup``: its rollup as Parquet parts, see
:mod:`jobtrace.store._packs`) is not an event: :func:`pack_document` puts it in a data stream
of its own, ``metrics-jobtrace.rollup-<namespace>`` (:func:`rollup_stream_name`), which the
``<type>-jobtrace-*`` patterns the event readers search do not match, kept as long as the
metrics. :func:`from_pack_document` gives the record back.
"""

from __future__ import annotations

import base64
import calendar
import functools
import hashlib
import re
import time
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "DATASET",
    "ECS_VERSION",
    "PACK_FIELD",
    "ROLLUP_DATASET",
    "STREAM_TYPES",
    "constant_fields",
    "data_stream_name",
    "doc_id",
    "document_core",
    "from_document",
    "from_pack_document",
    "is_pack",
    "iso_ns",
    "pack_constant_fields",
    "pack_document",
    "parse_iso_ns",
    "rollup_stream_name",
    "stream_type",
    "to_document",
    "validate_namespace",
]

DATASET: Final = "jobtrace"
ECS_VERSION: Final = "8.11.0"
STREAM_TYPES: Final = ("logs", "metrics", "traces")

_NONFINITE: Final = frozenset({"NaN", "Infinity", "-Infinity"})
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_/:@+\-]{0,199}$")
_NAMESPACE = re.compile(r"^[a-z0-9_]{1,100}$")

# Attributes with a typed home, per kind of event: name -> accepted Python types.
_KW = (str, int, float)
COLLECTIVE_ATTRS: Final[dict[str, tuple[type, ...]]] = {
    "op": (str,), "group": _KW, "group_size": (int,), "seq": (int,), "bytes": (int,), "async": (bool,),
    "error": (str,),
}
HEARTBEAT_ATTRS: Final[dict[str, tuple[type, ...]]] = {
    "progress_age_ms": (int,), "in_span": (str,), "in_cat": (str,), "span_age_ms": (int,), "in_op": (str,),
    "in_group": _KW, "in_seq": (int,), "op_age_ms": (int,),
}

# canonical key -> (top-level object, field) for the plain one-to-one keys
_PLAIN: Final = (
    ("kind", "jobtrace", "kind"),
    ("job", "jobtrace", "job"),
    ("trace_id", "trace", "id"),
    ("rank", "jobtrace", "rank"),
    ("local_rank", "jobtrace", "local_rank"),
    ("world", "jobtrace", "world_size"),
    ("node", "host", "name"),
    ("pid", "process", "pid"),
    ("span_id", "span", "id"),
    ("parent_id", "jobtrace", "parent_id"),
    ("step", "jobtrace", "step"),
    ("level", "log", "level"),
    ("logger", "log", "logger"),
    ("exc", "error", "stack_trace"),
    ("dur", "event", "duration"),
    ("est", "jobtrace", "ts_estimated"),
    ("v", "jobtrace", "schema_version"),
)
_KNOWN: Final = frozenset({k for k, _, _ in _PLAIN} | {"ts", "msg", "name", "cat", "start", "attrs", "metrics"})
_EVENT_KIND: Final = {"log": "event", "span": "event", "metric": "metric", "heartbeat": "state"}


def validate_namespace(namespace: str) -> str:
    """A data stream namespace: lowercase letters, digits and ``_``, at most 100 characters (no ``-``)."""
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"namespace {namespace!r} must be 1-100 of a-z, 0-9 and _ (no '-': it separates "
                         "type-dataset-namespace in data stream names)")
    return namespace


def stream_type(event: Mapping[str, Any]) -> str:
    kind = event.get("kind")
    if kind == "metric":
        return "metrics"
    if kind == "span":
        return "metrics" if event.get("cat") == "step" else "traces"
    return "logs"


def data_stream_name(type_: str, namespace: str) -> str:
    return f"{type_}-{DATASET}-{namespace}"


ROLLUP_DATASET: Final = "jobtrace.rollup"
"""The dataset of the packs' data stream: ``metrics-jobtrace.rollup-<namespace>`` is not ``metrics-jobtrace-*``."""

PACK_KIND: Final = "rollup"
"""``kind`` of a pack record (``jobtrace.store.PACK_KIND``; repeated so this module imports no store)."""

PACK_FIELD: Final = "jobtrace_pack"
"""The document field holding a pack part's base64 Parquet (mapped ``binary``: stored, never indexed)."""


def is_pack(record: Mapping[str, Any]) -> bool:
    return record.get("kind") == PACK_KIND


def rollup_stream_name(namespace: str) -> str:
    """The data stream of the packs (any namespace with ``*``)."""
    return f"metrics-{ROLLUP_DATASET}-{namespace}"


def pack_constant_fields(namespace: str) -> dict[str, Any]:
    """The fields every pack document of one namespace shares (the encoder splices them in)."""
    return {"data_stream": {"type": "metrics", "dataset": ROLLUP_DATASET, "namespace": namespace}}


def pack_document(record: Mapping[str, Any], doc_id_: str | None = None) -> dict[str, Any]:
    """A pack record as a document, without :func:`pack_constant_fields`.

    The identity keys go where the events keep them in ``jobtrace.*`` (so one ``term`` on
    ``jobtrace.job`` finds both), the ``rollup`` object as it is, the Parquet part under
    :data:`PACK_FIELD`. Raises ``ValueError`` for a record without an integer ``ts``.
    """
    jt: dict[str, Any] = {"kind": PACK_KIND}
    for key in ("job", "rank", "node", "pid", "trace_id"):
        if record.get(key) is not None:
            jt[key] = record[key]
    roll = record.get("rollup")
    if isinstance(roll, Mapping):
        jt["rollup"] = dict(roll)
    doc: dict[str, Any] = {"@timestamp": iso_ns(record.get("ts")), "jobtrace": jt}  # type: ignore[arg-type]
    if doc_id_:
        doc["event"] = {"id": doc_id_}
    if record.get("parquet") is not None:
        doc[PACK_FIELD] = record["parquet"]
    return doc


def from_pack_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pack record :func:`pack_document` was given (what ``jobtrace.store.unpack`` reads)."""
    jt = doc.get("jobtrace") or {}
    out: dict[str, Any] = {"kind": PACK_KIND, "ts": parse_iso_ns(doc["@timestamp"])}
    for key in ("job", "rank", "node", "pid", "trace_id", "rollup"):
        if jt.get(key) is not None:
            out[key] = jt[key]
    if doc.get(PACK_FIELD) is not None:
        out["parquet"] = doc[PACK_FIELD]
    return out


def doc_id(line: bytes) -> str:
    """A deterministic id from the canonical line: a replayed line hits 409 instead of duplicating.

    120 bits of BLAKE2b: two distinct events would have to be byte-identical
    (same nanosecond, rank, pid, span, message) to share an id.
    """
    digest = hashlib.blake2b(line.rstrip(b"\n"), digest_size=15).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii")


@functools.lru_cache(maxsize=4096)
def _second_prefix(sec: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))


def iso_ns(ts: int) -> str:
    """Integer Unix nanoseconds as RFC 3339 UTC with nine fraction digits (what ``date_nanos`` keeps)."""
    if type(ts) is not int:
        raise ValueError(f"timestamp must be integer nanoseconds, not {type(ts).__name__}")
    sec, frac = divmod(ts, 1_000_000_000)
    return f"{_second_prefix(sec)}.{frac:09d}Z"


@functools.lru_cache(maxsize=4096)
def _timegm(prefix: str) -> int:
    return calendar.timegm(time.strptime(prefix, "%Y-%m-%dT%H:%M:%S"))


_ISO = re.compile(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?$")


def parse_iso_ns(value: Any) -> int:
    """The inverse of :func:`iso_ns`; also reads other RFC 3339 forms and epoch milliseconds."""
    if isinstance(value, str):
        if len(value) == 30 and value[19] == "." and value[29] == "Z":
            return _timegm(value[:19]) * 1_000_000_000 + int(value[20:29])
        m = _ISO.match(value)
        if not m:
            raise ValueError(f"not an RFC 3339 timestamp: {value!r}")
        sec = _timegm(f"{m.group(1)}T{m.group(2)}")
        frac = int((m.group(3) or "0").ljust(9, "0"))
        tz = m.group(4)
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            hh, mm = int(tz[1:3]), int(tz[-2:])
            sec -= sign * (hh * 3600 + mm * 60)
        return sec * 1_000_000_000 + frac
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1_000_000)  # epoch_millis, the other default date format
    raise ValueError(f"not a timestamp: {value!r}")


def _split_attrs(attrs: Any, typed: Mapping[str, tuple[type, ...]] | None) -> tuple[dict[str, Any], Any]:
    if not isinstance(attrs, dict):
        return {}, attrs
    if typed is None:
        return {}, attrs
    hit: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for k, v in attrs.items():
        kinds = typed.get(k)
        if kinds is not None and isinstance(v, kinds) and (bool in kinds or not isinstance(v, bool)):
            hit[k] = v
        else:
            rest[k] = v
    return hit, rest


def _field_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_/:@+\-]", "_", name)[:200]
    return cleaned if cleaned and cleaned[0].isalnum() else "m" + cleaned[:199]


def _split_metrics(metrics: Any, jt: dict[str, Any]) -> None:
    if not isinstance(metrics, dict):
        jt.setdefault("raw", {})["metrics"] = metrics
        return
    numbers: dict[str, Any] = {}
    nonfinite: dict[str, str] = {}
    text: dict[str, str] = {}
    exact = True
    for name, value in metrics.items():
        if not (isinstance(name, str) and _SAFE_NAME.match(name)):
            exact = False
            name = _field_name(str(name))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[name] = value
        elif isinstance(value, str):
            (nonfinite if value in _NONFINITE else text)[name] = value
        else:
            exact = False  # null, a list, a bool: kept only in the raw copy
    jt["metrics"] = numbers
    if nonfinite:
        jt["nonfinite"] = nonfinite
    if text:
        jt["metrics_text"] = text
    if not exact:
        jt.setdefault("raw", {})["metrics"] = metrics


def to_document(event: Mapping[str, Any], namespace: str, *, doc_id_: str | None = None,
                service_name: str = "jobtrace") -> tuple[str, dict[str, Any]]:
    """``(data stream type, document)`` for one canonical event dict.

    Raises ``ValueError`` for an event without an integer ``ts`` (the sender then
    dead-letters that line with the reason).
    """
    type_, doc = document_core(event, doc_id_)
    doc.update(constant_fields(type_, namespace, service_name))
    return type_, doc


def constant_fields(type_: str, namespace: str, service_name: str = "jobtrace") -> dict[str, Any]:
    """The fields that are the same for every document of one data stream (the encoder splices them in)."""
    return {"service": {"name": service_name}, "ecs": {"version": ECS_VERSION},
            "data_stream": {"type": type_, "dataset": DATASET, "namespace": namespace}}


def document_core(event: Mapping[str, Any], doc_id_: str | None = None) -> tuple[str, dict[str, Any]]:
    """:func:`to_document` without :func:`constant_fields`."""
    type_ = stream_type(event)
    doc: dict[str, Any] = {"@timestamp": iso_ns(event.get("ts"))}  # type: ignore[arg-type]
    jt: dict[str, Any] = {}
    objects: dict[str, dict[str, Any]] = {"jobtrace": jt}
    for key, obj, fld in _PLAIN:
        value = event.get(key)
        if value is not None:
            target = objects.get(obj)
            if target is None:
                target = objects[obj] = {}
            target[fld] = value
    msg = event.get("msg")
    if msg is not None:
        doc["message"] = msg
    kind = event.get("kind")
    ev = objects.setdefault("event", {})
    ev["kind"] = _EVENT_KIND.get(kind, "event")  # type: ignore[arg-type]
    ev["dataset"] = DATASET
    if doc_id_:
        ev["id"] = doc_id_
    start = event.get("start")
    if start is not None:
        ev["start"] = iso_ns(start) if type(start) is int else start
    name, cat = event.get("name"), event.get("cat")
    if name is not None or cat is not None:
        span: dict[str, Any] = {}
        if name is not None:
            span["name"] = name
        if cat is not None:
            span["category"] = cat
        jt["span"] = span
        if cat == "phase" and name is not None:
            jt["phase"] = name
    attrs = event.get("attrs")
    if attrs is not None:
        typed = COLLECTIVE_ATTRS if (kind == "span" and cat == "collective") else (
            HEARTBEAT_ATTRS if kind == "heartbeat" else None)
        hit, rest = _split_attrs(attrs, typed)
        if hit:
            jt["collective" if typed is COLLECTIVE_ATTRS else "heartbeat"] = hit
            if typed is COLLECTIVE_ATTRS and "error" in hit:
                ev["outcome"] = "failure"
        if rest or not hit:
            jt["attrs"] = rest
    metrics = event.get("metrics")
    if metrics is not None:
        _split_metrics(metrics, jt)
    extra = {k: v for k, v in event.items() if k not in _KNOWN}
    if extra:
        jt["extra"] = extra
    doc.update(objects)
    return type_, doc


def from_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical event dict a document was made from (see the table above)."""
    out: dict[str, Any] = {"ts": parse_iso_ns(doc["@timestamp"])}
    jt = doc.get("jobtrace") or {}
    for key, obj, fld in _PLAIN:
        src = jt if obj == "jobtrace" else doc.get(obj)
        if src:
            value = src.get(fld)
            if value is not None:
                out[key] = value
    if "message" in doc and doc["message"] is not None:
        out["msg"] = doc["message"]
    span = jt.get("span")
    if span:
        if span.get("name") is not None:
            out["name"] = span["name"]
        if span.get("category") is not None:
            out["cat"] = span["category"]
    ev = doc.get("event") or {}
    start = ev.get("start")
    if start is not None:
        out["start"] = parse_iso_ns(start) if isinstance(start, str) else start
    if "collective" in jt or "heartbeat" in jt or "attrs" in jt:
        attrs: dict[str, Any] = {}
        attrs.update(jt.get("collective") or {})
        attrs.update(jt.get("heartbeat") or {})
        rest = jt.get("attrs")
        if isinstance(rest, dict):
            attrs.update(rest)
        elif rest is not None and not attrs:
            out["attrs"] = rest
        if "attrs" not in out:
            out["attrs"] = attrs
    raw = jt.get("raw") or {}
    if "metrics" in raw:
        out["metrics"] = raw["metrics"]
    elif "metrics" in jt:
        metrics: dict[str, Any] = dict(jt.get("metrics") or {})
        metrics.update(jt.get("nonfinite") or {})
        metrics.update(jt.get("metrics_text") or {})
        out["metrics"] = metrics
    extra = jt.get("extra")
    if isinstance(extra, dict):
        for k, v in extra.items():
            out.setdefault(k, v)
    return out
