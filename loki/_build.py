"""Generate the Grafana dashboards and the Loki ruler rules from the query library.

    python -m loki build     # rewrite loki/grafana/dashboards/*.json and loki/rules/*.yaml
    python -m loki check     # exit 1 when the committed files differ from what the library gives

Panels name their query (``library: <name>`` in the panel description) and carry
exactly ``QueryLibrary.grafana(name)``; a test checks both, so a dashboard cannot hold
a hand-edited copy of a query.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ASSETS, JOB_LABEL, QueryLibrary, library

__all__ = ["DASHBOARDS", "INPUTS", "LOKI_DS", "METRICS_DS", "PANEL_DS", "TRACE_DS", "build", "check", "link",
           "rules_yaml", "vlogs_rules_yaml", "write"]

LOKI_DS = {"type": "loki", "uid": "jobtrace-loki"}
TRACE_DS = {"type": "tempo", "uid": "jobtrace-tempo"}
PANEL_DS = {"type": "loki", "uid": "${datasource}"}
"""What panels and variables use: the dashboard's ``datasource`` variable, so that a dashboard imported into an
existing Grafana runs on whichever Loki it is given (``__inputs``), and the provisioned one on jobtrace's."""

INPUTS = [{"name": "DS_LOKI", "label": "Loki", "description": "The Loki (or VictoriaLogs' Loki API) jobtrace ships to",
           "type": "datasource", "pluginId": "loki", "pluginName": "Loki"}]


@dataclass(frozen=True)
class Panel:
    query: str
    title: str
    type: str = "timeseries"
    w: int = 12
    h: int = 8
    legend: str = "rank {{rank}}"
    instant: bool = False
    unit: str | None = None
    options: dict[str, Any] | None = None


# One row of a dashboard is a list of panels whose widths add up to 24.
DASHBOARDS: dict[str, tuple[str, str, list[list[Panel]]]] = {
    "jobtrace-overview": (
        "jobtrace: job overview",
        "A training job at a glance: is every rank alive and progressing, who is slow, is the loss sane, "
        "what failed where. Select the job; node and rank narrow it down.",
        [
            [Panel("ranks_reporting", "Ranks reporting", "stat", 4, 5, legend="ranks", instant=True),
             Panel("slowest_ranks", "Slowest ranks (time outside collectives)", "bargauge", 10, 5, instant=True,
                   unit="ms", options={"orientation": "horizontal", "displayMode": "gradient"}),
             Panel("last_seen", "Last seen per rank", "table", 10, 5, instant=True, unit="dateTimeFromNow")],
            [Panel("step_progress", "Job timeline: last step finished per rank"),
             Panel("step_durations", "Median step time per rank", unit="ms")],
            [Panel("rank_compute", "Time outside collectives per rank (the straggler is highest)", unit="ms"),
             Panel("event_volume", "Events per kind", legend="{{kind}}")],
            [Panel("loss_by_rank", "Loss per rank", w=8),
             Panel("loss_nan", "NaN/Inf losses per rank", "timeseries", 8),
             Panel("loss_spike", "Loss spikes (>= 10x recent median)", "timeseries", 8)],
            [Panel("errors_by_node", "Errors by node", "timeseries", 8, legend="{{node}}"),
             Panel("nccl_timeouts_by_node", "NCCL timeouts by node", "timeseries", 8, legend="{{node}}"),
             Panel("cuda_oom_by_rank", "CUDA OOM by rank", "timeseries", 8, legend="rank {{rank}} ({{node}})")],
            [Panel("errors", "Errors (click a trace id to open the trace)", "logs", 24, 10)],
        ],
    ),
    "jobtrace-ranks": (
        "jobtrace: per-rank step time",
        "Per-rank step time as a heatmap (one row per rank) and timelines: a straggler is a bright row, "
        "a stalled rank a row that ends early.",
        [
            [Panel("step_durations", "Step time heatmap (ms, one row per rank)", "heatmap", 24, 12, unit="ms",
                   options={"calculate": False, "yAxis": {"axisLabel": "rank"},
                            "cellValues": {"unit": "ms"}, "color": {"scheme": "Oranges", "mode": "scheme"}})],
            [Panel("rank_compute", "Time outside collectives heatmap (ms per window)", "heatmap", 24, 12,
                   unit="ms", options={"calculate": False, "yAxis": {"axisLabel": "rank"},
                                       "cellValues": {"unit": "ms"}})],
            [Panel("step_progress", "Timeline: last step finished per rank"),
             Panel("heartbeats_by_rank", "Heartbeats per rank")],
        ],
    ),
    "jobtrace-logs": (
        "jobtrace: logs with trace links",
        "The job's logs and timeline; each line's trace id links to the trace view (Tempo).",
        [
            [Panel("rank_logs", "Logs", "logs", 24, 12)],
            [Panel("nccl_timeouts", "NCCL / collective timeouts", "logs", 24, 6)],
            [Panel("job_timeline", "Timeline: spans and logs in time order", "logs", 24, 12)],
            [Panel("log_volume", "Log records per level", "timeseries", 24, 6, legend="{{level}}")],
        ],
    ),
}


METRICS_DS = {"type": "prometheus", "uid": "${metrics}"}
"""Where the rank list comes from: a rank is structured metadata in Loki, not a stream label, and Loki's
label-values API (what Grafana's Loki variables query) lists stream labels only (grafana/grafana#84909).
The Prometheus that scrapes ``jobtrace metrics`` has every rank as a label; without one, the list is empty,
"All" still applies and a typed rank is accepted."""


def _variables() -> list[dict[str, Any]]:
    job = JOB_LABEL
    nodes = f'label_values({{{job}=~"$job"}}, node)'
    ranks = 'label_values(jobtrace_step{job=~"$job"}, rank)'  # Prometheus keeps `job` for the training job
    return [
        # Grafana's import puts the chosen data source's uid where ${DS_LOKI} is; provisioned, no such uid exists
        # and the variable falls back to the first Loki data source (jobtrace's, the default).
        {"name": "datasource", "label": "Loki", "type": "datasource", "query": "loki", "refresh": 1,
         "current": {"text": "${DS_LOKI}", "value": "${DS_LOKI}"}, "options": [], "hide": 0},
        {"name": "metrics", "label": "Prometheus (rank list)", "type": "datasource", "query": "prometheus",
         "refresh": 1, "options": [], "hide": 0,
         "description": "Optional: the Prometheus scraping `jobtrace metrics`, whose labels list the ranks"},
        {"name": "job", "label": "Job", "type": "query", "datasource": PANEL_DS, "query": f"label_values({job})",
         "definition": f"label_values({job})", "refresh": 2, "sort": 1, "multi": True, "includeAll": False,
         "options": [], "description": f"Job ids: the `{job}` stream label"},
        {"name": "node", "label": "Node", "type": "query", "datasource": PANEL_DS, "query": nodes,
         "definition": nodes, "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
         "current": {"text": "All", "value": "$__all"}, "options": []},
        {"name": "rank", "label": "Rank", "type": "query", "datasource": METRICS_DS, "query": ranks,
         "definition": ranks, "refresh": 2, "sort": 3, "multi": True, "includeAll": True, "allValue": ".+",
         "allowCustomValue": True, "current": {"text": "All", "value": "$__all"}, "options": [],
         "description": "Ranks, listed by the Prometheus above; type one (or a regex) where there is none"},
    ]


def _annotations(lib: QueryLibrary) -> list[dict[str, Any]]:
    """Findings on every panel's time axis: what jobtrace flagged in the job (its own warning records:
    stalls with stacks, guard actions, SIGTERM, crashes) and, off by default, every error record."""
    return [
        {"name": "jobtrace findings", "datasource": PANEL_DS, "enable": True, "hide": False, "iconColor": "orange",
         "expr": lib.grafana("findings"), "titleFormat": "{{level}}: rank {{rank}} on {{node}}",
         "textFormat": "{{msg}}", "tagKeys": "level,node,logger"},
        {"name": "Errors", "datasource": PANEL_DS, "enable": False, "hide": False, "iconColor": "red",
         "expr": lib.grafana("errors"), "titleFormat": "{{level}}: rank {{rank}} on {{node}}",
         "textFormat": "{{msg}}", "tagKeys": "level,node,logger"},
    ]


def link(title: str, url: str, tooltip: str) -> dict[str, Any]:
    """A dashboard link carrying the time range and the variables (Grafana adds them: keepTime, includeVars),
    with every field the dashboard schema requires."""
    return {"title": title, "type": "link", "url": url, "icon": "dashboard", "tooltip": tooltip, "tags": [],
            "asDropdown": False, "targetBlank": False, "includeVars": True, "keepTime": True}


def _panel(lib: QueryLibrary, p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    q = lib[p.query]
    target: dict[str, Any] = {
        "refId": "A", "datasource": PANEL_DS, "expr": lib.grafana(p.query), "editorMode": "code",
        "queryType": "instant" if p.instant else "range",
    }
    if q.type == "metric":
        target["legendFormat"] = p.legend
    else:
        target["maxLines"] = 1000
    panel: dict[str, Any] = {
        "id": pid, "type": p.type, "title": p.title,
        "description": f"{q.answers}\n\nlibrary: {p.query}",
        "datasource": PANEL_DS, "gridPos": {"x": x, "y": y, "w": p.w, "h": p.h}, "targets": [target],
    }
    defaults: dict[str, Any] = {}
    if p.unit or q.unit:
        defaults["unit"] = p.unit or q.unit
    if q.type == "metric":
        panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    if p.type == "logs":
        panel["options"] = {"showTime": True, "wrapLogMessage": True, "prettifyLogMessage": False,
                            "enableLogDetails": True, "sortOrder": "Descending", "dedupStrategy": "none"}
    elif p.options is not None:
        panel["options"] = p.options
    if p.type == "table":
        panel["transformations"] = [{"id": "reduce", "options": {"reducers": ["lastNotNull"]}}]
    return panel


def dashboard(uid: str, lib: QueryLibrary | None = None) -> dict[str, Any]:
    lib = lib or library()
    title, description, rows = DASHBOARDS[uid]
    panels = []
    y = 0
    pid = 1
    for row in rows:
        if sum(p.w for p in row) != 24:
            raise ValueError(f"{uid}: a row of panels is {sum(p.w for p in row)} wide, not 24")
        x = 0
        for p in row:
            panels.append(_panel(lib, p, pid, x, y))
            pid += 1
            x += p.w
        y += max(p.h for p in row)
    links = [link(t, f"/d/{u}", d.split(".")[0]) for u, (t, d, _) in DASHBOARDS.items() if u != uid]
    return {
        "__inputs": INPUTS,
        "__requires": [{"type": "datasource", "id": "loki", "name": "Loki", "version": "1.0.0"}],
        "id": None, "uid": uid, "title": title, "description": description,
        "tags": ["jobtrace", "loki", "training"], "timezone": "browser", "editable": True, "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "schemaVersion": 39, "version": 1,
        "templating": {"list": _variables()}, "annotations": {"list": _annotations(lib)}, "links": links,
        "panels": panels,
    }


def rules_yaml(lib: QueryLibrary | None = None) -> str:
    """The Loki ruler rule file (Prometheus rule-group format with LogQL expressions)."""
    import yaml

    lib = lib or library()
    rules = []
    for a in lib.alerts:
        rules.append({
            "alert": a.alert, "expr": lib.alert_expr(a), "for": a.for_,
            "labels": {"severity": a.severity, "source": "jobtrace"},
            "annotations": {"summary": a.summary, "description": a.description},
        })
    doc = {"groups": [{"name": "jobtrace", "interval": "1m", "rules": rules}]}
    header = ("# Generated from loki/queries.yaml by `python -m loki build`; edit the library, not this file.\n"
              "# Loki ruler rules: put this file under <ruler.storage.local.directory>/<tenant>/ (tenant `fake`\n"
              "# when auth_enabled is false), or load it with `lokitool rules sync` / cortextool.\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=10_000, allow_unicode=True)


def vlogs_rules_yaml(lib: QueryLibrary | None = None, *, interval: str = "30s",
                     overrides: dict[str, dict[str, Any]] | None = None) -> str:
    """vmalert's rule file for VictoriaLogs (``type: vlogs`` groups, LogsQL ``stats`` expressions): the library's
    alerts that have a LogsQL form. ``overrides``: per alert name, parameter values to use instead."""
    import yaml

    lib = lib or library()
    rules = []
    for a in lib.alerts:
        expr = a.logsql_expr(**(overrides or {}).get(a.alert, {}))
        if expr is None:
            continue
        rules.append({
            "alert": a.alert, "expr": expr, "for": a.for_,
            "labels": {"severity": a.severity, "source": "jobtrace"},
            "annotations": {"summary": a.summary, "description": a.description},
        })
    doc = {"groups": [{"name": "jobtrace", "type": "vlogs", "interval": interval, "rules": rules}]}
    header = ("# Generated from loki/queries.yaml by `python -m loki build`; edit the library, not this file.\n"
              "# vmalert rules for VictoriaLogs: vmalert -rule=<this file> -datasource.url=http://victorialogs:9428\n"
              "#   -notifier.url=http://alertmanager:9093 (tests/loki/test_vmalert.py runs them for real).\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=10_000, allow_unicode=True)


def build(lib: QueryLibrary | None = None) -> dict[Path, str]:
    """Every generated file, by path, with its content."""
    lib = lib or library()
    out = {ASSETS / "rules" / "jobtrace-alerts.yaml": rules_yaml(lib),
           ASSETS / "rules" / "jobtrace-vlogs-alerts.yaml": vlogs_rules_yaml(lib)}
    for uid in DASHBOARDS:
        out[ASSETS / "grafana" / "dashboards" / f"{uid}.json"] = json.dumps(dashboard(uid, lib), indent=2) + "\n"
    return out


def write() -> list[Path]:
    written = []
    for path, text in build().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def check() -> list[Path]:
    """Generated files that are missing or differ from the library."""
    return [p for p, text in build().items() if not p.exists() or p.read_text(encoding="utf-8") != text]
