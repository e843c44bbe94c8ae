"""OpenTelemetry wiring: providers with the job's resource, and the job's trace as context.

Our own spans are recorded by the cheap recorder; OpenTelemetry is set up so that
(1) any span a library or the user starts with the OTel API joins the job's trace,
nested under our current step/phase, and is recorded as an event too, and (2) the
providers carry resource attributes following the semantic conventions
(``service.*``, ``host.name``, ``process.pid``) plus ``jobtrace.*`` for the rank.

The OTel context is attached once, at setup, with a :class:`_LiveSpan` that answers
"which span is current?" from the recorder's stack when asked. Attaching a context per
span would cost every step and phase ~10 µs; asking costs only the rare OTel span.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, SpanContext, TraceFlags

from jobtrace import config
from jobtrace.events import SpanCategory
from jobtrace.identity import Identity

from ._recorder import _SPAN, TraceRecorder

__all__ = ["install_otel", "resource_for"]


def resource_for(ident: Identity) -> Resource:
    return Resource.create(
        {
            "service.name": config.get_str(config.OTEL_SERVICE_NAME, default="training"),
            "service.namespace": "jobtrace",
            "service.instance.id": f"{ident.job_id}/rank-{ident.rank}",
            "host.name": ident.node,
            "process.pid": ident.pid,
            "jobtrace.job.id": ident.job_id,
            "jobtrace.rank": ident.rank,
            "jobtrace.local_rank": ident.local_rank,
            "jobtrace.world_size": ident.world_size,
            "jobtrace.launcher": ident.launcher,
            # the same identity by the names of NVIDIA's NeMo Lens (``dl.*``, ``nemo.run.id``) and NVRx
            # (``nv.dl.*``), for their readers (jobtrace.events.DL_IDENTITY)
            "nemo.run.id": ident.job_id,
            "dl.rank": ident.rank,
            "dl.local_rank": ident.local_rank,
            "dl.world_size": ident.world_size,
            "nv.dl.job.uuid": ident.job_id,
            "nv.dl.run.uuid": ident.job_id,
            "nv.dl.rank": ident.rank,
            "nv.dl.local_rank": ident.local_rank,
            "nv.dl.world_size": ident.world_size,
            **({"slurm.job.id": ident.slurm_step.split(".", 1)[0]} if ident.slurm_step else {}),
        }
    )


class _RecordSpans(SpanProcessor):
    """Records spans started through the OpenTelemetry API as jobtrace span events."""

    def __init__(self, rec: TraceRecorder) -> None:
        self._rec = rec
        self.enabled = True  # providers cannot drop a processor; shutdown disables it instead

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if not self.enabled:
            return
        if ctx is None or span.start_time is None or span.end_time is None:
            return
        attrs: dict[str, Any] = dict(span.attributes or {})
        parent = span.parent.span_id if span.parent is not None else None
        self._rec.emit(
            (_SPAN, ctx.span_id, parent, span.name, SpanCategory.USER, span.start_time, span.end_time,
             self._rec.step, attrs or None)
        )


class _LiveSpan(NonRecordingSpan):
    """The current OpenTelemetry span: whichever of our spans is innermost when it is asked."""

    def __init__(self, rec: TraceRecorder, trace_id: int, steps_only: bool) -> None:
        super().__init__(INVALID_SPAN_CONTEXT)
        self._rec = rec
        self._trace_id = trace_id
        self._steps_only = steps_only
        self._flags = TraceFlags(TraceFlags.SAMPLED)

    def get_span_context(self) -> SpanContext:
        rec = self._rec
        span_id = (rec.current_step_span_id() if self._steps_only else rec.current_span_id()) or 1
        return SpanContext(trace_id=self._trace_id, span_id=span_id, is_remote=False, trace_flags=self._flags)


def install_otel(rec: TraceRecorder, context: str = "all") -> Callable[[], None]:
    """Set up providers and context; returns a function that undoes the context attachment.

    ``context``: which of our spans is the current OTel span: ``"all"`` (the innermost),
    ``"step"`` (the step span) or ``"none"`` (the job's trace is not put in the context).
    """
    ident = rec.identity
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        provider = current  # the user configured one; add our processor to it
    else:
        provider = TracerProvider(resource=resource_for(rec.identity))
        trace.set_tracer_provider(provider)
    processor = _RecordSpans(rec)
    provider.add_span_processor(processor)
    try:
        from opentelemetry._logs import get_logger_provider, set_logger_provider
        from opentelemetry.sdk._logs import LoggerProvider

        if not isinstance(get_logger_provider(), LoggerProvider):
            set_logger_provider(LoggerProvider(resource=resource_for(rec.identity)))
    except ImportError:  # the logs SDK moved between releases; tracing works without it
        pass

    token = None
    if context != "none":
        live = _LiveSpan(rec, int(ident.trace_id, 16), steps_only=context == "step")
        token = otel_context.attach(trace.set_span_in_context(live))

    def undo() -> None:
        processor.enabled = False
        if token is not None:
            try:
                otel_context.detach(token)
            except Exception:  # noqa: BLE001, S110 - detached from another context; nothing to undo
                pass

    return undo
