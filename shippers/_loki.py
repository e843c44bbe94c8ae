"""The Loki shipper: a Loki push encoder on top of the shared spooling sender.

``LokiShipper`` is a :class:`SpoolingSender` (disk spool, retries with backoff and
``Retry-After``, dead-letter file, one request in flight) around a
:class:`LokiEncoder`, which knows only Loki's push API:

* **Payload.** Protobuf ``logproto.PushRequest`` compressed with raw (block) snappy,
  as Loki's own clients send (default); or JSON, optionally gzipped
  (``JOBTRACE_LOKI_FORMAT=json``, ``JOBTRACE_LOKI_GZIP=1``). The message classes are
  built with the protobuf library from a descriptor equal in wire format to Loki's
  published ``pkg/push/push.proto`` (kept in ``loki/proto/``), in a private descriptor
  pool so that an application's own ``logproto`` classes never clash with ours. On the
  hot path the same bytes are written by :class:`_WireWriter` (about twice as fast as
  building upb messages); the tests check that both produce identical bytes and decode
  them with classes protoc compiled from Loki's ``.proto``.
* **Lines** are the canonical JSON events, unchanged, so ``| json`` sees every field
  and ``trace-job`` rebuilds the exact events.
* **Stream labels** stay low-cardinality: ``job``, ``node``, ``kind`` and, for logs,
  ``level`` (plus static labels from ``JOBTRACE_LOKI_LABELS``). Rank, trace id,
  span id and step go to **structured metadata** (Loki 3.x). Fallback for Loki
  before 3.0 or with ``allow_structured_metadata: false``: they are not sent as
  metadata, and the queries find them inside the JSON line (``| json``), which
  carries them anyway. The fallback is chosen with
  ``JOBTRACE_LOKI_STRUCTURED_METADATA=0``, or automatically when Loki answers that
  structured metadata is disallowed (the batch is then resent without it).
* **Refusals.** 429/5xx/connection errors are retried by the sender. A 400-class
  answer (too old, line too long, …) may concern one line only, and Loki stores the
  valid lines of a request it answers 400 to; so the encoder bisects: it resends
  halves of the batch until the refused lines stand alone, and those go to the
  dead-letter file with Loki's reason. Resending lines Loki already stored is
  harmless: Loki drops an entry identical in stream, timestamp, line and metadata.
  401/403/404 are configuration problems, not data problems: the batch stays
  spooled and is retried with backoff (a warning is logged once), instead of
  dead-lettering every line of the job.
* **VictoriaLogs** speaks the same push API at ``/insert/loki/api/v1/push``. Our lines
  are JSON objects, which VictoriaLogs would split into fields and leave without a
  message; the encoder adds ``disable_message_parsing=1`` to such URLs (unless the
  URL sets it) so the canonical line is stored whole as ``_msg`` and read back
  losslessly; labels and structured metadata still become searchable fields.

* **Packs** (a rank's rollup, :func:`jobtrace.store.pack_lines`, sent once at its clean exit) are
  lines like events: their ``kind`` (``rollup``) makes them a stream of their own, which every
  event query excludes (``kind!="rollup"``), and their rank goes to structured metadata. A
  pack line holds at most 128 KiB of base64, half the default ``max_line_bytes``.

Runs on the sender thread only; nothing here is called from the training thread.
"""

from __future__ import annotations

import gzip
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from jobtrace import config
from jobtrace.errors import ConfigError
from jobtrace.http import HttpConfig, Request, RequestsTransport, Response, RetryPolicy, Transport
from jobtrace.redact import url_for_display
from loki import JOB_LABEL, LABEL_KEYS, METADATA_KEYS, is_label_name, job_label, label_string, valid_job_label

from ._process import ProcessInfo
from ._sender import Outcome, SpoolingSender

__all__ = ["LokiEncoder", "LokiOptions", "LokiShipper", "push_url", "victorialogs_push_base"]

_log = logging.getLogger("jobtrace.export")

_NS: Final = 1_000_000_000


def push_url(url: str) -> str:
    """The push endpoint for a base URL a user gave.

    ``http://loki:3100`` → ``…/loki/api/v1/push``; a URL already ending in
    ``/api/v1/push`` is kept; VictoriaLogs' ``…/insert/loki`` → ``…/insert/loki/api/v1/push``
    with ``disable_message_parsing=1`` (see the module docstring).
    """
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith("/api/v1/push"):
        if path.endswith("/loki") or path.endswith("/insert/loki"):
            path += "/api/v1/push"
        else:
            path += "/loki/api/v1/push"
    query = parts.query
    if path.endswith("/insert/loki/api/v1/push"):
        params = dict(parse_qsl(query, keep_blank_values=True))
        if "disable_message_parsing" not in params:
            query = urlencode([*parse_qsl(query, keep_blank_values=True), ("disable_message_parsing", "1")])
    return urlunsplit(parts._replace(path=path, query=query))


def victorialogs_push_base(url: str) -> str:
    """VictoriaLogs' Loki ingest for the URL a user gave it: ``http://vl:9428`` → ``…/insert/loki``
    (kept when the URL already points there), for :func:`push_url`."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if "/insert/loki" not in path:
        path += "/insert/loki"
    return urlunsplit(parts._replace(path=path))


def _parse_labels(raw: str, var: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not is_label_name(name):
            raise ConfigError(f"{var}: {item!r} is not name=value with a Prometheus label name")
        if name in LABEL_KEYS or name in METADATA_KEYS:
            raise ConfigError(f"{var}: label {name!r} is set by jobtrace itself")
        labels[name] = value.strip()
    return labels


@dataclass(frozen=True)
class LokiOptions:
    """How to encode pushes. ``from_env`` reads ``JOBTRACE_LOKI_*``.

    Args:
        format: ``"protobuf"`` (snappy-compressed, default) or ``"json"``.
        gzip: gzip the JSON body (``Content-Encoding: gzip``); ignored for protobuf.
        structured_metadata: send rank/trace_id/span_id/step as structured metadata
            (Loki 3.x); ``False`` for older Loki (the line carries them anyway).
        static_labels: extra stream labels, e.g. ``{"cluster": "a"}`` (keep them few and static).
        job_label: the stream label that holds the job id (default ``training_job``; ``job`` is what
            earlier versions wrote, and what Promtail and Prometheus give the scrape job).
        max_batch_lines, max_batch_bytes: the largest push (Promtail's default batch was 1 MiB).
        max_line_bytes: lines longer than this are dead-lettered without being sent
            (Loki's ``max_line_size`` default is 256 KB).
    """

    format: str = "protobuf"
    gzip: bool = False
    structured_metadata: bool = True
    static_labels: Mapping[str, str] = field(default_factory=dict)
    job_label: str = JOB_LABEL
    max_batch_lines: int = 8192
    max_batch_bytes: int = 1 << 20
    max_line_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        if self.format not in ("protobuf", "json"):
            raise ConfigError(f"Loki format {self.format!r}: use protobuf or json")
        for name in self.static_labels:
            if not is_label_name(name):
                raise ConfigError(f"Loki label name {name!r} is not a valid Prometheus label name")
        valid_job_label(self.job_label)  # the readers' check: a site's shippers and readers agree on one name
        if self.job_label in self.static_labels:
            raise ConfigError(f"Loki label {self.job_label!r} holds the job id; it cannot be a static label too")

    @classmethod
    def from_env(cls, **overrides: Any) -> LokiOptions:
        """``JOBTRACE_LOKI_FORMAT``, ``_GZIP``, ``_STRUCTURED_METADATA``, ``_LABELS`` (``a=x,b=y``),
        ``_JOB_LABEL``, ``_BATCH_LINES``, ``_BATCH_BYTES``, ``_MAX_LINE_BYTES`` (see :mod:`jobtrace.config`)."""
        values: dict[str, Any] = dict(
            format=config.get_choice(config.LOKI_FORMAT, ("protobuf", "json"), default="protobuf"),
            gzip=config.get_bool(config.LOKI_GZIP, default=False),
            structured_metadata=config.get_bool(config.LOKI_STRUCTURED_METADATA, default=True),
            static_labels=_parse_labels(config.get_str(config.LOKI_LABELS, default="") or "", config.LOKI_LABELS),
            job_label=job_label(),
            max_batch_lines=config.get_int(config.LOKI_BATCH_LINES, default=cls.max_batch_lines, minimum=1),
            max_batch_bytes=config.get_int(config.LOKI_BATCH_BYTES, default=cls.max_batch_bytes, minimum=1),
            max_line_bytes=config.get_int(config.LOKI_MAX_LINE_BYTES, default=cls.max_line_bytes, minimum=1),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# ---- protobuf messages ---------------------------------------------------------------------------

def _build_push_request_class() -> Any:
    """``logproto.PushRequest`` from a descriptor matching Loki's push.proto field for field.

    The gogoproto options of the published file only steer Go code generation and
    do not change the wire format, so they are left out (and with them the
    ``gogoproto/gogo.proto`` import).
    """
    from google.protobuf import (  # type: ignore[import-untyped, unused-ignore]
        descriptor_pb2,
        descriptor_pool,
        message_factory,
        timestamp_pb2,
    )

    fdp = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="jobtrace/loki/push.proto", package="logproto", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    rep, opt = fdp.LABEL_REPEATED, fdp.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> None:
        msg = file.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label, json_name=fname)
            if type_name:
                f.type_name = type_name

    message("PushRequest", ("streams", 1, fdp.TYPE_MESSAGE, rep, ".logproto.StreamAdapter"),
            ("format", 2, fdp.TYPE_STRING, opt, None))
    message("StreamAdapter", ("labels", 1, fdp.TYPE_STRING, opt, None),
            ("entries", 2, fdp.TYPE_MESSAGE, rep, ".logproto.EntryAdapter"),
            ("hash", 3, fdp.TYPE_UINT64, opt, None))
    message("LabelPairAdapter", ("name", 1, fdp.TYPE_STRING, opt, None), ("value", 2, fdp.TYPE_STRING, opt, None))
    message("EntryAdapter", ("timestamp", 1, fdp.TYPE_MESSAGE, opt, ".google.protobuf.Timestamp"),
            ("line", 2, fdp.TYPE_STRING, opt, None),
            ("structuredMetadata", 3, fdp.TYPE_MESSAGE, rep, ".logproto.LabelPairAdapter"),
            ("parsed", 4, fdp.TYPE_MESSAGE, rep, ".logproto.LabelPairAdapter"))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("logproto.PushRequest"))


_PUSH_REQUEST: Any = None


def push_request_class() -> Any:
    """The ``logproto.PushRequest`` message class (built once, on first use)."""
    global _PUSH_REQUEST
    if _PUSH_REQUEST is None:
        _PUSH_REQUEST = _build_push_request_class()
    return _PUSH_REQUEST


def _snappy() -> Any:
    import cramjam

    return cramjam.snappy


# ---- a fast writer for the same messages -------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL: Final = [_varint(i) for i in range(4096)]


def _pair(name: str, value: str) -> bytes:
    """A ``structuredMetadata`` field (EntryAdapter field 3) holding one LabelPairAdapter."""
    nb, vb = name.encode(), value.encode()
    body = b"\x0a" + _varint(len(nb)) + nb + (b"\x12" + _varint(len(vb)) + vb if vb else b"")
    return b"\x1a" + _varint(len(body)) + body


_SPAN_ID_16: Final = _pair("span_id", "0" * 16)[:-16]  # the bytes before a 16-character span id


class _WireWriter:
    """Serializes ``logproto.PushRequest`` directly, byte for byte as the protobuf library does.

    Building upb messages costs several microseconds per entry in Python; this writer
    costs a fraction of that because what repeats is cached: the (rank, trace id)
    metadata, step numbers, timestamp seconds. Fields are written in field-number order
    and default values are left out, exactly like the library's serializer; a test
    compares the two byte for byte and decodes the result with classes compiled from
    Loki's push.proto.
    """

    def __init__(self, encoder: LokiEncoder) -> None:
        self._encoder = encoder
        self._seconds: dict[int, bytes] = {}
        self._identity: dict[tuple[Any, Any], bytes] = {}
        self._steps: dict[Any, bytes] = {}

    def entry(self, ts: int, line: bytes, event: Mapping[str, Any]) -> bytes:
        """One ``entries`` field of a StreamAdapter (EntryAdapter with timestamp, line, metadata)."""
        sec, nanos = divmod(ts, _NS)
        stamp = self._seconds.get(sec)
        if stamp is None:
            if len(self._seconds) > 4096:
                self._seconds.clear()
            stamp = self._seconds[sec] = (b"\x08" + _varint(sec)) if sec else b""
        if nanos:
            stamp = stamp + b"\x10" + _varint(nanos)
        n = len(line)
        msg = b"\x0a" + _SMALL[len(stamp)] + stamp + ((b"\x12" + (_SMALL[n] if n < 4096 else _varint(n)) + line)
                                                     if n else b"")
        if self._encoder.structured_metadata:
            msg += self._metadata(event)
        n = len(msg)
        return b"\x12" + (_SMALL[n] if n < 4096 else _varint(n)) + msg

    def _metadata(self, event: Mapping[str, Any]) -> bytes:
        rank, trace = event.get("rank"), event.get("trace_id")
        key = (rank, trace)
        sm = self._identity.get(key)
        if sm is None:
            sm = b""
            if rank is not None:
                sm += _pair("rank", str(rank))
            if trace:
                sm += _pair("trace_id", trace if type(trace) is str else str(trace))
            if len(self._identity) > 10_000:
                self._identity.clear()
            self._identity[key] = sm
        span = event.get("span_id")
        if span:
            if type(span) is str and len(span) == 16 and span.isascii():
                sm += _SPAN_ID_16 + span.encode()
            else:
                sm += _pair("span_id", str(span))
        step = event.get("step")
        if step is not None:
            sb = self._steps.get(step) if type(step) is int else None
            if sb is None:
                sb = _pair("step", str(step))
                if type(step) is int:
                    if len(self._steps) > 100_000:
                        self._steps.clear()
                    self._steps[step] = sb
            sm += sb
        return sm

    @staticmethod
    def push_request(streams: Sequence[tuple[str, list[bytes]]]) -> bytes:
        """The PushRequest: one ``streams`` field per stream (labels, then its entries)."""
        parts = []
        for labels, entries in streams:
            lb = labels.encode()
            body = b"\x0a" + _varint(len(lb)) + lb + b"".join(entries)
            parts.append(b"\x0a" + _varint(len(body)) + body)
        return b"".join(parts)


# ---- the encoder ---------------------------------------------------------------------------------

_SM_DISALLOWED = re.compile(r"structured metadata[^\n]{0,40}(disallowed|not allowed|disabled)|"
                            r"disallowed_structured_metadata", re.I)
_CONFIG_STATUSES: Final = frozenset({401, 403, 404, 405, 407})
_BLOCKED_STATUS: Final = 260  # Loki's blocked_ingestion answer: not stored, by policy


class LokiEncoder:
    """Lines → one Loki push request; Loki's answer → which lines to retry or dead-letter.

    Stateful between ``request`` and ``outcome`` (the sender calls them in pairs from
    one thread): it remembers which lines went into the payload, for bisection.
    """

    name = "loki"

    def __init__(self, url: str, options: LokiOptions | None = None, *, tenant: str | None = None,
                 defaults: Mapping[str, str] | None = None, implementation: str = "wire") -> None:
        if implementation not in ("wire", "library"):
            raise ConfigError(f"protobuf implementation {implementation!r}: use wire or library")
        self.options = options or LokiOptions()
        self.url = url
        self.max_batch_lines = self.options.max_batch_lines
        self.max_batch_bytes = self.options.max_batch_bytes
        self.structured_metadata = self.options.structured_metadata
        self._defaults = dict(defaults or {})
        self._static = dict(self.options.static_labels)
        self._job_label = self.options.job_label
        headers = {"User-Agent": "jobtrace-loki"}
        if tenant:
            headers["X-Scope-OrgID"] = tenant
        if self.options.format == "protobuf":
            headers["Content-Type"] = "application/x-protobuf"
            push_request_class()  # fail at construction, not on the sender thread
        else:
            headers["Content-Type"] = "application/json"
            if self.options.gzip:
                headers["Content-Encoding"] = "gzip"
        self._headers = headers
        self.implementation = implementation
        self._wire = _WireWriter(self)
        self._labels_cache: dict[tuple[Any, ...], str] = {}
        self._str_cache: dict[int, str] = {}
        # bisection state: how many lines the next payload may hold, and what the last one held
        self._limit: int | None = None
        self._sent: list[int] = []
        self._withheld: list[int] = []
        self._local_rejects: list[tuple[int, str]] = []
        self._warned: set[int] = set()
        self.requests_bisected = 0

    # ---- request --------------------------------------------------------------------------------
    def request(self, lines: Sequence[bytes]) -> Request:
        """Build one push of ``lines`` (or of the first part of them while bisecting)."""
        wire = self.options.format == "protobuf" and self.implementation == "wire"
        writer = self._wire if wire else None
        streams: dict[tuple[Any, ...], list[Any]] = {}
        sent: list[int] = []
        withheld: list[int] = []
        rejects: list[tuple[int, str]] = []
        limit = self._limit
        max_line = self.options.max_line_bytes
        loads = orjson.loads
        for i, raw in enumerate(lines):
            line = raw[:-1] if raw[-1:] == b"\n" else raw
            if len(line) > max_line:
                rejects.append((i, f"line_too_long: {len(line)} bytes, over the {max_line}-byte limit "
                                   "(JOBTRACE_LOKI_MAX_LINE_BYTES; Loki's max_line_size)"))
                continue
            if limit is not None and len(sent) >= limit:
                withheld.append(i)
                continue
            try:
                event = loads(line)
                if type(event) is not dict:
                    event = {}
            except orjson.JSONDecodeError:
                event = {}
                line = line.decode("utf-8", "replace").encode()  # protobuf strings must be UTF-8
            ts = event.get("ts")
            if type(ts) is not int or ts <= 0:
                ts = time.time_ns()
            key = (event.get("job"), event.get("node"), event.get("kind"), event.get("level"))
            entries = streams.get(key)
            if entries is None:
                entries = streams[key] = []
            entries.append(writer.entry(ts, line, event) if writer is not None else (ts, line, event))
            sent.append(i)
        self._sent, self._withheld, self._local_rejects = sent, withheld, rejects
        if writer is not None:
            body = writer.push_request([(self._label_text(k), v) for k, v in streams.items()])
            body = bytes(_snappy().compress_raw(body))
        elif self.options.format == "protobuf":
            body = self._protobuf(streams)
        else:
            body = self._json(streams)
        return Request("POST", self.url, body, self._headers)

    def _labels(self, key: tuple[Any, ...]) -> dict[str, str]:
        job, node, kind, level = key
        labels = dict(self._static)
        labels[self._job_label] = str(job) if job else self._defaults.get("job", "unknown")
        node = node or self._defaults.get("node")
        if node:
            labels["node"] = str(node)
        labels["kind"] = str(kind) if kind else "unknown"
        if level and kind == "log":
            labels["level"] = str(level)
        return labels

    def _label_text(self, key: tuple[Any, ...]) -> str:
        text = self._labels_cache.get(key)
        if text is None:
            if len(self._labels_cache) > 10_000:
                self._labels_cache.clear()
            text = self._labels_cache[key] = label_string(self._labels(key))
        return text

    def _metadata(self, event: Mapping[str, Any]) -> dict[str, str]:
        """Structured metadata of one event (values are strings, as Loki requires)."""
        sm: dict[str, str] = {}
        strs = self._str_cache
        rank = event.get("rank")
        if rank is not None:
            s = strs.get(rank) if type(rank) is int else None
            if s is None:
                s = str(rank)
                if type(rank) is int and len(strs) < 100_000:
                    strs[rank] = s
            sm["rank"] = s
        for key in ("trace_id", "span_id"):
            v = event.get(key)
            if v:
                sm[key] = v if type(v) is str else str(v)
        step = event.get("step")
        if step is not None:
            sm["step"] = str(step)
        return sm

    def _protobuf(self, streams: Mapping[tuple[Any, ...], list[tuple[int, bytes, dict[str, Any]]]]) -> bytes:
        """The push built and serialized by the protobuf library (the reference the wire writer matches)."""
        with_sm = self.structured_metadata
        metadata = self._metadata
        out = []
        for key, entries in streams.items():
            rows = []
            for ts, line, event in entries:
                row: dict[str, Any] = {"timestamp": {"seconds": ts // _NS, "nanos": ts % _NS},
                                       "line": line.decode("utf-8", "replace")}
                if with_sm:
                    row["structuredMetadata"] = [{"name": k, "value": v} for k, v in metadata(event).items()]
                rows.append(row)
            out.append({"labels": self._label_text(key), "entries": rows})
        message = push_request_class()(streams=out)
        return bytes(_snappy().compress_raw(message.SerializeToString()))

    def _json(self, streams: Mapping[tuple[Any, ...], list[tuple[int, bytes, dict[str, Any]]]]) -> bytes:
        with_sm = self.structured_metadata
        metadata = self._metadata
        out = []
        for key, entries in streams.items():
            if with_sm:
                values: list[list[Any]] = [[str(ts), line.decode("utf-8", "replace"), metadata(event)]
                                           for ts, line, event in entries]
            else:
                values = [[str(ts), line.decode("utf-8", "replace")] for ts, line, _ in entries]
            out.append({"stream": self._labels(key), "values": values})
        body = orjson.dumps({"streams": out})
        return gzip.compress(body, compresslevel=1) if self.options.gzip else body

    # ---- outcome --------------------------------------------------------------------------------
    def outcome(self, lines: Sequence[bytes], response: Response) -> Outcome:
        """Map Loki's answer onto line indices (429/5xx never get here: the sender retries them)."""
        status = response.status
        sent, withheld, local = self._sent, self._withheld, self._local_rejects
        again = "0" if withheld else None
        if not sent:
            return Outcome(retry=list(withheld), rejected=list(local), retry_after=again)
        if 200 <= status < 300 and status != _BLOCKED_STATUS:
            # While bisecting, a part that went through lets the next part grow again.
            self._limit = None if not withheld or self._limit is None else self._limit * 2
            return Outcome(retry=list(withheld), rejected=list(local), retry_after=again)
        reason = _reason(response)
        if status in _CONFIG_STATUSES:
            if status not in self._warned:
                self._warned.add(status)
                _log.warning("jobtrace: loki: HTTP %d from %s: %s; check the URL, tenant and credentials "
                             "(JOBTRACE_LOKI_*). Lines stay spooled and are retried.",
                             status, url_for_display(self.url), reason[:200])
            return Outcome(retry=sent + withheld, rejected=list(local), status=status)
        if status == 400 and self.structured_metadata and _SM_DISALLOWED.search(reason):
            self.structured_metadata = False
            _log.warning("jobtrace: loki: the server does not accept structured metadata (%s); sending rank, "
                         "trace_id, span_id and step inside the JSON line only (set "
                         "JOBTRACE_LOKI_STRUCTURED_METADATA=0 to skip this probe)", reason[:200])
            return Outcome(retry=sent + withheld, rejected=list(local), retry_after="0", status=status)
        if status == _BLOCKED_STATUS:
            return Outcome(retry=list(withheld), rejected=list(local) + [(i, f"HTTP 260 (ingestion blocked): {reason}")
                                                                          for i in sent],
                           retry_after=again, status=status)
        if len(sent) == 1:
            self._limit = None  # the refused line is found; the rest goes in full batches again
            return Outcome(retry=list(withheld), rejected=list(local) + [(sent[0], f"HTTP {status}: {reason}")],
                           retry_after=again, status=status)
        # Some line of this push was refused; find which by halving (see the module docstring).
        self._limit = max(1, len(sent) // 2)
        self.requests_bisected += 1
        return Outcome(retry=sent + withheld, rejected=list(local), retry_after="0", status=status)


def _reason(response: Response) -> str:
    text = response.body[:2000].decode("utf-8", "replace").strip()
    return " ".join(text.split()) or f"HTTP {response.status}"


# ---- the shipper ---------------------------------------------------------------------------------

class LokiShipper(SpoolingSender):
    """A sink that ships canonical event lines to Loki (or VictoriaLogs) without losing any.

    Build it from the environment with :meth:`from_env` (what ``init_tracing`` does
    when ``JOBTRACE_LOKI_URL`` is set), or pass an encoder and transport directly.
    """

    encoder: LokiEncoder

    takes_packs = True
    """Packs go out as lines of their own stream (``kind="rollup"``, the rank in structured metadata):
    ``trace-job --backend victorialogs`` reads a rank's pack instead of its events, and every event query
    of the library excludes that stream (``kind!="rollup"``)."""

    @classmethod
    def from_env(cls, info: ProcessInfo, *, url: str | None = None, **options: Any) -> LokiShipper:
        """Connection and secrets from ``JOBTRACE_LOKI_*`` (:meth:`HttpConfig.from_env`), encoding
        from :meth:`LokiOptions.from_env`; spools under ``info.spool_dir("loki")``. ``options``:
        ``options`` (a :class:`LokiOptions`), ``transport``, ``policy`` and the sender's own."""
        http = HttpConfig.from_env(config.LOKI.prefix, url)
        return cls._connect(info, http, push_url(http.url), "loki", http.tenant, **options)

    @classmethod
    def for_victorialogs(cls, info: ProcessInfo, *, url: str | None = None, **options: Any) -> LokiShipper:
        """The same shipper pushing to VictoriaLogs' Loki ingest (``<url>/insert/loki``): connection and
        secrets from ``JOBTRACE_VL_*``, the URL ``trace-job --backend victorialogs`` reads, and its
        tenant (``<AccountID>[:<ProjectID>]``) sent as VictoriaLogs' headers, not Loki's
        ``X-Scope-OrgID``; encoding from :meth:`LokiOptions.from_env` (the wire is Loki's). Spools
        under ``info.spool_dir("victorialogs")``."""
        http = HttpConfig.from_env(config.VL.prefix, url)
        headers = dict(http.extra_headers)
        if http.tenant:
            account, _, project = http.tenant.partition(":")
            headers["AccountID"] = account
            if project:
                headers["ProjectID"] = project
        http = replace(http, tenant=None, extra_headers=headers)
        return cls._connect(info, http, push_url(victorialogs_push_base(http.url)), "victorialogs", None, **options)

    @classmethod
    def _connect(cls, info: ProcessInfo, http: HttpConfig, push: str, backend: str, tenant: str | None, *,
                 options: LokiOptions | None = None, transport: Transport | None = None,
                 policy: RetryPolicy | None = None, **sender_options: Any) -> LokiShipper:
        encoder = LokiEncoder(push, options or LokiOptions.from_env(), tenant=tenant,
                              defaults={"job": info.job_id, "node": info.node})
        return cls(encoder, transport or RequestsTransport(http), info.spool_dir(backend),
                   policy=policy, timeout_s=sender_options.pop("timeout_s", http.timeout_s), **sender_options)
