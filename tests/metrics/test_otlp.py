"""``jobtrace metrics --otlp``: a real job's series as OTLP metrics, through opentelemetry-exporter-otlp's HTTP
exporter into a real receiver (VictoriaMetrics, built from its Go module), then read back with PromQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.metrics import last_losses, wait_for_series

pytest.importorskip("torch", reason="a torch.distributed job")
pytest.importorskip("prometheus_client", reason="jobtrace[metrics]")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="jobtrace[otlp]")

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


def wait(server, promql: str, n: int) -> list[dict]:
    return wait_for_series(server.query, promql, n, timeout=60)


def test_a_real_jobs_series_arrive_as_otlp_metrics(tmp_path, victoriametrics):
    from jobtrace.demo import DemoConfig, run_job
    from metrics import OtlpPusher, StoreMetrics
    from tests.procs import stop_tree

    assert run_job(DemoConfig(job_id="otlp-job", data_dir=str(tmp_path / "d"), ranks=2, steps=20)) == 0
    pusher = subprocess.Popen([sys.executable, "-m", "jobtrace.cli", "metrics", "--data-dir", str(tmp_path / "d"),
                               "--listen", "", "--otlp", victoriametrics.otlp_url, "--push-interval", "1"],
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        steps = wait(victoriametrics, 'jobtrace_step{job="otlp-job"}', 2)
        assert sorted((s["metric"]["rank"], s["value"][1]) for s in steps) == [("0", "19"), ("1", "19")]
        assert {s["metric"]["rank"] for s in wait(victoriametrics, 'jobtrace_steps{job="otlp-job"}', 2)} == {"0", "1"}
        losses = {s["metric"]["rank"]: float(s["value"][1])
                  for s in wait(victoriametrics, 'jobtrace_loss{job="otlp-job"}', 2)}
        assert losses == pytest.approx(last_losses(tmp_path / "d" / "otlp-job"))
        # the step-time histogram, bucket by bucket: 20 steps a rank
        counts = wait(victoriametrics, 'jobtrace_step_duration_seconds_count{job="otlp-job"}', 2)
        assert {s["value"][1] for s in counts} == {"20"}
        buckets = wait(victoriametrics, 'jobtrace_step_duration_seconds_bucket{job="otlp-job", rank="0"}', 2)
        assert max(float(s["value"][1]) for s in buckets) == 20
    finally:
        stop_tree(pusher)
    # a receiver that is not there: a failed push, counted, no exception
    dead = OtlpPusher("http://127.0.0.1:9/v1/metrics")
    assert dead.push(StoreMetrics(tmp_path / "d", forget_after_s=1e9).collect()) is False and dead.failures == 1


def test_prometheus_own_otlp_receiver_keeps_the_training_job_and_the_scrape_names(tmp_path, prometheus3):
    """Into a real Prometheus 3 (``--web.enable-otlp-receiver``): its ``job`` label is made of ``service.name``, so
    each training job's series carry that job, the node is the instance, and the names are the scrape path's."""
    from jobtrace.demo import DemoConfig, run_job
    from metrics import OtlpPusher, StoreMetrics

    assert run_job(DemoConfig(job_id="p3-job", data_dir=str(tmp_path / "d"), ranks=2, steps=10)) == 0
    assert OtlpPusher(prometheus3.otlp_url, node="node-a").push(StoreMetrics(tmp_path / "d", forget_after_s=1e9).collect())
    steps = wait(prometheus3, 'jobtrace_step{job="p3-job"}', 2)
    assert {(s["metric"]["rank"], s["metric"]["instance"], s["value"][1]) for s in steps} == {
        ("0", "node-a", "9"), ("1", "node-a", "9")}
    for name in ("jobtrace_steps_total", "jobtrace_step_duration_seconds_bucket", "jobtrace_loss"):
        assert wait(prometheus3, f'{name}{{job="p3-job"}}', 2), name
    losses = {s["metric"]["rank"]: float(s["value"][1]) for s in wait(prometheus3, 'jobtrace_loss{job="p3-job"}', 2)}
    assert losses == pytest.approx(last_losses(tmp_path / "d" / "p3-job"))
