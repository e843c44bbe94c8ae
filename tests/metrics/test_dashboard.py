"""The Prometheus board (``metrics/grafana/jobtrace-metrics.json``): generated, importable anywhere, and every
variable it uses defined. Its queries run on a real Prometheus in test_prometheus.py."""

from __future__ import annotations

import json
import re

from metrics._dashboard import DASHBOARD_PATH, dashboard, render

BUILTINS = {"__rate_interval", "__interval", "__url_time_range", "__all_variables", "__field", "__value", "__all"}


def test_the_committed_board_is_the_generated_one():
    assert DASHBOARD_PATH.read_text() == render(), "run: python -m metrics build"


def test_it_runs_on_a_datasource_variable_and_imports_into_any_grafana():
    """Panels, variables and the alerts annotation run on ``${datasource}`` (Prometheus, the one import input); the
    findings annotation on ``${logs}`` (Loki, optional). No data-source uid is pinned."""
    d = json.loads(DASHBOARD_PATH.read_text())
    variables = {v["name"]: v for v in d["templating"]["list"]}
    var, logs = variables["datasource"], variables["logs"]
    (inp,) = d["__inputs"]
    assert var["type"] == logs["type"] == "datasource"
    assert var["query"] == inp["pluginId"] == "prometheus" and logs["query"] == "loki"
    assert var["current"]["value"] == "${%s}" % inp["name"] and "current" not in logs
    uids = {p["datasource"]["uid"] for p in d["panels"]} | {t["datasource"]["uid"] for p in d["panels"]
                                                             for t in p["targets"]}
    uids |= {v["datasource"]["uid"] for v in d["templating"]["list"] if "datasource" in v}
    annotations = {a["name"]: a for a in d["annotations"]["list"]}
    assert uids | {annotations["jobtrace alerts"]["datasource"]["uid"]} == {"${datasource}"}
    assert annotations["jobtrace findings"]["datasource"] == {"type": "loki", "uid": "${logs}"}
    job, rank = (next(v for v in d["templating"]["list"] if v["name"] == n) for n in ("job", "rank"))
    assert job["multi"] and rank["multi"] and rank["includeAll"]


def test_it_is_valid_under_grafanas_published_dashboard_schema():
    """Grafana's dashboard JSON Schema (tests/loki/grafana_schema), the Prometheus query schema for every target."""
    from tests.loki.grafana_schema import dashboard_errors

    assert dashboard_errors(json.loads(DASHBOARD_PATH.read_text())) == []


def test_job_and_rank_lists_come_from_the_labels_the_exporter_serves():
    """The job, rank and node variables are label queries over ``jobtrace_step``; the exporter's series carry exactly
    those labels (a renamed label would leave the lists empty)."""
    from metrics._state import RankMetrics

    served = set(RankMetrics("j", 3).labels())
    for name in ("job", "rank", "node"):
        var = next(v for v in dashboard()["templating"]["list"] if v["name"] == name)
        assert var["type"] == "query" and var["multi"], name
        m = re.fullmatch(r'label_values\(jobtrace_step(?:\{job=~"\$job"\})?, (\w+)\)', var["query"])
        assert m and m.group(1) == name and m.group(1) in served, var["query"]


def test_every_variable_used_is_defined_and_no_query_has_a_step_label():
    d = dashboard()
    defined = {v["name"] for v in d["templating"]["list"]} | {i["name"] for i in d["__inputs"]}
    text = json.dumps(d["panels"]) + json.dumps(d["templating"]) + json.dumps(d["annotations"]) + json.dumps(d["links"])
    used = set(re.findall(r"\$\{?(\w+)", text))
    assert used - BUILTINS <= defined
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    assert exprs and not any("step=" in e for e in exprs)
    for p in d["panels"]:
        if any(t["expr"].startswith("jobtrace_") or "(jobtrace_" in t["expr"] for t in p["targets"]):
            assert p["fieldConfig"]["defaults"]["links"], p["title"]  # to the rank's logs at that time
    heat = [p for p in d["panels"] if p["type"] == "heatmap"]
    assert any(t.get("exemplar") for p in heat for t in p["targets"])


def test_the_dcgm_counters_file_is_in_dcgm_exporters_format_and_turns_on_what_it_leaves_off():
    """deploy/prometheus/dcgm-counters.csv: ``FIELD, type, help`` lines; the Xid, ECC, NVLink-error and violation
    counters that dcgm-exporter's default-counters.csv ships commented out are on, and every DCGM series the
    board plots is in it."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "dcgm-counters.csv"
    rows = [[c.strip() for c in line.split(",", 2)] for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert all(len(r) == 3 and re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", r[0]) and r[1] in ("gauge", "counter", "label")
               and r[2] for r in rows), rows
    fields = {r[0] for r in rows}
    assert len(fields) == len(rows)
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION"} <= fields
    plotted = {m for p in dashboard()["panels"] for t in p["targets"] for m in re.findall(r"DCGM_FI_\w+", t["expr"])}
    assert plotted and plotted <= fields
