"""Faults against the real OpenSearch node: node down mid-job, lost answers, 429s, mapping rejections."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
import requests

from jobtrace.http import HttpConfig
from jobtrace.store import job_dir
from kibana._document import from_document
from kibana._setup import run_setup
from shippers import RetryPolicy
from tests.elasticsearch.conftest import (
    as_multiset,
    canonical,
    job_docs,
    read_lines,
    refresh,
    ship,
    synth_lines,
)

FAST = RetryPolicy(initial_s=0.05, max_s=0.5)


def count(url: str, job: str) -> int:
    try:
        requests.post(f"{url}/*-jobtrace-*/_refresh", timeout=5)
        r = requests.post(f"{url}/*-jobtrace-*/_count", json={"query": {"term": {"jobtrace.job": job}}}, timeout=5)
        return int(r.json().get("count", 0)) if r.status_code == 200 else 0
    except requests.RequestException:
        return 0


@pytest.mark.torchjob
def test_node_down_during_a_real_job_loses_nothing_and_duplicates_nothing(private_opensearch, tmp_path):
    """The node stops while ranks ship and comes back on the same data: every event arrives exactly once."""
    pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")
    from tests.elasticsearch.test_torch_jobs import replay_spools, run_demo

    node, job, ns = private_opensearch, "es-node-down", "faults"
    result: dict[str, int] = {}
    runner = threading.Thread(target=lambda: result.update(rc=run_demo(
        node.url, ns, tmp_path, job_id=job, ranks=2, steps=150, slow_ranks=[1], slow_ms=40.0, stall_s=60.0)))
    runner.start()
    deadline = time.monotonic() + 120
    while count(node.url, job) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert count(node.url, job) > 0, "the job never shipped anything"
    # The job runs for ~6 s after its first batch arrives (150 steps of 40 ms), so the node goes down while
    # it ships, even when indexing is slow to show that first batch (60 steps once ended before it).
    node.stop()
    down_at, down_ns = time.monotonic(), time.time_ns()
    time.sleep(2.0)
    node.start()
    up_ns = time.time_ns()
    runner.join(180)
    assert not runner.is_alive() and 0 == result["rc"]
    assert time.monotonic() - down_at > 2.0
    replay_spools(node.url, tmp_path, job, ns)  # a rank that exited before the node was back
    local = canonical(read_lines(job_dir(tmp_path, job)))
    docs = job_docs(node.url, job)
    assert len(local) == len(docs)
    assert as_multiset(local) == as_multiset([from_document(d) for d in docs])
    while_down = [e for e in local if down_ns <= e["ts"] <= up_ns and e["kind"] != "heartbeat"]
    assert while_down, "the job did not record anything while the node was down: the fault was not exercised"


def test_a_lost_answer_is_retried_and_the_replay_does_not_duplicate(opensearch, fault_proxy, tmp_path, namespace):
    """The first bulk is stored but its answer never reaches us; the resend gets 409s, counted as stored."""
    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp_path, job_id="es-lost-answer", ranks=2, steps=10)
    proxy = fault_proxy(opensearch)
    proxy.delay(3.0, count=1)  # forwarded after the client gave up (timeout 1 s)
    shipper = ship(proxy.url, lines, tmp_path / "spool", namespace=namespace, setup="off", request_timeout_s=1.0,
                   policy=RetryPolicy(initial_s=4.0, max_s=4.0, jitter=0.0), shutdown_timeout_s=30)
    assert 1 <= shipper.stats.retries
    assert len(lines) == shipper.encoder.duplicates  # all of the resend were already there
    assert len(lines) == len(job_docs(opensearch.url, "es-lost-answer"))


def test_a_429_from_bulk_is_retried_after_retry_after(opensearch, fault_proxy, tmp_path, namespace):
    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp_path, job_id="es-429", ranks=2, steps=5)
    proxy = fault_proxy(opensearch)
    proxy.respond(429, '{"error":{"type":"es_rejected_execution_exception"},"status":429}',
                  headers={"Retry-After": "1"}, count=2)
    t0 = time.monotonic()
    shipper = ship(proxy.url, lines, tmp_path / "spool", namespace=namespace, setup="off", policy=FAST)
    assert time.monotonic() - t0 >= 2.0  # two Retry-After: 1 honoured (not the 50 ms backoff)
    assert [429, 429, 200] == [s.status for s in proxy.seen][:3]
    assert 2 == shipper.stats.retries and 0 == shipper.stats.rejected
    assert len(lines) == len(job_docs(opensearch.url, "es-429"))


def test_per_item_429s_resend_those_items(opensearch, fault_proxy, tmp_path, namespace):
    """A 200 whose items say 429 (a full write queue): the items are sent again, nothing is dead-lettered."""
    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp_path, job_id="es-item-429", ranks=1, steps=5)
    lines = lines[:40]
    busy = {"took": 1, "errors": True, "items": [
        {"create": {"status": 429, "error": {"type": "es_rejected_execution_exception",
                                             "reason": "rejected execution of coordinating operation"}}}] * 40}
    proxy = fault_proxy(opensearch)
    proxy.respond(200, orjson.dumps(busy), headers={"Content-Type": "application/json"}, count=1)
    shipper = ship(proxy.url, lines, tmp_path / "spool", namespace=namespace, setup="off", policy=FAST,
                   max_batch_lines=40)
    assert 1 == shipper.stats.retries and 0 == shipper.stats.rejected
    assert len(lines) == len(job_docs(opensearch.url, "es-item-429"))


def test_a_mapping_rejection_goes_to_the_dead_letter_file_with_the_reason(opensearch, tmp_path, namespace):
    """OpenSearch refuses rank="two" for an integer field: that line alone is dead-lettered, with the reason."""
    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp_path, job_id="es-reject", ranks=1, steps=3)
    bad = orjson.loads(lines[0])
    bad.update(rank="two", msg="corrupt")
    bad_line = orjson.dumps(bad) + b"\n"
    shipper = ship(opensearch.url, [*lines, bad_line], tmp_path / "spool", namespace=namespace, setup="off")
    assert 1 == shipper.stats.rejected and len(lines) == shipper.stats.sent
    dead = [orjson.loads(x) for x in (tmp_path / "spool" / "dead-letter.jsonl").read_bytes().splitlines()]
    assert 1 == len(dead)
    assert bad_line.rstrip(b"\n").decode() == dead[0]["line"]
    assert 400 == dead[0]["status"] and "elasticsearch" == dead[0]["backend"]
    assert "mapper_parsing_exception" in dead[0]["reason"] and "jobtrace.rank" in dead[0]["reason"]
    refresh(opensearch.url)
    assert len(lines) == len(job_docs(opensearch.url, "es-reject"))


def test_jobtrace_replay_sends_what_a_shipper_left_behind(opensearch, tmp_path, namespace, monkeypatch):
    """A spool left by an outage that outlasted the job goes out with `jobtrace replay DIR --to elasticsearch`."""
    from click.testing import CliRunner

    from jobtrace.cli import main
    from shippers._elasticsearch import ElasticsearchShipper

    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp_path, job_id="es-replay", ranks=2, steps=4)
    stranded = ElasticsearchShipper(HttpConfig("http://127.0.0.1:9", timeout_s=0.5), tmp_path / "spool",
                                    namespace=namespace, setup="off", shutdown_timeout_s=0.5)
    stranded.write(lines)
    stranded.close()  # the server never answered: everything stays spooled
    assert stranded.stats.spooled_bytes > 0
    monkeypatch.setenv("JOBTRACE_ES_NAMESPACE", namespace)
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "spool"), "--to", "elasticsearch",
                                       "--url", opensearch.url])
    assert 0 == result.exit_code, result.output
    assert len(lines) == len(job_docs(opensearch.url, "es-replay"))
