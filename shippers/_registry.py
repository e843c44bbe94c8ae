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

from ._batch import Sink

__all__ = ["ProcessInfo", "network_sinks_from_env"]


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


def network_sinks_from_env(info: ProcessInfo) -> list[Sink]:
    sinks: list[Sink] = []
    if os.environ.get("JOBTRACE_LOKI_URL"):
        from ._loki import LokiShipper

        sinks.append(LokiShipper.from_env(info))
    if os.environ.get("JOBTRACE_ES_URL"):
        from ._elasticsearch import ElasticsearchShipper

        sinks.append(ElasticsearchShipper.from_env(info))
    return sinks


def local_store_enabled() -> bool:
    return os.environ.get("JOBTRACE_LOCAL", "1") not in ("0", "false", "no")
