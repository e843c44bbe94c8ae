"""The bridge from stdlib ``logging``: every record of every logger becomes an event.

OpenTelemetry's own ``LoggingHandler`` builds an SDK LogRecord on the calling
thread (about 50 µs a record here); ours appends the ``LogRecord`` to the export
queue and lets the export thread do the formatting. The handler skips the
per-handler lock of ``logging.Handler.handle`` because appending to a deque is
already atomic.

Libraries such as DeepSpeed and Transformers log through loggers with
``propagate=False``; a root handler never sees them, so :func:`attach_to_loggers`
also puts the handler on those (and is re-run from the heartbeat thread to catch
loggers created after ``init_tracing``).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._recorder import TraceRecorder

__all__ = ["JobtraceHandler", "TraceContextFilter", "TraceContextFormatter", "attach_to_loggers"]

CONSOLE_FORMAT = "%(asctime)s %(levelname)s [%(jobtrace)s] %(name)s: %(message)s"


class JobtraceHandler(logging.Handler):
    """Queues each record for export; never formats or does I/O on the calling thread.

    Every logging call of the process passes through here, so while the handler has no
    filters its ``handle`` *is* the recorder's ``log_record`` (one Python call fewer per
    record, about 5 % of its cost); :meth:`addFilter` switches to a filtering ``handle``
    and :meth:`removeFilter` back. The recorder itself drops the exporter's own warnings.
    """

    def __init__(self, recorder: TraceRecorder, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self._log_record = recorder.log_record
        self.handle = self._log_record  # type: ignore[method-assign,assignment]

    def _filtered(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        self._log_record(record)
        return True

    def addFilter(self, filter: Any) -> None:  # noqa: A002 - logging's own parameter name
        super().addFilter(filter)
        self.handle = self._filtered  # type: ignore[method-assign]

    def removeFilter(self, filter: Any) -> None:  # noqa: A002
        super().removeFilter(filter)
        if not self.filters:
            self.handle = self._log_record  # type: ignore[method-assign,assignment]

    def emit(self, record: logging.LogRecord) -> None:
        self._filtered(record)


_CONTEXT_FIELDS = ("trace_id", "span_id", "job_id", "rank", "jobtrace")


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id``, ``span_id``, ``job_id``, ``rank`` and ``jobtrace`` attributes to records.

    Add it to any handler whose format string uses ``%(trace_id)s`` and friends.
    """

    def __init__(self, recorder: TraceRecorder) -> None:
        super().__init__()
        ident = recorder.identity
        self._job = ident.job_id
        self._trace = ident.trace_id
        self._rank = ident.rank
        self._prefix = f"job={self._job} rank={self._rank} trace={self._trace} span="
        self._current_span_id = recorder.current_span_id
        # The last call's answer: a step logs under one span, so the text is made once per span. One
        # tuple, swapped whole, so threads never see half an update.
        self._last: tuple[int | None, str, str, str] = (-1, "", "", "")

    def context(self) -> tuple[int | None, str, str, str]:
        """``(span id, as hex or "-", "job=… rank=… trace=… span=…", "[that] ")`` for the calling
        thread's current span."""
        sid = self._current_span_id()
        last = self._last
        if last[0] != sid:
            span = f"{sid:016x}" if sid is not None else "-"
            context = self._prefix + span
            last = self._last = (sid, span, context, f"[{context}] ")
        return last

    def filter(self, record: logging.LogRecord) -> bool:
        _, record.span_id, record.jobtrace, _ = self.context()
        record.trace_id = self._trace
        record.job_id = self._job
        record.rank = self._rank
        return True


class TraceContextFormatter(logging.Formatter):
    """Wraps an existing formatter so the console line shows job, rank, trace and span.

    The record also gets the filter's attributes only where the wrapped formatter could read
    them: its format string names one, or it is not a plain ``logging.Formatter`` (a JSON
    formatter may write every attribute). Otherwise only the line's prefix is made, from
    the filter's per-span cache: on a training step's log line, setting five attributes
    (the record's dict grows) cost more than the rest of the context.
    """

    def __init__(self, inner: logging.Formatter | None, recorder: TraceRecorder) -> None:
        super().__init__()
        self._inner = inner or logging.Formatter(logging.BASIC_FORMAT)
        self._filter = TraceContextFilter(recorder)
        fmt = getattr(getattr(self._inner, "_style", None), "_fmt", None) or ""
        self._set_fields = type(self._inner) is not logging.Formatter or any(f in fmt for f in _CONTEXT_FIELDS)

    def format(self, record: logging.LogRecord) -> str:
        f = self._filter
        if self._set_fields:
            f.filter(record)
        last = f._last  # noqa: SLF001 - the filter's cache, read here without a call when it holds
        if last[0] != f._current_span_id():  # noqa: SLF001
            last = f.context()
        return last[3] + self._inner.format(record)


def attach_to_loggers(handler: logging.Handler) -> int:
    """Attach ``handler`` to every non-propagating logger; returns how many were added.

    A logger that propagates again (a library flipped ``propagate`` back) loses the
    handler, or every record it logs would reach it twice: there and at the root.
    """
    added = 0
    at_root = handler in logging.root.handlers
    for logger in list(logging.root.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue
        if not logger.propagate:
            if handler not in logger.handlers:
                logger.handlers.insert(0, handler)
                added += 1
        elif at_root and handler in logger.handlers:
            logger.removeHandler(handler)
    return added


def install_console(recorder: TraceRecorder, console: bool) -> list[tuple[logging.Handler, Any]]:
    """Make console output carry the trace context; returns (handler, old formatter) to undo."""
    changed: list[tuple[logging.Handler, Any]] = []
    if not console:
        return changed
    root = logging.getLogger()
    streams = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    if not streams and not [h for h in root.handlers if not isinstance(h, JobtraceHandler)]:
        # Nothing prints yet; mirror logging.lastResort (WARNING and up to stderr) with context.
        h = logging.StreamHandler(sys.stderr)
        h.setLevel(logging.WARNING)
        h._jobtrace_owned = True  # type: ignore[attr-defined]  # noqa: SLF001 - our mark on a handler we own
        h.addFilter(TraceContextFilter(recorder))
        h.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        root.addHandler(h)
        changed.append((h, None))
        return changed
    for h in streams:
        changed.append((h, h.formatter))
        h.setFormatter(TraceContextFormatter(h.formatter, recorder))
    return changed
