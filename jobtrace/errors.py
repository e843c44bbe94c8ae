"""The exception tree. Exceptions are raised only at user-facing edges (API, CLI);
the export path inside a training process returns results and counts instead.

    JobtraceError
    ├── ConfigError            bad arguments, variables or config files
    ├── Refused                declined because of what was found (an unhealthy job kept as golden)
    ├── StoreError             the embedded store cannot be written or read
    ├── ShipperError
    │   ├── BackendUnavailable      the server did not answer (retryable)
    │   └── RejectedByBackend       the server refused the data (not retryable)
    └── QueryError
        └── JobNotFound        no event of that job in the chosen backend
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "JobNotFound",
    "JobtraceError",
    "QueryError",
    "Refused",
    "RejectedByBackend",
    "ServerUnavailable",
    "ShipperError",
    "StoreError",
]


class JobtraceError(Exception):
    """Base of everything jobtrace raises on purpose."""


class ConfigError(JobtraceError):
    pass


class Refused(JobtraceError):
    """The request was understood and declined because of what jobtrace found, not because it
    failed: keeping an unhealthy job as a golden run, say. The CLI exits 1 (problem found)."""


class StoreError(JobtraceError):
    pass


class ShipperError(JobtraceError):
    pass


class BackendUnavailable(ShipperError):
    pass


class RejectedByBackend(ShipperError):
    pass


class QueryError(JobtraceError):
    pass


class ServerUnavailable(QueryError):
    """A server to read from did not answer, or kept answering 429/5xx, through every retry: maybe for a while
    only (a watcher keeps polling; ``trace-job`` stops with exit 3)."""


class JobNotFound(QueryError):
    pass
