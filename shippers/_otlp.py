"""Spans to a trace store (Tempo, Jaeger, any OpenTelemetry Collector) over OTLP.

Our spans are recorded cheaply as events; this sink turns the span lines of each
export batch into OpenTelemetry ``ReadableSpan`` objects and hands them to the SDK's
``BatchSpanProcessor`` with the ``opentelemetry-exporter-otlp`` HTTP exporter. The
SDK processor has its own thread and queue, so a slow or absent collector never
holds up the export thread (and hence never the embedded store or log shippers).

Besides jobtrace's own attribute names (``jobtrace.*``), the spans carry the names NVIDIA's NeMo Lens and
NVRx use (their ``semconv``: ``dl.iteration`` on spans of a step; on a step's span, the step's
``dl.loss``, ``dl.grad_norm``, ``dl.learning_rate``, ``dl.throughput_*`` where the job logged them; the
``nv.dl.*`` identity is on the resource, :func:`otel_instrumentation._otel.resource_for`), so that
their readers read our spans.

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
from jobtrace.events import DL_METRICS

__all__ = ["OtlpSpanSink", "RootSpan"]


class RootSpan(NamedTuple):
    """The job's root span, which one process (rank 0) closes when its sink closes."""

    trace_id: int
    span_id: int
    name: str
    start_ns: int


_SPAN_MARK = b'"kind":"span"'
_METRIC_MARK = b'"kind":"metric"'

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
        self._step_metrics: dict[int, dict[str, Any]] = {}  # step -> its dl.* values, until its span goes
        self._held: dict[str, Any] | None = None  # the last step span, until the next (its metrics may follow it)

    def write(self, lines: Sequence[bytes]) -> None:
        for line in lines:
            if _METRIC_MARK in line:
                self._keep_metrics(orjson.loads(line))
            elif _SPAN_MARK in line:
                ev = orjson.loads(line)
                if ev.get("cat") == "step":
                    # a step's metrics are often logged just after its span ends: hold it until the next step's
                    ev, self._held = self._held, ev
                if ev is not None:
                    self._export(ev)

    def _export(self, ev: dict[str, Any]) -> None:
        span = self._to_span(ev)
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
            attrs["jobtrace.step"] = attrs["dl.iteration"] = ev["step"]
            if ev.get("cat") == "step":
                attrs.update(self._step_metrics.pop(ev["step"], {}))
        error = None
        for k, v in (ev.get("attrs") or {}).items():
            if k == "error":
                error = str(v)
            elif isinstance(v, (str, bool, int, float)):
                attrs[f"jobtrace.{k}"] = v
        start = ev.get("start", ev["ts"])
        return self._readable(ev.get("name", "span"), trace_id, span_id, parent_id, attrs, start,
                              start + ev.get("dur", 0), error)

    def _keep_metrics(self, ev: dict[str, Any]) -> None:
        """A step's metrics (logged inside the step or just after it), for its span."""
        step = ev.get("step")
        if not isinstance(step, int):
            return
        values = {DL_METRICS[k]: v for k, v in (ev.get("metrics") or {}).items()
                  if k in DL_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if values:
            self._step_metrics.setdefault(step, {}).update(values)
            while len(self._step_metrics) > 64:  # steps whose span never came (no step spans): forget the oldest
                del self._step_metrics[min(self._step_metrics)]

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
        held, self._held = self._held, None
        if held is not None:
            self._export(held)
        root, self._root = self._root, None
        if root is not None:
            self._processor.on_end(self._readable(root.name, root.trace_id, root.span_id, None,
                                                  {"jobtrace.category": "job"}, root.start_ns,
                                                  max(time.time_ns(), root.start_ns)))
        self._processor.force_flush(5000)
        self._processor.shutdown()
