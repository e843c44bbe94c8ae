"""``init_tracing()``: the one line a training script adds, and the handle it returns.

What it wires, in order: identity (job, rank, node, TraceID) → recorder (hot path)
→ batch worker (export thread) → sinks (embedded store by default), then the
bridges: stdlib logging, OpenTelemetry providers and context, torch collectives,
memory per step, the heartbeat thread, and exit hooks (atexit, uncaught exceptions,
SIGTERM, fork). Any failure to set up a *sink* is reported on stderr and training
goes on: a tracing tool must never be the reason a job dies.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import os
import signal
import sys
import tempfile
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from time import time_ns
from types import FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from jobtrace import config
from jobtrace.config import TracingSettings
from jobtrace.errors import ConfigError, StoreError
from jobtrace.events import SpanCategory
from jobtrace.identity import Identity, job_root_span_id, resolve_identity
from jobtrace.redact import Redactor, redactor_from_env
from jobtrace.store import job_dir, safe_name, spool_root
from shippers import (
    BatchWorker,
    LocalStoreSink,
    OtlpSpanSink,
    ProcessInfo,
    RootSpan,
    Sink,
    connect_packs,
    network_sinks_from_env,
)

from ._logging import JobtraceHandler, attach_to_loggers, install_console
from ._recorder import Recorder, TraceRecorder

if TYPE_CHECKING:
    from ._autostep import AutoSteps
    from ._guard import Guard
    from ._torch import CollectiveSource

__all__ = ["Tracing", "get_tracing", "init_tracing", "log_metrics", "phase", "publish_entry_points_on", "span", "step"]

_lock = threading.Lock()
_active: Tracing | None = None
_disabled: DisabledTracing | None = None


def _stderr(msg: str) -> None:
    try:
        sys.stderr.write(f"jobtrace: {msg}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110 - stderr closed: nowhere left to say it
        pass


class _NullSpan:
    """What ``step()``/``phase()`` return when tracing is not initialised: scripts still run."""

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_SPAN = _NullSpan()


class Tracing:
    """The live tracing of this process. Returned by :func:`init_tracing`."""

    def __init__(
        self,
        identity: Identity,
        sinks: Sequence[Sink],
        *,
        level: int,
        heartbeat_s: float,
        stall_dump_s: float,
        console: bool,
        torch: bool,
        memory_interval_s: float = 0.1,
        otel: bool,
        flush_interval_s: float,
        otel_context: str = "all",
        sink_factory: Callable[[Identity], list[Sink]] | None = None,
        native: bool | None = None,
        redact: Redactor | bool | None = None,
        collectives: str = "auto",
        auto_steps: bool = True,
        integrations: bool = True,
        data_dir: str | None = None,
        run_info: dict[str, Any] | None = None,
    ) -> None:
        self.identity = identity
        self._run_info = dict(run_info or {})
        self.recorder = make_recorder(identity, native)
        self.new_span = self.recorder.new_span  # what the module's step()/phase()/span() call
        self._sink_factory = sink_factory
        self.worker: BatchWorker[tuple[Any, ...]] = BatchWorker(
            self.recorder.encode_batch, sinks, flush_interval_s=flush_interval_s, redact=redact
        )
        self.recorder.bind(self.worker)
        self._flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self.stall_dump_s = stall_dump_s
        self._data_dir = data_dir
        self._closed = False
        self._undo: list[Callable[[], object]] = []  # what an undo returns is ignored
        if identity.parent_span_id is None:
            # One root span id per job, the same on every rank, so all step spans share a parent.
            self.recorder.root_span_id = job_root_span_id(identity.job_id)

        self._install_logging(level, console)
        if otel:
            self._install_otel(otel_context)
        self.torch_instrumented = False
        self.auto_steps: AutoSteps | None = None
        """Steps and phases from optimizer, DataLoader, module and backward hooks (None: off, or no torch)."""
        self.collectives: CollectiveSource | None = None
        """How collectives are recorded (``.mode``: ``hooks`` or ``wrap``), and which one the rank is in."""
        if torch and ("torch" in sys.modules or _torch_importable()):
            from ._torch import instrument_torch, memory_hook

            self.collectives = instrument_torch(self.recorder, collectives)
            self.torch_instrumented = self.collectives is not None
            if self.collectives is not None:
                self._undo.append(self.collectives.uninstall)
                if self.collectives.compiled:  # their records go out with each batch
                    self.worker.before_export(self.collectives.drain)
            hook = memory_hook(self.recorder, memory_interval_s)
            if hook is not None:
                self.recorder.step_end_hooks.append(hook)
            if auto_steps:
                from ._autostep import AutoSteps

                self.auto_steps = AutoSteps(self.recorder)
                self.auto_steps.install()
                self._undo.append(self.auto_steps.uninstall)
            from . import integrations as frameworks

            frameworks.bind(log_metrics)  # the callbacks' values, also for a script that adds them itself
            if integrations:
                frameworks.install()  # patches Trainers when their modules are imported; inert once tracing stops
        self._stop_beat = threading.Event()
        self._beat_thread = threading.Thread(target=self._beat_loop, name="jobtrace-heartbeat", daemon=True)
        self._beat_thread.start()
        self._install_exit_hooks()
        self._record_message(logging.INFO, "start", logger="jobtrace.lifecycle")
        for w in identity.warnings:
            logging.getLogger("jobtrace").warning("jobtrace: %s", w)

    # ---- user API -----------------------------------------------------------------------
    def step(self, i: int, **attrs: Any) -> AbstractContextManager[Any]:
        """``with tracing.step(i):`` marks one training step (the unit the analysis compares)."""
        return self.recorder.span("step", SpanCategory.STEP, i, **attrs)

    def phase(self, name: str, **attrs: Any) -> AbstractContextManager[Any]:
        """``with tracing.phase("forward"):`` a part of a step: data, forward, backward, optimizer…"""
        return self.recorder.span(name, SpanCategory.PHASE, None, **attrs)

    def span(self, name: str, **attrs: Any) -> AbstractContextManager[Any]:
        return self.recorder.span(name, SpanCategory.USER, None, **attrs)

    def log_metrics(self, step: int | None = None, **values: Any) -> None:
        """Record metric values (loss, lr, grad_norm, tokens_per_s…) for a step."""
        self.recorder.metrics(step, values)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return self.worker.force_flush(timeout_s)

    def stats(self) -> dict[str, Any]:
        # Queued: on the worker's queue, and in the compiled recorder's buffer where that is in use.
        return asdict(self.worker.stats) | {"queued": self.worker.queued + self.recorder.pending}

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush and stop. Idempotent; called automatically at exit and on SIGTERM."""
        global _active
        if self._closed:
            return
        self._closed = True
        self._stop_beat.set()
        if self.collectives is not None:
            self.collectives.drain()  # the compiled hooks' last records, before the final flush (never raises)
        self._record_message(logging.INFO, "stop", logger="jobtrace.lifecycle")
        self.worker.shutdown(timeout_s)
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # noqa: BLE001, S110 - undo what can be undone, whatever failed
                pass
        with _lock:
            if _active is self:
                _active = None
                _publish(None)
        self.recorder.retire(_NULL_SPAN)

    # ---- wiring ---------------------------------------------------------------------------
    def _install_logging(self, level: int, console: bool) -> None:
        root = logging.getLogger()
        self.handler = JobtraceHandler(self.recorder, level)
        old_level = root.level
        if root.level == logging.NOTSET or root.level > level:
            # Capture INFO even when the script left the root at WARNING, without making
            # its existing console handlers print more than before.
            for h in root.handlers:
                if h.level == logging.NOTSET:
                    h.setLevel(old_level or logging.WARNING)
                    self._undo.append(functools.partial(h.setLevel, logging.NOTSET))
            root.setLevel(level)
            self._undo.append(lambda: root.setLevel(old_level))
        changed = install_console(self.recorder, console)
        root.handlers.insert(0, self.handler)
        attach_to_loggers(self.handler)

        def undo_logging() -> None:
            for logger in [root, *logging.root.manager.loggerDict.values()]:
                if isinstance(logger, logging.Logger) and self.handler in logger.handlers:
                    logger.removeHandler(self.handler)
            for h, fmt in changed:
                if fmt is None and getattr(h, "_jobtrace_owned", False):
                    root.removeHandler(h)
                else:
                    h.setFormatter(fmt)

        self._undo.append(undo_logging)

    def _install_otel(self, context: str) -> None:
        try:
            from ._otel import install_otel

            self._undo.append(install_otel(self.recorder, context))
        except Exception as exc:  # noqa: BLE001 - OTel trouble must not break training
            _stderr(f"OpenTelemetry setup skipped: {exc}")

    def _install_exit_hooks(self) -> None:
        atexit.register(self.shutdown)
        self._undo.append(lambda: atexit.unregister(self.shutdown))

        prev_hook = sys.excepthook

        def excepthook(t: type[BaseException], e: BaseException, tb: TracebackType | None) -> None:
            self._record_exception("uncaught exception", (t, e, tb))
            self.shutdown()
            prev_hook(t, e, tb)

        sys.excepthook = excepthook
        self._undo.append(lambda: setattr(sys, "excepthook", prev_hook))

        prev_thread_hook = threading.excepthook

        def thread_hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is not SystemExit:
                self._record_exception(
                    f"uncaught exception in thread {getattr(args.thread, 'name', '?')}",
                    (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
                )
            prev_thread_hook(args)

        threading.excepthook = thread_hook
        self._undo.append(lambda: setattr(threading, "excepthook", prev_thread_hook))

        if threading.current_thread() is threading.main_thread():
            prev_term = signal.getsignal(signal.SIGTERM)

            def on_term(signum: int, frame: FrameType | None) -> None:
                self._record_message(logging.WARNING, "received SIGTERM; flushing and exiting")
                self.shutdown()
                if callable(prev_term):
                    prev_term(signum, frame)
                elif prev_term != signal.SIG_IGN:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_term)
            self._undo.append(lambda: signal.signal(signal.SIGTERM, prev_term))

        if hasattr(os, "register_at_fork"):
            # A fork hook cannot be unregistered: hold the handle weakly, so a shut-down Tracing can be freed.
            after_fork = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (method := after_fork()) is not None and method())

    def _after_fork(self) -> None:
        """In a forked child (e.g. a DataLoader worker) events go to the child's own file."""
        if self._closed:
            return
        ident = Identity(**{**asdict(self.identity), "pid": os.getpid(), "warnings": (), "forked": True})
        self.identity = ident
        self.recorder.set_identity(ident)
        sinks = self._sink_factory(ident) if self._sink_factory else []
        self.worker = BatchWorker(self.recorder.encode_batch, sinks, flush_interval_s=self._flush_interval_s,
                                  redact=self.worker.redactor or False)
        self.recorder.bind(self.worker)
        self._stop_beat.set()  # heartbeats describe the rank; the parent keeps sending them
        atexit.register(self.shutdown)

    # ---- heartbeat thread ----------------------------------------------------------------
    def _flight_recorder_path(self) -> str | None:
        """Where a stall's Flight Recorder dump goes: beside the rank's events (None without torch collectives)."""
        if self.collectives is None or self._data_dir is None:
            return None
        ident = self.identity
        return str(job_dir(self._data_dir, ident.job_id) / f"fr-{safe_name(ident.node)}.r{ident.rank}.p{ident.pid}.json")

    def _record_message(self, levelno: int, msg: str, exc_text: str | None = None, logger: str = "jobtrace") -> None:
        record = logging.LogRecord(logger, levelno, __file__, 0, msg, None, None)
        if exc_text:
            record.exc_text = exc_text
        self.recorder.log_record(record, progress=False)

    def _record_exception(self, msg: str, exc_info: Any) -> None:
        record = logging.LogRecord("jobtrace", logging.CRITICAL, __file__, 0, msg, None, exc_info)
        self.recorder.log_record(record, progress=False)

    def _beat_loop(self) -> None:
        rec = self.recorder
        main_ident = threading.main_thread().ident
        dumped_for: int | None = None
        modules, last_env = -1, None
        first = True  # the first beat comes at once: a rank that dies in its first seconds has said who it is
        while first or not self._stop_beat.wait(self.heartbeat_s):
            first = False
            try:
                now = time_ns()
                attrs: dict[str, Any] = {"progress_age_ms": (now - rec.last_progress_ns) // 1_000_000}
                if self.identity.slurm_step:
                    attrs["slurm_step"] = self.identity.slurm_step
                if len(sys.modules) != modules:  # a framework imported since: say its version (once, on change)
                    modules = len(sys.modules)
                    env = {**self._run_info, "versions": framework_versions()}
                    if env != last_env:
                        attrs["env"] = last_env = env
                top = rec.top()
                if top is None and self.auto_steps is not None:
                    top = self.auto_steps.top()
                if top is not None:
                    name, cat, start = top
                    attrs.update(in_span=name, in_cat=cat, span_age_ms=(now - start) // 1_000_000)
                coll = self.collectives.waiting() if self.collectives is not None else None
                if coll is not None:
                    attrs.update(in_op=coll[0], in_group=coll[1], in_seq=coll[2], op_age_ms=(now - coll[3]) // 1_000_000)
                    if len(coll) > 4:
                        attrs["in_bytes"] = coll[4]
                done = getattr(self.collectives, "last_done", None)
                if done is not None:  # the last collective this rank completed: where a watcher sees it stopped
                    attrs.update(last_op=done[0], last_group=done[1], last_seq=done[2],
                                 last_done_ms=(now - done[3]) // 1_000_000)
                rec.heartbeat(attrs)
                stalled_ns = now - rec.last_progress_ns
                if stalled_ns > self.stall_dump_s * 1e9 and dumped_for != rec.last_progress_ns:
                    dumped_for = rec.last_progress_ns
                    self._record_message(
                        logging.WARNING,
                        f"no progress for {stalled_ns / 1e9:.0f}s; main thread stack attached"
                        + (f" (in {coll[0]} #{coll[2]}, group {coll[1]})" if coll is not None else ""),
                        exc_text=_scene(main_ident, self._flight_recorder_path()),
                    )
                attach_to_loggers(self.handler)
            except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive any bug
                _stderr(f"heartbeat error: {exc}")


def _scene(main_ident: int | None, fr_path: str | None) -> str:
    """What a stalled rank is doing, while it still is: every Python thread's stack (the main thread's first),
    and the Flight Recorder's buffer written to ``fr_path`` where torch keeps one (its path is named)."""
    frames = sys._current_frames()  # noqa: SLF001 - the way to read other threads' stacks
    names = {t.ident: t.name for t in threading.enumerate()}
    order = sorted(frames, key=lambda ident: (ident != main_ident, names.get(ident, "")))
    parts = []
    for ident in order:
        label = "main thread" if ident == main_ident else f"thread {names.get(ident, ident)!s}"
        parts.append(f"--- {label} ---\n" + "".join(traceback.format_stack(frames[ident])))
    text = "".join(parts) if parts else "(no threads)"
    if fr_path is not None:
        try:
            from torch._C._distributed_c10d import _dump_fr_trace_json  # torch's own dump, as on a timeout

            data = _dump_fr_trace_json(includeCollectives=True)
            with open(fr_path, "w", encoding="utf-8") as fh:
                fh.write(data if isinstance(data, str) else data.decode())
            text += f"--- Flight Recorder buffer written to {fr_path} ---\n"
        except Exception as exc:  # noqa: BLE001 - no buffer (no collectives yet, an old torch): the stacks still say it
            text += f"--- no Flight Recorder buffer: {type(exc).__name__} ---\n"
    return text


def make_recorder(identity: Identity, native: bool | None = None) -> TraceRecorder:
    """The compiled recorder where ``jobtrace_native`` is built, unless ``native`` is false (default
    ``JOBTRACE_NATIVE``); otherwise the Python one."""
    if native if native is not None else config.get_bool(config.NATIVE, default=True):
        try:
            from ._native import NativeRecorder
        except ImportError:
            pass
        else:
            return NativeRecorder(identity)
    return Recorder(identity)


def _torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _default_sinks(data_dir: str, settings: TracingSettings, strict: bool) -> Callable[[Identity], list[Sink]]:
    def build(ident: Identity) -> list[Sink]:
        network: list[Sink] = []
        try:
            info = ProcessInfo(ident.job_id, ident.node, ident.rank, ident.pid, spool_root(data_dir, ident.job_id))
            network = network_sinks_from_env(info)
        except Exception as exc:  # a bad server config must not stop training
            if strict:
                raise ConfigError(f"cannot set up a log shipper: {exc}") from exc
            _stderr(f"cannot set up a log shipper: {exc}; continuing with the embedded store")
        network += _otlp_sinks(ident, settings)
        if network and not settings.local_store:
            return network
        # The store sink first: it is closed first, and sends its rank's pack to the shippers still open.
        sinks = _local_sink(data_dir, ident, strict, settings.compact) + network
        connect_packs(sinks)
        return sinks

    return build


def _otlp_sinks(ident: Identity, settings: TracingSettings) -> list[Sink]:
    """Spans to a trace store when an OTLP endpoint is configured the standard OpenTelemetry way."""
    if not (settings.otlp_endpoint or settings.otlp_traces_endpoint):
        return []
    try:
        from ._otel import resource_for

        # Rank 0's first process closes the job's root span, which no rank records itself: without it
        # trace views (Jaeger, Tempo) show the job as a trace whose root was never received.
        root = (None if ident.rank != 0 or ident.forked or ident.parent_span_id is not None
                else RootSpan(int(ident.trace_id, 16), job_root_span_id(ident.job_id), "job", time_ns()))
        return [OtlpSpanSink(resource_for(ident), root=root)]
    except ImportError as exc:
        _stderr(f"OTLP endpoint set but the exporter is missing ({exc}): pip install 'jobtrace[otlp]'")
        return []


def _local_sink(target: str, ident: Identity, strict: bool, compact: bool) -> list[Sink]:
    try:
        return [LocalStoreSink(target, ident.job_id, ident.node, ident.rank, ident.pid, compact=compact)]
    except StoreError as exc:
        if strict:
            raise ConfigError(str(exc)) from exc
        fallback = os.path.join(tempfile.gettempdir(), "jobtrace-data")
        try:
            sink = LocalStoreSink(fallback, ident.job_id, ident.node, ident.rank, ident.pid, compact=compact)
        except StoreError as exc2:
            _stderr(f"{exc}; fallback failed too ({exc2}). Training continues, events are NOT stored.")
            return []
        _stderr(f"{exc}; writing to {sink.path} instead. Training continues.")
        return [sink]


def init_tracing(
    job_id: str | None = None,
    *,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    node: str | None = None,
    data_dir: str | None = None,
    sinks: Sequence[Sink] | None = None,
    level: int = logging.INFO,
    heartbeat_s: float | None = None,
    stall_dump_s: float | None = None,
    memory_interval_s: float | None = None,
    console: bool = True,
    torch: bool = True,
    otel: bool = True,
    otel_context: str = "all",
    flush_interval_s: float | None = None,
    strict: bool = False,
    redact: bool | Redactor | Sequence[tuple[str, str]] | None = None,
    model: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> Tracing:
    """Trace this process as one rank of a job. Safe to call more than once (returns the live handle).

    Args:
        job_id: shared by all ranks; default from ``JOBTRACE_JOB_ID`` or the launcher.
        rank, local_rank, world_size, node: override what the launcher variables say.
        data_dir: embedded store directory (default ``$JOBTRACE_DATA_DIR`` or ``./jobtrace-data``).
        sinks: replace the embedded store with these sinks (e.g. a Loki shipper).
        level: lowest stdlib logging level captured (default INFO).
        heartbeat_s: seconds between heartbeats (default ``$JOBTRACE_HEARTBEAT_S`` or 2).
        stall_dump_s: seconds without progress before the main thread's stack is recorded
            (default ``$JOBTRACE_STALL_DUMP_S`` or 10).
        memory_interval_s: least seconds between two host RSS samples at step ends (default
            ``$JOBTRACE_MEMORY_INTERVAL_S`` or 0.1; 0 samples every step). CUDA counters are
            read every step: unlike RSS they need no system call.
        console: prefix console log lines with job, rank, trace and span ids.
        torch: record torch.distributed collectives and per-step memory when torch is present.
        otel: set up OpenTelemetry providers and put the job's trace in the current context.
        otel_context: which of our spans is the current OpenTelemetry span, so that spans started
            with the OTel API nest under it: ``"all"`` (default: the innermost), ``"step"`` or
            ``"none"``. Resolved when an OTel span starts, so it costs our spans nothing.
        flush_interval_s: seconds between the export thread's batches (default ``$JOBTRACE_FLUSH_INTERVAL_S``
            or 1). Longer spares each rank a wake-up a second (measurable on millisecond steps with more ranks
            than cores) but widens what a SIGKILL loses: everything after the last batch.
        strict: raise :class:`ConfigError` when the store cannot be written instead of falling back.
        redact: secrets in events become ``[REDACTED:<kind>]`` on the export thread, before any sink
            (default ``$JOBTRACE_REDACT``, on; see docs/redaction.md). ``False``: off; ``True``: on whatever
            the variable says; ``[(kind, regex), …]``: on, with these patterns besides the built-in ones and
            ``$JOBTRACE_REDACT_PATTERNS``; a :class:`jobtrace.redact.Redactor`: that one.
        model: the model's name, and ``config`` the run's configuration (hashed, never sent): heartbeats
            carry them with the versions of the frameworks the process has imported, so that a golden
            library (``jobtrace golden``) compares a run with runs of its own model and configuration.
    """
    global _active, _disabled
    with _lock:
        if _active is not None:
            return _active
        if otel_context not in ("step", "all", "none"):
            raise ConfigError(f"otel_context={otel_context!r}: use 'step', 'all' or 'none'")
        settings = TracingSettings.from_env()
        identity = resolve_identity(
            job_id=job_id, rank=rank, local_rank=local_rank, world_size=world_size, node=node
        )
        if identity.job_derived and torch and not settings.disabled:
            identity = _with_run_nonce(identity, rank, local_rank, world_size, node)
        if settings.disabled:
            if _disabled is None:
                _disabled = DisabledTracing(identity)
            return _disabled  # type: ignore[return-value]  # the same interface, doing nothing
        redactor = _redactor(redact)
        beat = _given(heartbeat_s, settings.heartbeat_s, "heartbeat_s", positive=True)
        flush = _given(flush_interval_s, settings.flush_interval_s, "flush_interval_s", positive=True)
        dump = _given(stall_dump_s, settings.stall_dump_s, "stall_dump_s")
        memory = _given(memory_interval_s, settings.memory_interval_s, "memory_interval_s")
        factory = _default_sinks(data_dir or settings.data_dir, settings, strict)
        chosen = list(sinks) if sinks is not None else factory(identity)
        _active = Tracing(
            identity,
            chosen,
            level=level,
            heartbeat_s=beat,
            stall_dump_s=dump,
            memory_interval_s=memory,
            console=console,
            torch=torch,
            otel=otel,
            flush_interval_s=flush,
            otel_context=otel_context,
            sink_factory=factory if sinks is None else None,
            native=settings.native,
            redact=redactor,
            collectives=settings.collectives,
            auto_steps=settings.auto_steps,
            data_dir=(data_dir or settings.data_dir) if sinks is None and settings.local_store else None,
            integrations=settings.integrations,
            run_info=run_info(model, config),
        )
        _publish(_active.recorder)
        return _active


#: the frameworks whose versions a heartbeat reports, where the process has imported them (never imported here)
FRAMEWORKS = ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed", "megatron.core",
              "nemo", "jobtrace")


def framework_versions() -> dict[str, str]:
    """Python's version and those of :data:`FRAMEWORKS` this process has imported."""
    out = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in FRAMEWORKS:
        mod = sys.modules.get(name)
        version = getattr(mod, "__version__", None) if mod is not None else None
        if version is not None:
            out[name] = str(version)
    return out


def run_info(model: str | None, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``init_tracing(model=, config=)`` says of the run: the model's name and a hash of its configuration
    (sorted JSON, values as text where not JSON; the configuration itself never leaves the process)."""
    import hashlib
    import json

    out: dict[str, Any] = {}
    if model:
        out["model"] = str(model)[:200]
    if config is not None:
        text = json.dumps(dict(config), sort_keys=True, default=str, separators=(",", ":"))
        out["config_hash"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def _with_run_nonce(identity: Identity, rank: int | None, local_rank: int | None, world_size: int | None,
                    node: str | None) -> Identity:
    """A derived job id made this run's own with a nonce from the run's store (``_runid``), where there is one."""
    from ._runid import run_nonce

    env = config.environ()
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("true", "1")
    wait = 30.0 if agent else config.get_float(config.RUN_NONCE_TIMEOUT_S, env, 300.0, positive=True) or 300.0
    nonce = run_nonce(env, identity.rank, timeout_s=wait)
    if nonce is None:
        return identity
    job = f"{identity.job_id}-{nonce}"
    again = resolve_identity(job_id=job, rank=rank, local_rank=local_rank, world_size=world_size, node=node)
    where = "torchrun's agent store" if agent else "the store rank 0 serves at MASTER_ADDR/PORT"
    note = (f"no launcher job id found; derived {job} from MASTER_ADDR/PORT and this run's nonce in {where}. "
            f"Set {config.JOB_ID} to name the job.")
    kept = tuple(w for w in again.warnings if not w.startswith("no launcher job id"))
    return dataclasses.replace(again, warnings=(note, *kept))


def _redactor(redact: bool | Redactor | Sequence[tuple[str, str]] | None) -> Redactor | bool:
    """What ``init_tracing(redact=…)`` asks for, as the export thread's redactor (``False``: none)."""
    if isinstance(redact, Redactor) or redact is False:
        return redact
    if redact is None or redact is True:
        found = redactor_from_env(force=redact is True)
    else:
        found = redactor_from_env(extra=redact, force=True)
    return found if found is not None else False


def _given(value: float | None, default: float, name: str, *, positive: bool = False) -> float:
    """An argument when given (an explicit 0 included), else the setting; checked like the variable."""
    if value is None:
        return default
    if value != value or value < 0 or (positive and value == 0):
        raise ConfigError(f"{name}={value!r} must be {'above' if positive else 'at least'} 0")
    return float(value)


class DisabledTracing:
    """What :func:`init_tracing` returns under ``JOBTRACE_DISABLE=1``: the handle's interface, doing nothing.

    No handler, hook, thread or file is installed, so a job can turn tracing off without a code change
    and without paying for it; ``step``/``phase``/``span`` return a null span.
    """

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.torch_instrumented = False
        self.collectives = None
        self.auto_steps = None

    def step(self, i: int, **attrs: Any) -> AbstractContextManager[Any]:
        return _NULL_SPAN

    def phase(self, name: str, **attrs: Any) -> AbstractContextManager[Any]:
        return _NULL_SPAN

    def span(self, name: str, **attrs: Any) -> AbstractContextManager[Any]:
        return _NULL_SPAN

    def log_metrics(self, step: int | None = None, **values: Any) -> None:
        return None

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return {"disabled": True}

    def shutdown(self, timeout_s: float = 10.0) -> None:
        global _disabled
        with _lock:
            if _disabled is self:
                _disabled = None


def get_tracing() -> Tracing | None:
    return _active


_ENTRY_POINTS = ("step", "phase", "span", "log_metrics")
_entry_namespaces: list[ModuleType] = []
"""The modules whose ``step``/``phase``/``span``/``log_metrics`` :func:`_publish` rebinds: the package's
``__init__`` and the ``jobtrace`` facade register themselves, so this module never imports either."""


def publish_entry_points_on(namespace: ModuleType) -> None:
    """Keep ``namespace``'s entry points bound to the live recorder's from now on."""
    if namespace not in _entry_namespaces:
        _entry_namespaces.append(namespace)
    _publish(_active.recorder if _active is not None else None)


def _publish(recorder: TraceRecorder | None) -> None:
    """Bind the package's ``step``/``phase``/``span``/``log_metrics`` to ``recorder``'s entry points
    (the compiled recorder's), or back to the functions below (``None``).

    Each runs several times a step, cold, where the Python function's own frame costs about as much
    as the compiled call it makes (~1.2 µs). ``oi.phase(...)`` looks the name up on the package at
    each call, so a script gets the compiled one while tracing runs; a name imported before
    ``init_tracing`` keeps the function below, which does the same one frame slower.
    """
    fast = recorder.entry_points() if recorder is not None else {}
    here = globals()
    for namespace in _entry_namespaces:
        for name in _ENTRY_POINTS:
            setattr(namespace, name, fast.get(name, here[name]))


# The module-level helpers build the Span directly: every layer of call and ``**attrs``
# re-packing is paid per phase, several times a step, on the training thread.
def step(i: int, **attrs: Any) -> AbstractContextManager[Any]:
    t = _active
    return t.new_span("step", SpanCategory.STEP, i, attrs or None) if t is not None else _NULL_SPAN


def phase(name: str, **attrs: Any) -> AbstractContextManager[Any]:
    t = _active
    return t.new_span(name, SpanCategory.PHASE, None, attrs or None) if t is not None else _NULL_SPAN


def span(name: str, **attrs: Any) -> AbstractContextManager[Any]:
    t = _active
    return t.new_span(name, SpanCategory.USER, None, attrs or None) if t is not None else _NULL_SPAN


def guard(*, grad_norm_max: float | None = None, on: str = "clip", nan: str | None = "stop",
          checkpoint: Callable[[int | None], Any] | None = None, pause_file: str | None = None,
          batch_ids: Callable[[], Any] | None = None) -> Guard:
    """Act on NaN or exploding gradients at every optimizer step, the same way on every rank (``_guard``).

    ``on`` (a norm above ``grad_norm_max``) and ``nan`` (NaN/Inf gradients): ``clip``, ``skip``, ``pause``
    (until ``pause_file`` is removed or SIGUSR1 comes; the step is then skipped) or ``stop``
    (``checkpoint(step)``, then exit with status 65).
    Call after :func:`init_tracing`; returns the guard (``.actions`` says what it did, ``.remove()``).
    """
    from ._guard import Guard

    t = _active
    if t is None:
        raise ConfigError("guard(): call init_tracing() first")
    g = Guard(t.recorder, grad_norm_max=grad_norm_max, on=on, nan=nan, checkpoint=checkpoint, pause_file=pause_file,
              batch_ids=batch_ids, on_stop=t.shutdown)
    t._undo.append(g.remove)  # noqa: SLF001 - the handle's own list of what to undo at shutdown
    return g.install()


def log_metrics(step: int | None = None, **values: Any) -> None:
    t = _active
    if t is not None:
        t.recorder.metrics(step, values)
