"""jobtrace: one TraceID for every rank of a distributed training job.

    import jobtrace
    jobtrace.init_tracing()

    for i, batch in enumerate(loader):
        with jobtrace.step(i):
            with jobtrace.phase("forward"):
                ...
            jobtrace.log_metrics(loss=loss)

These names are the instrumentation's (:mod:`otel_instrumentation`, the same functions under
their own package's name), imported on the first use of one of them: ``import jobtrace.events``,
the core every other package reads, never pays for the instrumentation, nor does a reader of
jobs (:mod:`queries`, ``trace-job``). While tracing runs, ``jobtrace.step``/``phase``/``span``/
``log_metrics`` are the compiled recorder's entry points, as ``otel_instrumentation``'s are.
Shippers are in :mod:`shippers`, the analysis in :mod:`queries`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Tracing", "__version__", "get_tracing", "guard", "init_tracing", "log_metrics", "phase", "span", "step"]

_INSTRUMENTATION = ("Tracing", "get_tracing", "guard", "init_tracing", "log_metrics", "phase", "span", "step")
"""The names this module takes from otel_instrumentation when one is first asked for."""

if TYPE_CHECKING:
    from otel_instrumentation import Tracing, get_tracing, guard, init_tracing, log_metrics, phase, span, step


def __getattr__(name: str) -> Any:
    """An instrumentation name, on first use (PEP 562): all of them become this module's own attributes
    then (later lookups cost what any attribute costs), the entry points kept bound to the live recorder's."""
    if name not in _INSTRUMENTATION:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import otel_instrumentation

    here = globals()
    for key in _INSTRUMENTATION:
        here[key] = getattr(otel_instrumentation, key)
    otel_instrumentation.publish_entry_points_on(sys.modules[__name__])
    return here[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_INSTRUMENTATION})
