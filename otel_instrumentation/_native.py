"""The recorder with its hot path compiled (``jobtrace_native.Recorder``), used when that package is installed.

In a training step each tracing call runs once, on caches the model's kernels have just
evicted, where a line of Python costs about a microsecond: the Python recorder's eight
events of the demo's step cost ~50 µs on the training thread and ~37 µs on the export
thread (``benchmarks/demo_calls.py``). The compiled one writes each event's line into one
byte buffer at the call (a span's enter and exit are one C call each) and the export
thread only takes that buffer.

This class is the Python :class:`Recorder` with the hot methods replaced by the compiled
ones (instance attributes, so a call is one C call, not a Python method calling one). What
the compiled side hands back, it hands to the methods here, which prepare it as the Python
recorder does and queue it in the same buffer, in order: a log record whose arguments could
change or that carries an exception, a metric value that is neither a number nor a CPU
tensor, and, at the drain, any event it cannot write byte for byte as the Python encoder
would (those are written by :meth:`Recorder.encode_batch`). ``JOBTRACE_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import functools
import importlib
from time import time_ns
from typing import TYPE_CHECKING, Any, Callable

import orjson

from jobtrace.events import json_default

from ._identity import Identity
from ._recorder import _METRIC, Recorder, log_fields, prepare_metric_values

if TYPE_CHECKING:
    from shippers._batch import BatchWorker

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


class NativeRecorder(Recorder):
    """A :class:`Recorder` whose training-thread state and queue live in ``jobtrace_native``."""

    def _init_hot(self, emit: Callable[[tuple[Any, ...]], None] | None) -> None:
        ident = self.identity
        core = jobtrace_native.Recorder(
            self._base_json,
            hooks=self.step_end_hooks,
            slow_log=self._slow_log,
            slow_metrics=self._slow_metrics,
            encode_one=self._encode_one,
            encode_attrs=_encode_attrs,
            root_span_id=int(ident.parent_span_id, 16) if ident.parent_span_id else None,
            sci_style=_SCI_STYLE,
        )
        self._core = core
        # The hot path, one C call each (``emit`` given by a caller is not used: the core is the queue).
        self.new_span = core.span
        self.log_record = core.log_record  # type: ignore[method-assign]
        self.metrics = core.metrics  # type: ignore[method-assign]
        self.emit = core.emit
        self.current_span_id = core.current_span_id  # type: ignore[method-assign]
        self.current_step_span_id = core.current_step_span_id  # type: ignore[method-assign]
        self.top = core.top  # type: ignore[method-assign]
        # Host RSS at step ends (``_torch.memory_hook`` asks for it), read by the core without a Python call.
        self.sample_rss: Callable[[float, int], bool] = core.sample_rss
        self.drain: Callable[[], tuple[bytes, int, int]] = core.drain

    # The training thread's state, kept by the core.
    @property
    def step(self) -> int | None:
        return self._core.step  # type: ignore[no-any-return]

    @step.setter
    def step(self, value: int | None) -> None:
        self._core.step = value

    @property
    def last_progress_ns(self) -> int:
        return self._core.last_progress_ns  # type: ignore[no-any-return]

    @last_progress_ns.setter
    def last_progress_ns(self, value: int) -> None:
        self._core.last_progress_ns = value

    @property
    def root_span_id(self) -> int | None:
        return self._core.root_span_id  # type: ignore[no-any-return]

    @root_span_id.setter
    def root_span_id(self, value: int | None) -> None:
        self._core.root_span_id = value

    @property
    def in_collective(self) -> tuple[str, str, int, int, int] | None:
        """Set by the core's collective wrapper only."""
        return self._core.in_collective  # type: ignore[no-any-return]

    @in_collective.setter
    def in_collective(self, value: tuple[str, str, int, int, int] | None) -> None:
        raise AttributeError("the compiled recorder sets in_collective itself")

    @property
    def pending(self) -> int:
        """Events queued in the core and not yet drained."""
        return self._core.pending  # type: ignore[no-any-return]

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
        """``fn`` recorded by the core on every call (see ``_torch``)."""
        wrapper = self._core.wrap_collective(fn, op, describe, group_type, payload_bytes)
        functools.update_wrapper(wrapper, fn)
        wrapper.__jobtrace_wrapped__ = fn
        return wrapper  # type: ignore[no-any-return]

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
