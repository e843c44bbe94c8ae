"""Prometheus 3 built from its Go module (v0.316.0): the OTLP receiver (``--web.enable-otlp-receiver``) that Debian's
Prometheus 2.42 predates, for ``jobtrace metrics --otlp`` into a real Prometheus. The web UI's assets are not built
(the API is all the tests use)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, wait_until
from .gobuild import build_go_server

VERSION = "v0.316.0"
PACKAGE = "github.com/prometheus/prometheus/cmd/prometheus"


class Prometheus3Server(ManagedServer):
    name = "prometheus3"
    start_timeout = 60.0

    @classmethod
    def build(cls) -> Path:
        """The cached binary (built on first use, several minutes); ``$JOBTRACE_PROMETHEUS3_BIN`` skips the build."""
        override = os.environ.get("JOBTRACE_PROMETHEUS3_BIN")
        if override:
            return Path(override)
        return build_go_server("prometheus", VERSION, PACKAGE, "prometheus")

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        config = data_dir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\n")
        return [str(artifact), f"--config.file={config}", f"--storage.tsdb.path={data_dir / 'tsdb'}",
                f"--web.listen-address={self.host}:{self.port}", "--web.enable-otlp-receiver"]

    def _wait_ready(self) -> None:
        wait_until(lambda: self._http_ok("/-/ready"), self.start_timeout, f"{self.name} GET /-/ready",
                   alive=self.is_running)

    @property
    def otlp_url(self) -> str:
        return f"{self.url}/api/v1/otlp/v1/metrics"

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        return list(r.json()["data"]["result"])
