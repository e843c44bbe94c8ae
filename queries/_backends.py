"""Where ``trace-job`` reads a job from. Every backend ends in the same DuckDB ``events`` table.

One table maps each backend's name to its :class:`Loader`. Backends other than the
embedded store are imported when their loader is called, so that a user who only uses
one of them needs only that extra installed.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from jobtrace.errors import ConfigError

from ._reading import TimeRange
from ._store import JobData, load_local

__all__ = ["BACKENDS", "Loader", "TimeRange", "load_job"]


class Loader(Protocol):
    """Loads one job from one kind of backend into DuckDB (:class:`JobData`).

    Each is given every option :func:`load_job` was given and takes what its backend uses:
    the embedded store ``data_dir``, a server ``url``, ``time_range``, ``whole`` and its own ``options``.
    A server that can aggregate does, unless ``whole`` asks for every event (the views draw them).
    """

    def __call__(self, job_id: str, *, data_dir: str, url: str | None, time_range: TimeRange, whole: bool,
                 **options: Any) -> JobData: ...


def _load_local(job_id: str, *, data_dir: str, url: str | None, time_range: TimeRange, whole: bool,
                **options: Any) -> JobData:
    return load_local(data_dir, job_id)


def _load_loki(job_id: str, *, data_dir: str, url: str | None, time_range: TimeRange, whole: bool,
               **options: Any) -> JobData:
    from ._loki import load_loki

    return load_loki(job_id, url=url, time_range=time_range, whole=whole, **options)


def _load_victorialogs(job_id: str, *, data_dir: str, url: str | None, time_range: TimeRange, whole: bool,
                       **options: Any) -> JobData:
    from ._victorialogs import load_victorialogs

    return load_victorialogs(job_id, url=url, time_range=time_range, whole=whole, **options)


def _load_elasticsearch(job_id: str, *, data_dir: str, url: str | None, time_range: TimeRange, whole: bool,
                        **options: Any) -> JobData:
    from ._elasticsearch import load_elasticsearch

    return load_elasticsearch(job_id, url=url, time_range=time_range, whole=whole, **options)


def _load_archive(job_id: str, *, data_dir: str, url: str | None, time_range: TimeRange, whole: bool,
                  **options: Any) -> JobData:
    """A job archived by ``jobtrace archive`` (``--url s3://bucket/prefix``): downloaded, checked, then read."""
    import atexit
    import shutil

    from jobtrace.store import restore_job

    if not url:
        raise ConfigError("--backend archive needs --url s3://bucket/prefix (where jobtrace archive put the job)")
    restored = restore_job(url, job_id)
    atexit.register(shutil.rmtree, restored, True)
    return load_local(str(restored), job_id)


LOADERS: Final[dict[str, Loader]] = {
    "local": _load_local,
    "loki": _load_loki,
    "victorialogs": _load_victorialogs,
    "elasticsearch": _load_elasticsearch,
    "archive": _load_archive,
}
"""Each backend ``load_job`` reads, by the name ``trace-job --backend`` takes, in the order the help lists them."""

BACKENDS = tuple(LOADERS)


def load_job(backend: str, job_id: str, *, data_dir: str = "jobtrace-data", url: str | None = None,
             time_range: TimeRange | None = None, whole: bool = False, **options: Any) -> JobData:
    """Load ``job_id`` from ``backend`` into DuckDB (a server's: over ``time_range``, the last seven days by
    default). VictoriaLogs and Elasticsearch aggregate the spans and metrics themselves unless ``whole``
    asks for every event: the timeline, Perfetto, golden profiles and Flight Recorder merges need them."""
    loader = LOADERS.get(backend)
    if loader is None:
        raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return loader(job_id, data_dir=data_dir, url=url, time_range=time_range or TimeRange.parse(None, None),
                  whole=whole, **options)
