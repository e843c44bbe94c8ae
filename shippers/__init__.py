"""Moving events out of the training process: one batching engine, many sinks.

The embedded store (:class:`LocalStoreSink`) is the default sink. Network shippers
are a :class:`SpoolingSender` (disk spool, retry policy, dead-letter file, one
sender thread) around a backend-specific :class:`Encoder` and a :class:`Transport`.
:func:`export_job` sends a job already in the embedded store through the same shippers.
"""

from __future__ import annotations

from ._batch import BatchWorker, Sink, WorkerStats
from ._export import ExportSummary, export_job
from ._local import LocalStoreSink, job_dir
from ._registry import open_shipper
from ._sender import Encoder, Outcome, SenderStats, SpoolingSender
from ._spool import Batch, DeadLetter, Spool
from ._transport import (
    HttpConfig,
    InMemoryTransport,
    Request,
    RequestsTransport,
    Response,
    RetryPolicy,
    Transport,
)

__all__ = [
    "Batch",
    "BatchWorker",
    "DeadLetter",
    "Encoder",
    "ExportSummary",
    "HttpConfig",
    "InMemoryTransport",
    "LocalStoreSink",
    "Outcome",
    "Request",
    "RequestsTransport",
    "Response",
    "RetryPolicy",
    "SenderStats",
    "Sink",
    "Spool",
    "SpoolingSender",
    "Transport",
    "WorkerStats",
    "export_job",
    "job_dir",
    "open_shipper",
]
