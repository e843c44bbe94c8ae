"""Jaeger v2 (v1.76.0 = v2.13.0) built from the Go module proxy, memory storage, on loopback ports.

Why Jaeger: the trace view users open for a job (Jaeger itself, or Grafana's trace
panel over Tempo) takes spans over OTLP; this is a real OTLP receiver and trace
store, so the spans' hierarchy, resource and root are checked the way a user sees
them. Only the OTLP/HTTP receiver and the query API run (``/api/traces/<id>``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, ServerError, free_port, wait_until
from .gobuild import build_go_server

VERSION = "v1.76.0"
PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"

_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{grpc}
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"""


class JaegerServer(ManagedServer):
    """Jaeger all-in-one: ``.otlp_url`` takes spans, ``.trace(id)`` reads a trace back."""

    name = "jaeger"
    start_timeout = 30.0

    def __init__(self, port: int | None = None) -> None:
        super().__init__(port)
        self.otlp_port: int | None = None

    @classmethod
    def build(cls) -> Path:
        """The cached binary (built on first use, minutes); ``$JOBTRACE_JAEGER_BIN`` skips the build."""
        override = os.environ.get("JOBTRACE_JAEGER_BIN")
        if override:
            return Path(override)
        return build_go_server("jaeger", VERSION, PACKAGE, "jaeger")

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        self.otlp_port = free_port()
        config = data_dir / "jaeger.yaml"
        config.write_text(_CONFIG.format(query=self.port, grpc=free_port(), otlp=self.otlp_port))
        return [str(artifact), "--config", str(config)]

    def _wait_ready(self) -> None:
        wait_until(lambda: self._http_ok("/api/services"), self.start_timeout, f"{self.name} GET /api/services",
                   alive=self.is_running)

    @property
    def otlp_url(self) -> str:
        """Base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        if self.otlp_port is None:
            raise ServerError(f"{self.name} was never started")
        return f"http://{self.host}:{self.otlp_port}"

    def trace(self, trace_id: str, min_spans: int = 1, timeout: float = 30.0, settle_s: float = 1.5) -> dict[str, Any]:
        """The trace (Jaeger's JSON) once it holds ``min_spans`` spans and has not grown for ``settle_s``:
        spans arrive in batches (the exporters' and the collector's own)."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            r = requests.get(f"{self.url}/api/traces/{trace_id}", timeout=10)
            if r.status_code == 200 and r.json().get("data"):
                last = r.json()["data"][0]
                n = len(last["spans"])
                if n != seen:
                    seen, since = n, time.monotonic()
                elif n >= min_spans and time.monotonic() - since >= settle_s:
                    return last
            time.sleep(0.25)
        if last:
            return last
        raise ServerError(f"{self.name}: trace {trace_id} not found after {timeout:.0f}s")

    def trace_otlp(self, trace_id: str) -> bytes:
        """The trace as Jaeger's query API v3 answers it: one OTLP/JSON document (``{"result": {"resourceSpans"``)."""
        r = requests.get(f"{self.url}/api/v3/traces/{trace_id}", timeout=30)
        if r.status_code != 200:
            raise ServerError(f"{self.name}: GET /api/v3/traces/{trace_id} answered {r.status_code}: {r.text[:300]}")
        return r.content
