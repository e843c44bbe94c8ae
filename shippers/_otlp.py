"""Spans to a trace store (Tempo, Jaeger, any OpenTelemetry Collector) over OTLP.

Our spans are recorded cheaply as events; this sink turns the span lines of each
export batch into OpenTelemetry ``ReadableSpan`` objects and hands them to the SDK's
``BatchSpanProcessor`` with the ``opentelemetry-exporter-otlp`` HTTP exporter. The
SDK processor has its own thread and queue, so a slow or absent collector never
holds up the export thread (and hence never the embedded store or log shippers).

The trace store is a view for Explore's trace panel; the complete, lossless record
is the log backend. The SDK queue drops spans when the collector is away for long
(its counters say how many); that trade-off is deliberate and documented.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from jobtrace import config

__all__ = ["OtlpSpanSink", "RootSpan"]


class RootSpan(NamedTuple):
    """The job's root span, which one process (rank 0) closes when its sink closes."""

    trace_id: int
    span_id: int
    name: str
    start_ns: int


_SPAN_MARK = b'"kind":"span"'


class OtlpSpanSink:
    """Turns the span lines of each batch into OpenTelemetry spans for the SDK's OTLP exporter."""

    takes_chunks = False
    """Each item is parsed as one event."""

    def __init__(self, resource: Any, endpoint: str | None = None, *, exporter: Any = None,
                 root: RootSpan | None = None) -> None:
        from opentelemetry.sdk.trace import SpanProcessor
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            url = endpoint or config.get_str(config.OTLP_TRACES_ENDPOINT)
            base = config.get_str(config.OTLP_ENDPOINT)
            if url is None and base:
                url = base.rstrip("/") + "/v1/traces"
            exporter = OTLPSpanExporter(endpoint=url)
        self._resource = resource
        self._root = root
        self._processor: SpanProcessor = BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=2048)
        self.converted = 0

    def write(self, lines: Sequence[bytes]) -> None:
        for line in lines:
            if _SPAN_MARK in line:
                span = self._to_span(orjson.loads(line))
                if span is not None:
                    self._processor.on_end(span)
                    self.converted += 1

    def _to_span(self, ev: dict[str, Any]) -> Any:
        try:
            trace_id, span_id = int(ev["trace_id"], 16), int(ev["span_id"], 16)
            parent_id = int(ev["parent_id"], 16) if ev.get("parent_id") else None
        except (KeyError, TypeError, ValueError):
            return None
        attrs: dict[str, Any] = {"jobtrace.category": ev.get("cat", "user"), "jobtrace.rank": ev.get("rank", 0),
                                 "jobtrace.node": ev.get("node", "")}
        if ev.get("step") is not None:
            attrs["jobtrace.step"] = ev["step"]
        error = None
        for k, v in (ev.get("attrs") or {}).items():
            if k == "error":
                error = str(v)
            elif isinstance(v, (str, bool, int, float)):
                attrs[f"jobtrace.{k}"] = v
        start = ev.get("start", ev["ts"])
        return self._readable(ev.get("name", "span"), trace_id, span_id, parent_id, attrs, start,
                              start + ev.get("dur", 0), error)

    def _readable(self, name: str, trace_id: int, span_id: int, parent_id: int | None, attrs: dict[str, Any],
                  start: int, end: int, error: str | None = None) -> Any:
        """A finished SDK span of this sink's resource, for the batch processor."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED)
        parent = SpanContext(trace_id, parent_id, False, flags) if parent_id is not None else None
        return ReadableSpan(name=name, context=SpanContext(trace_id, span_id, False, flags), parent=parent,
                            resource=self._resource, attributes=attrs, kind=SpanKind.INTERNAL,
                            status=Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET),
                            start_time=start, end_time=end)

    def flush(self) -> None:
        """The SDK processor exports on its own schedule; a final flush happens in close()."""

    def close(self) -> None:
        root, self._root = self._root, None
        if root is not None:
            self._processor.on_end(self._readable(root.name, root.trace_id, root.span_id, None,
                                                  {"jobtrace.category": "job"}, root.start_ns,
                                                  max(time.time_ns(), root.start_ns)))
        self._processor.force_flush(5000)
        self._processor.shutdown()
