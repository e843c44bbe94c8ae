"""Kibana / OpenSearch Dashboards saved objects: format, references, fields, and their queries run for real.

No Kibana or OpenSearch Dashboards runs here, so the import itself is checked against the
documented API (``POST /api/saved_objects/_import``: multipart ``file`` field, ``kbn-xsrf``
or ``osd-xsrf`` header, ``{success, successCount, errors}`` answer) with a small fake,
while every query and aggregation the objects carry is run on the real OpenSearch node.
"""

from __future__ import annotations

import email.policy
import json
import re
import threading
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
import requests

import kibana
from jobtrace.errors import ConfigError
from jobtrace.http import HttpConfig
from kibana import _build
from kibana._document import doc_id
from kibana._setup import import_saved_objects, run_setup
from tests.elasticsearch.conftest import refresh, ship, synth_lines
from tests.servers.base import free_port

FLAVOURS = ("kibana", "opensearch-dashboards")


def objects(flavour: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in kibana.saved_objects(flavour).decode().splitlines()]


def search_source(obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(obj["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])


# ---- format --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_files_are_valid_ndjson_of_saved_objects(flavour):
    raw = kibana.saved_objects(flavour)
    assert raw.endswith(b"\n") and b"\n\n" not in raw
    objs = objects(flavour)
    assert ["index-pattern", "search", "search", "search", "search", "visualization", "visualization",
            "visualization", "visualization", "dashboard"] == [o["type"] for o in objs]
    assert len({o["id"] for o in objs}) == len(objs)
    for obj in objs:
        assert {"id", "type", "attributes", "references"} <= set(obj)
        if flavour == "kibana":
            assert "8.8.0" == obj["coreMigrationVersion"] and re.fullmatch(r"8\.\d+\.\d+", obj["typeMigrationVersion"])
            assert "migrationVersion" not in obj
        else:  # OpenSearch Dashboards is Kibana 7.10: no versions it does not know
            assert {obj["type"]} == set(obj["migrationVersion"]) and "typeMigrationVersion" not in obj
            assert tuple(map(int, obj["migrationVersion"][obj["type"]].split("."))) <= (7, 10, 0)
        for key in ("visState", "panelsJSON", "optionsJSON", "uiStateJSON", "fieldFormatMap"):
            if key in obj["attributes"]:
                json.loads(obj["attributes"][key])
        if "kibanaSavedObjectMeta" in obj["attributes"]:
            assert "lucene" == search_source(obj)["query"]["language"]


def test_the_packaged_files_are_what_the_generator_writes():
    for flavour, name in kibana.SAVED_OBJECT_FILES.items():
        assert _build.render(flavour) == kibana.saved_objects(flavour).decode(), f"run python -m kibana._build ({name})"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_reference_resolves_and_every_ref_name_is_declared(flavour):
    objs = objects(flavour)
    present = {(o["type"], o["id"]) for o in objs}
    for obj in objs:
        names = {r["name"] for r in obj["references"]}
        for ref in obj["references"]:
            assert (ref["type"], ref["id"]) in present, (obj["id"], ref)
        used: set[str] = set()
        if "kibanaSavedObjectMeta" in obj["attributes"]:
            source = search_source(obj)
            if "indexRefName" in source:
                used.add(source["indexRefName"])
            used |= {f["meta"]["indexRefName"] for f in source["filter"]}
        if obj["type"] == "dashboard":
            for panel in json.loads(obj["attributes"]["panelsJSON"]):
                used.add(f"{panel['panelIndex']}:{panel['panelRefName']}" if flavour == "kibana"
                         else panel["panelRefName"])
                assert panel["gridData"]["i"] == panel["panelIndex"]
                assert 0 <= panel["gridData"]["x"] and panel["gridData"]["x"] + panel["gridData"]["w"] <= 48
        assert used == names, obj["id"]


def mapping_fields() -> dict[str, str]:
    props = kibana.load_template("jobtrace-mappings")["template"]["mappings"]["properties"]

    def walk(p: dict[str, Any], prefix: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        for name, spec in p.items():
            if "properties" in spec:
                out.update(walk(spec["properties"], f"{prefix}{name}."))
            if "type" in spec and spec["type"] != "object":
                out[f"{prefix}{name}"] = spec["type"]
        return out

    return walk(props)


def fields_used(obj: dict[str, Any]) -> set[str]:
    attrs = obj["attributes"]
    used: set[str] = set()
    used |= set(attrs.get("columns", []))
    used |= {s[0] for s in attrs.get("sort", [])}
    if obj["type"] == "index-pattern":
        used.add(attrs["timeFieldName"])
        used |= set(json.loads(attrs["fieldFormatMap"]))
    if "visState" in attrs:
        used |= {a["params"]["field"] for a in json.loads(attrs["visState"])["aggs"] if "field" in a["params"]}
    if "kibanaSavedObjectMeta" in attrs:
        source = search_source(obj)
        used |= set(re.findall(r"([A-Za-z_@][\w.@]*):", source["query"]["query"]))
        for f in source["filter"]:
            used.add(f["meta"]["key"])
            used |= set(next(iter(f["query"].values())))
    return used


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_field_used_exists_in_the_index_template_mapping(flavour):
    known = mapping_fields()
    for obj in objects(flavour):
        missing = fields_used(obj) - set(known)
        assert not missing, (obj["id"], missing)
    assert "keyword" == known["jobtrace.job"] and "date_nanos" == known["@timestamp"]


# ---- the queries, for real -------------------------------------------------------------------------------
JOB = "saved-objects-job"


@pytest.fixture(scope="module")
def dataset(opensearch, tmp_path_factory):
    """A hung synthetic job plus errors, NCCL timeouts and a failed collective, shipped to the node."""
    tmp = tmp_path_factory.mktemp("saved")
    run_setup(HttpConfig(opensearch.url))
    _, lines = synth_lines(tmp, job_id=JOB, ranks=4, steps=8, ranks_per_node=2, hang_rank=1, hang_step=5, hang_s=300,
                           nan_step=6)
    base = orjson.loads(lines[0])
    common = {k: base[k] for k in ("job", "trace_id", "local_rank", "world", "pid", "v")}
    t = 1_767_300_000_000_000_000
    extra = [
        {**common, "ts": t, "kind": "log", "rank": 3, "node": "node0001", "level": "ERROR", "logger": "train",
         "msg": "CUDA error: out of memory", "step": 4},
        {**common, "ts": t + 1, "kind": "log", "rank": 2, "node": "node0001", "level": "WARNING", "logger": "torch",
         "msg": "[Rank 2] NCCL watchdog caught collective operation timeout after 600000 milliseconds", "step": 5},
        {**common, "ts": t + 2, "kind": "log", "rank": 0, "node": "node0000", "level": "CRITICAL", "logger": "train",
         "msg": "giving up", "step": 5},
        {**common, "ts": t + 3, "kind": "span", "rank": 0, "node": "node0000", "span_id": "e" * 16, "name": "all_reduce",
         "cat": "collective", "start": t, "dur": 3, "step": 5,
         "attrs": {"op": "all_reduce", "group": "default", "group_size": 4, "seq": 9, "bytes": 4,
                   "error": "DistBackendError: NCCL communicator was aborted"}},
        {**common, "ts": t + 4, "kind": "log", "rank": 1, "node": "node0000", "level": "INFO", "logger": "train",
         "msg": "nccl initialised fine", "step": 0},
    ]
    lines += [orjson.dumps(e) + b"\n" for e in extra]
    ship(opensearch.url, lines, tmp / "spool", namespace="saved")
    refresh(opensearch.url)
    return {"events": [(orjson.loads(x), doc_id(x)) for x in lines], "trace": base["trace_id"]}


def is_error(ev: dict[str, Any]) -> bool:
    words = set(re.findall(r"\w+", (ev.get("msg") or "").lower()))
    return (ev.get("level") in ("ERROR", "CRITICAL", "FATAL") or bool((ev.get("attrs") or {}).get("error")) and
            ev.get("cat") == "collective") or ("nccl" in words and bool(words & {"timeout", "watchdog"})) or \
        ("nccl" in words and "timed out" in (ev.get("msg") or "").lower())


EXPECTED = {
    "jobtrace-search-timeline": lambda ev: True,
    "jobtrace-search-trace": lambda ev: ev["kind"] in ("span", "log"),
    "jobtrace-search-errors": is_error,
    "jobtrace-search-stalls": lambda ev: ev["kind"] == "heartbeat" and (ev.get("attrs") or {}).get(
        "progress_age_ms", 0) >= 60000,
    "jobtrace-vis-step-time": lambda ev: ev["kind"] == "span" and ev.get("cat") == "step",
    "jobtrace-vis-slowest-ranks": lambda ev: ev["kind"] == "span" and ev.get("cat") == "step",
    "jobtrace-vis-errors-by-node": is_error,
    "jobtrace-vis-loss": lambda ev: ev["kind"] == "metric",
    "jobtrace-dashboard": lambda ev: True,
}


def runnable_query(obj: dict[str, Any], values: dict[str, str], flavour: str = "kibana") -> dict[str, Any]:
    """What Kibana sends for this object once the user filled in and enabled its filter pills.

    A visualization has no filter of its own: on the dashboard it gets the dashboard's (the job).
    """
    source = search_source(obj)
    filters = list(source["filter"])
    if obj["type"] == "visualization":
        dashboard = next(o for o in objects(flavour) if o["type"] == "dashboard")
        filters += search_source(dashboard)["filter"]
    clauses: list[dict[str, Any]] = []
    if source["query"]["query"]:
        clauses.append({"query_string": {"query": source["query"]["query"], "analyze_wildcard": True}})
    for f in filters:
        key = f["meta"]["key"]
        assert f["meta"]["disabled"] and f["meta"]["params"]["query"] in (_build.JOB_PLACEHOLDER,
                                                                          _build.TRACE_PLACEHOLDER)
        clauses.append({"match_phrase": {key: values[key]}})
    return {"bool": {"filter": clauses}}


def vis_aggs(vis: dict[str, Any]) -> dict[str, Any]:
    metrics = {a["id"]: {a["type"]: {"field": a["params"]["field"]}} for a in vis["aggs"]
               if a["schema"] == "metric" and a["type"] != "count"}
    inner: dict[str, Any] = dict(metrics)
    for a in reversed([a for a in vis["aggs"] if a["schema"] != "metric"]):
        p = a["params"]
        if a["type"] == "terms":
            order_key = "_count" if p["orderBy"] == "_count" or p["orderBy"] not in metrics else p["orderBy"]
            body = {"terms": {"field": p["field"], "size": p["size"], "order": {order_key: p["order"]}}}
        else:
            assert "histogram" == a["type"]
            body = {"histogram": {"field": p["field"], "interval": p["interval"]}}
        body["aggs"] = {**metrics, **inner}  # Kibana adds the metrics at each level (they order the terms)
        inner = {a["id"]: body}
    return inner


@pytest.mark.parametrize("obj_id", sorted(EXPECTED))
def test_each_saved_query_runs_on_opensearch_and_returns_the_expected_documents(opensearch, dataset, obj_id):
    obj = next(o for o in objects("kibana") if o["id"] == obj_id)
    osd = next(o for o in objects("opensearch-dashboards") if o["id"] == obj_id)
    assert search_source(obj)["query"] == search_source(osd)["query"]
    query = runnable_query(obj, {"jobtrace.job": JOB, "trace.id": dataset["trace"]})
    body: dict[str, Any] = {"size": 10_000, "query": query, "_source": ["event.id"]}
    if "visState" in obj["attributes"]:
        body["aggs"] = vis_aggs(json.loads(obj["attributes"]["visState"]))
    sort = obj["attributes"].get("sort")
    if sort:
        body["sort"] = [{field: direction} for field, direction in sort]
    r = requests.post(f"{opensearch.url}/{_build.PATTERN}/_search", json=body, timeout=60)
    assert 200 == r.status_code, r.text[:800]
    got = sorted(h["_source"]["event"]["id"] for h in r.json()["hits"]["hits"])
    expected = sorted(i for ev, i in dataset["events"] if EXPECTED[obj_id](ev))
    assert expected and expected == got
    if "aggs" in body:
        aggs = r.json()["aggregations"]
        first = next(iter(aggs.values()))
        assert first["buckets"], aggs


def test_the_errors_search_finds_nccl_timeouts_but_not_every_nccl_line(dataset):
    matched = [ev["msg"] for ev, _ in dataset["events"] if is_error(ev) and "msg" in ev]
    assert any("watchdog" in m for m in matched) and not any("initialised" in m for m in matched)


# ---- import -------------------------------------------------------------------------------------------------
class FakeDashboards:
    """Kibana's (or OpenSearch Dashboards') import API as documented; records what it received."""

    def __init__(self, flavour: str, version: str, status: int = 200) -> None:
        self.flavour, self.version, self.status = flavour, version, status
        self.imports: list[dict[str, Any]] = []
        self.port = free_port()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def reply(self, status: int, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("osd-name" if fake.flavour == "opensearch-dashboards" else "kbn-name", "fake")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if fake.status != 200:
                    return self.reply(fake.status, {"statusCode": fake.status, "error": "Unauthorized"})
                self.reply(200, {"name": "fake", "version": {"number": fake.version}, "status": {"overall": {
                    "level": "available"}}})

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                xsrf = "osd-xsrf" if fake.flavour == "opensearch-dashboards" else "kbn-xsrf"
                if not self.headers.get(xsrf):
                    return self.reply(400, {"statusCode": 400, "message": f"Request must contain a {xsrf} header."})
                if not self.path.startswith("/api/saved_objects/_import") and "/api/saved_objects/_import" not in self.path:
                    return self.reply(404, {})
                assert self.headers["Content-Type"].startswith("multipart/form-data; boundary=")
                message = BytesParser(policy=email.policy.HTTP).parsebytes(
                    b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body)
                (part,) = [p for p in message.iter_parts() if p.get_param("name", header="content-disposition") == "file"]
                assert part.get_filename().endswith(".ndjson")
                objs = [json.loads(x) for x in part.get_payload(decode=True).decode().splitlines() if x.strip()]
                fake.imports.append({"path": self.path, "objects": objs})
                self.reply(200, {"success": True, "successCount": len(objs),
                                 "successResults": [{"type": o["type"], "id": o["id"]} for o in objs]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("flavour,version", [("kibana", "8.15.0"), ("opensearch-dashboards", "2.19.0")])
def test_setup_imports_the_right_flavour_with_overwrite_and_the_xsrf_header(opensearch, flavour, version):
    fake = FakeDashboards(flavour, version)
    try:
        report = run_setup(HttpConfig(opensearch.url), kibana=HttpConfig(fake.url), kibana_space="ml" if
                           flavour == "kibana" else None)
        (imp,) = fake.imports
        assert objects(flavour) == imp["objects"]
        assert "overwrite=true" in imp["path"]
        assert imp["path"].startswith("/s/ml/") == (flavour == "kibana")
        assert f"10 objects imported into {'Kibana' if flavour == 'kibana' else 'OpenSearch Dashboards'} {version}" \
            == report.saved_objects
    finally:
        fake.close()


def test_an_old_kibana_is_refused_with_a_clear_message():
    fake = FakeDashboards("kibana", "8.7.1")
    try:
        with pytest.raises(ConfigError, match="Kibana 8.7.1 .* too old.*8.9"):
            import_saved_objects(HttpConfig(fake.url))
        assert [] == fake.imports
    finally:
        fake.close()


def test_wrong_kibana_credentials_are_named_without_the_secret():
    fake = FakeDashboards("kibana", "8.15.0", status=401)
    try:
        with pytest.raises(ConfigError) as err:
            import_saved_objects(HttpConfig(fake.url, username="elastic", password="hunter2-secret"))
        assert "authentication failed" in str(err.value) and "hunter2-secret" not in str(err.value)
    finally:
        fake.close()
