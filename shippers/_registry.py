"""Network sinks chosen by environment, so ``init_tracing()`` stays one line.

``JOBTRACE_LOKI_URL`` adds the Loki shipper, ``JOBTRACE_ES_URL`` the
Elasticsearch/OpenSearch shipper (credentials and TLS from the same prefix, see
:meth:`shippers.HttpConfig.from_env`). ``JOBTRACE_LOCAL=0`` turns the embedded
store off when a server is configured. Each process spools under
``<data_dir>/<job>/.spool/<backend>-r<rank>`` so a restarted rank replays what its
previous life could not send.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jobtrace.errors import ConfigError

from ._batch import Sink
from ._sender import SpoolingSender

__all__ = ["NETWORK_BACKENDS", "ProcessInfo", "network_sinks_from_env", "open_shipper"]

NETWORK_BACKENDS = ("loki", "elasticsearch")


@dataclass(frozen=True)
class ProcessInfo:
    """What a shipper needs to know about the process it ships for (labels, spool location)."""

    job_id: str
    node: str
    rank: int
    pid: int
    spool_root: Path
    spool_override: Path | None = None  # replaying one given spool directory

    def spool_dir(self, backend: str) -> Path:
        return self.spool_override or self.spool_root / f"{backend}-r{self.rank}"


def open_shipper(backend: str, info: ProcessInfo, url: str | None = None) -> SpoolingSender:
    """The shipper for ``backend`` (``loki`` or ``elasticsearch``), configured from the environment.

    ``url`` overrides ``JOBTRACE_LOKI_URL`` / ``JOBTRACE_ES_URL``; credentials and TLS
    still come from the environment only, so they never appear on a command line.
    """
    if backend == "loki":
        from ._loki import LokiShipper

        return LokiShipper.from_env(info, url=url)
    if backend == "elasticsearch":
        from ._elasticsearch import ElasticsearchShipper

        return ElasticsearchShipper.from_env(info, url=url)
    raise ConfigError(f"unknown backend {backend!r}; expected one of {', '.join(NETWORK_BACKENDS)}")


def network_sinks_from_env(info: ProcessInfo) -> list[Sink]:
    env = {"loki": "JOBTRACE_LOKI_URL", "elasticsearch": "JOBTRACE_ES_URL"}
    return [open_shipper(backend, info) for backend in NETWORK_BACKENDS if os.environ.get(env[backend])]


def local_store_enabled() -> bool:
    return os.environ.get("JOBTRACE_LOCAL", "1") not in ("0", "false", "no")
