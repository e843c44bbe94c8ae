"""Credentials and TLS as the shipper sends them (a local HTTPS server that answers like OpenSearch)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobtrace.http import HttpConfig
from shippers._elasticsearch import ElasticsearchShipper
from tests.servers.base import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

LINE = orjson.dumps({"ts": 1_767_225_600_000_000_000, "kind": "log", "job": "tls", "trace_id": "a" * 32, "rank": 0,
                     "local_rank": 0, "world": 1, "node": "n", "pid": 1, "v": 1, "msg": "hello"}) + b"\n"


class FakeCluster:
    """Answers ``GET /`` like OpenSearch and ``_bulk`` with 201s; records each request's headers."""

    def __init__(self, cert: Path | None = None, key: Path | None = None) -> None:
        self.headers: list[dict[str, str]] = []
        self.port = free_port()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _reply(self, value: Any) -> None:
                data = orjson.dumps(value)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.headers.append(dict(self.headers))
                if self.path.startswith("/_index_template/"):
                    return self._reply({"index_templates": [{"name": f"jobtrace-{t}", "index_template": {
                        "version": 1}} for t in ("logs", "metrics", "traces")]})
                if self.path.startswith("/_component_template/"):
                    return self._reply({"component_templates": [{"name": n, "component_template": {"version": 1}}
                                                                for n in ("jobtrace-mappings", "jobtrace-settings")]})
                self._reply({"version": {"number": "2.19.0", "distribution": "opensearch"}})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.headers.append(dict(self.headers))
                n = len(body.splitlines()) // 2
                self._reply({"errors": False, "items": [{"create": {"status": 201}}] * n})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://localhost:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A private CA and a server certificate for localhost signed by it."""
    d = tmp_path_factory.mktemp("pki")
    run = lambda *args: subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=jobtrace test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}


def ship_one(config: HttpConfig, spool: Path, wait_s: float = 10.0) -> ElasticsearchShipper:
    shipper = ElasticsearchShipper(config, spool, shutdown_timeout_s=0.5)
    shipper.write([LINE])
    shipper.wait_idle(wait_s)
    shipper.close()
    return shipper


@pytest.mark.parametrize("env,expected", [
    ({"JOBTRACE_ES_API_KEY": "a2V5OnNlY3JldA=="}, "ApiKey a2V5OnNlY3JldA=="),
    ({"JOBTRACE_ES_TOKEN": "tok-123"}, "Bearer tok-123"),
    ({"JOBTRACE_ES_USERNAME": "trainer", "JOBTRACE_ES_PASSWORD": "pw"}, "Basic dHJhaW5lcjpwdw=="),
])
def test_api_key_bearer_and_basic_auth_reach_every_request(tmp_path, monkeypatch, env, expected):
    fake = FakeCluster()
    try:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        shipper = ship_one(HttpConfig.from_env("JOBTRACE_ES", url=fake.url), tmp_path / "s")
        assert 1 == shipper.stats.sent
        assert fake.headers and all(expected == h.get("Authorization") for h in fake.headers)
        assert "secret" not in repr(HttpConfig.from_env("JOBTRACE_ES", url=fake.url)).replace("***", "")
    finally:
        fake.close()


def test_secrets_can_come_from_files(tmp_path, monkeypatch):
    fake = FakeCluster()
    try:
        (tmp_path / "key").write_text("from-a-file\n")
        monkeypatch.setenv("JOBTRACE_ES_API_KEY_FILE", str(tmp_path / "key"))
        ship_one(HttpConfig.from_env("JOBTRACE_ES", url=fake.url), tmp_path / "s")
        assert "ApiKey from-a-file" == fake.headers[-1]["Authorization"]
    finally:
        fake.close()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_is_verified_by_default_and_a_private_ca_can_be_given(certs, tmp_path):
    """An unknown CA is refused (the line stays spooled); with JOBTRACE_ES_CA_FILE it ships."""
    fake = FakeCluster(certs["cert"], certs["key"])
    try:
        refused = ship_one(HttpConfig(fake.url), tmp_path / "spool", wait_s=1.5)
        assert 0 == refused.stats.sent and refused.stats.spooled_bytes > 0
        assert "SSLError" in (refused.stats.last_error or "")
        assert [] == fake.headers
        trusted = ship_one(HttpConfig(fake.url, ca_file=str(certs["ca"])), tmp_path / "spool")
        assert 2 == trusted.stats.sent  # its own line and the one the refused attempt left in the spool
        insecure = ship_one(HttpConfig(fake.url, verify=False), tmp_path / "other")
        assert 1 == insecure.stats.sent
    finally:
        fake.close()
