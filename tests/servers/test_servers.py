"""Tests of the test-server harness itself: real ingest + query round trips, and faults.

Each server is driven only through its real APIs (Loki push, ES ``_bulk``, LogsQL,
OpenSearch ``_bulk``/``_search``) so that a passing test here means the shippers'
integration tests have a working target.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.servers import FaultProxy, OpenSearchServer, VictoriaLogsServer

REPO = Path(__file__).resolve().parents[2]
T0_NS = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z: old enough to test retention=100y


def _rid() -> str:
    return uuid.uuid4().hex[:12]


def _loki_push(url: str, run: str, lines: list[str], session: requests.Session | None = None) -> requests.Response:
    body = {"streams": [{
        "stream": {"job": "jobtrace-smoke", "run": run},
        "values": [[str(T0_NS + i * 1_000_000_000), line, {"rank": str(i)}] for i, line in enumerate(lines)],
    }]}
    return (session or requests).post(url, data=json.dumps(body),
                                      headers={"Content-Type": "application/json"}, timeout=30)


def _connect_refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# --- VictoriaLogs ---------------------------------------------------------------------

def test_victorialogs_loki_push_roundtrip(victorialogs: VictoriaLogsServer) -> None:
    run = _rid()
    r = _loki_push(victorialogs.loki_push_url, run, ["step 0 loss=2.5", "step 1 loss=2.1", "step 2 loss=1.9"])
    assert r.status_code == 204, r.text

    rows = victorialogs.query(f"run:={run} | sort by (_time)")
    assert [row["_msg"] for row in rows] == ["step 0 loss=2.5", "step 1 loss=2.1", "step 2 loss=1.9"]
    assert [row["_time"] for row in rows] == ["2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z",
                                              "2024-01-01T00:00:02Z"]
    assert [row["rank"] for row in rows] == ["0", "1", "2"]  # structured metadata -> fields
    assert rows[0]["job"] == "jobtrace-smoke"
    assert rows[0]["_stream"] == f'{{job="jobtrace-smoke",run="{run}"}}'

    stats = victorialogs.query(f"run:={run} | stats count() as n, max(rank) as mx")
    assert stats == [{"n": "3", "mx": "2"}]


def test_victorialogs_es_bulk_roundtrip(victorialogs: VictoriaLogsServer) -> None:
    trace = _rid()
    docs = [{"@timestamp": "2024-01-01T00:00:05Z", "message": "allreduce slow", "trace": {"id": trace},
             "rank": 3, "job": "es-smoke"},
            {"@timestamp": "2024-01-01T00:00:06Z", "message": "allreduce done", "trace": {"id": trace},
             "rank": 4, "job": "es-smoke"}]
    body = "".join(json.dumps(x) + "\n" for d in docs for x in ({"create": {"_index": "ignored"}}, d))
    r = requests.post(victorialogs.es_bulk_url, data=body.encode(),
                      params={"_msg_field": "message", "_time_field": "@timestamp", "_stream_fields": "job"},
                      headers={"Content-Type": "application/x-ndjson"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["X-Elastic-Product"] == "Elasticsearch"
    answer = r.json()
    assert answer["errors"] is False
    assert [item["create"]["status"] for item in answer["items"]] == [201, 201]

    rows = victorialogs.query(f'trace.id:="{trace}" | sort by (_time) | fields _time, _msg, rank, _stream')
    assert rows == [
        {"_time": "2024-01-01T00:00:05Z", "_msg": "allreduce slow", "rank": "3", "_stream": '{job="es-smoke"}'},
        {"_time": "2024-01-01T00:00:06Z", "_msg": "allreduce done", "rank": "4", "_stream": '{job="es-smoke"}'},
    ]


# --- OpenSearch -----------------------------------------------------------------------

def test_opensearch_bulk_search_roundtrip(opensearch: OpenSearchServer) -> None:
    index = f"jobtrace-smoke-{_rid()}"
    lines: list[dict[str, Any]] = []
    for rank, lat in enumerate([10.0, 20.0, 60.0]):
        lines += [{"index": {"_index": index, "_id": f"r{rank}"}},
                  {"@timestamp": f"2024-01-01T00:00:0{rank}Z", "rank": rank, "latency_ms": lat,
                   "message": f"rank {rank} step done", "trace_id": "t-1"}]
    result = opensearch.bulk(lines)
    assert [item["index"]["status"] for item in result["items"]] == [201, 201, 201]

    hits = opensearch.search(index, {"query": {"term": {"rank": 2}}})["hits"]
    assert hits["total"]["value"] == 1
    assert hits["hits"][0]["_id"] == "r2"
    assert hits["hits"][0]["_source"]["message"] == "rank 2 step done"

    aggs = opensearch.search(index, {"size": 0, "aggs": {
        "avg_lat": {"avg": {"field": "latency_ms"}},
        "ranks": {"terms": {"field": "trace_id.keyword"}}}})
    assert aggs["hits"]["total"]["value"] == 3
    assert aggs["aggregations"]["avg_lat"]["value"] == pytest.approx(30.0)
    assert aggs["aggregations"]["ranks"]["buckets"] == [{"key": "t-1", "doc_count": 3}]

    # Painless is loaded (script_fields), analysis-common too (a non-core analyzer).
    scripted = opensearch.search(index, {"query": {"term": {"rank": 1}},
                                         "script_fields": {"x2": {"script": "doc['latency_ms'].value * 2"}}})
    assert scripted["hits"]["hits"][0]["fields"]["x2"] == [40.0]
    r = requests.post(f"{opensearch.url}/_analyze", json={"analyzer": "whitespace", "text": "A b"}, timeout=10)
    assert [t["token"] for t in r.json()["tokens"]] == ["A", "b"]
    r = requests.post(f"{opensearch.url}/_analyze",
                      json={"tokenizer": "standard", "filter": ["reverse"], "text": "abc"}, timeout=10)
    assert r.status_code == 200, r.text
    assert [t["token"] for t in r.json()["tokens"]] == ["cba"]


# --- fault controls: stop / restart on the same data -----------------------------------

def test_victorialogs_stop_refuses_then_restart_keeps_data(private_victorialogs: VictoriaLogsServer) -> None:
    vl = private_victorialogs
    run = _rid()
    assert _loki_push(vl.loki_push_url, run, ["before stop a", "before stop b"]).status_code == 204
    vl.force_flush()
    port = vl.port

    vl.stop()
    assert not vl.is_running()
    with pytest.raises(requests.ConnectionError):
        requests.get(vl.url + "/health", timeout=5)
    assert _connect_refused(*vl.address)

    vl.start()  # same data dir, same port
    assert vl.port == port
    rows = vl.query(f"run:={run} | sort by (_time)")
    assert [row["_msg"] for row in rows] == ["before stop a", "before stop b"]


def test_opensearch_stop_refuses_then_restart_keeps_data(private_opensearch: OpenSearchServer) -> None:
    os_ = private_opensearch
    index = "jobtrace-restart"
    os_.bulk([x for i in range(5) for x in ({"index": {"_index": index}}, {"i": i, "msg": f"doc {i}"})],
             refresh="true")
    port, data = os_.port, os_.data_dir

    os_.restart()
    assert (os_.port, os_.data_dir) == (port, data)
    # restart() waited for yellow; an index's primaries may still be recovering
    requests.get(f"{os_.url}/_cluster/health/{index}", params={"wait_for_status": "yellow", "timeout": "30s"},
                 timeout=40).raise_for_status()
    assert requests.get(f"{os_.url}/{index}/_count", timeout=10).json()["count"] == 5

    os_.stop()
    assert port is not None and _connect_refused(os_.host, port)


# --- fault controls: FaultProxy --------------------------------------------------------

def test_proxy_status_modes_and_counts(victorialogs: VictoriaLogsServer,
                                       fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(victorialogs)
    push_url = proxy.url + "/insert/loki/api/v1/push"
    run = _rid()

    r = requests.get(proxy.url + "/health", timeout=5)
    assert (r.status_code, r.text) == (200, "OK")
    assert proxy.requests_seen == 1

    proxy.respond(429, "slow down", headers={"Retry-After": "1"}, count=2)
    with requests.Session() as s:  # keep-alive: still counted per request
        answers = [_loki_push(push_url, run, [f"try {i}"], session=s) for i in range(3)]
    assert [a.status_code for a in answers] == [429, 429, 204]
    assert answers[0].headers["Retry-After"] == "1"
    assert answers[0].text == "slow down"
    assert proxy.mode == "pass"
    assert proxy.requests_seen == 4
    assert [(q.action, q.status) for q in list(proxy.seen)[1:]] == [("respond", 429), ("respond", 429),
                                                                   ("pass", 204)]
    # only the pass-through push reached the server
    assert [row["_msg"] for row in victorialogs.query(f"run:={run}")] == ["try 2"]

    proxy.respond(500)  # until changed
    assert [requests.get(proxy.url + "/health", timeout=5).status_code for _ in range(3)] == [500] * 3
    proxy.respond(400, b"bad line 3: unexpected EOF")
    r = requests.post(push_url, data=b"{", headers={"Content-Type": "application/json"}, timeout=5)
    assert (r.status_code, r.text) == (400, "bad line 3: unexpected EOF")
    proxy.pass_through()
    assert requests.get(proxy.url + "/health", timeout=5).status_code == 200
    assert proxy.requests_seen == 9


def test_proxy_delay_refuse_drop(victorialogs: VictoriaLogsServer,
                                 fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(victorialogs)
    proxy.delay(1.0, count=1)
    t = time.monotonic()
    assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - t >= 1.0
    t = time.monotonic()
    assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - t < 0.5
    # a client timeout shorter than the delay times out
    proxy.delay(2.0)
    with pytest.raises(requests.ReadTimeout):
        requests.get(proxy.url + "/health", timeout=0.5)

    proxy.refuse()
    assert _connect_refused(*proxy.address)
    with pytest.raises(requests.ConnectionError):
        requests.get(proxy.url + "/health", timeout=5)
    proxy.pass_through()  # listens again on the same port
    assert requests.get(proxy.url + "/health", timeout=5).text == "OK"

    proxy.drop(count=1)
    with pytest.raises(requests.ConnectionError):
        requests.get(proxy.url + "/health", timeout=5)
    assert requests.get(proxy.url + "/health", timeout=5).text == "OK"
    assert [q.action for q in proxy.seen] == ["delay", "pass", "delay", "pass", "drop", "pass"]


def test_proxy_follows_restarted_server_and_reports_502(private_victorialogs: VictoriaLogsServer,
                                                         fault_proxy: Callable[..., FaultProxy]) -> None:
    vl = private_victorialogs
    proxy = fault_proxy(vl)
    assert requests.get(proxy.url + "/health", timeout=5).status_code == 200
    vl.stop()
    r = requests.get(proxy.url + "/health", timeout=5)
    assert r.status_code == 502 and "upstream" in r.text
    vl.start()
    assert requests.get(proxy.url + "/health", timeout=5).text == "OK"


def test_proxy_in_front_of_opensearch_bulk(opensearch: OpenSearchServer,
                                           fault_proxy: Callable[..., FaultProxy]) -> None:
    proxy = fault_proxy(opensearch)
    index = f"jobtrace-proxy-{_rid()}"
    body = (json.dumps({"index": {"_index": index}}) + "\n" + json.dumps({"m": "x"}) + "\n").encode()
    headers = {"Content-Type": "application/x-ndjson"}
    proxy.respond(429, '{"error":"too_many_requests"}', {"Retry-After": "1"}, count=1)
    assert requests.post(proxy.url + "/_bulk", data=body, headers=headers, timeout=10).status_code == 429
    r = requests.post(proxy.url + "/_bulk?refresh=true", data=body, headers=headers, timeout=30)
    assert r.status_code == 200 and r.json()["errors"] is False
    assert opensearch.search(index)["hits"]["total"]["value"] == 1
    assert proxy.requests_seen == 2


# --- command line -----------------------------------------------------------------------

def test_cli_run_victorialogs_until_sigint(victorialogs: VictoriaLogsServer) -> None:
    # depends on the session fixture only so that the binary is known to be built
    proc = subprocess.Popen([sys.executable, "-m", "tests.servers", "run", "victorialogs"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        m = re.search(r"victorialogs ready in [\d.]+s at (http://127\.0\.0\.1:\d+)", first)
        assert m, first
        assert requests.get(m.group(1) + "/health", timeout=5).text == "OK"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "victorialogs stopped" in out
        assert _connect_refused("127.0.0.1", int(m.group(1).rsplit(":", 1)[1]))
    finally:
        if proc.poll() is None:
            proc.kill()
