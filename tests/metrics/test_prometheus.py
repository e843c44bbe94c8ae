"""The metrics path for real: a traced gloo job, ``jobtrace metrics`` beside it, a real Prometheus (Debian's
package) scraping it and evaluating the shipped rules, and a real Alertmanager receiving the alert.

* the series exist per rank with the labels job, rank, node, local_rank (and never a step);
* the slow rank's compute series is the slow one;
* a rank frozen with SIGSTOP makes its heartbeat age grow and the heartbeat alert reach Alertmanager;
* ``promtool check rules`` and ``promtool test rules`` pass on the shipped rule file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.metrics import last_losses, wait_for_series
from tests.servers.base import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "jobtrace-rules.yaml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="needs Debian's prometheus package (prometheus, promtool)")


@needs_prometheus
def test_promtool_checks_and_unit_tests_every_shipped_rule():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    tests = subprocess.run([PROMTOOL, "test", "rules", "jobtrace-rules.test.yaml"], cwd=RULES.parent,
                           capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    # every alert of the file has a unit test
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    tested = {t["alertname"] for case in yaml.safe_load((RULES.parent / "jobtrace-rules.test.yaml").read_text())["tests"]
              for t in case.get("alert_rule_test", [])}
    assert alerts == tested


def _short_rules(tmp_path: Path) -> Path:
    """The shipped heartbeat alert with a test's patience: 5 s of silence, no ``for``."""
    doc = yaml.safe_load(RULES.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "JobtraceHeartbeatStale")
    rule["expr"] = rule["expr"].replace("> 60", "> 5")
    rule["for"] = "0s"
    out = tmp_path / "short.yaml"
    out.write_text(yaml.safe_dump({"groups": [{"name": "jobtrace.test", "interval": "1s", "rules": [rule]}]}))
    return out


class Prometheus:
    def __init__(self, tmp_path: Path, target: str | None = None, rule_files: tuple[Path, ...] = (),
                 alertmanager: str | None = None) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        conf = tmp_path / "prometheus.yml"
        doc: dict = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                     "rule_files": [str(p) for p in rule_files]}
        if alertmanager:
            doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.split("//")[1]]}]}]}
        if target:
            # the series carry the training job's own "job" label: honour it (docs/metrics.md)
            doc["scrape_configs"] = [{"job_name": "jobtrace", "honor_labels": True,
                                      "static_configs": [{"targets": [target]}]}]
        conf.write_text(yaml.safe_dump(doc))
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen([PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/-/ready", timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.close()
        raise AssertionError("Prometheus did not start")

    def query(self, promql: str) -> list[dict]:
        answer = requests.get(self.url + "/api/v1/query", params={"query": promql}, timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait(self, promql: str, n: int, timeout: float = 90) -> list[dict]:
        return wait_for_series(self.query, promql, n, timeout)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


@needs_prometheus
@pytest.mark.torchjob
def test_a_real_job_scraped_by_a_real_prometheus_and_its_alert_in_alertmanager(tmp_path, alertmanager):
    pytest.importorskip("torch", reason="a torch.distributed job")
    pytest.importorskip("prometheus_client", reason="jobtrace[metrics]")
    from tests.procs import stop_tree
    from tests.watching import Job

    job = Job(tmp_path, "prom-job", 3, "--steps", "100000", "--slow-rank", "2", "--slow-ms", "30")
    port = free_port()
    sidecar = subprocess.Popen([sys.executable, "-m", "jobtrace.cli", "metrics", "--data-dir", str(tmp_path),
                                "--listen", f"127.0.0.1:{port}"], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    prom = Prometheus(tmp_path, f"127.0.0.1:{port}", (RULES, _short_rules(tmp_path)), alertmanager)
    try:
        series = prom.wait('jobtrace_compute_seconds{job="prom-job"}', 3)
        assert sorted(s["metric"]["rank"] for s in series) == ["0", "1", "2"]
        for s in series:
            assert set(s["metric"]) == {"__name__", "job", "rank", "node", "local_rank", "instance"}, s["metric"]
        for name in ("jobtrace_loss", "jobtrace_learning_rate", "jobtrace_grad_norm", "jobtrace_host_rss_bytes",
                     "jobtrace_step_seconds", "jobtrace_steps_total", "jobtrace_heartbeat_age_seconds",
                     "jobtrace_step_duration_seconds_bucket", "jobtrace_tflops"):
            assert prom.wait(f'{name}{{job="prom-job"}}', 3), name
        assert prom.query('{job="prom-job", step!=""}') == []  # never a step label
        time.sleep(5)  # a few scrapes of steady state
        slowest = prom.query('topk(1, avg_over_time(jobtrace_compute_seconds{job="prom-job"}[5s]))')
        assert slowest[0]["metric"]["rank"] == "2", slowest
        waiting = prom.query('bottomk(1, avg_over_time(jobtrace_comm_share_ratio{job="prom-job"}[5s]))')
        assert waiting[0]["metric"]["rank"] == "2"  # the straggler waits least: the others wait for it
        # every query of the shipped Grafana board runs on the real server (with the variables filled in)
        from metrics._dashboard import dashboard

        board = dashboard()
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = (target["expr"].replace("$job", "prom-job").replace("$rank", ".+").replace("$node", ".+")
                        .replace("$__rate_interval", "1m"))
                result = prom.query(expr)  # a syntax or type error is not "success"
                if "jobtrace_" in expr and not any(k in expr for k in ("cuda", "tokens", "samples", "gpu", "kernel")):
                    assert result, (panel["title"], expr)
        # every rule evaluates cleanly ("unknown" until a group's first evaluation: the recording group runs every
        # 15 s, at an offset of Prometheus' choosing)
        deadline, rules = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            rules = requests.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
            if all(r["health"] != "unknown" for g in rules for r in g["rules"]):
                break
            time.sleep(1)
        assert {g["name"] for g in rules} >= {"jobtrace.recording", "jobtrace.alerts"}
        assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
        # a frozen rank: its heartbeat age grows, the alert fires and reaches Alertmanager with its rank
        frozen = job.pid_of(1)
        os.kill(frozen, signal.SIGSTOP)
        deadline, found = time.monotonic() + 90, []
        while time.monotonic() < deadline and not found:
            found = [a for a in requests.get(alertmanager + "/api/v2/alerts", timeout=5).json()
                     if a["labels"].get("alertname") == "JobtraceHeartbeatStale"
                     and a["labels"].get("job") == "prom-job"]
            time.sleep(1)
        assert found and {a["labels"]["rank"] for a in found} >= {"1"}, found
        assert "nothing from rank 1" in " ".join(a["annotations"]["summary"] for a in found)
    finally:
        job.stop()
        prom.close()
        stop_tree(sidecar)


@needs_prometheus
@pytest.mark.torchjob
def test_remote_write_pushes_the_same_series_to_a_real_prometheus(tmp_path):
    """``jobtrace metrics --listen '' --remote-write``: a finished real job's last values arrive by remote write,
    and a push the server refuses is an error said once, not a crash."""
    pytest.importorskip("torch", reason="a torch.distributed job")
    pytest.importorskip("prometheus_client", reason="jobtrace[metrics]")
    from jobtrace.demo import DemoConfig, run_job
    from jobtrace.errors import ShipperError
    from metrics import RemoteWriter, StoreMetrics
    from tests.procs import stop_tree

    assert run_job(DemoConfig(job_id="rw-job", data_dir=str(tmp_path / "d"), ranks=2, steps=20)) == 0
    prom = Prometheus(tmp_path)
    pusher = subprocess.Popen([sys.executable, "-m", "jobtrace.cli", "metrics", "--data-dir", str(tmp_path / "d"),
                               "--listen", "", "--remote-write", prom.url + "/api/v1/write", "--push-interval", "1"],
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        steps = prom.wait('jobtrace_step{job="rw-job"}', 2)
        assert sorted((s["metric"]["rank"], s["value"][1]) for s in steps) == [("0", "19"), ("1", "19")]
        losses = {s["metric"]["rank"]: float(s["value"][1]) for s in prom.wait('jobtrace_loss{job="rw-job"}', 2)}
        assert losses == pytest.approx(last_losses(tmp_path / "d" / "rw-job"))
        assert prom.wait('jobtrace_step_duration_seconds_count{job="rw-job"}', 2)
        refused = RemoteWriter(prom.url + "/api/v1/nope")  # a real 404 from the real server
        with pytest.raises(ShipperError, match="remote write refused: HTTP 404"):
            refused.push(StoreMetrics(tmp_path / "d", forget_after_s=1e9).collect())
        assert refused.failures == 1 and refused.pushes == 1 and refused.samples == 0
    finally:
        stop_tree(pusher)
        prom.close()
