"""Kibana / OpenSearch Dashboards saved objects: format, references, fields, and their queries run for real.

No Kibana or OpenSearch Dashboards runs here, so the import itself is checked against the
documented API (``POST /api/saved_objects/_import``: multipart ``file`` field, ``kbn-xsrf``
or ``osd-xsrf`` header, ``{success, successCount, errors}`` answer) with a small fake,
while every query the objects carry, every chart's aggregations (Lens layers as Kibana's
esaggs nests them, legacy ``visState``) and every job/rank control is run on the real
OpenSearch node, with the dashboard's controls set as a user would; a chart's table is
compared with the one computed here from the job's events. The published formats
themselves are checked in ``test_saved_object_shapes.py``.
"""

from __future__ import annotations

import email.policy
import json
import math
import re
import statistics
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
from tests.elasticsearch.test_saved_object_shapes import mapped_fields
from tests.servers.base import free_port

FLAVOURS = ("kibana", "opensearch-dashboards")


def objects(flavour: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in kibana.saved_objects(flavour).decode().splitlines()]


def search_source(obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(obj["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])


def lens_layers(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["attributes"]["state"]["datasourceStates"]["formBased"]["layers"])


def saved_query(obj: dict[str, Any]) -> str:
    """The Lucene query an object carries: in its search source, or in its Lens state."""
    if obj["type"] == "lens":
        query = obj["attributes"]["state"]["query"]
    else:
        query = search_source(obj)["query"]
    assert "lucene" == query["language"]
    return str(query["query"])


# ---- format --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_files_are_valid_ndjson_of_saved_objects(flavour):
    raw = kibana.saved_objects(flavour)
    assert raw.endswith(b"\n") and b"\n\n" not in raw
    objs = objects(flavour)
    charts = ["lens"] * 4 if flavour == "kibana" else ["visualization"] * 5  # OSD: + the input controls
    assert ["index-pattern", "search", "search", "search", "search", *charts, "dashboard"] == [o["type"] for o in objs]
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
        attrs = obj["attributes"]
        if "kibanaSavedObjectMeta" in attrs:
            source = search_source(obj)
            if "indexRefName" in source:
                used.add(source["indexRefName"])
            used |= {f["meta"]["indexRefName"] for f in source["filter"]}
        if obj["type"] == "lens":
            used |= {f"indexpattern-datasource-layer-{layer}" for layer in lens_layers(obj)}
        if "visState" in attrs:
            used |= {c["indexPatternRefName"] for c in json.loads(attrs["visState"])["params"].get("controls", [])}
        if "controlGroupInput" in attrs:
            used |= {f"controlGroup_{cid}:optionsListDataView"
                     for cid in json.loads(attrs["controlGroupInput"]["panelsJSON"])}
        if obj["type"] == "dashboard":
            for panel in json.loads(attrs["panelsJSON"]):
                used.add(f"{panel['panelIndex']}:{panel['panelRefName']}" if flavour == "kibana"
                         else panel["panelRefName"])
                assert panel["gridData"]["i"] == panel["panelIndex"]
                assert 0 <= panel["gridData"]["x"] and panel["gridData"]["x"] + panel["gridData"]["w"] <= 48
        assert used == names, obj["id"]


def fields_used(obj: dict[str, Any]) -> set[str]:
    attrs = obj["attributes"]
    used: set[str] = set()
    used |= set(attrs.get("columns", []))
    used |= {s[0] for s in attrs.get("sort", [])}
    if obj["type"] == "index-pattern":
        used.add(attrs["timeFieldName"])
        used |= set(json.loads(attrs["fieldFormatMap"]))
    if "visState" in attrs:
        vis = json.loads(attrs["visState"])
        used |= {a["params"]["field"] for a in vis["aggs"] if "field" in a["params"]}
        used |= {c["fieldName"] for c in vis["params"].get("controls", [])}
    if obj["type"] == "lens":
        used |= {c["sourceField"] for layer in lens_layers(obj).values() for c in layer["columns"].values()
                 if c["sourceField"] != "___records___"}
        used |= set(re.findall(r"([A-Za-z_@][\w.@]*):", saved_query(obj)))
    if "controlGroupInput" in attrs:
        used |= {p["explicitInput"]["fieldName"] for p in json.loads(attrs["controlGroupInput"]["panelsJSON"]).values()}
    if "kibanaSavedObjectMeta" in attrs:
        source = search_source(obj)
        used |= set(re.findall(r"([A-Za-z_@][\w.@]*):", source["query"]["query"]))
        for f in source["filter"]:
            used.add(f["meta"]["key"])
            used |= set(next(iter(f["query"].values())))
    return used


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_field_used_exists_in_the_index_template_mapping(flavour):
    known = mapped_fields()
    for obj in objects(flavour):
        missing = fields_used(obj) - set(known)
        assert not missing, (obj["id"], missing)
    assert "keyword" == known["jobtrace.job"] and "date_nanos" == known["@timestamp"]


# ---- the queries, for real -------------------------------------------------------------------------------
JOB = "saved-objects-job"
OTHER_JOB = "saved-objects-other-job"


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
    _, other = synth_lines(tmp / "other", job_id=OTHER_JOB, ranks=3, steps=2, ranks_per_node=3)
    lines += other  # another job in the same data stream: the job control must keep it out
    ship(opensearch.url, lines, tmp / "spool", namespace="saved")
    refresh(opensearch.url)
    return {"events": [(orjson.loads(x), doc_id(x)) for x in lines], "trace": base["trace_id"]}


def is_error(ev: dict[str, Any]) -> bool:
    words = set(re.findall(r"\w+", (ev.get("msg") or "").lower()))
    return (ev.get("level") in ("ERROR", "CRITICAL", "FATAL") or bool((ev.get("attrs") or {}).get("error")) and
            ev.get("cat") == "collective") or ("nccl" in words and bool(words & {"timeout", "watchdog"})) or \
        ("nccl" in words and "timed out" in (ev.get("msg") or "").lower())


def is_step(ev: dict[str, Any]) -> bool:
    return bool(ev["kind"] == "span" and ev.get("cat") == "step")


def is_metric(ev: dict[str, Any]) -> bool:
    return bool(ev["kind"] == "metric")


EXPECTED = {  # which of the job's events each object selects
    "jobtrace-search-timeline": lambda ev: True,
    "jobtrace-search-trace": lambda ev: ev["kind"] in ("span", "log"),
    "jobtrace-search-errors": is_error,
    "jobtrace-search-stalls": lambda ev: ev["kind"] == "heartbeat" and (ev.get("attrs") or {}).get(
        "progress_age_ms", 0) >= 60000,
    "jobtrace-lens-step-time": is_step, "jobtrace-vis-step-time": is_step,
    "jobtrace-lens-slowest-ranks": is_step, "jobtrace-vis-slowest-ranks": is_step,
    "jobtrace-lens-errors-by-node": is_error, "jobtrace-vis-errors-by-node": is_error,
    "jobtrace-lens-loss": is_metric, "jobtrace-vis-loss": is_metric,
    "jobtrace-dashboard": lambda ev: True,
}
# What a user picks: the job alone, or the job and two ranks (rank is chained to the job)
SELECTIONS = {"job": {"jobtrace.job": [JOB]}, "job-and-ranks": {"jobtrace.job": [JOB], "jobtrace.rank": [2, 3]}}


def dashboard(flavour: str) -> dict[str, Any]:
    return next(o for o in objects(flavour) if o["type"] == "dashboard")


def control_fields(flavour: str) -> list[str]:
    """The fields of the dashboard's controls, in their order."""
    attrs = dashboard(flavour)["attributes"]
    if flavour == "kibana":
        panels = json.loads(attrs["controlGroupInput"]["panelsJSON"]).values()
        return [p["explicitInput"]["fieldName"] for p in sorted(panels, key=lambda p: p["order"])]
    vis = [json.loads(o["attributes"]["visState"]) for o in objects(flavour) if o["type"] == "visualization"]
    (controls,) = [v for v in vis if v["type"] == "input_control_vis"]
    return [c["fieldName"] for c in controls["params"]["controls"]]


def on_dashboard(flavour: str) -> set[str]:
    dash = dashboard(flavour)
    refs = {r["name"]: r["id"] for r in dash["references"]}
    names = [f"{p['panelIndex']}:{p['panelRefName']}" if flavour == "kibana" else p["panelRefName"]
             for p in json.loads(dash["attributes"]["panelsJSON"])]
    return {refs[n] for n in names} | {dash["id"]}


def control_filters(flavour: str, selection: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The filters Kibana (or OSD) adds for the controls' choices: a ``phrase`` filter, or ``phrases`` for several."""
    out: list[dict[str, Any]] = []
    for field in control_fields(flavour):
        values = selection.get(field) or []
        if len(values) == 1:
            out.append({"match_phrase": {field: values[0]}})
        elif values:
            out.append({"bool": {"should": [{"match_phrase": {field: v}} for v in values], "minimum_should_match": 1}})
    return out


def runnable_query(flavour: str, obj: dict[str, Any], selection: dict[str, list[Any]], trace: str) -> dict[str, Any]:
    """What the UI sends for ``obj``: on the dashboard with the controls set, or (the trace search) in Discover
    with ``AND trace.id:<id>`` typed into its query bar, as its description says."""
    query = "" if obj["type"] == "dashboard" else saved_query(obj)
    clauses: list[dict[str, Any]] = []
    if obj["id"] in on_dashboard(flavour):
        clauses += control_filters(flavour, selection)
    else:
        assert "trace.id" in obj["attributes"]["description"]
        query = f"({query}) AND trace.id:{trace}"
    if query:
        clauses.append({"query_string": {"query": query, "analyze_wildcard": True}})
    return {"bool": {"filter": clauses}}


def vis_aggs(vis: dict[str, Any]) -> dict[str, Any]:
    """A legacy (``visState``) visualisation's aggregations as OpenSearch Dashboards nests them."""
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


LENS_METRICS = {"average": "avg", "max": "max", "min": "min", "sum": "sum"}


def lens_aggs(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """A Lens layer as the aggregations Kibana's esaggs sends: the bucket columns nested in ``columnOrder``,
    the metrics under each level (a terms column is ordered by one); histograms of interval 1 (a step)."""
    (layer,) = lens_layers(obj).values()
    cols = layer["columns"]
    metrics = {cid: {LENS_METRICS[c["operationType"]]: {"field": c["sourceField"]}} for cid, c in cols.items()
               if not c["isBucketed"] and c["operationType"] != "count"}
    buckets = [cid for cid in layer["columnOrder"] if cols[cid]["isBucketed"]]
    inner: dict[str, Any] = dict(metrics)
    for cid in reversed(buckets):
        c, p = cols[cid], cols[cid]["params"]
        if c["operationType"] == "terms":
            order = p["orderBy"]
            key = "_key" if order["type"] == "alphabetical" else (
                "_count" if cols[order["columnId"]]["operationType"] == "count" else order["columnId"])
            body: dict[str, Any] = {"terms": {"field": c["sourceField"], "size": p["size"],
                                              "order": {key: p["orderDirection"]}}}
        else:
            assert ("range", "histogram") == (c["operationType"], p["type"])
            body = {"histogram": {"field": c["sourceField"], "interval": 1, "min_doc_count": 1}}
        body["aggs"] = {**metrics, **inner}
        inner = {cid: body}
    return inner, buckets, cols


def tabify(aggs: dict[str, Any], buckets: list[str], cols: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The response as Lens's table: one row per bucket path, keyed by the bucket keys."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def walk(level: dict[str, Any], depth: int, path: tuple[Any, ...]) -> None:
        if depth == len(buckets):
            rows[path] = {cid: (level["doc_count"] if c["operationType"] == "count" else level[cid]["value"])
                          for cid, c in cols.items() if not c["isBucketed"]}
            return
        for b in level[buckets[depth]]["buckets"]:
            walk(b, depth + 1, (*path, b["key"]))

    walk(aggs, 0, ())
    return rows


EVENT_FIELDS = {  # the ECS field a chart reads -> that value in a jobtrace event line
    "jobtrace.rank": lambda ev: ev.get("rank"), "host.name": lambda ev: ev.get("node"),
    "jobtrace.step": lambda ev: ev.get("step"), "event.duration": lambda ev: ev.get("dur"),
    "jobtrace.metrics.loss": lambda ev: (ev.get("metrics") or {}).get("loss"),
    "jobtrace.metrics.grad_norm": lambda ev: (ev.get("metrics") or {}).get("grad_norm"),
}


def expected_table(events: list[dict[str, Any]], buckets: list[str], cols: dict[str, Any]) -> dict[Any, Any]:
    """The same table computed here from the events themselves."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for ev in events:
        path = tuple(EVENT_FIELDS[cols[b]["sourceField"]](ev) for b in buckets)
        if None not in path:
            groups.setdefault(path, []).append(ev)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path, evs in groups.items():
        row: dict[str, Any] = {}
        for cid, c in cols.items():
            if c["isBucketed"]:
                continue
            if c["operationType"] == "count":
                row[cid] = len(evs)
                continue
            values = [v for v in (EVENT_FIELDS[c["sourceField"]](e) for e in evs)
                      if isinstance(v, (int, float)) and math.isfinite(v)]
            row[cid] = None if not values else {"average": statistics.fmean, "max": max, "min": min,
                                                "sum": sum}[c["operationType"]](values)
        out[path] = row
    return out


# (flavour, object, selection); an object opened on its own (the trace search) has no rank control
CASES = [(f, o["id"], sel) for f in FLAVOURS for o in objects(f) if o["id"] in EXPECTED for sel in sorted(SELECTIONS)
         if sel == "job" or o["id"] in on_dashboard(f)]


@pytest.mark.parametrize("flavour,obj_id,selection", CASES)
def test_each_saved_query_runs_on_opensearch_and_returns_the_expected_documents(opensearch, dataset, flavour, obj_id,
                                                                                selection):
    obj = next(o for o in objects(flavour) if o["id"] == obj_id)
    chosen = SELECTIONS[selection]
    body: dict[str, Any] = {"size": 10_000, "query": runnable_query(flavour, obj, chosen, dataset["trace"]),
                            "_source": ["event.id"]}
    if "visState" in obj["attributes"]:
        body["aggs"] = vis_aggs(json.loads(obj["attributes"]["visState"]))
    if obj["type"] == "lens":
        body["aggs"], buckets, cols = lens_aggs(obj)
    sort = obj["attributes"].get("sort")
    if sort:
        body["sort"] = [{field: direction} for field, direction in sort]
    r = requests.post(f"{opensearch.url}/{_build.PATTERN}/_search", json=body, timeout=60)
    assert 200 == r.status_code, r.text[:800]
    got = sorted(h["_source"]["event"]["id"] for h in r.json()["hits"]["hits"])
    ranks = set(chosen.get("jobtrace.rank") or []) or None
    mine = [(ev, i) for ev, i in dataset["events"] if ev["job"] == JOB and (ranks is None or ev["rank"] in ranks)]
    expected = sorted(i for ev, i in mine if EXPECTED[obj_id](ev))
    assert expected and expected == got
    if "visState" in obj["attributes"]:
        first = next(iter(r.json()["aggregations"].values()))
        assert first["buckets"], r.json()["aggregations"]
    if obj["type"] == "lens":  # what the chart draws is what the events say
        table = tabify(r.json()["aggregations"], buckets, cols)
        want = expected_table([ev for ev, _ in mine if EXPECTED[obj_id](ev)], buckets, cols)
        assert set(want) == set(table)
        for path, row in want.items():
            assert set(row) == set(table[path]), path
            for col, value in row.items():  # None: no finite value to average (a NaN step)
                got_value = table[path][col]
                assert (value is None and got_value is None) or value == pytest.approx(got_value, rel=1e-9), (
                    path, col, value, got_value)


def test_the_slowest_ranks_table_lists_every_rank_slowest_first(opensearch, dataset):
    obj = next(o for o in objects("kibana") if o["id"] == "jobtrace-lens-slowest-ranks")
    aggs, buckets, _ = lens_aggs(obj)
    query = runnable_query("kibana", obj, SELECTIONS["job"], dataset["trace"])
    r = requests.post(f"{opensearch.url}/{_build.PATTERN}/_search", json={"size": 0, "query": query, "aggs": aggs},
                      timeout=60)
    rows = r.json()["aggregations"][buckets[0]]["buckets"]
    durations: dict[int, list[int]] = {}
    for ev, _ in dataset["events"]:
        if ev["job"] == JOB and is_step(ev):
            durations.setdefault(ev["rank"], []).append(ev["dur"])
    assert {row["key"] for row in rows} == set(durations)
    means = [row["mean"]["value"] for row in rows]
    assert means == sorted(means, reverse=True)
    assert means[0] == pytest.approx(max(statistics.fmean(d) for d in durations.values()), rel=1e-9)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_controls_offer_the_job_and_then_only_its_ranks(opensearch, dataset, flavour):
    """An options list (or input control) fills itself with a terms aggregation on its field, filtered by the
    controls before it when chained."""
    job_field, rank_field = control_fields(flavour)

    def options(field: str, filters: list[dict[str, Any]]) -> set[Any]:
        body = {"size": 0, "query": {"bool": {"filter": filters}}, "aggs": {"o": {"terms": {"field": field,
                                                                                            "size": 1000}}}}
        r = requests.post(f"{opensearch.url}/{_build.PATTERN}/_search", json=body, timeout=60)
        assert 200 == r.status_code, r.text[:800]
        return {b["key"] for b in r.json()["aggregations"]["o"]["buckets"]}

    jobs = options(job_field, [{"term": {"data_stream.namespace": "saved"}}])  # this test's data stream only
    assert {JOB, OTHER_JOB} <= jobs
    ranks = options(rank_field, control_filters(flavour, {job_field: [JOB]}))
    assert ranks == {ev["rank"] for ev, _ in dataset["events"] if ev["job"] == JOB}
    assert options(rank_field, control_filters(flavour, {job_field: [OTHER_JOB]})) == {0, 1, 2}


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
        assert f"{len(objects(flavour))} objects imported into {'Kibana' if flavour == 'kibana' else 'OpenSearch Dashboards'} {version}" \
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
