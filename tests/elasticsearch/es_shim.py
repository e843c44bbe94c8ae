"""An Elasticsearch 8/9 façade over the real OpenSearch node, for the Elasticsearch-flavour code path.

No Elasticsearch server can run here, so the parts of the Elasticsearch REST API that
differ from OpenSearch are played by this proxy, following the documented formats
(elasticsearch-specification; see /work/shared/reference/backends.md §4), while
searching, indexing, templates and data streams stay real (OpenSearch does them):

* every answer carries ``X-Elastic-Product: Elasticsearch`` (elasticsearch-py refuses a
  server without it) and ``GET /`` answers like Elasticsearch (``tagline``,
  ``build_flavor``);
* ``application/vnd.elasticsearch+json; compatible-with=N`` is accepted only for the
  emulated major and the one before it (else 400 ``media_type_header_exception``, as
  Elasticsearch 8 answers a 9.x client), and forwarded as ``application/json``;
* ILM (``/_ilm/policy/<name>``) is kept here, each body validated against the
  documented policy shape; ``index.lifecycle.name`` / ``lifecycle`` are recorded and
  removed from templates and settings before they reach OpenSearch;
* point in time: ``POST /<index>/_pit`` → ``{"id"}`` and ``DELETE /_pit`` ``{"id"}`` are
  translated to OpenSearch's ``/_search/point_in_time`` API, and a ``_shard_doc`` sort to
  ``_index`` + ``_doc`` (the search_after values stay opaque to the client).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.servers.base import free_port

COMPAT = re.compile(r"application/vnd\.elasticsearch\+(json|x-ndjson);\s*compatible-with=(\d+)")
ILM_PHASES = ("hot", "warm", "cold", "frozen", "delete")
ILM_ACTIONS = {
    "hot": {"rollover", "set_priority", "unfollow", "readonly", "shrink", "forcemerge", "searchable_snapshot",
            "downsample"},
    "warm": {"set_priority", "unfollow", "readonly", "allocate", "migrate", "shrink", "forcemerge", "downsample"},
    "cold": {"set_priority", "unfollow", "readonly", "searchable_snapshot", "allocate", "migrate", "downsample"},
    "frozen": {"unfollow", "searchable_snapshot"},
    "delete": {"wait_for_snapshot", "delete"},
}
ROLLOVER_CONDITIONS = {"max_age", "max_docs", "max_size", "max_primary_shard_size", "max_primary_shard_docs",
                       "min_age", "min_docs", "min_size", "min_primary_shard_size", "min_primary_shard_docs"}
TIME_VALUE = re.compile(r"^\d+(d|h|m|s|ms|micros|nanos)$")


def validate_ilm(body: Any) -> str | None:
    """None when ``body`` is a valid ``PUT _ilm/policy`` request, else the reason."""
    if not isinstance(body, dict) or set(body) != {"policy"} or not isinstance(body["policy"], dict):
        return "body must be {\"policy\": {...}}"
    policy = body["policy"]
    unknown = set(policy) - {"phases", "_meta"}
    if unknown:
        return f"unknown policy keys {sorted(unknown)}"
    phases = policy.get("phases")
    if not isinstance(phases, dict) or not phases:
        return "policy.phases missing"
    for name, phase in phases.items():
        if name not in ILM_PHASES:
            return f"unknown phase {name}"
        if set(phase) - {"min_age", "actions"}:
            return f"phase {name}: unknown keys"
        if "min_age" in phase and not TIME_VALUE.match(str(phase["min_age"])):
            return f"phase {name}: bad min_age {phase['min_age']!r}"
        actions = phase.get("actions", {})
        if set(actions) - ILM_ACTIONS[name]:
            return f"phase {name}: action(s) {sorted(set(actions) - ILM_ACTIONS[name])} not allowed"
        rollover = actions.get("rollover")
        if rollover is not None:
            if not rollover or set(rollover) - ROLLOVER_CONDITIONS:
                return f"rollover conditions {rollover!r}"
            for key in ("max_age", "min_age"):
                if key in rollover and not TIME_VALUE.match(str(rollover[key])):
                    return f"rollover {key} {rollover[key]!r}"
        if "delete" in actions and actions["delete"] not in ({}, {"delete_searchable_snapshot": True},
                                                              {"delete_searchable_snapshot": False}):
            return "delete action takes no options but delete_searchable_snapshot"
    order = [p for p in ILM_PHASES if p in phases]
    ages = [_age_s(phases[p].get("min_age", "0ms")) for p in order]
    if ages != sorted(ages):
        return "phase min_age values must not decrease"
    return None


def _age_s(value: str) -> float:
    m = re.match(r"^(\d+)(d|h|m|s|ms|micros|nanos)$", value)
    if not m:
        return 0.0
    return int(m.group(1)) * {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 1e-3, "micros": 1e-6,
                              "nanos": 1e-9}[m.group(2)]


class EsShim:
    """``EsShim(opensearch_url, version="8.15.3").start()``; ``.url`` looks like Elasticsearch."""

    def __init__(self, upstream_url: str, version: str = "8.15.3", serverless: bool = False) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 9200)
        self.version = version
        self.major = int(version.split(".")[0])
        self.serverless = serverless
        self.ilm: dict[str, dict[str, Any]] = {}
        self.lifecycle_settings: dict[str, Any] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content-type)
        self.shard_doc_searches = 0
        self.lock = threading.Lock()
        self.port = free_port()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EsShim:
        shim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, data, ctype = shim.handle(self.command, self.path, dict(self.headers), body)
                self.send_response(status)
                self.send_header("X-Elastic-Product", "Elasticsearch")
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._httpd = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    # ---- translation -------------------------------------------------------------------------
    def _json(self, status: int, value: Any) -> tuple[int, bytes, str]:
        mt = f"application/vnd.elasticsearch+json;compatible-with={self.major}"
        return status, json.dumps(value).encode(), mt

    def _error(self, status: int, type_: str, reason: str) -> tuple[int, bytes, str]:
        return self._json(status, {"error": {"root_cause": [{"type": type_, "reason": reason}], "type": type_,
                                             "reason": reason}, "status": status})

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        lower = {k.lower(): v for k, v in headers.items()}
        with self.lock:
            self.requests.append((method, target, lower.get("content-type", "")))
        for name in ("accept", "content-type"):
            m = COMPAT.search(lower.get(name, ""))
            if m and int(m.group(2)) not in (self.major, self.major - 1):
                return self._error(400, "media_type_header_exception",
                                   f"Invalid media-type value on headers [{name}]: Accept version must be either "
                                   f"version {self.major} or {self.major - 1}, but found {m.group(2)}")
        path, _, query = target.partition("?")
        doc: Any = None
        if body and "ndjson" not in lower.get("content-type", ""):
            try:
                doc = json.loads(body)
            except ValueError:
                return self._error(400, "x_content_parse_exception", "not JSON")
        if path == "/" and method in ("GET", "HEAD"):
            return self._json(200, {"name": "es-shim", "cluster_name": "es-shim", "cluster_uuid": "shim",
                                    "version": {"number": self.version,
                                                "build_flavor": "serverless" if self.serverless else "default",
                                                "build_type": "docker", "lucene_version": "9.12.0",
                                                "minimum_wire_compatibility_version": "7.17.0",
                                                "minimum_index_compatibility_version": "7.0.0"},
                                    "tagline": "You Know, for Search"})
        m = re.match(r"^/_ilm/policy/([^/]+)$", path)
        if m:
            if self.serverless:
                return self._error(410, "api_not_available_exception", "ILM is not available in serverless")
            name = m.group(1)
            if method == "GET":
                if name not in self.ilm:
                    return self._error(404, "resource_not_found_exception", f"Lifecycle policy not found: {name}")
                return self._json(200, {name: {"version": 1, "modified_date": "2026-01-01T00:00:00.000Z",
                                               "policy": self.ilm[name]["policy"]}})
            if method == "PUT":
                problem = validate_ilm(doc)
                if problem:
                    return self._error(400, "x_content_parse_exception", problem)
                self.ilm[name] = doc
                return self._json(200, {"acknowledged": True})
        if method == "PUT" and path.startswith("/_index_template/") and isinstance(doc, dict):
            settings = doc.get("template", {}).get("settings", {})
            if "index.lifecycle.name" in settings:
                self.lifecycle_settings[path.rsplit("/", 1)[1]] = settings.pop("index.lifecycle.name")
            if "lifecycle" in doc.get("template", {}):
                self.lifecycle_settings[path.rsplit("/", 1)[1]] = doc["template"].pop("lifecycle")
            doc.pop("allow_auto_create", None)
            body = json.dumps(doc).encode()
        if method == "PUT" and path.endswith("/_settings") and isinstance(doc, dict) and \
                set(doc) == {"index.lifecycle.name"}:
            self.lifecycle_settings[path] = doc["index.lifecycle.name"]
            return self._json(200, {"acknowledged": True})
        m = re.match(r"^/([^/_][^/]*)/_pit$", path)
        if m and method == "POST":
            status, data = self._forward("POST", f"/{m.group(1)}/_search/point_in_time?{query}", b"")
            if status != 200:
                return status, data, "application/json"
            return self._json(200, {"id": json.loads(data)["pit_id"]})
        if path == "/_pit" and method == "DELETE":
            pit = (doc or {}).get("id")
            status, data = self._forward("DELETE", "/_search/point_in_time",
                                         json.dumps({"pit_id": [pit]}).encode())
            return self._json(200 if status == 200 else status, {"succeeded": status == 200, "num_freed": 1})
        if path == "/_search" and isinstance(doc, dict) and doc.get("sort") == [{"_shard_doc": "asc"}]:
            # OpenSearch has no _shard_doc: page by (_index, _doc) instead; the client treats sort values as opaque
            doc["sort"] = [{"_index": "asc"}, {"_doc": "asc"}]
            self.shard_doc_searches += 1
            body = json.dumps(doc).encode()
        status, data = self._forward(method, target, body, lower.get("content-type"))
        return status, data, "application/json"

    def _forward(self, method: str, target: str, body: bytes, ctype: str | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/x-ndjson" if ctype and "ndjson" in ctype else "application/json"}
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(method, target, body=body or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()
