"""Kibana's own objects: Lens visualisations and the dashboard's job/rank options-list controls.

Kibana 8/9 draws charts with Lens (saved-object type ``lens``); the aggregation-based
``visualization`` objects (``visState``) are legacy there, and the ``paste a job id`` filter pill
they needed is replaced by Kibana's controls: options lists on ``jobtrace.job`` and
``jobtrace.rank`` in the dashboard's ``controlGroupInput``. OpenSearch Dashboards has neither
(it forked Kibana 7.10), so it gets :mod:`._legacy_vis` instead; :mod:`._build` picks by flavour.

The shapes follow the objects Kibana itself ships and exports (elastic/kibana):

* a by-reference Lens object, ``attributes.state.datasourceStates.formBased.layers.<layer>``
  with ``columns``/``columnOrder`` and one ``indexpattern-datasource-layer-<layer>``
  reference per layer: the sample data sets
  ``src/platform/plugins/shared/home/server/services/sample_data/data_sets/{ecommerce,flights,logs}/saved_objects.ts``
  (column shapes of ``terms``, ``range`` with ``type: histogram``, ``average``/``max``,
  ``count`` on ``___records___``; XY ``layers[]`` with ``xAccessor``/``accessors``/
  ``splitAccessor``/``yConfig``; datatable ``columns[]``/``sorting``);
* ``formBased`` is the datasource's name since the lens ``8.6.0`` migration
  (``commonMigrateIndexPatternDatasource`` in
  ``x-pack/plugins/lens/server/migrations/saved_object_migrations.ts``), hence
  ``typeMigrationVersion: 8.6.0``: Kibana runs every later migration on import;
* the control group: the logs sample's dashboard (``controlGroupInput`` with ``controlStyle``,
  ``chainingSystem``, ``panelsJSON`` of ``optionsListControl`` panels whose ``explicitInput``
  has ``fieldName``/``title``/``id``, ``ignoreParentSettingsJSON``), its data view carried
  as the dashboard reference ``controlGroup_<control id>:optionsListDataView``.

Queries are Lucene, like the saved searches, and hold no user input: the job and the rank
come from the controls, which Kibana turns into filters itself.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CONTROLS", "LENS", "LENS_TYPE_VERSION", "control_group", "control_references", "lens_object"]

LENS_TYPE_VERSION = "8.6.0"
RECORDS = "___records___"  # Lens's pseudo-field of a document count

# (control id, field, title, single select): job first, so that rank (chained) offers only its ranks
CONTROLS: list[tuple[str, str, str, bool]] = [
    ("jobtrace-control-job", "jobtrace.job", "job", True),
    ("jobtrace-control-rank", "jobtrace.rank", "rank", False),
]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---- columns ---------------------------------------------------------------------------------------------
def _metric(op: str, field: str, label: str) -> dict[str, Any]:
    return {"label": label, "customLabel": True, "dataType": "number", "operationType": op, "sourceField": field,
            "isBucketed": False, "scale": "ratio", "params": {"emptyAsNull": True}}


def _count(label: str) -> dict[str, Any]:
    return _metric("count", RECORDS, label)


def _terms(field: str, label: str, size: int, order_by: str | None, *, data_type: str,
           other: bool = False) -> dict[str, Any]:
    order = {"type": "column", "columnId": order_by} if order_by else {"type": "alphabetical", "fallback": True}
    return {"label": label, "customLabel": True, "dataType": data_type, "operationType": "terms",
            "sourceField": field, "isBucketed": True, "scale": "ordinal",
            "params": {"size": size, "orderBy": order, "orderDirection": "desc" if order_by else "asc",
                       "otherBucket": other, "missingBucket": False, "parentFormat": {"id": "terms"}}}


def _histogram(field: str, label: str) -> dict[str, Any]:
    """A numeric histogram (Lens's ``range`` operation in histogram mode): steps on the x axis."""
    return {"label": label, "customLabel": True, "dataType": "number", "operationType": "range",
            "sourceField": field, "isBucketed": True, "scale": "interval",
            "params": {"type": "histogram", "maxBars": "auto", "includeEmptyRows": False,
                       "ranges": [{"from": 0, "to": 1000, "label": ""}]}}


# ---- visualisation states ----------------------------------------------------------------------------------
def _xy(layer: str, series: str, x: str, ys: list[tuple[str, str]], split: str | None = None,
        *, histogram: bool = False) -> dict[str, Any]:
    data_layer: dict[str, Any] = {
        "layerId": layer, "layerType": "data", "seriesType": series, "xAccessor": x,
        "accessors": [y for y, _ in ys], "yConfig": [{"forAccessor": y, "axisMode": axis} for y, axis in ys],
        "palette": {"type": "palette", "name": "default"}}
    if split:
        data_layer["splitAccessor"] = split
    if histogram:
        data_layer.update(isHistogram=True, xScaleType="linear")
    on = {"x": True, "yLeft": True, "yRight": True}
    return {"legend": {"isVisible": True, "position": "right"}, "valueLabels": "hide", "fittingFunction": "None",
            "preferredSeriesType": series, "layers": [data_layer], "axisTitlesVisibilitySettings": on,
            "tickLabelsVisibilitySettings": on, "gridlinesVisibilitySettings": on,
            "labelsOrientation": {"x": 0, "yLeft": 0, "yRight": 0}}


def _table(layer: str, columns: list[str], sort_by: str) -> dict[str, Any]:
    return {"layerId": layer, "layerType": "data",
            "columns": [{"columnId": c, "isTransposed": False} for c in columns],
            "sorting": {"columnId": sort_by, "direction": "desc"}}


STEP, STEP_TIME, RANK = "step", "step-time", "rank"

# The visualisations: id, title, description, query, Lens type, the layer's columns in nesting order
# (Kibana's esaggs nests the bucket columns in columnOrder), and the visualisation state.
LENS: list[dict[str, Any]] = [
    {"id": "jobtrace-lens-step-time", "title": "jobtrace: step time per rank", "query_key": "step",
     "description": "Mean step span duration over steps, one line per rank (the 20 slowest).",
     "type": "lnsXY", "layer": "step-time",
     "columns": {RANK: _terms("jobtrace.rank", "rank", 20, STEP_TIME, data_type="number"),
                 STEP: _histogram("jobtrace.step", "step"),
                 STEP_TIME: _metric("average", "event.duration", "step time")},
     "state": _xy("step-time", "line", STEP, [(STEP_TIME, "left")], RANK, histogram=True)},
    {"id": "jobtrace-lens-slowest-ranks", "title": "jobtrace: slowest ranks", "query_key": "step",
     "description": "Ranks by mean step time, slowest first, with their node.",
     "type": "lnsDatatable", "layer": "slowest",
     "columns": {RANK: _terms("jobtrace.rank", "rank", 10, "mean", data_type="number"),
                 "node": _terms("host.name", "node", 1, "steps", data_type="string"),
                 "mean": _metric("average", "event.duration", "mean step time"),
                 "max": _metric("max", "event.duration", "max step time"),
                 "steps": _count("steps")},
     "state": _table("slowest", [RANK, "node", "mean", "max", "steps"], "mean")},
    {"id": "jobtrace-lens-errors-by-node", "title": "jobtrace: errors by node", "query_key": "errors",
     "description": "Errors, failed collectives and NCCL timeouts per node.",
     "type": "lnsXY", "layer": "errors",
     "columns": {"node": _terms("host.name", "node", 50, "errors", data_type="string", other=True),
                 "errors": _count("errors")},
     "state": _xy("errors", "bar", "node", [("errors", "left")])},
    {"id": "jobtrace-lens-loss", "title": "jobtrace: loss and grad norm over steps", "query_key": "metric",
     "description": "Mean loss (left axis) and gradient norm (right axis) over ranks, per step. NaN/Inf values "
                    "are in jobtrace.nonfinite.*, not in these averages.",
     "type": "lnsXY", "layer": "loss",
     "columns": {STEP: _histogram("jobtrace.step", "step"),
                 "loss": _metric("average", "jobtrace.metrics.loss", "loss"),
                 "grad-norm": _metric("average", "jobtrace.metrics.grad_norm", "grad norm")},
     "state": _xy("loss", "line", STEP, [("loss", "left"), ("grad-norm", "right")], histogram=True)},
]


def lens_object(spec: dict[str, Any], query: str, data_view_id: str) -> dict[str, Any]:
    """One by-reference Lens saved object (flavour ``kibana`` only)."""
    layer = spec["layer"]
    state = {
        "datasourceStates": {"formBased": {"layers": {layer: {
            "columns": spec["columns"], "columnOrder": list(spec["columns"]), "incompleteColumns": {}}}}},
        "visualization": spec["state"], "query": {"query": query, "language": "lucene"}, "filters": [],
        "internalReferences": [], "adHocDataViews": {}}
    return {"id": spec["id"], "type": "lens", "attributes": {
        "title": spec["title"], "description": spec["description"], "visualizationType": spec["type"],
        "state": state},
        "references": [{"type": "index-pattern", "id": data_view_id, "name": f"indexpattern-datasource-layer-{layer}"}]}


# ---- the dashboard's controls ------------------------------------------------------------------------------
def control_group() -> dict[str, Any]:
    """``attributes.controlGroupInput`` of the dashboard: job, then rank chained to it."""
    panels = {}
    for order, (cid, field, title, single) in enumerate(CONTROLS):
        explicit: dict[str, Any] = {"id": cid, "fieldName": field, "title": title, "enhancements": {}}
        if single:
            explicit["singleSelect"] = True  # one job at a time; ranks may be several
        panels[cid] = {"order": order, "width": "medium", "grow": True, "type": "optionsListControl",
                       "explicitInput": explicit}
    return {"controlStyle": "oneLine", "chainingSystem": "HIERARCHICAL", "panelsJSON": _dumps(panels),
            "ignoreParentSettingsJSON": _dumps({"ignoreFilters": False, "ignoreQuery": False,
                                                "ignoreTimerange": False, "ignoreValidations": False})}


def control_references(data_view_id: str) -> list[dict[str, str]]:
    return [{"name": f"controlGroup_{cid}:optionsListDataView", "type": "index-pattern", "id": data_view_id}
            for cid, *_ in CONTROLS]
