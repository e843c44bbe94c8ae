"""Per-rank training metrics as Prometheus time series, read from the embedded store by a per-node sidecar.

    jobtrace metrics --listen 127.0.0.1:9464        # one per node, beside the ranks' store
    jobtrace metrics --remote-write http://prometheus:9090/api/v1/write

See :mod:`metrics._exporter` for why a sidecar, :mod:`metrics._state` for the series and their labels.
"""

from __future__ import annotations

from ._exporter import StoreMetrics
from ._gpu import GpuReading, GpuSampler
from ._otlp import OtlpPusher
from ._remote_write import RemoteWriter, encode_write_request
from ._state import COUNTERS, GAUGES, STEP_BUCKETS, RankMetrics

__all__ = ["COUNTERS", "GAUGES", "STEP_BUCKETS", "GpuReading", "GpuSampler", "OtlpPusher", "RankMetrics", "RemoteWriter",
           "StoreMetrics", "encode_write_request", "serve"]


def serve(collector: StoreMetrics, host: str, port: int) -> tuple[object, object]:
    """Serve ``collector`` at ``http://host:port/metrics`` (text or OpenMetrics, as the scraper asks) on a
    thread of ``prometheus_client``'s; returns its server and thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return start_http_server(port, host, registry)
