"""The packaged saved objects against the formats Kibana and OpenSearch Dashboards publish.

The rules below are taken from outside this project, not from our generator:

* the saved-object envelope and the dashboard/search attributes: ``../shared/reference/backends.md``
  section 5 (Kibana's import API and its sample data);
* Lens: the by-reference ``lens`` objects and by-value Lens panels Kibana ships in its sample
  data, elastic/kibana
  ``src/platform/plugins/shared/home/server/services/sample_data/data_sets/{ecommerce,flights,logs}/saved_objects.ts``:
  ``attributes.{title, visualizationType, state}``; ``state.{datasourceStates, visualization,
  query, filters}``; ``datasourceStates.formBased.layers.<id>.{columns, columnOrder}``; columns
  with ``label, dataType, operationType, isBucketed, scale`` (and ``sourceField``; ``count`` reads
  ``___records___``); one ``indexpattern-datasource-layer-<layer id>`` reference per layer; XY
  layers with ``layerId, layerType, seriesType, accessors`` (+ ``xAccessor``, ``splitAccessor``);
  datatable ``layerId, layerType, columns[{columnId}]``. ``formBased`` is the name since the lens
  8.6.0 migration (``x-pack/plugins/lens/server/migrations/saved_object_migrations.ts``).
* controls: the logs sample's dashboard ``controlGroupInput.{controlStyle, chainingSystem,
  panelsJSON, ignoreParentSettingsJSON}``, panels ``{order, width, grow, type, explicitInput:
  {fieldName, title, id}}`` of type ``optionsListControl``, data view as the reference
  ``controlGroup_<id>:optionsListDataView``;
* OpenSearch Dashboards (Kibana 7.10): no ``lens`` type and no control group (backends.md: ship
  ≤7.10 shapes); input controls as ``input_control_vis`` with ``list`` controls whose index
  pattern is the reference ``control_<n>_index_pattern`` (Kibana's 7.0.0 visualization migration,
  ``src/plugins/visualizations/server/saved_objects/visualization_migrations.test.ts``,
  "extracts index patterns from controls").

Which field a column may read is checked against the index template the data streams use
(``kibana/templates/jobtrace-mappings.json``), and its Lens ``dataType`` against that field's type.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import kibana

ENVELOPE = {"id", "type", "attributes", "references"}
REFERENCE = {"id", "type", "name"}
LENS_ATTRIBUTES = {"title", "visualizationType", "state"}
LENS_STATE = {"datasourceStates", "visualization", "query", "filters"}
LAYER = {"columns", "columnOrder"}
COLUMN = {"label", "dataType", "operationType", "isBucketed", "scale"}
VISUALIZATION_TYPES = {"lnsXY", "lnsDatatable", "lnsMetric", "lnsPie", "lnsHeatmap", "lnsGauge", "lnsTagcloud",
                       "lnsLegacyMetric"}
SERIES_TYPES = {"bar", "bar_stacked", "bar_percentage_stacked", "bar_horizontal", "bar_horizontal_stacked",
                "bar_horizontal_percentage_stacked", "line", "area", "area_stacked", "area_percentage_stacked"}
# operation -> (isBucketed, scale, the Lens data types of the fields it reads; None: any, or ___records___)
OPERATIONS: dict[str, tuple[bool, str, set[str] | None]] = {
    "terms": (True, "ordinal", {"string", "number", "ip", "boolean"}),
    "range": (True, "interval", {"number"}),
    "date_histogram": (True, "interval", {"date"}),
    "average": (False, "ratio", {"number"}), "sum": (False, "ratio", {"number"}),
    "min": (False, "ratio", {"number", "date"}), "max": (False, "ratio", {"number", "date"}),
    "median": (False, "ratio", {"number"}), "unique_count": (False, "ratio", None),
    "count": (False, "ratio", None),
}
RECORDS = "___records___"
# Elasticsearch field types -> the data type Lens gives them
LENS_TYPE = {"keyword": "string", "constant_keyword": "string", "wildcard": "string", "long": "number",
             "integer": "number", "short": "number", "byte": "number", "double": "number", "float": "number",
             "half_float": "number", "scaled_float": "number", "unsigned_long": "number", "date": "date",
             "date_nanos": "date", "boolean": "boolean", "ip": "ip"}
CONTROL_GROUP = {"controlStyle", "chainingSystem", "panelsJSON", "ignoreParentSettingsJSON"}
CONTROL_PANEL = {"order", "width", "grow", "type", "explicitInput"}
CONTROL_INPUT = {"fieldName", "title", "id"}
INPUT_CONTROL = {"id", "fieldName", "label", "type", "options", "parent", "indexPatternRefName"}
OSD_TYPES = {"index-pattern", "search", "visualization", "dashboard"}  # what Kibana 7.10 / OSD knows of these


def objects(flavour: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in kibana.saved_objects(flavour).decode().splitlines()]


def by_type(flavour: str, type_: str) -> list[dict[str, Any]]:
    return [o for o in objects(flavour) if o["type"] == type_]


def mapped_fields() -> dict[str, str]:
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


def data_view_id(flavour: str) -> str:
    (view,) = by_type(flavour, "index-pattern")
    return str(view["id"])


def layers(obj: dict[str, Any]) -> dict[str, Any]:
    states = obj["attributes"]["state"]["datasourceStates"]
    assert set(states) <= {"formBased", "textBased"} and "formBased" in states, set(states)
    return dict(states["formBased"]["layers"])


LENS_IDS = [o["id"] for o in by_type("kibana", "lens")]


# ---- which types where ---------------------------------------------------------------------------------
def test_kibana_draws_with_lens_and_opensearch_dashboards_gets_only_types_it_knows():
    kib = {o["type"] for o in objects("kibana")}
    assert "visualization" not in kib and len(LENS_IDS) == 4
    osd = objects("opensearch-dashboards")
    assert {o["type"] for o in osd} <= OSD_TYPES
    for obj in osd:
        assert "controlGroupInput" not in obj["attributes"] and '"formBased"' not in json.dumps(obj)
    for flavour in kibana.FLAVOURS:
        for obj in objects(flavour):
            assert ENVELOPE <= set(obj) and all(REFERENCE == set(r) for r in obj["references"]), obj["id"]


# ---- Lens ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("obj_id", LENS_IDS)
def test_each_lens_object_has_the_published_attribute_and_state_shape(obj_id):
    obj = next(o for o in by_type("kibana", "lens") if o["id"] == obj_id)
    attrs = obj["attributes"]
    assert LENS_ATTRIBUTES <= set(attrs) and attrs["visualizationType"] in VISUALIZATION_TYPES
    assert LENS_STATE <= set(attrs["state"])
    assert attrs["state"]["query"]["language"] in ("kuery", "lucene") and isinstance(attrs["state"]["filters"], list)
    assert layers(obj), "a Lens object needs at least one layer"
    for layer_id, layer in layers(obj).items():
        assert LAYER <= set(layer)
        assert sorted(layer["columnOrder"]) == sorted(layer["columns"]), layer_id
        for col_id, col in layer["columns"].items():
            assert COLUMN <= set(col), (layer_id, col_id)
            bucketed, scale, _ = OPERATIONS[col["operationType"]]
            assert (bucketed, scale) == (col["isBucketed"], col["scale"]), (layer_id, col_id)
            if col["operationType"] == "terms":
                order = col["params"]["orderBy"]
                if order["type"] == "column":  # ordered by a metric of the same layer
                    assert not layer["columns"][order["columnId"]]["isBucketed"]
                assert col["params"]["orderDirection"] in ("asc", "desc") and col["params"]["size"] >= 1
            if col["operationType"] == "range":
                assert col["params"]["type"] in ("histogram", "range")


@pytest.mark.parametrize("obj_id", LENS_IDS)
def test_each_lens_visualisation_state_points_only_at_columns_of_its_layers(obj_id):
    obj = next(o for o in by_type("kibana", "lens") if o["id"] == obj_id)
    vis, all_layers = obj["attributes"]["state"]["visualization"], layers(obj)
    if obj["attributes"]["visualizationType"] == "lnsXY":
        assert vis["preferredSeriesType"] in SERIES_TYPES
        for layer in vis["layers"]:
            assert {"layerId", "layerType", "seriesType", "accessors"} <= set(layer)
            assert layer["layerType"] == "data" and layer["seriesType"] in SERIES_TYPES
            cols = all_layers[layer["layerId"]]["columns"]
            assert layer["accessors"] and all(not cols[a]["isBucketed"] for a in layer["accessors"])
            for key in ("xAccessor", "splitAccessor"):
                if key in layer:
                    assert cols[layer[key]]["isBucketed"], (key, layer[key])
            for y in layer.get("yConfig", []):
                assert y["forAccessor"] in layer["accessors"] and y.get("axisMode", "auto") in (
                    "auto", "left", "right", "bottom")
            used = {*layer["accessors"], layer.get("xAccessor"), layer.get("splitAccessor")} - {None}
            assert used == set(cols), "every column is drawn"
    else:
        assert obj["attributes"]["visualizationType"] == "lnsDatatable"
        assert {"layerId", "layerType", "columns"} <= set(vis)
        cols = all_layers[vis["layerId"]]["columns"]
        assert [c["columnId"] for c in vis["columns"]] and {c["columnId"] for c in vis["columns"]} == set(cols)
        assert vis["sorting"]["columnId"] in cols and vis["sorting"]["direction"] in ("asc", "desc")


@pytest.mark.parametrize("obj_id", LENS_IDS)
def test_each_lens_layer_has_one_reference_and_it_is_the_data_view(obj_id):
    obj = next(o for o in by_type("kibana", "lens") if o["id"] == obj_id)
    expected = {f"indexpattern-datasource-layer-{layer_id}" for layer_id in layers(obj)}
    names = [r["name"] for r in obj["references"]]
    assert expected <= set(names) and len(names) == len(set(names))
    for ref in obj["references"]:
        assert ("index-pattern", data_view_id("kibana")) == (ref["type"], ref["id"])


@pytest.mark.parametrize("obj_id", LENS_IDS)
def test_every_lens_column_reads_a_field_the_index_template_maps_with_its_lens_type(obj_id):
    known = mapped_fields()
    obj = next(o for o in by_type("kibana", "lens") if o["id"] == obj_id)
    for layer in layers(obj).values():
        for col_id, col in layer["columns"].items():
            field = col.get("sourceField")
            if col["operationType"] == "count" and field == RECORDS:
                continue
            assert field in known, (col_id, field)
            lens_type = LENS_TYPE[known[field]]
            allowed = OPERATIONS[col["operationType"]][2]
            assert allowed is None or lens_type in allowed, (col_id, field, known[field])
            if col["isBucketed"]:  # a bucket column's type is its field's
                assert col["dataType"] == lens_type, (col_id, field)


def test_the_kibana_dashboard_embeds_every_lens_object_by_reference():
    (dash,) = by_type("kibana", "dashboard")
    refs = {r["name"]: r for r in dash["references"]}
    lens_panels = [p for p in json.loads(dash["attributes"]["panelsJSON"]) if p["type"] == "lens"]
    ids = set()
    for panel in lens_panels:
        ref = refs[f"{panel['panelIndex']}:{panel['panelRefName']}"]
        assert ref["type"] == "lens"
        ids.add(ref["id"])
    assert ids == set(LENS_IDS)


# ---- the job and rank controls ------------------------------------------------------------------------------
def test_the_kibana_dashboard_has_options_list_controls_for_job_then_rank():
    (dash,) = by_type("kibana", "dashboard")
    group = dash["attributes"]["controlGroupInput"]
    assert CONTROL_GROUP <= set(group) and group["chainingSystem"] in ("HIERARCHICAL", "NONE")
    assert group["controlStyle"] in ("oneLine", "twoLine")
    json.loads(group["ignoreParentSettingsJSON"])
    panels = json.loads(group["panelsJSON"])
    known = mapped_fields()
    for cid, panel in panels.items():
        assert CONTROL_PANEL <= set(panel) and CONTROL_INPUT <= set(panel["explicitInput"])
        assert panel["type"] == "optionsListControl" and panel["explicitInput"]["id"] == cid
        assert panel["width"] in ("small", "medium", "large")
        field = panel["explicitInput"]["fieldName"]
        assert LENS_TYPE[known[field]] in ("string", "number"), field  # what an options list can list
    fields = [p["explicitInput"]["fieldName"] for p in sorted(panels.values(), key=lambda p: p["order"])]
    assert ["jobtrace.job", "jobtrace.rank"] == fields
    assert group["chainingSystem"] == "HIERARCHICAL", "rank must offer only the chosen job's ranks"
    refs = {r["name"]: r for r in dash["references"]}
    for cid in panels:
        ref = refs[f"controlGroup_{cid}:optionsListDataView"]
        assert ("index-pattern", data_view_id("kibana")) == (ref["type"], ref["id"])


def test_the_opensearch_dashboards_dashboard_has_input_controls_for_job_then_rank():
    (dash,) = by_type("opensearch-dashboards", "dashboard")
    dash_refs = {r["name"]: r["id"] for r in dash["references"]}
    panels = json.loads(dash["attributes"]["panelsJSON"])
    on_dashboard = {dash_refs[p["panelRefName"]] for p in panels}
    (controls,) = [o for o in by_type("opensearch-dashboards", "visualization")
                   if json.loads(o["attributes"]["visState"])["type"] == "input_control_vis"]
    assert controls["id"] in on_dashboard
    state = json.loads(controls["attributes"]["visState"])
    refs = {r["name"]: r for r in controls["references"]}
    known = mapped_fields()
    items = state["params"]["controls"]
    for n, item in enumerate(items):
        assert INPUT_CONTROL <= set(item) and item["type"] == "list" and item["options"]["type"] == "terms"
        assert item["indexPatternRefName"] == f"control_{n}_index_pattern"
        ref = refs[item["indexPatternRefName"]]
        assert ("index-pattern", data_view_id("opensearch-dashboards")) == (ref["type"], ref["id"])
        assert item["fieldName"] in known
        if item["options"].get("dynamicOptions"):  # a prefix search: string fields only
            assert LENS_TYPE[known[item["fieldName"]]] == "string"
    assert ["jobtrace.job", "jobtrace.rank"] == [i["fieldName"] for i in items]
    assert items[0]["parent"] == "" and items[1]["parent"] == items[0]["id"]
    assert not items[0]["options"]["multiselect"] and items[1]["options"]["multiselect"]


@pytest.mark.parametrize("flavour", kibana.FLAVOURS)
def test_no_object_carries_a_placeholder_a_disabled_filter_or_a_job_id(flavour):
    for obj in objects(flavour):
        text = json.dumps(obj)
        assert "paste-a" not in text and "edit me" not in text, obj["id"]
        attrs = obj["attributes"]
        filters = list(attrs.get("state", {}).get("filters", []))
        queries = [attrs.get("state", {}).get("query", {}).get("query", "")]
        if "kibanaSavedObjectMeta" in attrs:
            source = json.loads(attrs["kibanaSavedObjectMeta"]["searchSourceJSON"])
            filters += source["filter"]
            queries.append(source["query"]["query"])
        assert not any(f.get("meta", {}).get("disabled") for f in filters), obj["id"]
        assert not filters, "the job comes from the controls, not from a saved filter"
        for q in queries:  # no job, trace or rank is built into a saved query
            assert not any(k in q for k in ("jobtrace.job", "trace.id", "jobtrace.rank")), (obj["id"], q)


# ---- the envelope, searches and dashboards (backends.md section 5) -----------------------------------------------
DASHBOARD = {"title", "panelsJSON", "optionsJSON", "timeRestore", "kibanaSavedObjectMeta"}
PANEL = {"version", "gridData", "panelIndex", "embeddableConfig", "panelRefName"}
GRID = {"x", "y", "w", "h", "i"}


@pytest.mark.parametrize("flavour", kibana.FLAVOURS)
def test_searches_data_view_and_dashboard_have_the_documented_attributes(flavour):
    for obj in objects(flavour):
        attrs, refs = obj["attributes"], {r["name"]: r for r in obj["references"]}
        if flavour == "kibana":
            assert {"coreMigrationVersion", "typeMigrationVersion"} <= set(obj) and "migrationVersion" not in obj
        else:
            assert "migrationVersion" in obj and "typeMigrationVersion" not in obj
        if obj["type"] == "index-pattern":
            assert {"title", "timeFieldName"} <= set(attrs)
        if obj["type"] == "search":
            assert isinstance(attrs["columns"], list) and all(d in ("asc", "desc") for _, d in attrs["sort"])
            source = json.loads(attrs["kibanaSavedObjectMeta"]["searchSourceJSON"])
            assert {"query", "filter", "indexRefName"} <= set(source) and {"query", "language"} <= set(source["query"])
            assert refs[source["indexRefName"]]["type"] == "index-pattern"
        if obj["type"] == "dashboard":
            assert DASHBOARD <= set(attrs)
            json.loads(attrs["optionsJSON"])
            for n, panel in enumerate(json.loads(attrs["panelsJSON"])):
                assert PANEL <= set(panel) and GRID == set(panel["gridData"]), panel
                if flavour == "kibana":  # prefixReferencesFromPanel: "<panelIndex>:panel_<panelIndex>"
                    assert panel["panelRefName"] == f"panel_{panel['panelIndex']}" and "type" in panel
                    assert refs[f"{panel['panelIndex']}:{panel['panelRefName']}"]["type"] == panel["type"]
                else:  # Kibana 7.10: "panel_<n>" in panel order
                    assert panel["panelRefName"] == f"panel_{n}" and panel["panelRefName"] in refs
