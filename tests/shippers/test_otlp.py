"""Spans reach an OTLP/HTTP endpoint (what Tempo, Jaeger and the Collector accept), decoded with the official protos."""

from __future__ import annotations

import http.server
import subprocess
import textwrap
import threading

import pytest

from tests.conftest import PYTHON, python_env

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra is part of the test dependencies")


class Receiver(http.server.ThreadingHTTPServer):
    def __init__(self):
        self.bodies = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers["Content-Length"])
                outer.bodies.append((self.path, self.headers.get("Content-Type"), self.rfile.read(n)))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def run_child(tmp_path, source: str, rank: int) -> list[tuple[str, str, bytes]]:
    """Run ``source`` as rank ``rank`` of 2 with an OTLP endpoint; the (path, content type, body) of each request."""
    rx = Receiver()
    threading.Thread(target=rx.serve_forever, daemon=True).start()
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(source))
    env = python_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rx.server_address[1]}", RANK=str(rank),
                     WORLD_SIZE="2")
    proc = subprocess.run([PYTHON, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    rx.shutdown()
    assert proc.returncode == 0, proc.stderr
    return rx.bodies


def test_step_and_phase_spans_arrive_as_otlp_with_the_job_trace_and_resource(tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_instrumentation import trace_id_for_job

    bodies = run_child(tmp_path, """
        import otel_instrumentation as oi
        t = oi.init_tracing("otlp-job", data_dir="store", torch=False)
        for i in range(3):
            with oi.step(i):
                with oi.phase("forward"):
                    pass
        t.shutdown()
        """, rank=1)
    spans, resources = [], []
    for path, ctype, body in bodies:
        assert path == "/v1/traces" and ctype == "application/x-protobuf"
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            resources.append({a.key: a.value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                spans += list(ss.spans)
    names = sorted(s.name for s in spans)
    assert names == ["forward"] * 3 + ["step"] * 3
    assert {s.trace_id.hex() for s in spans} == {trace_id_for_job("otlp-job")}
    by_id = {s.span_id: s for s in spans}
    assert all(by_id[s.parent_span_id].name == "step" for s in spans if s.name == "forward")
    assert resources[0]["jobtrace.rank"].int_value == 1 and resources[0]["service.namespace"].string_value == "jobtrace"


def test_rank_0_closes_the_job_root_span_once_even_with_a_forked_child(tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from jobtrace.identity import job_root_span_id

    bodies = run_child(tmp_path, """
        import os
        import otel_instrumentation as oi
        t = oi.init_tracing("root-job", data_dir="store", torch=False)
        with oi.step(0):
            pass
        pid = os.fork()  # a DataLoader-style worker: its own sinks, never the job's root
        if pid == 0:
            with oi.span("in-child"):
                pass
            oi.get_tracing().shutdown()
            os._exit(0)
        os.waitpid(pid, 0)
        t.shutdown()
        """, rank=0)
    spans = [s for _, _, body in bodies for rs in ExportTraceServiceRequest.FromString(body).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in spans) == ["in-child", "job", "step"]
    (job,) = [s for s in spans if s.name == "job"]
    assert int.from_bytes(job.span_id, "big") == job_root_span_id("root-job") and not job.parent_span_id
    assert job.start_time_unix_nano <= min(s.start_time_unix_nano for s in spans if s.name == "step")
    assert all(s.parent_span_id == job.span_id for s in spans if s.name == "step")
