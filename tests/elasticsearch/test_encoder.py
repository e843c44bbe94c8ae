"""EsBulkEncoder against the documented ``_bulk`` request/response formats, through the shared sender.

Bulk response shape (elasticsearch-specification ``_global/bulk/BulkResponse.ts``):
``{took, errors, items: [{<op>: {_index, _id, status, error?: {type, reason, caused_by?}}}]}``,
in request order; each item succeeds or fails on its own.
"""

from __future__ import annotations

import logging

import orjson
import pytest

from jobtrace.http import HttpConfig
from shippers import InMemoryTransport, Response, RetryPolicy, SpoolingSender
from shippers._elasticsearch import ElasticsearchShipper, EsBulkEncoder

FAST = RetryPolicy(initial_s=0.01, max_s=0.05)


def line(i: int, **extra) -> bytes:
    ev = {"ts": 1_767_225_600_000_000_000 + i, "kind": "log", "job": "j", "trace_id": "a" * 32, "rank": i % 4,
          "local_rank": 0, "world": 4, "node": "n", "pid": 1, "v": 1, "level": "INFO", "logger": "t", "msg": f"m{i}"}
    ev.update(extra)
    return orjson.dumps(ev) + b"\n"


def bulk_answer(statuses, errors=None):
    items = []
    for i, st in enumerate(statuses):
        item = {"_index": ".ds-logs-jobtrace-default-000001", "_id": str(i), "status": st}
        if st >= 300:
            item["error"] = (errors or {}).get(i, {"type": "es_rejected_execution_exception" if st == 429 else
                                                  "mapper_parsing_exception", "reason": f"reason {i}"})
        items.append({"create": item})
    return orjson.dumps({"took": 3, "errors": any(s >= 300 for s in statuses), "items": items})


def parse_bulk(body: bytes):
    rows = body.splitlines()
    assert body.endswith(b"\n") and len(rows) % 2 == 0
    return [(orjson.loads(rows[i]), orjson.loads(rows[i + 1])) for i in range(0, len(rows), 2)]


class TestRequest:
    def test_bulk_body_is_create_pairs_with_data_stream_and_deterministic_ids(self):
        """Data streams accept only create; _id is the line's hash so a replay cannot duplicate."""
        enc = EsBulkEncoder("https://es:9200/", namespace="prod")
        lines = [line(1), line(2, kind="metric", metrics={"loss": 1.0}), line(3, kind="span", cat="phase",
                                                                             name="forward", start=1, dur=2)]
        req = enc.request(lines)
        assert "POST" == req.method
        assert req.url.startswith("https://es:9200/_bulk?filter_path=")
        assert "application/x-ndjson" == req.headers["Content-Type"]
        pairs = parse_bulk(req.body)
        assert ["logs-jobtrace-prod", "metrics-jobtrace-prod", "traces-jobtrace-prod"] == \
            [a["create"]["_index"] for a, _ in pairs]
        assert [a["create"]["_id"] for a, _ in pairs] == [d["event"]["id"] for _, d in pairs]
        assert enc.request(lines).body == req.body
        assert {"type": "metrics", "dataset": "jobtrace", "namespace": "prod"} == pairs[1][1]["data_stream"]

    def test_gzip_when_asked(self):
        import gzip

        enc = EsBulkEncoder("http://es", compress=True)
        req = enc.request([line(1)])
        assert "gzip" == req.headers["Content-Encoding"]
        assert 2 == len(gzip.decompress(req.body).splitlines())

    def test_victorialogs_url_gets_its_field_parameters(self):
        enc = EsBulkEncoder("http://vl:9428/insert/elasticsearch")
        assert enc.victorialogs and "_time_field=%40timestamp" in enc.url and "_msg_field=message" in enc.url


class TestOutcome:
    def test_all_created_is_all_ok(self):
        enc = EsBulkEncoder("http://es")
        out = enc.outcome([line(i) for i in range(3)], Response(200, bulk_answer([201, 201, 201])))
        assert ([], []) == (out.retry, out.rejected)

    def test_409_means_already_stored_429_and_5xx_retry_mapping_errors_are_rejected_with_reason(self):
        enc = EsBulkEncoder("http://es")
        answer = bulk_answer([201, 409, 429, 503, 400],
                             {1: {"type": "version_conflict_engine_exception", "reason": "exists"},
                              4: {"type": "document_parsing_exception", "reason": "[1:12] failed to parse field "
                                  "[jobtrace.rank] of type [integer]",
                                  "caused_by": {"type": "number_format_exception", "reason": "For input string"}}})
        out = enc.outcome([line(i) for i in range(5)], Response(200, answer))
        assert [2, 3] == out.retry
        assert [4] == [i for i, _ in out.rejected]
        assert "document_parsing_exception" in out.rejected[0][1] and "number_format_exception" in out.rejected[0][1]
        assert 1 == enc.duplicates and 400 == out.status

    def test_a_read_only_block_is_retried_whatever_its_status(self):
        """Flood-stage disk watermark: cluster_block_exception (403 on older versions) clears by itself."""
        enc = EsBulkEncoder("http://es")
        out = enc.outcome([line(0)], Response(200, bulk_answer([403], {0: {"type": "cluster_block_exception",
                                                                           "reason": "index read-only"}})))
        assert [0] == out.retry and [] == out.rejected

    def test_wrong_credentials_keep_the_data_and_say_so_once(self, caplog):
        enc = EsBulkEncoder("http://es")
        with caplog.at_level(logging.WARNING, "jobtrace.export"):
            out1 = enc.outcome([line(0)], Response(401, b'{"error":"unauthorized"}'))
            out2 = enc.outcome([line(0)], Response(401, b'{"error":"unauthorized"}'))
        assert [0] == out1.retry == out2.retry
        assert 1 == sum("HTTP 401" in r.getMessage() for r in caplog.records)

    def test_a_whole_request_400_dead_letters_every_line_with_the_reason(self):
        enc = EsBulkEncoder("http://es")
        out = enc.outcome([line(0), line(1)], Response(400, b'{"error":{"type":"illegal_argument_exception"}}'))
        assert [0, 1] == [i for i, _ in out.rejected] and "illegal_argument_exception" in out.rejected[0][1]

    def test_413_refuses_only_an_oversized_line_and_shrinks_later_batches(self):
        enc = EsBulkEncoder("http://es", max_batch_bytes=1 << 20)
        huge = line(0, msg="x" * (600 << 10))
        out = enc.outcome([line(1), huge, line(2)], Response(413, b""))
        assert [1] == [i for i, _ in out.rejected] and [0, 2] == out.retry
        assert enc.max_batch_bytes == 512 << 10

    def test_a_garbled_success_answer_is_retried(self):
        enc = EsBulkEncoder("http://es")
        assert [0] == enc.outcome([line(0)], Response(200, b"<html>proxy</html>")).retry

    def test_an_item_count_mismatch_is_retried(self):
        enc = EsBulkEncoder("http://es")
        assert [0, 1] == enc.outcome([line(0), line(1)], Response(200, bulk_answer([201, 400, 201]))).retry


class TestThroughTheSharedSender:
    def test_only_failed_items_are_resent_and_rejected_ones_reach_the_dead_letter_file(self, tmp_path):
        """First answer: item 1 gets 429, item 2 a mapping error; the second request carries item 1 only."""
        answers = [bulk_answer([201, 429, 400]), bulk_answer([201])]
        bodies = []

        def server(req):
            bodies.append(req.body)
            return Response(200, answers.pop(0))

        sender = SpoolingSender(EsBulkEncoder("http://es"), InMemoryTransport(server), tmp_path / "spool",
                                policy=FAST)
        lines = [line(0), line(1), line(2)]
        sender.write(lines)
        assert sender.wait_idle(10)
        sender.close()
        assert [3, 1] == [len(parse_bulk(b)) for b in bodies]
        assert parse_bulk(bodies[1])[0][1]["message"] == "m1"
        dead = [orjson.loads(x) for x in (tmp_path / "spool" / "dead-letter.jsonl").read_bytes().splitlines()]
        assert 1 == len(dead) and lines[2].rstrip(b"\n").decode() == dead[0]["line"]
        assert "mapper_parsing_exception" in dead[0]["reason"] and 400 == dead[0]["status"]
        assert 1 == sender.stats.rejected and 2 == sender.stats.sent

    def test_an_unreadable_line_is_dead_lettered_and_the_rest_shipped(self, tmp_path):
        bodies = []

        def server(req):
            bodies.append(req.body)
            return Response(200, bulk_answer([201] * (len(req.body.splitlines()) // 2)))

        sender = SpoolingSender(EsBulkEncoder("http://es"), InMemoryTransport(server), tmp_path / "s", policy=FAST)
        sender.write([line(0), b'{"kind":"log","msg":"no ts"}\n', b"not json\n", line(1)])
        assert sender.wait_idle(10)
        sender.close()
        dead = [orjson.loads(x) for x in (tmp_path / "s" / "dead-letter.jsonl").read_bytes().splitlines()]
        assert 2 == len(dead) and "cannot encode" in dead[0]["reason"]
        assert 2 == sender.stats.sent


class TestShipperConfig:
    def test_setup_first_then_bulk_over_the_same_transport(self, tmp_path):
        """GET / and the template check run once, before the first bulk request."""
        seen = []

        def server(req):
            seen.append((req.method, req.url.split("?")[0]))
            if req.url.endswith(":9200/"):
                return Response(200, orjson.dumps({"version": {"number": "2.19.0", "distribution": "opensearch"}}))
            if "_template" in req.url and req.method == "GET":
                return Response(200, orjson.dumps({"index_templates": [{"name": f"jobtrace-{t}", "index_template":
                                                   {"version": 1}} for t in ("logs", "metrics", "traces")],
                                                   "component_templates": [{"name": n, "component_template":
                                                                            {"version": 1}} for n in
                                                                           ("jobtrace-mappings", "jobtrace-settings")]}))
            return Response(200, bulk_answer([201] * (len(req.body.splitlines()) // 2)))

        shipper = ElasticsearchShipper(HttpConfig("http://os:9200"), tmp_path / "s", transport=InMemoryTransport(server),
                                       policy=FAST)
        shipper.write([line(0)])
        shipper.write([line(1)])
        assert shipper.wait_idle(10)
        shipper.close()
        assert ("GET", "http://os:9200/") == seen[0]
        assert 1 == sum(1 for m, u in seen if u.endswith(":9200/"))
        assert seen[-1] == ("POST", "http://os:9200/_bulk")
        assert "OpenSearch 2.19.0" == shipper.setup_transport.cluster.label

    def test_from_env_reads_namespace_batch_and_setup(self, tmp_path, monkeypatch):
        from shippers._registry import ProcessInfo

        monkeypatch.setenv("JOBTRACE_ES_URL", "https://es.example:9200")
        monkeypatch.setenv("JOBTRACE_ES_NAMESPACE", "team_a")
        monkeypatch.setenv("JOBTRACE_ES_SETUP", "off")
        monkeypatch.setenv("JOBTRACE_ES_BATCH_LINES", "500")
        info = ProcessInfo("job", "node", 3, 99, tmp_path)
        shipper = ElasticsearchShipper.from_env(info, transport=InMemoryTransport(lambda r: Response(200, b"{}")))
        try:
            assert "team_a" == shipper.encoder.namespace and 500 == shipper.encoder.max_batch_lines
            assert shipper.setup_transport is None
            assert tmp_path / "elasticsearch-r3" == shipper.spool.dir
        finally:
            shipper.close()

    @pytest.mark.parametrize("var,value", [("JOBTRACE_ES_NAMESPACE", "bad-name"), ("JOBTRACE_ES_SETUP", "maybe"),
                                           ("JOBTRACE_ES_BATCH_LINES", "lots")])
    def test_bad_configuration_is_a_config_error(self, tmp_path, monkeypatch, var, value):
        from jobtrace.errors import ConfigError
        from shippers._registry import ProcessInfo

        monkeypatch.setenv("JOBTRACE_ES_URL", "http://es:9200")
        monkeypatch.setenv(var, value)
        with pytest.raises(ConfigError):
            ElasticsearchShipper.from_env(ProcessInfo("j", "n", 0, 1, tmp_path))
