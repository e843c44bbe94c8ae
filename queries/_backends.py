"""Where ``trace-job`` reads a job from. Every backend ends in the same DuckDB ``events`` table.

Backends other than the embedded store are imported lazily so that a user who only
uses one of them needs only that extra installed.
"""

from __future__ import annotations

from typing import Any

from jobtrace.errors import ConfigError

from ._reading import TimeRange
from ._store import JobData, load_local

__all__ = ["BACKENDS", "TimeRange", "load_job"]

BACKENDS = ("local", "loki", "victorialogs", "elasticsearch")


def load_job(backend: str, job_id: str, *, data_dir: str = "jobtrace-data", url: str | None = None,
             time_range: TimeRange | None = None, **options: Any) -> JobData:
    """Load ``job_id``'s events from ``backend`` into DuckDB."""
    if backend == "local":
        return load_local(data_dir, job_id)
    rng = time_range or TimeRange.parse(None, None)
    if backend == "loki":
        from ._loki import load_loki

        return load_loki(job_id, url=url, time_range=rng, **options)
    if backend == "victorialogs":
        from ._victorialogs import load_victorialogs

        return load_victorialogs(job_id, url=url, time_range=rng, **options)
    if backend == "elasticsearch":
        from ._elasticsearch import load_elasticsearch

        return load_elasticsearch(job_id, url=url, time_range=rng, **options)
    raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
