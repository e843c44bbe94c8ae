"""The sidecar's series as OTLP metrics, for an OpenTelemetry Collector (or any OTLP receiver).

The families a scrape would return (:class:`metrics.StoreMetrics`) become the SDK's own data model
(``MetricsData``: gauges, cumulative monotonic sums, cumulative explicit-bucket histograms) and leave
through ``opentelemetry-exporter-otlp``'s HTTP exporter, so its endpoint, headers, TLS and retries are
the standard ``OTEL_EXPORTER_OTLP_*`` variables. Names are the Prometheus ones without the ``_total`` a
Prometheus exposition adds to counters (a receiver with Prometheus naming adds it back); labels become
data-point attributes. There is one resource a training job, ``service.name`` its job id (``host.name`` the node),
so that a receiver that derives Prometheus' ``job`` label from ``service.name`` keeps the training job in it; the
sidecar's own series (GPUs, kernel events) go under ``service.name=jobtrace-metrics``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["OtlpPusher"]


class OtlpPusher:
    """Pushes ``prometheus_client`` metric families to an OTLP/HTTP endpoint (default: from the environment)."""

    def __init__(self, endpoint: str | None = None, *, node: str = "", exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import Resource

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter(endpoint=endpoint)
        self.exporter = exporter
        self.resource = Resource.create({"service.name": "jobtrace-metrics", "service.instance.id": node or "sidecar",
                                         "host.name": node})
        self.start_ns = time.time_ns()
        self.pushes = 0
        self.failures = 0

    def push(self, families: Iterable[Any]) -> bool:
        """One export of every family; whether the receiver took it."""
        from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData, ResourceMetrics, ScopeMetrics
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        now = time.time_ns()
        per_job: dict[str, list[Any]] = {}
        for family in families:
            for job, samples in _by_job(family.samples).items():
                m = self._metric(family, samples, now)
                if m is not None:
                    per_job.setdefault(job, []).append(m)
        scope = InstrumentationScope("jobtrace.metrics")
        # One resource a training job, named after it: receivers that make Prometheus' `job` label of
        # service.name (Prometheus' own OTLP receiver does) keep the training job there, not the sidecar's name.
        data = MetricsData([ResourceMetrics(self.resource if not job else self.resource.merge(
            Resource({"service.name": job})), [ScopeMetrics(scope, metrics, "")], "") for job, metrics in per_job.items()])
        self.pushes += 1
        ok = bool(self.exporter.export(data) == MetricExportResult.SUCCESS)
        self.failures += not ok
        return ok

    def _metric(self, family: Any, samples: list[Any], now: int) -> Any:
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            Gauge,
            Histogram,
            HistogramDataPoint,
            Metric,
            NumberDataPoint,
            Sum,
        )

        points: list[Any] = []
        if family.type == "histogram":
            for labels, series in _by_labels(samples).items():
                cumulative = sorted((float(s.labels["le"]), s.value) for s in series if s.name.endswith("_bucket"))
                bounds = [le for le, _ in cumulative if not math.isinf(le)]
                counts = [int(v - (cumulative[i - 1][1] if i else 0)) for i, (_, v) in enumerate(cumulative)]
                total = next((s.value for s in series if s.name.endswith("_sum")), 0.0)
                points.append(HistogramDataPoint(dict(labels), self.start_ns, now, int(cumulative[-1][1]) if cumulative
                                                 else 0, total, counts, bounds, None, None))  # type: ignore[arg-type]
            data: Any = Histogram(points, AggregationTemporality.CUMULATIVE)
        else:
            points = [NumberDataPoint(s.labels, self.start_ns, now, s.value) for s in samples
                      if not s.name.endswith("_created")]
            if family.type == "counter":
                data = Sum(points, AggregationTemporality.CUMULATIVE, True)
            else:
                data = Gauge(points)
        if not points:
            return None
        return Metric(family.name, family.documentation, "", data)


def _by_job(samples: Iterable[Any]) -> dict[str, list[Any]]:
    """A family's samples per training job (``""``: the sidecar's own, such as the GPU series)."""
    out: dict[str, list[Any]] = {}
    for s in samples:
        out.setdefault(s.labels.get("job", ""), []).append(s)
    return out


def _by_labels(samples: Iterable[Any]) -> dict[tuple[tuple[str, str], ...], list[Any]]:
    """A histogram's samples per series (its labels without ``le``)."""
    out: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        out.setdefault(key, []).append(s)
    return out
