"""VictoriaMetrics (single node, v1.150.0, the module vmalert is built from) built from the Go module proxy: a real
receiver of OTLP metrics (``/opentelemetry/v1/metrics``) that answers PromQL, for ``jobtrace metrics --otlp``.

Prometheus from Debian (2.42) predates Prometheus' OTLP receiver, and the OpenTelemetry Collector's build is far
heavier; VictoriaMetrics takes OTLP over HTTP (protobuf) and is queried like Prometheus (``/api/v1/query``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, wait_until
from .gobuild import build_go_server

VERSION = "v1.150.0"
PACKAGE = "github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics"


class VictoriaMetricsServer(ManagedServer):
    name = "victoria-metrics"
    start_timeout = 30.0

    @classmethod
    def build(cls) -> Path:
        """The cached binary (built on first use); ``$JOBTRACE_VICTORIAMETRICS_BIN`` skips the build."""
        override = os.environ.get("JOBTRACE_VICTORIAMETRICS_BIN")
        if override:
            return Path(override)
        return build_go_server("victoria-metrics", VERSION, PACKAGE, "victoria-metrics")

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        return [str(artifact), f"-httpListenAddr={self.host}:{self.port}", f"-storageDataPath={data_dir}",
                "-retentionPeriod=100y", "-loggerLevel=WARN", "-search.latencyOffset=0s"]

    def _wait_ready(self) -> None:
        wait_until(lambda: self._http_ok("/health"), self.start_timeout, f"{self.name} GET /health",
                   alive=self.is_running)

    @property
    def otlp_url(self) -> str:
        return f"{self.url}/opentelemetry/v1/metrics"

    def query(self, promql: str) -> list[dict[str, Any]]:
        requests.get(f"{self.url}/internal/force_flush", timeout=10)
        r = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        return list(r.json()["data"]["result"])
