"""The one definition of jobtrace's saved objects, written out as NDJSON for each dashboards flavour.

Run ``python -m kibana._build`` after changing this file (or ``_lens.py``, ``_legacy_vis.py``);
a test fails while the packaged files differ from what it generates.

Objects (fixed ids, so a second import overwrites instead of duplicating):

* data view ``jobtrace-data-view`` over ``*-jobtrace-*`` (the logs, metrics and traces
  data streams), time field ``@timestamp``, ``event.duration`` shown in milliseconds;
* saved searches: the job timeline; one trace; errors and NCCL timeouts by rank;
  stalled-rank heartbeats;
* four charts: step time per rank, slowest ranks, errors by node, loss and grad norm over
  steps. Kibana gets them as Lens visualisations (:mod:`._lens`); OpenSearch Dashboards,
  which has no Lens, as aggregation-based visualizations (:mod:`._legacy_vis`);
* the dashboard ``jobtrace-dashboard`` with those charts, the timeline, stalled ranks and
  errors, and a job and a rank control on top: Kibana's options-list controls
  (``controlGroupInput``), or an input-controls panel in OpenSearch Dashboards. Rank is
  chained to job, so it offers that job's ranks.

Choosing the job: on the dashboard, with its job control. A saved search opened on its own
(Discover) takes the job in its query bar: ``jobtrace.job:"<id>"``, and the trace search
``trace.id:<id>``; ``trace-job``'s Discover links fill those in, escaped (``queries``). No
object carries a job id, a placeholder or a disabled filter. Queries are Lucene syntax, which
both Kibana and OpenSearch Dashboards run as a ``query_string``.

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

from ._legacy_vis import CONTROLS_VIS_ID, VISUALIZATIONS, controls_visualization, vis_state
from ._lens import CONTROLS, LENS, LENS_TYPE_VERSION, control_group, control_references, lens_object

DATA_VIEW_ID = "jobtrace-data-view"
PATTERN = "*-jobtrace-*"

ERRORS_QUERY = ('log.level:(ERROR OR CRITICAL OR FATAL) OR event.outcome:failure OR '
                '(message:nccl AND message:(timeout OR "timed out" OR watchdog))')
STALL_QUERY = "jobtrace.kind:heartbeat AND jobtrace.heartbeat.progress_age_ms:>=60000"
STEP_QUERY = "jobtrace.span.category:step"
METRIC_QUERY = "jobtrace.kind:metric"
QUERIES = {"step": STEP_QUERY, "errors": ERRORS_QUERY, "metric": METRIC_QUERY}

KIBANA_TYPE_VERSIONS = {"index-pattern": "8.0.0", "search": "8.0.0", "lens": LENS_TYPE_VERSION,
                        "dashboard": "8.9.0"}
OSD_TYPE_VERSIONS = {"index-pattern": "7.6.0", "search": "7.9.3", "visualization": "7.10.0", "dashboard": "7.9.3"}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _search_source(query: str, *, with_index: bool = True) -> str:
    source: dict[str, Any] = {"query": {"query": query, "language": "lucene"}, "filter": []}
    if with_index:
        source["indexRefName"] = "kibanaSavedObjectMeta.searchSourceJSON.index"
    return _dumps(source)


_INDEX_REF = {"name": "kibanaSavedObjectMeta.searchSourceJSON.index", "type": "index-pattern", "id": DATA_VIEW_ID}


# ---- objects -------------------------------------------------------------------------------------------------
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
     "description": "Every event of a job in time order: logs, spans, metrics, heartbeats. On the dashboard, "
                    "choose the job with its control; on its own, query jobtrace.job:\"<id>\".",
     "columns": ["jobtrace.rank", "host.name", "jobtrace.step", "jobtrace.kind", "jobtrace.span.name", "span.id",
                 "event.duration", "log.level", "message"],
     "sort": [["@timestamp", "asc"]], "query": ""},
    {"id": "jobtrace-search-trace", "title": "jobtrace: one trace",
     "description": "Spans and logs of one trace (the job's trace.id): add AND trace.id:<id> to the query.",
     "columns": ["jobtrace.rank", "jobtrace.span.category", "jobtrace.span.name", "span.id", "jobtrace.parent_id",
                 "event.start", "event.duration", "message"],
     "sort": [["@timestamp", "asc"]], "query": "jobtrace.kind:(span OR log)"},
    {"id": "jobtrace-search-errors", "title": "jobtrace: errors and NCCL timeouts by rank",
     "description": "ERROR/CRITICAL logs, failed collectives and NCCL watchdog timeouts, by rank.",
     "columns": ["jobtrace.rank", "host.name", "jobtrace.step", "log.level", "log.logger", "message",
                 "jobtrace.collective.op", "jobtrace.collective.error"],
     "sort": [["jobtrace.rank", "asc"], ["@timestamp", "asc"]], "query": ERRORS_QUERY},
    {"id": "jobtrace-search-stalls", "title": "jobtrace: stalled-rank heartbeats",
     "description": "Heartbeats of ranks without progress for 60 s or more (edit the threshold in the query): "
                    "what each rank was doing.",
     "columns": ["jobtrace.rank", "host.name", "jobtrace.step", "jobtrace.heartbeat.progress_age_ms",
                 "jobtrace.heartbeat.in_span", "jobtrace.heartbeat.in_op", "jobtrace.heartbeat.in_seq"],
     "sort": [["@timestamp", "desc"]], "query": STALL_QUERY},
]

# Panels on Kibana's 48-column grid: (chart key, x, y, w, h); charts by key, then the searches.
CHARTS = {"step-time": ("jobtrace-lens-step-time", "jobtrace-vis-step-time"),
          "slowest-ranks": ("jobtrace-lens-slowest-ranks", "jobtrace-vis-slowest-ranks"),
          "loss": ("jobtrace-lens-loss", "jobtrace-vis-loss"),
          "errors-by-node": ("jobtrace-lens-errors-by-node", "jobtrace-vis-errors-by-node")}
PANELS: list[tuple[str, int, int, int, int]] = [
    ("step-time", 0, 0, 32, 15),
    ("slowest-ranks", 32, 0, 16, 15),
    ("loss", 0, 15, 32, 15),
    ("errors-by-node", 32, 15, 16, 15),
    ("jobtrace-search-timeline", 0, 30, 48, 20),
    ("jobtrace-search-stalls", 0, 50, 24, 15),
    ("jobtrace-search-errors", 24, 50, 24, 15),
]
CONTROLS_PANEL_HEIGHT = 5  # OpenSearch Dashboards: the input-controls panel above the others


def _search_object(spec: dict[str, Any], flavour: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {"title": spec["title"], "description": spec["description"], "columns": spec["columns"],
                             "sort": spec["sort"],
                             "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source(spec["query"])}}
    if flavour == "kibana":
        attrs.update(grid={}, hideChart=False, isTextBasedQuery=False, timeRestore=False)
    else:
        attrs.update(hits=0, version=1)
    return {"id": spec["id"], "type": "search", "attributes": attrs, "references": [_INDEX_REF]}


def _vis_object(spec: dict[str, Any]) -> dict[str, Any]:
    return {"id": spec["id"], "type": "visualization", "references": [_INDEX_REF], "attributes": {
        "title": spec["title"], "description": spec["description"], "visState": _dumps(vis_state(spec)),
        "uiStateJSON": "{}", "version": 1,
        "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source(QUERIES[spec["query_key"]])}}}


def _panel_list(flavour: str) -> list[tuple[str, str, int, int, int, int]]:
    """``(object id, type, x, y, w, h)`` of every dashboard panel for ``flavour``."""
    kibana = flavour == "kibana"
    out: list[tuple[str, str, int, int, int, int]] = []
    if not kibana:
        out.append((CONTROLS_VIS_ID, "visualization", 0, 0, 48, CONTROLS_PANEL_HEIGHT))
    dy = 0 if kibana else CONTROLS_PANEL_HEIGHT
    for key, x, y, w, h in PANELS:
        if key in CHARTS:
            obj_id, type_ = (CHARTS[key][0], "lens") if kibana else (CHARTS[key][1], "visualization")
        else:
            obj_id, type_ = key, "search"
        out.append((obj_id, type_, x, y + dy, w, h))
    return out


def _dashboard(flavour: str) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    refs: list[dict[str, str]] = []
    for n, (obj_id, type_, x, y, w, h) in enumerate(_panel_list(flavour)):
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
    attrs: dict[str, Any] = {
        "title": "jobtrace: training job", "version": 1, "timeRestore": False,
        "description": "One distributed training job: per-rank step time, slowest ranks, loss and grad norm, "
                       "errors by node, the timeline and stalled ranks. Choose the job (and ranks) with the "
                       "controls at the top.",
        "panelsJSON": _dumps(panels),
        "optionsJSON": _dumps({"useMargins": True, "syncColors": False, "hidePanelTitles": False}),
        "kibanaSavedObjectMeta": {"searchSourceJSON": _search_source("", with_index=False)}}
    if flavour == "kibana":
        attrs["controlGroupInput"] = control_group()
        refs += control_references(DATA_VIEW_ID)
    return {"id": "jobtrace-dashboard", "type": "dashboard", "references": refs, "attributes": attrs}


def build(flavour: str) -> list[dict[str, Any]]:
    """The saved objects for ``kibana`` or ``opensearch-dashboards``, in import order."""
    if flavour not in ("kibana", "opensearch-dashboards"):
        raise ValueError(flavour)
    objects = [data_view(), *(_search_object(s, flavour) for s in SEARCHES)]
    if flavour == "kibana":
        objects += [lens_object(spec, QUERIES[spec["query_key"]], DATA_VIEW_ID) for spec in LENS]
    else:
        objects += [_vis_object(v) for v in VISUALIZATIONS]
        objects.append(controls_visualization(CONTROLS, DATA_VIEW_ID, _search_source("", with_index=False)))
    objects.append(_dashboard(flavour))
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
