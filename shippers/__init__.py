"""Moving events out of the training process: one batching engine, many sinks.

The embedded store (:class:`LocalStoreSink`) is the default sink; the Loki and
Elasticsearch shippers plug into the same :class:`BatchWorker`.
"""

from __future__ import annotations

from ._batch import BatchWorker, Sink, WorkerStats
from ._local import LocalStoreSink, job_dir

__all__ = ["BatchWorker", "LocalStoreSink", "Sink", "WorkerStats", "job_dir"]
