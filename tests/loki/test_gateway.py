"""deploy/loki/gateway: the real nginx config, run in a real nginx, in front of a stand-in for Loki.

What is tested is the gateway's own file (``deploy/loki/gateway/loki-gateway.conf``) and the
htpasswd its ``gateway-auth`` service writes (``deploy/loki/gateway/htpasswd.sh``): requests
without or with wrong credentials get 401 and never reach Loki; good ones reach it with the
tenant header set by the gateway (a client's own is replaced) and without the password. Only the
addresses differ from the compose stack: ports on 127.0.0.1 and a Python HTTP server for Loki
and Alertmanager. Skipped where nginx or Apache's ``htpasswd`` is not installed
(Debian: ``apt-get install nginx-light apache2-utils``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "deploy" / "loki" / "gateway"
USER = "jobtrace"
PASSWORD = "a-long-test-password-0123"

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
HTPASSWD = shutil.which("htpasswd")
pytestmark = pytest.mark.skipif(not (NGINX and HTPASSWD),
                                reason="needs nginx and htpasswd (apt-get install nginx-light apache2-utils)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Backend:
    """A stand-in for Loki (or Alertmanager) that records what reached it."""

    name: str
    seen: list[dict] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> int:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                backend.seen.append({"method": self.command, "path": self.path, "body": body,
                                     "headers": [(k.lower(), v) for k, v in self.headers.items()]})
                out = json.dumps({"backend": backend.name}).encode()
                self.send_response(204 if self.command == "POST" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "0" if self.command == "POST" else str(len(out)))
                self.end_headers()
                if self.command != "POST":
                    self.wfile.write(out)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def header(self, request: dict, name: str) -> list[str]:
        return [v for k, v in request["headers"] if k == name.lower()]


@dataclass
class Gateway:
    loki_url: str
    alertmanager_url: str
    loki: Backend
    alertmanager: Backend


def render(conf: str, *, listen_loki: int, listen_am: int, loki: int, am: int, htpasswd: Path) -> str:
    """The gateway's file with the compose stack's addresses swapped for local ones (each exactly once)."""
    swaps = [("listen 3100;", f"listen 127.0.0.1:{listen_loki};"),
             ("listen 9093;", f"listen 127.0.0.1:{listen_am};"),
             ("proxy_pass http://loki:3100;", f"proxy_pass http://127.0.0.1:{loki};"),
             ("proxy_pass http://alertmanager:9093;", f"proxy_pass http://127.0.0.1:{am};")]
    for old, new in swaps:
        assert conf.count(old) == 1, f"the gateway config no longer has exactly one {old!r}"
        conf = conf.replace(old, new)
    assert conf.count("auth_basic_user_file /etc/nginx/auth/htpasswd;") == 2
    return conf.replace("/etc/nginx/auth/htpasswd", str(htpasswd))


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    loki, am = Backend("loki"), Backend("alertmanager")
    loki_port, am_port = loki.start(), am.start()
    with tempfile.TemporaryDirectory(prefix="jobtrace-gateway-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)                       # nginx's workers (another user when run as root) read the htpasswd
        htpasswd = work / "htpasswd"
        env = {**os.environ, "LOKI_USER": USER, "LOKI_PASSWORD": PASSWORD}
        subprocess.run(["sh", str(GATEWAY / "htpasswd.sh"), str(htpasswd)], env=env, check=True,
                       capture_output=True, timeout=60)
        listen_loki, listen_am = _free_port(), _free_port()
        (work / "loki-gateway.conf").write_text(render(
            (GATEWAY / "loki-gateway.conf").read_text(), listen_loki=listen_loki, listen_am=listen_am,
            loki=loki_port, am=am_port, htpasswd=htpasswd))
        temp_paths = "\n".join(f"  {kind}_temp_path {work}/{kind};"
                               for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (work / "nginx.conf").write_text(f"""
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
{temp_paths}
  include {work}/loki-gateway.conf;
}}
""")
        proc = subprocess.Popen([NGINX, "-p", str(work), "-c", str(work / "nginx.conf")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{listen_loki}"
        try:
            deadline = time.monotonic() + 20
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"nginx did not start: {proc.stderr.read().decode()}"
                                f"{(work / 'error.log').read_text() if (work / 'error.log').exists() else ''}")
                try:
                    if requests.get(f"{base}/gateway-health", timeout=1).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail("nginx did not answer within 20 s")
                time.sleep(0.05)
            yield Gateway(base, f"http://127.0.0.1:{listen_am}", loki, am)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            loki.server.shutdown()
            am.server.shutdown()


def _reached(backend: Backend, action) -> list[dict]:
    before = len(backend.seen)
    action()
    return backend.seen[before:]


@pytest.mark.parametrize("auth", [None, (USER, "wrong-password-0123"), ("someone", PASSWORD), (USER, "")],
                         ids=["none", "bad-password", "bad-user", "empty-password"])
def test_requests_without_good_credentials_get_401_and_never_reach_loki(gateway, auth):
    url = f"{gateway.loki_url}/loki/api/v1/query_range?query=%7Bjob%3D%22j%22%7D"
    got: list[requests.Response] = []
    reached = _reached(gateway.loki, lambda: got.append(requests.get(url, auth=auth, timeout=5)))
    assert got[0].status_code == 401
    assert got[0].headers["WWW-Authenticate"].startswith("Basic realm=")
    assert reached == []
    push = _reached(gateway.loki, lambda: got.append(requests.post(
        f"{gateway.loki_url}/loki/api/v1/push", data=b"{}", auth=auth, timeout=5)))
    assert got[-1].status_code == 401 and push == []


def test_good_credentials_reach_loki_with_the_tenant_and_without_the_password(gateway):
    got: list[requests.Response] = []
    reached = _reached(gateway.loki, lambda: got.append(requests.get(
        f"{gateway.loki_url}/loki/api/v1/labels?start=1", auth=(USER, PASSWORD), timeout=5)))
    assert got[0].status_code == 200 and got[0].json() == {"backend": "loki"}
    (request,) = reached
    assert request["path"] == "/loki/api/v1/labels?start=1"
    assert gateway.loki.header(request, "X-Scope-OrgID") == ["jobtrace"]
    assert gateway.loki.header(request, "Authorization") == []


def test_the_gateway_replaces_a_tenant_the_client_chose(gateway):
    reached = _reached(gateway.loki, lambda: requests.get(
        f"{gateway.loki_url}/loki/api/v1/labels", auth=(USER, PASSWORD),
        headers={"X-Scope-OrgID": "someone-else"}, timeout=5))
    (request,) = reached
    assert gateway.loki.header(request, "X-Scope-OrgID") == ["jobtrace"]


def test_the_health_path_needs_no_credentials_and_tells_nothing_about_loki(gateway):
    got: list[requests.Response] = []
    reached = _reached(gateway.loki, lambda: got.append(requests.get(f"{gateway.loki_url}/gateway-health",
                                                                      timeout=5)))
    assert got[0].status_code == 200 and got[0].text == "ok\n" and reached == []
    # Loki's own /ready stays behind the password
    assert requests.get(f"{gateway.loki_url}/ready", timeout=5).status_code == 401


def test_alertmanager_is_behind_the_same_password(gateway):
    assert requests.get(f"{gateway.alertmanager_url}/api/v2/alerts", timeout=5).status_code == 401
    reached = _reached(gateway.alertmanager, lambda: requests.get(
        f"{gateway.alertmanager_url}/api/v2/alerts", auth=(USER, PASSWORD), timeout=5))
    (request,) = reached
    assert request["path"] == "/api/v2/alerts" and gateway.alertmanager.header(request, "Authorization") == []


def test_jobtrace_reaches_loki_through_the_gateway_with_its_own_variables(gateway, monkeypatch, tmp_path):
    """What deploy/loki/README.md tells a training job to set: URL, user name and a password file."""
    from jobtrace.http import HttpConfig, Request, RequestsTransport
    from shippers._loki import push_url

    secret = tmp_path / "loki-password"
    secret.write_text(PASSWORD + "\n")
    monkeypatch.setenv("JOBTRACE_LOKI_URL", gateway.loki_url)
    monkeypatch.setenv("JOBTRACE_LOKI_USERNAME", USER)
    monkeypatch.setenv("JOBTRACE_LOKI_PASSWORD_FILE", str(secret))
    monkeypatch.delenv("JOBTRACE_LOKI_PASSWORD", raising=False)
    http = HttpConfig.from_env("JOBTRACE_LOKI")
    transport = RequestsTransport(http)
    try:
        body = b'{"streams":[{"stream":{"job":"j"},"values":[["1","x"]]}]}'
        got = []
        reached = _reached(gateway.loki, lambda: got.append(transport.send(
            Request("POST", push_url(http.url), body, {"Content-Type": "application/json"}), 5.0)))
    finally:
        transport.close()
    assert got[0].status == 204
    (request,) = reached
    assert request["path"] == "/loki/api/v1/push" and request["body"] == body
    assert gateway.loki.header(request, "X-Scope-OrgID") == ["jobtrace"]
    # and the same variables with a wrong password are refused
    monkeypatch.setenv("JOBTRACE_LOKI_PASSWORD", "wrong-password-0123")
    monkeypatch.delenv("JOBTRACE_LOKI_PASSWORD_FILE")
    wrong = RequestsTransport(HttpConfig.from_env("JOBTRACE_LOKI"))
    try:
        assert wrong.send(Request("POST", push_url(http.url), body, {}), 5.0).status == 401
    finally:
        wrong.close()


def test_the_htpasswd_holds_a_bcrypt_hash_not_the_password(tmp_path):
    out = tmp_path / "htpasswd"
    env = {**os.environ, "LOKI_USER": USER, "LOKI_PASSWORD": PASSWORD}
    subprocess.run(["sh", str(GATEWAY / "htpasswd.sh"), str(out)], env=env, check=True, capture_output=True)
    (line,) = out.read_text().splitlines()
    user, _, digest = line.partition(":")
    assert user == USER and digest.startswith("$2y$") and PASSWORD not in line
    for bad_env, why in (({"LOKI_PASSWORD": ""}, "set LOKI_PASSWORD"), ({"LOKI_PASSWORD": "short"}, "too short"),
                         ({"LOKI_PASSWORD": PASSWORD, "LOKI_USER": "a:b"}, "no ':'")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")} | bad_env
        done = subprocess.run(["sh", str(GATEWAY / "htpasswd.sh"), str(tmp_path / "x")], env=env,
                              capture_output=True, text=True)
        assert done.returncode != 0 and why in done.stderr, (bad_env, done.stderr)
        assert not (tmp_path / "x").exists()

