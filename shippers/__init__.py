"""Moving events out of the training process: one batching engine, many sinks.

The embedded store (:class:`LocalStoreSink`) is the default sink. Network shippers
are a :class:`SpoolingSender` (disk spool, retry policy, dead-letter file, one
sender thread) around a backend-specific :class:`Encoder` and a :class:`Transport`.
:func:`export_job` sends a job already in the embedded store through the same shippers.
A rank's *pack* (its rollup as a few lines, :mod:`jobtrace.store._packs`) goes to the shippers that
take packs (:func:`connect_packs`) when the rank's store sink closes, and with every export.
"""

from __future__ import annotations

from jobtrace.http import (
    HttpConfig,
    InMemoryTransport,
    Request,
    RequestsTransport,
    Response,
    RetryPolicy,
    Transport,
)

from ._batch import BatchWorker, Sink, WorkerStats
from ._export import ExportSummary, export_job
from ._local import LocalStoreSink, connect_packs, takes_packs
from ._loki_logging import LokiHandler
from ._otlp import OtlpSpanSink, RootSpan
from ._process import ProcessInfo
from ._registry import NETWORK_BACKENDS, SHIPPER_BACKENDS, local_store_enabled, network_sinks_from_env, open_shipper
from ._sender import Encoder, Outcome, SenderStats, SpoolingSender
from ._spool import Batch, DeadLetter, Spool

__all__ = [
    "Batch",
    "BatchWorker",
    "DeadLetter",
    "Encoder",
    "ExportSummary",
    "HttpConfig",
    "InMemoryTransport",
    "LocalStoreSink",
    "LokiHandler",
    "NETWORK_BACKENDS",
    "OtlpSpanSink",
    "Outcome",
    "ProcessInfo",
    "Request",
    "RequestsTransport",
    "Response",
    "RetryPolicy",
    "RootSpan",
    "SHIPPER_BACKENDS",
    "SenderStats",
    "Sink",
    "Spool",
    "SpoolingSender",
    "Transport",
    "WorkerStats",
    "connect_packs",
    "export_job",
    "local_store_enabled",
    "network_sinks_from_env",
    "open_shipper",
    "takes_packs",
]
