"""The one definition of jobtrace's saved objects, written out as NDJSON for each dashboards flavour.

Run ``python -m kibana._build`` after changing this file; a test fails while the packaged
files differ from what it generates.

Objects (fixed ids, so a second import overwrites instead of duplicating):

* data view ``jobtrace-data-view`` over ``*-jobtrace-*`` (the logs, metrics and traces
  data streams), time field ``@timestamp``, ``event.duration`` shown in milliseconds;
* saved searches: the job timeline; one trace; errors and NCCL timeouts by rank;
  stalled-rank heartbeats;
* visualizations (aggregation-based, readable by both Kibana 8/9 and OpenSearch
  Dashboards): step time per rank, slowest ranks, errors by node, loss and grad norm
  over steps;
* the dashboard ``jobtrace-dashboard`` with those panels and the timeline.

Choosing the job (or the trace): every search and the dashboard carry a *disabled*
filter pill ``jobtrace.job: <job id>`` (``trace.id`` for the trace search). Edit its
value and enable it, or add ``jobtrace.job:"<id>"`` to the query bar. Queries are
Lucene syntax, which both Kibana and OpenSearch Dashboards run as a ``query_string``.

Format differences handled here: Kibana 8.9+ objects carry ``coreMigrationVersion`` and
``typeMigrationVersion`` and name dashboard references ``<panelIndex>:panel_<panelIndex>``;
OpenSearch Dashboards (a fork of Kibana 7.10) gets ``migrationVersion`` per type at the
last migration it knows and ``panel_<n>`` references.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATA_VIEW_ID = "jobtrace-data-view"
PATTERN = "*-jobtrace-*"
JOB_PLACEHOLDER = "paste-a-job-id"
TRACE_PLACEHOLDER = "paste-a-trace-id"

ERRORS_QUERY = ('log.level:(ERROR OR CRITICAL OR FATAL) OR event.outcome:failure OR '
                '(message:nccl AND message:(timeout OR "timed out" OR watchdog))')
STALL_QUERY = "jobtrace.kind:heartbeat AND jobtrace.heartbeat.progress_age_ms:>=60000"
STEP_QUERY = "jobtrace.span.category:step"
METRIC_QUERY = "jobtrace.kind:metric"

KIBANA_TYPE_VERSIONS = {"index-pattern": "8.0.0", "search": "8.0.0", "visualization": "8.5.0", "dashboard": "8.9.0"}
OSD_TYPE_VERSIONS = {"index-pattern": "7.6.0", "search": "7.9.3", "visualization": "7.10.0", "dashboard": "7.9.3"}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _phrase_filter(index_ref: str, key: str, value: str, *, disabled: bool, alias: str | None = None) -> dict[str, Any]:
    return {
        "meta": {"alias": alias, "negate": False, "disabled": disabled, "type": "phrase", "key": key,
                 "params": {"query": value}, "indexRefName": index_ref},
        "query": {"match_phrase": {key: value}},
        "$state": {"store": "appState"},
    }


def _search_source(query: str, filters: list[dict[str, Any]], *, with_index: bool = True) -> str:
    source: dict[str, Any] = {"query": {"query": query, "language": "lucene"}, "filter": filters}
    if with_index:
        source["indexRefName"] = "kibanaSavedObjectMeta.searchSourceJSON.index"
    return _dumps(source)


def _filter_refs(count: int) -> list[dict[str, str]]:
    return [{"name": f"kibanaSavedObjectMeta.searchSourceJSON.filter[{i}].meta.index", "type": "index-pattern",
             "id": DATA_VIEW_ID} for i in range(count)]


_INDEX_REF = {"name": "kibanaSavedObjectMeta.searchSourceJSON.index", "type": "index-pattern", "id": DATA_VIEW_ID}


def _job_filter(i: int = 0) -> dict[str, Any]:
    return _phrase_filter(f"kibanaSavedObjectMeta.searchSourceJSON.filter[{i}].meta.index", "jobtrace.job",
                          JOB_PLACEHOLDER, disabled=True, alias="job: edit me, then enable")


# ---- objects, flavour-independent attributes --------------------------------------------------------------
def data_view() -> dict[str, Any]:
    formats = {"event.duration": {"id": "duration", "params": {"inputFormat": "nanoseconds",
                                                                "outputFormat": "asMilliseconds",
                                                                "outputPrecision": 3}}}
    return {"id": DATA_VIEW_ID, "type": "index-pattern", "references": [], "attributes": {
        "title": PATTERN, "name": "jobtrace", "timeFieldName": "@timestamp", "fields": "[]",
        "fieldFormatMap": _dumps(formats), "fieldAttrs": "{}", "runtimeFieldMap": "{}", "sourceFilters": "[]",
        "typeMeta": "{}"}}


SEARCHES: list[dict[str, Any]] = [
    {"id": "jobtrace-search-timeline", "title": "jobtrace: job timeline",
     "description": "Every event of a job in time order: logs, spans, metrics, heartbeats. Set the job filter.",
     "columns": ["jobtrace.rank", "host.name", "jobtrace.step", "jobtrace.kind", "jobtrace.span.name", "span.id",
                 "event.duration", "log.level", "message"],
     "sort": [["@timestamp", "asc"]], "query": "", "filters": "job"},
    {"id": "jobtrace-search-trace", "title": "jobtrace: one trace",
     "description": "Spans and logs of one trace (the job's trace.id); set the trace.id filter.",
     "columns": ["jobtrace.rank", "jobtrace.span.category", "jobtrace.span.name", "span.id", "jobtrace.parent_id",
                 "event.start", "event.duration", "message"],
     "sort": [["@timestamp", "asc"]], "query": "jobtrace.kind:(span OR log)", "filters": "trace"},
    {"id": "jobtrace-search-errors", "title": "jobtrace: errors and NCCL timeouts by rank",
     "description": "ERROR/CRITICAL logs, failed collectives and NCCL watchdog timeouts, by rank.",
     "columns": ["jobtrace.rank", "host.name", "jobtrace.step", "log.level", "log.logger", "message",
                 "jobtrace.collective.op", "jobtrace.collective.error"],
     "sort": [["jobtrace.rank", "asc"], ["@timestamp", "asc"]], "query": ERRORS_QUERY, "filters": "job"},
    {"id": "jobtrace-search-stalls", "title": "jobtrace: stalled-rank heartbeats",
     "description": "Heartbeats of ranks without progress for 60 s or more (edit the threshold in the query): "
                    "what each rank was doing.",
     "columns": ["jobtrace.rank", "host.name", "jobtrace.step", "jobtrace.heartbeat.progress_age_ms",
                 "jobtrace.heartbeat.in_span", "jobtrace.heartbeat.in_op", "jobtrace.heartbeat.in_seq"],
     "sort": [["@timestamp", "desc"]], "query": STALL_QUERY, "filters": "job"},
]


def _axes(title: str, *, right: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    category = [{"id": "CategoryAxis-1", "type": "category", "position": "bottom", "show": True, "style": {},
                 "scale": {"type": "linear"}, "labels": {"show": True, "filter": True, "truncate": 100}, "title": {}}]
    values = [{"id": "ValueAxis-1", "name": "LeftAxis-1", "type": "value", "position": "left", "show": True,
               "style": {}, "scale": {"type": "linear", "mode": "normal"},
               "labels": {"show": True, "rotate": 0, "filter": False, "truncate": 100}, "title": {"text": title}}]
    if right:
        values.append({"id": "ValueAxis-2", "name": "RightAxis-1", "type": "value", "position": "right",
                       "show": True, "style": {}, "scale": {"type": "linear", "mode": "normal"},
                       "labels": {"show": True, "rotate": 0, "filter": False, "truncate": 100},
                       "title": {"text": right}})
    return category, values


def _xy_params(kind: str, series: list[tuple[str, str, str]], title: str, right: str | None = None) -> dict[str, Any]:
    category, values = _axes(title, right=right)
    return {
        "type": kind, "grid": {"categoryLines": False}, "categoryAxes": category, "valueAxes": values,
        "seriesParams": [{"show": True, "type": "line" if kind == "line" else "histogram",
                          "mode": "normal" if kind == "line" else "stacked", "data": {"label": label, "id": agg_id},
                          "valueAxis": axis, "drawLinesBetweenPoints": True, "lineWidth": 2, "showCircles": True,
                          "interpolate": "linear"} for agg_id, label, axis in series],
        "addTooltip": True, "addLegend": True, "legendPosition": "right", "times": [], "addTimeMarker": False,
        "thresholdLine": {"show": False, "value": 10, "width": 1, "style": "full", "color": "#E7664C"},
        "labels": {"show": False},
    }


def _agg(id_: str, type_: str, schema: str, **params: Any) -> dict[str, Any]:
    return {"id": id_, "enabled": True, "type": type_, "schema": schema, "params": params}


VISUALIZATIONS: list[dict[str, Any]] = [
    {"id": "jobtrace-vis-step-time", "title": "jobtrace: step time per rank", "query": STEP_QUERY,
     "description": "Mean step span duration per step, one line per rank (the 20 slowest).",
     "vis": {"type": "line", "aggs": [
         _agg("1", "avg", "metric", field="event.duration", customLabel="step time"),
         _agg("2", "histogram", "segment", field="jobtrace.step", interval=1, min_doc_count=False,
              extended_bounds={}, customLabel="step"),
         _agg("3", "terms", "group", field="jobtrace.rank", size=20, order="desc", orderBy="1",
              otherBucket=False, missingBucket=False, customLabel="rank")],
         "params": _xy_params("line", [("1", "step time", "ValueAxis-1")], "step time (ns)")}},
    {"id": "jobtrace-vis-slowest-ranks", "title": "jobtrace: slowest ranks", "query": STEP_QUERY,
     "description": "Ranks by mean step time, slowest first, with their node.",
     "vis": {"type": "table", "aggs": [
         _agg("1", "avg", "metric", field="event.duration", customLabel="mean step time"),
         _agg("2", "max", "metric", field="event.duration", customLabel="max step time"),
         _agg("3", "count", "metric", customLabel="steps"),
         _agg("4", "terms", "bucket", field="jobtrace.rank", size=10, order="desc", orderBy="1",
              otherBucket=False, missingBucket=False, customLabel="rank"),
         _agg("5", "terms", "bucket", field="host.name", size=1, order="desc", orderBy="_count",
              otherBucket=False, missingBucket=False, customLabel="node")],
         "params": {"perPage": 10, "showPartialRows": False, "showMetricsAtAllLevels": False, "showTotal": False,
                    "totalFunc": "sum", "percentageCol": ""}}},
    {"id": "jobtrace-vis-errors-by-node", "title": "jobtrace: errors by node", "query": ERRORS_QUERY,
     "description": "Errors, failed collectives and NCCL timeouts per node.",
     "vis": {"type": "histogram", "aggs": [
         _agg("1", "count", "metric", customLabel="errors"),
         _agg("2", "terms", "segment", field="host.name", size=50, order="desc", orderBy="1",
              otherBucket=True, otherBucketLabel="other nodes", missingBucket=False, customLabel="node")],
         "params": _xy_params("histogram", [("1", "errors", "ValueAxis-1")], "errors")}},
    {"id": "jobtrace-vis-loss", "title": "jobtrace: loss and grad norm over steps", "query": METRIC_QUERY,
     "description": "Mean loss (left axis) and gradient norm (right axis) over ranks, per step. NaN/Inf values "
                    "are in jobtrace.nonfinite.*, not in these averages.",
     "vis": {"type": "line", "aggs": [
         _agg("1", "avg", "metric", field="jobtrace.metrics.loss", customLabel="loss"),
         _agg("2", "avg", "metric", field="jobtrace.metrics.grad_norm", customLabel="grad norm"),
         _agg("3", "histogram", "segment", field="jobtrace.step", interval=1, min_doc_count=False,
              extended_bounds={}, customLabel="step")],
         "params": _xy_params("line", [("1", "loss", "ValueAxis-1"), ("2", "grad norm", "ValueAxis-2")], "loss",
                              right="grad norm")}},
]

PANELS = [  # (object id, type, x, y, w, h) on Kibana's 48-column grid
    ("jobtrace-vis-step-time", "visualization", 0, 0, 32, 15),
    ("jobtrace-vis-slowest-ranks", "visualization", 32, 0, 16, 15),
    ("jobtrace-vis-loss", "visualization", 0, 15, 32, 15),
    ("jobtrace-vis-errors-by-node", "visualization", 32, 15, 16, 15),
    ("jobtrace-search-timeline", "search", 0, 30, 48, 20),
    ("jobtrace-search-stalls", "search", 0, 50, 24, 15),
    ("jobtrace-search-errors", "search", 24, 50, 24, 15),
]


def _search_object(spec: dict[str, Any], flavour: str) -> dict[str, Any]:
    if spec["filters"] == "trace":
        filters = [_phrase_filter("kibanaSavedObjectMeta.searchSourceJSON.filter[0].meta.index", "trace.id",
                                  TRACE_PLACEHOLDER, disabled=True, alias="trace.id: edit me, then enable")]
    else:
        filters = [_job_filter()]
    attrs: dict[str, Any] = {"title": spec["title"], "description": spec["description"], "columns": spec["columns"],
                             "sort": spec["sort"],
                             "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source(spec["query"], filters)}}
    if flavour == "kibana":
        attrs.update(grid={}, hideChart=False, isTextBasedQuery=False, timeRestore=False)
    else:
        attrs.update(hits=0, version=1)
    return {"id": spec["id"], "type": "search", "attributes": attrs,
            "references": [_INDEX_REF, *_filter_refs(len(filters))]}


def _vis_object(spec: dict[str, Any]) -> dict[str, Any]:
    vis = {"title": spec["title"], **spec["vis"]}
    return {"id": spec["id"], "type": "visualization", "references": [_INDEX_REF], "attributes": {
        "title": spec["title"], "description": spec["description"], "visState": _dumps(vis), "uiStateJSON": "{}",
        "version": 1, "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source(spec["query"], [])}}}


def _dashboard(flavour: str) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    refs: list[dict[str, str]] = []
    for n, (obj_id, type_, x, y, w, h) in enumerate(PANELS):
        index = f"p{n + 1}" if flavour == "kibana" else str(n + 1)
        ref_name = f"panel_{index}" if flavour == "kibana" else f"panel_{n}"
        panel: dict[str, Any] = {"gridData": {"x": x, "y": y, "w": w, "h": h, "i": index}, "panelIndex": index,
                                 "panelRefName": ref_name}
        if flavour == "kibana":
            panel.update(type=type_, version=KIBANA_TYPE_VERSIONS["dashboard"],
                         embeddableConfig={"enhancements": {}})
            refs.append({"name": f"{index}:{ref_name}", "type": type_, "id": obj_id})
        else:
            panel.update(version="7.10.0", embeddableConfig={})
            refs.append({"name": ref_name, "type": type_, "id": obj_id})
        panels.append(panel)
    filters = [_job_filter()]
    return {"id": "jobtrace-dashboard", "type": "dashboard", "references": refs + _filter_refs(len(filters)),
            "attributes": {
                "title": "jobtrace: training job", "version": 1, "timeRestore": False,
                "description": "One distributed training job: per-rank step time, slowest ranks, loss and grad norm, "
                               "errors by node, the timeline and stalled ranks. Set the job filter (top left).",
                "panelsJSON": _dumps(panels),
                "optionsJSON": _dumps({"useMargins": True, "syncColors": False, "hidePanelTitles": False}),
                "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source("", filters, with_index=False)}}}


def build(flavour: str) -> list[dict[str, Any]]:
    """The saved objects for ``kibana`` or ``opensearch-dashboards``, in import order."""
    if flavour not in ("kibana", "opensearch-dashboards"):
        raise ValueError(flavour)
    objects = [data_view(), *(_search_object(s, flavour) for s in SEARCHES), *(_vis_object(v) for v in VISUALIZATIONS),
               _dashboard(flavour)]
    out = []
    for obj in objects:
        if flavour == "kibana":
            obj.update(coreMigrationVersion="8.8.0", typeMigrationVersion=KIBANA_TYPE_VERSIONS[obj["type"]],
                       managed=False)
        else:
            obj["migrationVersion"] = {obj["type"]: OSD_TYPE_VERSIONS[obj["type"]]}
            if obj["type"] == "index-pattern":  # attributes Kibana 7.10 did not have yet
                for key in ("name", "fieldAttrs", "runtimeFieldMap", "typeMeta"):
                    obj["attributes"].pop(key, None)
        out.append(obj)
    return out


def render(flavour: str) -> str:
    return "".join(json.dumps(obj, sort_keys=True, ensure_ascii=False) + "\n" for obj in build(flavour))


def main(argv: list[str] | None = None) -> int:
    from ._assets import SAVED_OBJECT_FILES

    target = Path(__file__).resolve().parent / "saved_objects"
    target.mkdir(exist_ok=True)
    for flavour, name in SAVED_OBJECT_FILES.items():
        (target / name).write_text(render(flavour), encoding="utf-8")
        print(f"wrote {target / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
