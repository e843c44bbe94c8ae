"""``trace-job --backend elasticsearch`` against the real OpenSearch node (synthetic jobs, shipped for real)."""

from __future__ import annotations

import json

import orjson
import pytest
from click.testing import CliRunner

from jobtrace.cli import trace_job
from jobtrace.errors import JobNotFound
from jobtrace.http import HttpConfig
from kibana._setup import run_setup
from queries import analyze, load_local
from queries._backends import TimeRange
from queries._elasticsearch import load_elasticsearch
from tests.elasticsearch.conftest import (
    all_time,
    report_modulo_ties,
    report_without_source,
    ship,
    synth_lines,
)

HOSTILE = ['*', 'victim*', 'x" OR jobtrace.job:*', '{"match_all":{}}', "a\\b'c", "jöb 🚀 <script>", "..", "a/b?c=d&e"]


@pytest.fixture(scope="module")
def shipped_jobs(opensearch, tmp_path_factory):
    """A victim job, a job with every hostile id, and a hung job, shipped into one namespace."""
    tmp = tmp_path_factory.mktemp("queries")
    run_setup(HttpConfig(opensearch.url))
    data, lines = synth_lines(tmp / "victim", job_id="victim", ranks=8, steps=25, ranks_per_node=4,
                              slow_ranks={5: 1.8}, nan_step=20)
    jobs = {"victim": (data, len(lines))}
    every = list(lines)
    for i, job_id in enumerate(HOSTILE):
        d, ls = synth_lines(tmp / f"hostile{i}", job_id=job_id, ranks=2, steps=3 + i)
        jobs[job_id] = (d, len(ls))
        every += ls
    d, ls = synth_lines(tmp / "hung", job_id="hung-job", ranks=4, steps=10, hang_rank=2, hang_step=6, hang_s=900)
    jobs["hung-job"] = (d, len(ls))
    every += ls
    ship(opensearch.url, every, tmp / "spool", namespace="queries")
    return jobs


def test_paged_point_in_time_read_gives_the_embedded_store_report(opensearch, shipped_jobs):
    """Pages of 500 (search_after over @timestamp + event.id): the same report as the embedded store."""
    data, n = shipped_jobs["victim"]
    job = load_elasticsearch("victim", url=opensearch.url, time_range=all_time(), page_size=500)
    assert n == job.stats.events == job.stats.lines
    remote = analyze(job)
    assert report_without_source(analyze(load_local(data, "victim"))) == report_without_source(remote)
    assert {"slow_rank", "nan_loss"} <= {f.kind for f in remote.findings}


def test_a_hung_job_names_the_stalled_rank_as_the_embedded_store_does(opensearch, shipped_jobs):
    data, _ = shipped_jobs["hung-job"]
    remote = analyze(load_elasticsearch("hung-job", url=opensearch.url, time_range=all_time()))
    assert report_modulo_ties(analyze(load_local(data, "hung-job"))) == report_modulo_ties(remote)
    assert [2] == next(f for f in remote.findings if f.kind == "stalled_rank").ranks


@pytest.mark.parametrize("job_id", HOSTILE)
def test_a_hostile_job_id_is_only_a_value(opensearch, shipped_jobs, job_id):
    """Wildcards, quotes, query syntax and JSON in a job id select that job's events and nothing else."""
    _, n = shipped_jobs[job_id]
    job = load_elasticsearch(job_id, url=opensearch.url, time_range=all_time())
    assert n == job.stats.events
    assert [(job_id,)] == job.con.execute("SELECT DISTINCT job FROM events").fetchall()


def test_the_cli_prints_the_same_json_and_exit_status(opensearch, shipped_jobs, monkeypatch):
    data, _ = shipped_jobs["victim"]
    monkeypatch.setenv("JOBTRACE_ES_URL", opensearch.url)
    runner = CliRunner()
    es = runner.invoke(trace_job, ["victim", "--backend", "elasticsearch", "--since", "2025-01-01", "--json"])
    local = runner.invoke(trace_job, ["victim", "--data-dir", str(data), "--json"])
    assert 1 == es.exit_code == local.exit_code, es.output
    a, b = json.loads(es.output), json.loads(local.output)
    assert a.pop("source").startswith("elasticsearch:") and b.pop("source")
    assert a == b


def test_an_unknown_job_or_a_time_range_without_it_is_not_found(opensearch, shipped_jobs):
    with pytest.raises(JobNotFound, match="no events for job 'nope'"):
        load_elasticsearch("nope", url=opensearch.url, time_range=all_time())
    with pytest.raises(JobNotFound, match="--since"):
        load_elasticsearch("victim", url=opensearch.url, time_range=TimeRange(1, 2))
    result = CliRunner().invoke(trace_job, ["nope", "--backend", "elasticsearch", "--url", opensearch.url])
    assert 3 == result.exit_code


def test_one_namespace_can_be_chosen(opensearch, shipped_jobs):
    assert shipped_jobs["victim"][1] == load_elasticsearch(
        "victim", url=opensearch.url, time_range=all_time(), namespace="queries").stats.events
    with pytest.raises(JobNotFound):
        load_elasticsearch("victim", url=opensearch.url, time_range=all_time(), namespace="elsewhere")


def test_documents_that_are_not_jobtrace_events_are_counted_not_fatal(opensearch, tmp_path):
    """A foreign document in our data stream (no @timestamp we can read) is skipped and counted."""
    import requests

    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp_path, job_id="with-foreign", ranks=1, steps=2)
    ship(opensearch.url, lines, tmp_path / "spool", namespace="foreign")
    doc = {"@timestamp": "2026-01-01T00:00:01Z", "jobtrace": {"job": "with-foreign", "kind": "log"},
           "event": {"id": "foreign"}}
    r = requests.post(f"{opensearch.url}/logs-jobtrace-foreign/_doc?refresh=true", data=orjson.dumps(doc),
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 201, r.text
    job = load_elasticsearch("with-foreign", url=opensearch.url, time_range=all_time())
    assert len(lines) + 1 == job.stats.events  # it parses: DuckDB takes it (ts from @timestamp)


def test_backing_indices_with_several_shards_are_still_read_completely(opensearch, tmp_path):
    """_doc repeats across shards on OpenSearch: then the (@timestamp, event.id) order is used."""
    import requests

    from jobtrace.http import RequestsTransport
    from kibana._setup import client_caller, detect_cluster, make_client
    from queries._elasticsearch import _sort

    run_setup(HttpConfig(opensearch.url))
    for t in ("logs", "metrics", "traces"):
        r = requests.put(f"{opensearch.url}/_index_template/multi-{t}", timeout=30, json={
            "index_patterns": [f"{t}-jobtrace-multishard"], "data_stream": {}, "priority": 900,
            "composed_of": ["jobtrace-mappings"], "template": {"settings": {"number_of_shards": 3,
                                                                            "number_of_replicas": 0}}})
        assert r.status_code == 200, r.text
    data, lines = synth_lines(tmp_path, job_id="multi-shard-job", ranks=4, steps=30)
    ship(opensearch.url, lines, tmp_path / "spool", namespace="multishard")
    cfg = HttpConfig(opensearch.url)
    cluster = detect_cluster(RequestsTransport(cfg), cfg.url)
    call = client_caller(make_client(cfg, cluster), cluster)
    assert "@timestamp" in _sort(call, cluster, "logs-jobtrace-multishard,traces-jobtrace-multishard")[0]
    ship(opensearch.url, lines[:10], tmp_path / "spool2", namespace="singleshard")
    assert [{"_index": "asc"}, {"_doc": "asc"}] == _sort(call, cluster, "logs-jobtrace-singleshard")
    job = load_elasticsearch("multi-shard-job", url=opensearch.url, time_range=all_time(), page_size=97,
                             namespace="multishard")
    assert len(lines) == job.stats.events
    assert report_without_source(analyze(load_local(data, "multi-shard-job"))) == report_without_source(analyze(job))


class FakeCluster:
    """A Caller that serves ``pages`` pages of 2 hits, optionally failing a shard on page ``fail_at``."""

    def __init__(self, pages: int, fail_at: int | None = None) -> None:
        self.pages, self.fail_at, self.served, self.closed = pages, fail_at, 0, []

    def __call__(self, method, path, params=None, body=None):
        if path.endswith("/_refresh") or "/_settings/" in path:
            return 200, {}
        if path.endswith("/point_in_time") and method == "POST":
            return 200, {"pit_id": "pit-1"}
        if path == "/_search/point_in_time" and method == "DELETE":
            self.closed.append(body)
            return 200, {}
        self.served += 1
        if self.served == self.fail_at:
            return 200, {"_shards": {"failed": 1, "failures": [{"reason": {"type": "x", "reason": "disk"}}]}}
        n = 2 if self.served < self.pages else 1
        hits = [{"_source": {"n": self.served * 10 + i}, "sort": [self.served, i]} for i in range(n)]
        return 200, {"pit_id": f"pit-{self.served}", "hits": {"hits": hits}}


def test_pages_are_prefetched_in_order_and_the_point_in_time_is_closed():
    from kibana._setup import Cluster
    from queries._elasticsearch import iter_job_documents

    fake = FakeCluster(pages=5)
    docs = list(iter_job_documents(fake, Cluster("opensearch", "2.19.0"), "j", all_time(), page_size=2))
    assert [10, 11, 20, 21, 30, 31, 40, 41, 50] == [d["n"] for d in docs]
    assert [{"pit_id": ["pit-4"]}] == fake.closed  # the newest id


def test_a_failed_shard_mid_read_is_an_error_not_a_partial_report():
    from jobtrace.errors import QueryError
    from kibana._setup import Cluster
    from queries._elasticsearch import iter_job_documents

    fake = FakeCluster(pages=5, fail_at=3)
    with pytest.raises(QueryError, match="1 shard.*failed.*incomplete"):
        list(iter_job_documents(fake, Cluster("opensearch", "2.19.0"), "j", all_time(), page_size=2))
    assert fake.closed


def test_stopping_early_closes_the_point_in_time():
    from kibana._setup import Cluster
    from queries._elasticsearch import iter_job_documents

    fake = FakeCluster(pages=1000)
    it = iter_job_documents(fake, Cluster("opensearch", "2.19.0"), "j", all_time(), page_size=2)
    assert 3 == len([next(it) for _ in range(3)])
    it.close()
    import time

    deadline = time.monotonic() + 5
    while not fake.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.closed and fake.served < 10
