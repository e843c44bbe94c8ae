"""Real multi-rank torch.distributed jobs shipping to the real OpenSearch node, then traced from it.

Each job runs under torchrun with ``JOBTRACE_ES_URL`` set (and the embedded store on),
so the same events land in both stores: what the node holds is compared event by
event with the embedded store, and ``trace-job`` on each must give the same report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from jobtrace.store import job_dir
from kibana._document import from_document
from queries import analyze, load_local
from queries._analysis import AnalysisConfig
from queries._elasticsearch import load_elasticsearch
from tests import demo_jobs
from tests.elasticsearch.conftest import (
    all_time,
    as_multiset,
    canonical,
    job_docs,
    read_lines,
    report_without_source,
    ship,
)

pytestmark = pytest.mark.torchjob
torch = pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")


def run_demo(url: str, namespace: str, data_dir: Path, **cfg: Any) -> int:
    """``jobtrace.demo.run_job`` with the shipper switched on through the environment, as a user would."""
    return demo_jobs.run_demo({"JOBTRACE_ES_URL": url, "JOBTRACE_ES_NAMESPACE": namespace}, data_dir=str(data_dir),
                              **cfg)


def replay_spools(url: str, data_dir: Path, job: str, namespace: str) -> int:
    """Send what killed ranks left in their spools (what their next start, or a replay, does)."""
    left = 0
    for spool in sorted((job_dir(data_dir, job) / ".spool").glob("elasticsearch-r*")):
        shipper = ship(url, [], spool, namespace=namespace)
        left += shipper.stats.sent
    return left


@pytest.fixture(scope="module")
def slow_nan_job(opensearch, tmp_path_factory):
    """2 ranks, rank 1 slow, rank 0's loss NaN from step 8: one run shared by the tests below.

    (stall_s=60: the demo's own stall watchdog must not stop a job slowed down by a busy 2-core box.)
    """
    data = tmp_path_factory.mktemp("torchjob")
    namespace = "torch_slow"
    rc = run_demo(opensearch.url, namespace, data, job_id="es-torch-slow-nan", ranks=2, steps=12,
                  slow_ranks=[1], slow_ms=40.0, nan_step=8, stall_s=60.0)
    assert 0 == rc
    return {"data": data, "job": "es-torch-slow-nan", "namespace": namespace, "url": opensearch.url}


def test_every_event_of_a_real_job_arrives_once_and_unchanged(slow_nan_job):
    """Compared event by event with the embedded store of the same run: nothing lost, nothing doubled."""
    local = canonical(read_lines(job_dir(slow_nan_job["data"], slow_nan_job["job"])))
    docs = job_docs(slow_nan_job["url"], slow_nan_job["job"])
    assert len(local) == len(docs) and len(local) > 200
    assert as_multiset(local) == as_multiset([from_document(d) for d in docs])
    assert len(docs) == len({d["event"]["id"] for d in docs})
    kinds = {d["jobtrace"]["kind"] for d in docs}
    assert {"log", "span", "metric", "heartbeat"} <= kinds
    assert not list((job_dir(slow_nan_job["data"], slow_nan_job["job"]) / ".spool").glob("*/dead-letter.jsonl"))


def test_the_mapping_the_node_built_has_the_intended_types(slow_nan_job):
    """No field got a type from dynamic guessing: every one is the template's, by name or dynamic template."""
    from kibana import load_template

    url, ns = slow_nan_job["url"], slow_nan_job["namespace"]
    declared = flat(load_template("jobtrace-mappings")["template"]["mappings"]["properties"])
    for type_ in ("logs", "metrics", "traces"):
        got = requests.get(f"{url}/{type_}-jobtrace-{ns}/_mapping", timeout=30).json()
        fields = flat(next(iter(got.values()))["mappings"]["properties"])
        for name, kind in fields.items():
            if name.startswith("jobtrace.metrics."):
                assert kind == declared.get(name, "long" if name.endswith("_bytes") else "double"), name
            elif name.startswith("jobtrace.nonfinite."):
                assert "keyword" == kind, name
            else:
                assert declared.get(name) == kind, name
    metrics = flat(next(iter(requests.get(f"{url}/metrics-jobtrace-{ns}/_mapping", timeout=30).json().values()))
                   ["mappings"]["properties"])
    assert ("double", "double", "long", "keyword") == (metrics["jobtrace.metrics.loss"],
                                                       metrics["jobtrace.metrics.grad_norm"],
                                                       metrics["jobtrace.metrics.rss_bytes"],
                                                       metrics["jobtrace.nonfinite.loss"])
    traces = flat(next(iter(requests.get(f"{url}/traces-jobtrace-{ns}/_mapping", timeout=30).json().values()))
                  ["mappings"]["properties"])
    assert ("keyword", "long", "long", "date_nanos") == (traces["jobtrace.collective.op"], traces["event.duration"],
                                                         traces["jobtrace.collective.bytes"], traces["event.start"])


def flat(props: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for name, spec in props.items():
        if "properties" in spec:
            out.update(flat(spec["properties"], f"{prefix}{name}."))
        if "type" in spec and spec["type"] != "object":
            out[f"{prefix}{name}"] = spec["type"]
    return out


def test_trace_job_on_the_node_gives_the_embedded_store_report(slow_nan_job):
    """Same findings (slow rank 1, NaN loss on rank 0 from step 8), same per-rank and per-step numbers."""
    job = slow_nan_job["job"]
    local = analyze(load_local(slow_nan_job["data"], job))
    remote = analyze(load_elasticsearch(job, url=slow_nan_job["url"], time_range=all_time()))
    assert report_without_source(local) == report_without_source(remote)
    kinds = {f.kind: f for f in remote.findings}
    assert [1] == kinds["slow_rank"].ranks
    assert 8 == kinds["nan_loss"].steps[0] and 0 in kinds["nan_loss"].ranks
    assert remote.source.startswith("elasticsearch:http://127.0.0.1")


def test_a_stalled_rank_is_found_on_the_node_as_in_the_embedded_store(opensearch, tmp_path):
    """Rank 1 hangs at step 3; the demo stops the job like an operator (SIGTERM, then SIGKILL)."""
    job, ns = "es-torch-hang", "torch_hang"
    rc = run_demo(opensearch.url, ns, tmp_path, job_id=job, ranks=2, steps=10, hang_rank=1, hang_step=3,
                  stall_s=5.0, heartbeat_s=0.5)
    assert -1 == rc
    replay_spools(opensearch.url, tmp_path, job, ns)
    cfg = AnalysisConfig(stall_s=5.0)
    local = analyze(load_local(tmp_path, job), cfg)
    remote = analyze(load_elasticsearch(job, url=opensearch.url, time_range=all_time()), cfg)
    assert report_without_source(local) == report_without_source(remote)
    stalled = [f for f in remote.findings if f.kind == "stalled_rank"]
    assert stalled and [1] == stalled[0].ranks
