"""Shared core of jobtrace: the event model, the exception tree and the CLI.

The user-facing one-line setup lives in :mod:`otel_instrumentation`; shippers in
:mod:`shippers`; analysis and ``trace-job`` in :mod:`queries`.
"""

from __future__ import annotations

__version__ = "0.1.0"
