"""The exception tree. Exceptions are raised only at user-facing edges (API, CLI);
the export path inside a training process returns results and counts instead.

    JobtraceError
    ├── ConfigError            bad arguments, variables or config files
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
    "RejectedByBackend",
    "ShipperError",
    "StoreError",
]


class JobtraceError(Exception):
    """Base of everything jobtrace raises on purpose."""


class ConfigError(JobtraceError):
    pass


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


class JobNotFound(QueryError):
    pass
