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

import os
import time
from typing import Any, NamedTuple, Sequence

import orjson

__all__ = ["OtlpSpanSink", "RootSpan"]


class RootSpan(NamedTuple):
    """The job's root span, which one process (rank 0) closes when its sink closes."""

    trace_id: int
    span_id: int
    name: str
    start_ns: int

_SPAN_MARK = b'"kind":"span"'


class OtlpSpanSink:
    def __init__(self, resource: Any, endpoint: str | None = None, *, exporter: Any = None,
                 root: RootSpan | None = None) -> None:
        from opentelemetry.sdk.trace import SpanProcessor
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            url = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            if url is None and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
                url = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
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
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        try:
            trace_id = int(ev["trace_id"], 16)
            ctx = SpanContext(trace_id, int(ev["span_id"], 16), False, TraceFlags(TraceFlags.SAMPLED))
            parent = (SpanContext(trace_id, int(ev["parent_id"], 16), False, TraceFlags(TraceFlags.SAMPLED))
                      if ev.get("parent_id") else None)
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
        status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET)
        start = ev.get("start", ev["ts"])
        return ReadableSpan(
            name=ev.get("name", "span"), context=ctx, parent=parent, resource=self._resource, attributes=attrs,
            kind=SpanKind.INTERNAL, status=status, start_time=start, end_time=start + ev.get("dur", 0),
        )

    def _root_span(self, root: RootSpan, end_ns: int) -> Any:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

        ctx = SpanContext(root.trace_id, root.span_id, False, TraceFlags(TraceFlags.SAMPLED))
        return ReadableSpan(name=root.name, context=ctx, parent=None, resource=self._resource,
                            attributes={"jobtrace.category": "job"}, kind=SpanKind.INTERNAL,
                            start_time=root.start_ns, end_time=max(end_ns, root.start_ns))

    def flush(self) -> None:
        """The SDK processor exports on its own schedule; a final flush happens in close()."""

    def close(self) -> None:
        if self._root is not None:
            self._processor.on_end(self._root_span(self._root, time.time_ns()))
            self._root = None
        self._processor.force_flush(5000)
        self._processor.shutdown()
