"""One-line tracing for distributed training.

    import otel_instrumentation as oi
    oi.init_tracing()

Then, optionally, mark steps and phases and record metrics::

    with oi.step(i):
        with oi.phase("forward"):
            ...
        oi.log_metrics(loss=loss)

The same names are ``jobtrace.init_tracing``, ``jobtrace.step``… (the ``jobtrace`` facade).
"""

from __future__ import annotations

import sys

from jobtrace.identity import Identity, resolve_identity, trace_id_for_job

from ._guard import GUARD_EXIT
from ._logging import TraceContextFilter
from ._setup import Tracing, get_tracing, guard, init_tracing, log_metrics, phase, publish_entry_points_on, span, step

__all__ = [
    "GUARD_EXIT",
    "Identity",
    "TraceContextFilter",
    "Tracing",
    "get_tracing",
    "guard",
    "init_tracing",
    "log_metrics",
    "phase",
    "publish_entry_points_on",
    "resolve_identity",
    "span",
    "step",
    "trace_id_for_job",
]

publish_entry_points_on(sys.modules[__name__])
