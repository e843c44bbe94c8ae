"""OpenSearch Dashboards' objects: aggregation-based visualisations and the input-controls panel.

OpenSearch Dashboards is a fork of Kibana 7.10: it has no Lens and no dashboard control
group, so where Kibana gets :mod:`._lens`, it gets the ``visualization`` type (``visState``)
and, for choosing the job and the rank, an ``input_control_vis`` panel with two ``list``
controls (rank chained to job through ``parent``).

Shapes: ``visState`` as in Kibana 7.10's sample data
(``src/plugins/home/server/services/sample_data/data_sets/*/saved_objects.ts`` in both
elastic/kibana and opensearch-project/OpenSearch-Dashboards); the input controls as in the
flights sample's ``[Flights] Controls``, with each control's index pattern moved to a
``control_<n>_index_pattern`` reference (``indexPatternRefName``), as the 7.0.0 visualization
migration does (``src/plugins/visualizations/server/saved_objects/visualization_migrations.ts``).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CONTROLS_VIS_ID", "VISUALIZATIONS", "controls_visualization", "vis_state"]

CONTROLS_VIS_ID = "jobtrace-vis-controls"


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
    {"id": "jobtrace-vis-step-time", "title": "jobtrace: step time per rank", "query_key": "step",
     "description": "Mean step span duration per step, one line per rank (the 20 slowest).",
     "vis": {"type": "line", "aggs": [
         _agg("1", "avg", "metric", field="event.duration", customLabel="step time"),
         _agg("2", "histogram", "segment", field="jobtrace.step", interval=1, min_doc_count=False,
              extended_bounds={}, customLabel="step"),
         _agg("3", "terms", "group", field="jobtrace.rank", size=20, order="desc", orderBy="1",
              otherBucket=False, missingBucket=False, customLabel="rank")],
         "params": _xy_params("line", [("1", "step time", "ValueAxis-1")], "step time (ns)")}},
    {"id": "jobtrace-vis-slowest-ranks", "title": "jobtrace: slowest ranks", "query_key": "step",
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
    {"id": "jobtrace-vis-errors-by-node", "title": "jobtrace: errors by node", "query_key": "errors",
     "description": "Errors, failed collectives and NCCL timeouts per node.",
     "vis": {"type": "histogram", "aggs": [
         _agg("1", "count", "metric", customLabel="errors"),
         _agg("2", "terms", "segment", field="host.name", size=50, order="desc", orderBy="1",
              otherBucket=True, otherBucketLabel="other nodes", missingBucket=False, customLabel="node")],
         "params": _xy_params("histogram", [("1", "errors", "ValueAxis-1")], "errors")}},
    {"id": "jobtrace-vis-loss", "title": "jobtrace: loss and grad norm over steps", "query_key": "metric",
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


def vis_state(spec: dict[str, Any]) -> dict[str, Any]:
    return {"title": spec["title"], **spec["vis"]}


def controls_visualization(controls: list[tuple[str, str, str, bool]], data_view_id: str,
                           search_source: str) -> dict[str, Any]:
    """The ``input_control_vis`` panel: one ``list`` control per ``(id, field, label, single)``, chained."""
    items = []
    for n, (cid, field, label, single) in enumerate(controls):
        items.append({"id": cid, "fieldName": field, "label": label, "type": "list",
                      "parent": controls[n - 1][0] if n else "", "indexPatternRefName": f"control_{n}_index_pattern",
                      # dynamic options (a prefix search while typing) exist only for string fields
                      "options": {"type": "terms", "multiselect": not single, "dynamicOptions": field == "jobtrace.job",
                                  "size": 100, "order": "desc"}})
    state = {"title": "jobtrace: job and rank", "type": "input_control_vis", "aggs": [],
             "params": {"controls": items, "updateFiltersOnChange": True, "useTimeFilter": True, "pinFilters": False}}
    return {"id": CONTROLS_VIS_ID, "type": "visualization", "attributes": {
        "title": "jobtrace: job and rank",
        "description": "Choose the job, then (optionally) ranks: every panel of the dashboard follows.",
        "visState": json.dumps(state, separators=(",", ":")), "uiStateJSON": "{}", "version": 1,
        "kibanaSavedObjectMeta": {"searchSourceJSON": search_source}},
        "references": [{"name": f"control_{n}_index_pattern", "type": "index-pattern", "id": data_view_id}
                       for n in range(len(controls))]}
