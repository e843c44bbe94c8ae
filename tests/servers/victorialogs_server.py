"""VictoriaLogs v1.52.1 built from the Go module proxy and run on a loopback port.

Why VictoriaLogs: one small Go binary that speaks both the Loki push API and the
Elasticsearch ``_bulk`` API, so the Loki and ES shippers can be tested against a
real server without Docker. Built with ``CGO_ENABLED=0`` (pure-Go zstd), so no C
toolchain is needed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, ServerError, wait_until
from .gobuild import build_go_server

VERSION = "v1.52.1"
MODULE = "github.com/VictoriaMetrics/VictoriaLogs"
PACKAGE = f"{MODULE}/app/victoria-logs"
LDFLAGS = f"-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=victoria-logs-{VERSION}"


class VictoriaLogsServer(ManagedServer):
    """A VictoriaLogs single-node server; see the URL helpers for its ingest/query APIs."""

    name = "victorialogs"
    start_timeout = 30.0

    @classmethod
    def build(cls) -> Path:
        """The cached binary (built on first use); ``$JOBTRACE_VICTORIALOGS_BIN`` skips the build."""
        override = os.environ.get("JOBTRACE_VICTORIALOGS_BIN")
        if override:
            return Path(override)
        return build_go_server("victorialogs", VERSION, PACKAGE, "victoria-logs", LDFLAGS)

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        return [str(artifact), "-httpListenAddr", f"{self.host}:{self.port}",
                "-storageDataPath", str(data_dir), "-retentionPeriod", "100y",
                "-futureRetention", "1y", "-loggerLevel", "WARN"]

    def _wait_ready(self) -> None:
        wait_until(lambda: self._http_ok("/health"), self.start_timeout,
                   f"{self.name} GET /health", alive=self.is_running)

    # --- URLs of the real APIs ------------------------------------------------------
    @property
    def loki_push_url(self) -> str:
        """Loki push API (JSON or snappy protobuf); the Loki shipper posts here."""
        return self.url + "/insert/loki/api/v1/push"

    @property
    def es_base_url(self) -> str:
        """Base URL for Elasticsearch clients; only ``<base>/_bulk`` ingests."""
        return self.url + "/insert/elasticsearch"

    @property
    def es_bulk_url(self) -> str:
        """Elasticsearch ``_bulk`` (index name in the path is NOT supported)."""
        return self.url + "/insert/elasticsearch/_bulk"

    @property
    def query_url(self) -> str:
        """LogsQL query endpoint; answers JSON Lines."""
        return self.url + "/select/logsql/query"

    # --- helpers --------------------------------------------------------------------
    def force_flush(self) -> None:
        """Make just-ingested rows searchable now instead of within ~1 s."""
        r = requests.get(self.url + "/internal/force_flush", timeout=30)
        r.raise_for_status()

    def query(self, logsql: str, flush: bool = True, **params: Any) -> list[dict[str, str]]:
        """Run a LogsQL query (after a flush by default); one dict per row, values are strings."""
        if flush:
            self.force_flush()
        r = requests.post(self.query_url, data={"query": logsql, **params}, timeout=30)
        if r.status_code != 200:
            raise ServerError(f"LogsQL {logsql!r}: HTTP {r.status_code}: {r.text[:500]}")
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]
