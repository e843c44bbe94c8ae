"""The stdlib-logging path (no OpenTelemetry, no init_tracing): LokiHandler, python-logging-loki compatible."""

from __future__ import annotations

import json
import logging
import time

import orjson
import pytest
import requests

from shippers import InMemoryTransport
from shippers._loki_logging import LokiHandler
from tests.loki.fake_loki import FakeLoki


@pytest.fixture
def logger():
    log = logging.getLogger(f"handler-test-{time.monotonic_ns()}")
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()


def test_tags_are_labels_record_tags_are_not_and_records_are_jobtrace_events(tmp_path, push_pb2, logger):
    fake = FakeLoki(push_pb2=push_pb2)
    h = LokiHandler("http://loki:3100", tags={"job": "etl", "service.name": "etl-svc"}, auth=("u", "p"),
                    spool_dir=tmp_path, transport=InMemoryTransport(fake))
    logger.addHandler(h)
    logger.info("row %d of %s", 3, "t", extra={"tags": {"request_id": "r-123"}})
    try:
        raise ValueError("bad row")
    except ValueError:
        logger.exception("failed")
    h.flush()
    assert h.shipper.wait_idle(30), "the two records were never sent"
    h.close()
    assert [e.labels for e in fake.entries] == [
        {"training_job": "etl", "kind": "log", "level": "INFO", "node": fake.entries[0].labels["node"], "service_name": "etl-svc"},
        {"training_job": "etl", "kind": "log", "level": "ERROR", "node": fake.entries[0].labels["node"], "service_name": "etl-svc"},
    ]
    first, second = (orjson.loads(e.line) for e in fake.entries)
    assert first["msg"] == "row 3 of t" and first["attrs"] == {"request_id": "r-123"} and first["job"] == "etl"
    assert len(first["trace_id"]) == 32 and fake.entries[0].metadata["trace_id"] == first["trace_id"]
    assert "ValueError: bad row" in second["exc"]


def test_emit_does_not_wait_for_the_server(tmp_path, logger):
    """A server that takes 0.5 s per push: 2,000 records are emitted in a blink, and all arrive."""
    fake = FakeLoki()

    def slow(req):
        time.sleep(0.5)
        return FakeLoki.__call__(fake, req)

    from shippers._loki import LokiOptions

    h = LokiHandler("http://loki:3100", tags={"job": "fast"}, spool_dir=tmp_path, transport=InMemoryTransport(slow),
                    options=LokiOptions(format="json"))
    logger.addHandler(h)
    t0 = time.perf_counter()
    for i in range(2000):
        logger.info("record %d", i)
    emit_s = time.perf_counter() - t0
    h.close()
    assert emit_s < 0.5, f"2,000 records took {emit_s:.2f}s on the calling thread"
    assert len(fake.entries) == 2000


@pytest.mark.servers
def test_into_victorialogs(vl, tmp_path, logger):
    h = LokiHandler(vl.url + "/insert/loki", tags={"job": f"handler-{time.time_ns()}"}, spool_dir=tmp_path)
    logger.addHandler(h)
    for i in range(100):
        logger.warning("w %d", i)
    job = h.job
    h.close()
    vl.force_flush()
    r = requests.post(vl.url + "/select/logsql/query", data={"query": '{training_job="%s"} | fields _msg, level' % job})
    rows = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert len(rows) == 100 and {row["level"] for row in rows} == {"WARNING"}
    assert sorted(json.loads(row["_msg"])["msg"] for row in rows) == sorted(f"w {i}" for i in range(100))
