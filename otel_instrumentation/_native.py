"""The recorder with its hot path compiled (``jobtrace_native.Recorder``), used when that package is installed.

In a training step each tracing call runs once, on caches the model's kernels have just
evicted, where a line of Python costs about a microsecond: the Python recorder's eight
events of the demo's step cost ~50 µs on the training thread and ~37 µs on the export
thread (``benchmarks/demo_calls.py``). The compiled one writes each event's line into one
byte buffer at the call (a span's enter and exit are one C call each) and the export
thread only takes that buffer.

This class is a :class:`TraceRecorder` whose hot members are the compiled core's own methods
(attributes bound per instance, so a call is one C call, not a Python method calling one), with
the Python recorder's encoder (:class:`LineEncoder`) for what the core cannot write. What
the compiled side hands back, it hands to the methods here, which prepare it as the Python
recorder does and queue it in the same buffer, in order: a log record whose arguments could
change or that carries an exception, a metric value that is neither a number nor a CPU
tensor, and, at the drain, any event it cannot write byte for byte as the Python encoder
would (those are written by :meth:`LineEncoder.encode_batch`). ``JOBTRACE_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from time import time_ns
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from jobtrace.events import SpanCategory, json_default
from jobtrace.identity import Identity

from ._recorder import _BEAT, _METRIC, LineEncoder, LogRecordFn, NewSpan, log_fields, prepare_metric_values

if TYPE_CHECKING:
    from shippers import BatchWorker

# ImportError: not installed (make_recorder falls back to the Python recorder).
jobtrace_native = importlib.import_module("jobtrace_native")

if not hasattr(jobtrace_native, "Recorder"):  # a build from before the compiled recorder
    raise ImportError("jobtrace_native has no Recorder: install the package again with Rust (cargo) on PATH")

__all__ = ["NativeRecorder"]


def _encode_attrs(attrs: Any) -> bytes:
    """A span's attributes as the Python encoder writes them (TypeError: its general path does)."""
    return orjson.dumps(attrs, default=json_default, option=orjson.OPT_SERIALIZE_NUMPY)


def _sci_style() -> int:
    """How the installed orjson writes floats in scientific notation (releases differ: ``1e16``, ``1e+16``).

    The compiled encoder writes them the same way, or (an unknown style) hands them to orjson.
    """
    return {b"[1e16,1.5e-7,1.2345e20]": 1, b"[1e+16,1.5e-7,1.2345e+20]": 2}.get(orjson.dumps([1e16, 1.5e-7, 1.2345e20]), 0)


_SCI_STYLE = _sci_style()


class _Core(Protocol):
    """``jobtrace_native.Recorder`` as this module uses it (``ingest/native/src/recorder.rs``)."""

    step: int | None
    last_progress_ns: int
    root_span_id: int | None

    @property
    def in_collective(self) -> tuple[str, str, int, int, int] | None: ...

    @property
    def pending(self) -> int: ...

    def span(self, name: str, cat: str, step: int | None = None,
             attrs: dict[str, Any] | None = None) -> AbstractContextManager[Any]: ...

    def step_span(self, i: int, **attrs: Any) -> AbstractContextManager[Any]: ...

    def phase(self, name: str, **attrs: Any) -> AbstractContextManager[Any]: ...

    def user_span(self, name: str, **attrs: Any) -> AbstractContextManager[Any]: ...

    def log_metrics(self, step: int | None = None, **values: Any) -> None: ...

    def log_record(self, record: logging.LogRecord, progress: bool = True) -> None: ...

    def push_log(self, created: float, level: str, logger: str, msg: Any, args: Any, exc: str | None,
                 progress: bool = True) -> None: ...

    def metrics(self, step: int | None, values: dict[str, Any]) -> None: ...

    def emit(self, item: tuple[Any, ...]) -> None: ...

    def current_span_id(self) -> int | None: ...

    def current_step_span_id(self) -> int | None: ...

    def top(self) -> tuple[str, str, int] | None: ...

    def sample_rss(self, interval_s: float, page_size: int) -> bool: ...

    def drain(self) -> tuple[bytes, int, int]: ...

    def bind(self, wake: Callable[[], None], spill: Callable[[bytes, int, int], None], batch: int,
             max_events: int) -> None: ...

    def after_fork(self, base: bytes) -> None: ...

    def retire(self, null: Any) -> None: ...

    def wrap_collective(self, fn: Callable[..., Any], op: str, describe: Callable[[Any], tuple[str, int]],
                        group_type: Any, payload_bytes: Callable[[Any], int]) -> Callable[..., Any]: ...


class NativeRecorder(LineEncoder):
    """A :class:`TraceRecorder` whose training-thread state and queue live in ``jobtrace_native``.

    The hot path's members are the core's own methods, bound to each instance when it is made: a
    call is one C call, where a method of this class calling the core would add a Python frame
    (about a microsecond in a cold training step).
    """

    new_span: NewSpan
    log_record: LogRecordFn
    metrics: Callable[[int | None, dict[str, Any]], None]
    emit: Callable[[tuple[Any, ...]], None]
    """The core is the queue (an ``emit`` given to the constructor is not used)."""
    current_span_id: Callable[[], int | None]
    current_step_span_id: Callable[[], int | None]
    top: Callable[[], tuple[str, str, int] | None]
    sample_rss: Callable[[float, int], bool]
    """Host RSS at step ends (``_torch.memory_hook`` asks for it), read by the core without a Python call."""
    drain: Callable[[], tuple[bytes, int, int]]

    def __init__(self, identity: Identity, emit: Callable[[tuple[Any, ...]], None] | None = None) -> None:
        super().__init__(identity)
        core: _Core = jobtrace_native.Recorder(
            self._base_json,
            hooks=self.step_end_hooks,
            slow_log=self._slow_log,
            slow_metrics=self._slow_metrics,
            encode_one=self._encode_one,
            encode_attrs=_encode_attrs,
            root_span_id=int(identity.parent_span_id, 16) if identity.parent_span_id else None,
            sci_style=_SCI_STYLE,
        )
        self._core = core
        self.new_span = core.span
        self.log_record = core.log_record
        self.metrics = core.metrics
        self.emit = core.emit
        self.current_span_id = core.current_span_id
        self.current_step_span_id = core.current_step_span_id
        self.top = core.top
        self.sample_rss = core.sample_rss
        self.drain = core.drain

    # The training thread's state, kept by the core.
    @property
    def step(self) -> int | None:
        return self._core.step

    @step.setter
    def step(self, value: int | None) -> None:
        self._core.step = value

    @property
    def last_progress_ns(self) -> int:
        return self._core.last_progress_ns

    @last_progress_ns.setter
    def last_progress_ns(self, value: int) -> None:
        self._core.last_progress_ns = value

    @property
    def root_span_id(self) -> int | None:
        return self._core.root_span_id

    @root_span_id.setter
    def root_span_id(self, value: int | None) -> None:
        self._core.root_span_id = value

    @property
    def in_collective(self) -> tuple[str, str, int, int, int] | None:
        """Set by the core's collective wrapper only."""
        return self._core.in_collective

    @in_collective.setter
    def in_collective(self, value: tuple[str, str, int, int, int] | None) -> None:
        raise AttributeError("the compiled recorder sets in_collective itself")

    @property
    def pending(self) -> int:
        """Events queued in the core and not yet drained."""
        return self._core.pending

    def span(self, name: str, cat: str = SpanCategory.USER, step: int | None = None,
             **attrs: Any) -> AbstractContextManager[Any]:
        """``with rec.span("load", "user", key=value):``, the core's span."""
        return self.new_span(name, cat, step, attrs or None)

    def heartbeat(self, attrs: dict[str, Any]) -> None:
        core = self._core
        core.emit((_BEAT, time_ns(), core.step, attrs))

    def bind(self, worker: BatchWorker[tuple[Any, ...]]) -> None:
        """The worker drains the core; a full batch wakes it, an overflow goes to its spill file."""
        batch, max_queue = worker.limits()
        self._core.bind(worker.wake, worker.spill_lines, batch, max_queue)
        worker.add_source(self._core.drain)

    def entry_points(self) -> dict[str, Callable[..., Any]]:
        core = self._core
        return {"step": core.step_span, "phase": core.phase, "span": core.user_span, "log_metrics": core.log_metrics}

    def retire(self, null_span: Any) -> None:
        self._core.retire(null_span)

    def set_identity(self, identity: Identity) -> None:
        super().set_identity(identity)
        self._core.after_fork(self._base_json)

    def wrap_collective(self, fn: Callable[..., Any], op: str, describe: Callable[[Any], tuple[str, int]],
                        group_type: Any, payload_bytes: Callable[[Any], int]) -> Callable[..., Any]:
        """``fn`` recorded by the core on every call (see :meth:`TraceRecorder.wrap_collective`)."""
        wrapper = self._core.wrap_collective(fn, op, describe, group_type, payload_bytes)
        functools.update_wrapper(wrapper, fn)
        wrapper.__jobtrace_wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    # ---- what the core hands back ------------------------------------------------------
    def _slow_log(self, record: Any, progress: bool) -> None:
        msg, args, exc = log_fields(record)
        self._core.push_log(record.created, record.levelname, record.name, msg, args, exc, progress)

    def _slow_metrics(self, step: int | None, values: Any) -> None:
        if isinstance(values, dict):
            prepare_metric_values(values)
        core = self._core
        core.emit((_METRIC, time_ns(), core.step if step is None else step, values, core.current_span_id()))

    def _encode_one(self, item: tuple[Any, ...]) -> bytes:
        return self.encode_batch([item])[0]
