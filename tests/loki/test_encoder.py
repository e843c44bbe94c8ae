"""The Loki encoder and shipper against Loki's published formats (no server): protobuf, JSON, refusals."""

from __future__ import annotations

import gzip
import logging
import time
from pathlib import Path

import cramjam
import orjson
import pytest

from jobtrace.errors import ConfigError
from shippers import InMemoryTransport, Response, RetryPolicy
from shippers._loki import LokiEncoder, LokiOptions, LokiShipper, label_string, push_url
from shippers._registry import ProcessInfo
from tests.loki.fake_loki import FakeLoki, go_unquote

FAST = RetryPolicy(initial_s=0.01, max_s=0.05)
T0 = 1_767_225_600_000_000_000
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def event(i: int, kind: str = "span", **kw) -> dict:
    d = {"ts": T0 + i * 1000, "kind": kind, "job": "job-1", "trace_id": TRACE, "rank": i % 4, "local_rank": i % 2,
         "world": 4, "node": f"node{i % 2}", "pid": 100 + i % 4, "span_id": f"{i + 1:016x}", "v": 1}
    if kind == "span":
        d.update(name="forward", cat="phase", start=T0 + i * 1000 - 500, dur=500, step=i // 4)
    elif kind == "log":
        d.update(level="INFO", logger="train", msg=f"step {i}")
    elif kind == "metric":
        d.update(metrics={"loss": 0.5}, step=i)
    d.update(kw)
    return d


def line(d: dict) -> bytes:
    return orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE)


def info(tmp_path: Path) -> ProcessInfo:
    return ProcessInfo("job-1", "node0", 0, 123, tmp_path / "spool")


class TestProtobufPayload:
    def test_payload_decodes_with_lokis_published_proto(self, push_pb2):
        """A push decodes with classes protoc compiled from loki/proto/push.proto: labels, lines, timestamps, metadata."""
        events = [event(i, kind) for i, kind in enumerate(["span", "log", "metric", "heartbeat"] * 3)]
        enc = LokiEncoder("http://loki:3100/loki/api/v1/push")
        req = enc.request([line(e) for e in events])
        assert req.headers["Content-Type"] == "application/x-protobuf"
        decoded = push_pb2.PushRequest.FromString(bytes(cramjam.snappy.decompress_raw(req.body)))
        got = []
        for stream in decoded.streams:
            labels = dict(re_labels(stream.labels))
            for e in stream.entries:
                ev = orjson.loads(e.line)
                assert e.timestamp.seconds * 10**9 + e.timestamp.nanos == ev["ts"]
                sm = {p.name: p.value for p in e.structuredMetadata}
                assert sm["rank"] == str(ev["rank"]) and sm["trace_id"] == TRACE and sm["span_id"] == ev["span_id"]
                assert sm.get("step") == (str(ev["step"]) if "step" in ev else None)
                assert labels == {"training_job": "job-1", "node": ev["node"], "kind": ev["kind"],
                                  **({"level": "INFO"} if ev["kind"] == "log" else {})}
                assert not e.parsed
                got.append(ev)
        assert sorted(got, key=lambda d: d["ts"]) == events

    @pytest.mark.parametrize("structured_metadata", [True, False])
    def test_the_fast_writer_is_byte_identical_to_the_protobuf_library(self, push_pb2, structured_metadata,
                                                                       monkeypatch):
        """Odd shapes included: no span id, no step, second-aligned timestamps, non-ASCII, very long and bad lines."""
        import shippers._loki as mod

        monkeypatch.setattr(mod.time, "time_ns", lambda: T0 + 5)  # lines without a timestamp get "now"
        events = []
        for i in range(500):
            e = event(i, ["span", "log", "metric", "heartbeat"][i % 4], msg="é€" * (i % 7) + "x" * (i * 13 % 5000))
            if i % 5 == 0:
                e["ts"] = T0  # nanos == 0: the field is left out
            if i % 7 == 0:
                del e["span_id"]
            if i % 11 == 0:
                e.pop("step", None)
            events.append(e)
        lines = [line(e) for e in events] + [b'{"kind":"log"}\n', b"[1,2]\n"]
        opts = LokiOptions(structured_metadata=structured_metadata)
        wire = LokiEncoder("http://x/loki/api/v1/push", opts).request(lines).body
        library = LokiEncoder("http://x/loki/api/v1/push", opts, implementation="library").request(lines).body
        raw = bytes(cramjam.snappy.decompress_raw(wire))
        assert raw == bytes(cramjam.snappy.decompress_raw(library))
        decoded = push_pb2.PushRequest.FromString(raw)
        assert sum(len(s.entries) for s in decoded.streams) == len(lines)

    def test_stream_labels_stay_low_cardinality(self, push_pb2):
        """1,000 events of 8 ranks and 500 steps make as many streams as (node, kind) pairs, not per rank or step."""
        events = [event(i, "span", rank=i % 8, step=i // 8) for i in range(1000)]
        enc = LokiEncoder("http://x/loki/api/v1/push")
        decoded = push_pb2.PushRequest.FromString(bytes(cramjam.snappy.decompress_raw(enc.request([line(e) for e in events]).body)))
        assert len(decoded.streams) == 2
        for s in decoded.streams:
            assert set(dict(re_labels(s.labels))) == {"training_job", "node", "kind"}

    def test_without_structured_metadata_the_line_still_carries_everything(self, push_pb2):
        """Fallback for Loki < 3.0: no metadata on the wire; rank, trace/span id and step are in the JSON line."""
        enc = LokiEncoder("http://x/loki/api/v1/push", LokiOptions(structured_metadata=False))
        decoded = push_pb2.PushRequest.FromString(bytes(cramjam.snappy.decompress_raw(enc.request([line(event(3))]).body)))
        entry = decoded.streams[0].entries[0]
        assert list(entry.structuredMetadata) == []
        ev = orjson.loads(entry.line)
        assert (ev["rank"], ev["trace_id"], ev["span_id"], ev["step"]) == (3, TRACE, f"{4:016x}", 0)

    def test_hostile_label_values_are_escaped(self, push_pb2):
        """A job id with quotes, braces, backslashes and newlines survives the label string intact."""
        hostile = 'x"} |= "" or {job=~".+\\\n\t\x01'
        enc = LokiEncoder("http://x/loki/api/v1/push")
        decoded = push_pb2.PushRequest.FromString(
            bytes(cramjam.snappy.decompress_raw(enc.request([line(event(0, job=hostile))]).body)))
        assert dict(re_labels(decoded.streams[0].labels))["training_job"] == hostile
        assert label_string({"job": hostile}).count("\n") == 0

    def test_static_labels_from_the_environment(self, monkeypatch):
        monkeypatch.setenv("JOBTRACE_LOKI_LABELS", "cluster=a, env=prod")
        monkeypatch.setenv("JOBTRACE_LOKI_FORMAT", "json")
        opts = LokiOptions.from_env()
        enc = LokiEncoder("http://x/loki/api/v1/push", opts)
        body = orjson.loads(enc.request([line(event(0))]).body)
        assert body["streams"][0]["stream"] == {"cluster": "a", "env": "prod", "training_job": "job-1", "node": "node0",
                                                "kind": "span"}
        monkeypatch.setenv("JOBTRACE_LOKI_LABELS", "rank=1")
        with pytest.raises(ConfigError, match="set by jobtrace"):
            LokiOptions.from_env()


def re_labels(text: str):
    import re

    return [(k, go_unquote(v)) for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*")', text)]


class TestJsonPayload:
    def test_json_matches_the_documented_shape(self):
        """{"streams":[{"stream":{…},"values":[["<ns as string>","<line>",{metadata}]]}]}, Content-Type JSON."""
        enc = LokiEncoder("http://x/loki/api/v1/push", LokiOptions(format="json"))
        events = [event(0, "log"), event(1, "span")]
        req = enc.request([line(e) for e in events])
        assert req.headers["Content-Type"] == "application/json" and "Content-Encoding" not in req.headers
        doc = orjson.loads(req.body)
        assert set(doc) == {"streams"}
        values = {}
        for s in doc["streams"]:
            assert set(s) == {"stream", "values"}
            assert all(isinstance(v, str) for v in s["stream"].values())
            for ts, text, sm in s["values"]:
                assert isinstance(ts, str) and ts.isdigit()
                assert all(isinstance(k, str) and isinstance(v, str) for k, v in sm.items())
                values[int(ts)] = (orjson.loads(text), sm)
        assert values[T0] == (events[0], {"rank": "0", "trace_id": TRACE, "span_id": f"{1:016x}"})
        assert values[T0 + 1000][1] == {"rank": "1", "trace_id": TRACE, "span_id": f"{2:016x}", "step": "0"}

    def test_gzip_json(self):
        enc = LokiEncoder("http://x/loki/api/v1/push", LokiOptions(format="json", gzip=True))
        req = enc.request([line(event(0))])
        assert req.headers["Content-Encoding"] == "gzip"
        assert orjson.loads(gzip.decompress(req.body))["streams"][0]["values"][0][0] == str(T0)

    def test_tenant_header(self):
        enc = LokiEncoder("http://x/loki/api/v1/push", tenant="team-a")
        assert enc.request([line(event(0))]).headers["X-Scope-OrgID"] == "team-a"


class TestPushUrl:
    @pytest.mark.parametrize("given,expected", [
        ("http://loki:3100", "http://loki:3100/loki/api/v1/push"),
        ("https://logs.example/", "https://logs.example/loki/api/v1/push"),
        ("http://loki:3100/loki/api/v1/push", "http://loki:3100/loki/api/v1/push"),
        ("http://vl:9428/insert/loki", "http://vl:9428/insert/loki/api/v1/push?disable_message_parsing=1"),
        ("http://vl:9428/insert/loki/api/v1/push?disable_message_parsing=0",
         "http://vl:9428/insert/loki/api/v1/push?disable_message_parsing=0"),
    ])
    def test_push_url(self, given, expected):
        assert push_url(given) == expected


class Server:
    """A scripted Loki: answers per call, records what it stored."""

    def __init__(self, push_pb2, script=(), reject_if=None):
        self.loki = FakeLoki(push_pb2=push_pb2)
        self.script = list(script)
        self.reject_if = reject_if  # line predicate → 400 for the whole push containing it (Loki keeps the rest)
        self.calls = []

    def __call__(self, req):
        step = self.script.pop(0) if self.script else None
        before = len(self.loki.entries)
        self.loki(req)
        new = self.loki.entries[before:]
        self.calls.append(len(new))
        if self.reject_if:
            bad = [e for e in new if self.reject_if(e)]
            if bad:
                # Like Loki: valid entries are stored, the request is answered 400 with the reason.
                self.loki.entries = self.loki.entries[:before] + [e for e in new if not self.reject_if(e)]
                return Response(400, b"entry for stream '{job=\"job-1\"}' has timestamp too old: 1970-01-01")
        if step is not None:
            self.loki.entries = self.loki.entries[:before]
            return step
        return Response(204)


def shipper(tmp_path, server, **kw) -> LokiShipper:
    kw.setdefault("policy", FAST)
    return LokiShipper.from_env(info(tmp_path), url="http://loki:3100", transport=InMemoryTransport(server), **kw)


class TestRefusals:
    def test_a_400_dead_letters_only_the_refused_lines_with_lokis_reason(self, tmp_path, push_pb2):
        """One bad line in a batch of 64: bisection isolates it; the 63 others are stored once each."""
        lines = [line(event(i)) for i in range(64)]
        server = Server(push_pb2, reject_if=lambda e: orjson.loads(e.line)["ts"] == T0 + 37 * 1000)
        s = shipper(tmp_path, server)
        s.write(lines)
        assert s.wait_idle(20)
        s.close()
        dead = [orjson.loads(x) for x in (tmp_path / "spool" / "loki-r0" / "dead-letter.jsonl").read_bytes().splitlines()]
        assert [orjson.loads(d["line"])["ts"] for d in dead] == [T0 + 37 * 1000]
        assert dead[0]["status"] == 400 and "timestamp too old" in dead[0]["reason"] and dead[0]["backend"] == "loki"
        stored = sorted({(e.ts, e.line) for e in server.loki.entries})
        assert len(stored) == 63 and s.stats.rejected == 1 and s.dead_letter.count == 1
        assert len(server.calls) <= 2 * 7 + 2  # about 2·log2(64) requests, not one per line

    def test_a_line_over_the_size_limit_is_dead_lettered_without_a_request(self, tmp_path, push_pb2):
        server = Server(push_pb2)
        s = shipper(tmp_path, server, options=LokiOptions(max_line_bytes=1000))
        s.write([line(event(0, "log", msg="x" * 2000)), line(event(1))])
        assert s.wait_idle(10)
        s.close()
        dead = (tmp_path / "spool" / "loki-r0" / "dead-letter.jsonl").read_bytes().splitlines()
        assert len(dead) == 1 and b"line_too_long" in dead[0]
        assert len(server.loki.entries) == 1

    def test_structured_metadata_refused_falls_back_to_the_line(self, tmp_path, push_pb2, caplog):
        """A Loki with structured metadata disallowed: the batch is resent without it, nothing dead-lettered."""
        msg = (b"stream '{job=\"job-1\"}' includes structured metadata, but this feature is disallowed. Please see "
               b"`limits_config.allow_structured_metadata`")

        def loki(req):
            body = push_pb2.PushRequest.FromString(bytes(cramjam.snappy.decompress_raw(req.body)))
            if any(e.structuredMetadata for s in body.streams for e in s.entries):
                return Response(400, msg)
            return server(req)

        server = Server(push_pb2)
        s = LokiShipper.from_env(info(tmp_path), url="http://loki:3100", transport=InMemoryTransport(loki), policy=FAST)
        with caplog.at_level(logging.WARNING, "jobtrace.export"):
            s.write([line(event(i)) for i in range(10)])
            assert s.wait_idle(10)
        s.close()
        assert len(server.loki.entries) == 10 and s.stats.rejected == 0
        assert s.encoder.structured_metadata is False
        assert "does not accept structured metadata" in caplog.text

    @pytest.mark.parametrize("status", [401, 403, 404])
    def test_auth_and_url_errors_keep_lines_spooled_and_retry(self, tmp_path, push_pb2, status, caplog):
        """A wrong token or URL must not dead-letter the job's events: they stay spooled and go once it is fixed."""
        server = Server(push_pb2, script=[Response(status, b"no org id")] * 3)
        s = shipper(tmp_path, server)
        with caplog.at_level(logging.WARNING, "jobtrace.export"):
            s.write([line(event(i)) for i in range(5)])
            assert s.wait_idle(10)
        s.close()
        assert len(server.loki.entries) == 5 and s.stats.rejected == 0
        assert f"HTTP {status}" in caplog.text

    def test_429_and_5xx_are_retried_honouring_retry_after(self, tmp_path, push_pb2):
        server = Server(push_pb2, script=[Response(429, b"rate_limited", {"Retry-After": "0.3"}), Response(503, b"")])
        s = shipper(tmp_path, server, policy=RetryPolicy(initial_s=0.01, max_s=1.0))
        t0 = time.monotonic()
        s.write([line(event(i)) for i in range(5)])
        assert s.wait_idle(10)
        s.close()
        assert time.monotonic() - t0 >= 0.3
        assert len(server.loki.entries) == 5 and s.stats.retries == 2


class TestSecrets:
    def test_credentials_never_reach_logs_errors_or_the_dead_letter_file(self, tmp_path, push_pb2, monkeypatch, caplog):
        monkeypatch.setenv("JOBTRACE_LOKI_TOKEN", "tok-SECRET-123")
        monkeypatch.setenv("JOBTRACE_LOKI_PASSWORD", "pw-SECRET-456")
        monkeypatch.setenv("JOBTRACE_LOKI_USERNAME", "u")
        seen = []

        def loki(req):
            seen.append(req)
            return Response(401, b"unauthorized")

        s = LokiShipper.from_env(info(tmp_path), url="http://user:url-SECRET-789@loki:3100",
                                 transport=InMemoryTransport(loki), policy=FAST, shutdown_timeout_s=0.3)
        with caplog.at_level(logging.DEBUG):
            s.write([line(event(0))])
            time.sleep(0.3)
            s.close()
        text = caplog.text + repr(s.stats) + repr(s.transport) + str(list(tmp_path.rglob("*")))
        for p in tmp_path.rglob("*"):
            if p.is_file():
                text += p.read_bytes().decode("utf-8", "replace")
        for secret in ("tok-SECRET-123", "pw-SECRET-456", "url-SECRET-789"):
            assert secret not in text
        assert seen, "the shipper did try"


class TestRegistry:
    def test_jobtrace_loki_url_adds_the_shipper_to_init_tracing(self, tmp_path, monkeypatch, push_pb2):
        """init_tracing() with JOBTRACE_LOKI_URL ships every event to Loki as well as the embedded store."""
        import otel_instrumentation as oi
        import shippers._loki as mod

        fake = FakeLoki(push_pb2=push_pb2)
        for var in ("JOBTRACE_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("JOBTRACE_LOKI_URL", "http://loki:3100")
        monkeypatch.setattr(mod, "RequestsTransport", lambda config: InMemoryTransport(fake))
        t = oi.init_tracing("reg-job", data_dir=str(tmp_path), heartbeat_s=0.1, torch=False, otel=False)
        try:
            for i in range(3):
                with t.step(i):
                    logging.getLogger("train").info("step %d", i)
        finally:
            t.shutdown()
        kinds = {orjson.loads(e.line)["kind"] for e in fake.entries}
        assert {"span", "log"} <= kinds
        assert all(e.labels["training_job"] == "reg-job" for e in fake.entries)
        assert {e.metadata["trace_id"] for e in fake.entries} == {t.identity.trace_id}
