"""The Grafana monitoring board on Prometheus: ``metrics/grafana/jobtrace-metrics.json``, generated here.

    python -m metrics build    # rewrite the dashboard
    python -m metrics check    # exit 1 when the committed file differs

Panels query the series of :mod:`metrics._state` and :mod:`metrics._gpu` (and dcgm-exporter's ``DCGM_FI_*``
beside them, for its users) through a
``${datasource}`` variable, so the board imports into any Grafana (``__inputs``). A panel's data link opens
the logs of that job and rank at that time (the ``jobtrace-logs`` board, on Loki); the step-time heatmap
shows exemplars, each the trace of a step (the data source's exemplar link opens it in Tempo). Prometheus'
``ALERTS`` for jobtrace's rules are annotations, and so are jobtrace's findings in the job's logs (the Loki
query library's ``findings``, on an optional ``${logs}`` Loki variable). The job, rank and node lists are
label queries; every link carries the fields Grafana's dashboard schema requires (tests/loki/grafana_schema).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

__all__ = ["DASHBOARD_PATH", "PANELS", "dashboard", "main"]

DASHBOARD_PATH: Final = Path(__file__).parent / "grafana" / "jobtrace-metrics.json"
DS: Final = {"type": "prometheus", "uid": "${datasource}"}
SEL: Final = 'job=~"$job", rank=~"$rank"'
"""Every per-rank query's selector: the chosen jobs and ranks."""

# (title, type, width, height, unit, [(expr, legend)], extra options)
PANELS: Final[list[list[tuple[str, str, int, int, str, list[tuple[str, str]], dict[str, Any]]]]] = [
    [("Step time per rank (s): a straggler's row is bright", "heatmap", 24, 10, "s",
      [(f"jobtrace_step_seconds{{{SEL}}}", "rank {{rank}}")],
      {"calculate": False, "yAxis": {"axisLabel": "rank"}, "color": {"scheme": "Oranges", "mode": "scheme"}})],
    [("Step-time distribution (exemplars: a step's trace)", "heatmap", 12, 9, "s",
      [(f"sum by (le) (rate(jobtrace_step_duration_seconds_bucket{{{SEL}}}[$__rate_interval]))", "{{le}}")],
      {"calculate": False, "exemplars": {"color": "rgba(255,0,255,0.7)"}, "yAxis": {"unit": "s"}}),
     ("Compute per rank (step less its collective wait: the straggler is highest)", "timeseries", 12, 9, "s",
      [(f"jobtrace_compute_seconds{{{SEL}}}", "rank {{rank}}")], {})],
    [("Throughput", "timeseries", 12, 8, "short",
      [('sum by (job) (rate(jobtrace_steps_total{job=~"$job"}[$__rate_interval]))', "{{job}} steps/s"),
       ('sum by (job) (jobtrace_samples_per_second{job=~"$job"})', "{{job}} samples/s"),
       ('sum by (job) (jobtrace_tokens_per_second{job=~"$job"})', "{{job}} tokens/s")], {}),
     ("Collective wait per rank (s)", "timeseries", 12, 8, "s",
      [(f"jobtrace_collective_seconds{{{SEL}}}", "rank {{rank}}")], {})],
    [("Loss", "timeseries", 8, 8, "short", [(f"jobtrace_loss{{{SEL}}}", "rank {{rank}}")], {}),
     ("Grad norm", "timeseries", 8, 8, "short", [(f"jobtrace_grad_norm{{{SEL}}}", "rank {{rank}}")], {}),
     ("Learning rate", "timeseries", 8, 8, "short", [(f"jobtrace_learning_rate{{{SEL}}}", "rank {{rank}}")], {})],
    [("Host memory (RSS) per rank", "timeseries", 8, 8, "bytes",
      [(f"jobtrace_host_rss_bytes{{{SEL}}}", "rank {{rank}}")], {}),
     ("CUDA memory per rank", "timeseries", 8, 8, "bytes",
      [(f"jobtrace_cuda_allocated_bytes{{{SEL}}}", "rank {{rank}} allocated"),
       (f"jobtrace_cuda_reserved_bytes{{{SEL}}}", "rank {{rank}} reserved")], {}),
     ("CUDA fragmentation (reserved - allocated)", "timeseries", 8, 8, "bytes",
      [(f"jobtrace_cuda_reserved_bytes{{{SEL}}} - jobtrace_cuda_allocated_bytes{{{SEL}}}", "rank {{rank}}")],
      {})],
    [("GPU utilisation", "timeseries", 6, 8, "percentunit",
      [('jobtrace_gpu_utilization_ratio{node=~"$node"}', "{{node}} GPU {{gpu}}"),
       ("DCGM_FI_DEV_GPU_UTIL / 100", "{{Hostname}} GPU {{gpu}} (dcgm)")], {}),
     ("GPU memory used", "timeseries", 6, 8, "bytes",
      [('jobtrace_gpu_memory_used_bytes{node=~"$node"}', "{{node}} GPU {{gpu}}"),
       ("DCGM_FI_DEV_FB_USED * 1048576", "{{Hostname}} GPU {{gpu}} (dcgm)")], {}),
     ("GPU power", "timeseries", 6, 8, "watt",
      [('jobtrace_gpu_power_watts{node=~"$node"}', "{{node}} GPU {{gpu}}"),
       ("DCGM_FI_DEV_POWER_USAGE", "{{Hostname}} GPU {{gpu}} (dcgm)")], {}),
     ("NVLink throughput", "timeseries", 6, 8, "Bps",
      [('sum by (node, gpu) (rate(jobtrace_gpu_nvlink_bytes_total{node=~"$node"}[$__rate_interval]))',
        "{{node}} GPU {{gpu}}"),
       ("DCGM_FI_PROF_NVLINK_TX_BYTES + DCGM_FI_PROF_NVLINK_RX_BYTES", "{{Hostname}} GPU {{gpu}} (dcgm)")], {})],
    [("Kernel events: Xid, ECC, NVLink, OOM killer (per node)", "timeseries", 12, 8, "short",
      [('increase(jobtrace_node_kernel_events_total{node=~"$node"}[$__rate_interval])', "{{node}} {{kind}}"),
       ("DCGM_FI_DEV_XID_ERRORS", "{{Hostname}} GPU {{gpu}} last Xid (dcgm)")], {}),
     ("GPU throttling and ECC", "timeseries", 12, 8, "short",
      [('jobtrace_gpu_clock_event_active{node=~"$node", reason!~"gpu_idle|applications_clocks"} > 0',
        "{{node}} GPU {{gpu}} {{reason}}"),
       ('increase(jobtrace_gpu_ecc_errors_total{node=~"$node"}[$__rate_interval])',
        "{{node}} GPU {{gpu}} ECC {{type}}")], {})],
    [("Heartbeat age per rank (grows on a hang)", "timeseries", 12, 8, "s",
      [(f"jobtrace_heartbeat_age_seconds{{{SEL}}}", "rank {{rank}}")], {}),
     ("Last step per rank", "timeseries", 12, 8, "short", [(f"jobtrace_step{{{SEL}}}", "rank {{rank}}")], {})],
]

LOGS_DS: Final = {"type": "loki", "uid": "${logs}"}
"""The Loki jobtrace ships to, for the findings annotations (optional: without one the board works, less them)."""


def _link(title: str, url: str, tooltip: str, *, keep: bool) -> dict[str, Any]:
    """A link with every field Grafana's dashboard schema requires (it types data links the same way).
    ``keep``: Grafana adds the time range and the variables itself (dashboard links)."""
    return {"title": title, "type": "link", "url": url, "icon": "dashboard", "tooltip": tooltip, "tags": [],
            "asDropdown": False, "targetBlank": False, "includeVars": keep, "keepTime": keep}


_LOGS_LINK: Final = _link(
    "Logs of job ${__field.labels.job}, rank ${__field.labels.rank}, at this time",
    "/d/jobtrace-logs?var-job=${__field.labels.job}&var-rank=${__field.labels.rank}&${__url_time_range}",
    "The jobtrace-logs board (Loki) on this series' job and rank", keep=False)


def _variables() -> list[dict[str, Any]]:
    # Label queries as Grafana's Prometheus data source takes them (a string: the schema's form for a query).
    jobs, ranks, nodes = ("label_values(jobtrace_step, job)", 'label_values(jobtrace_step{job=~"$job"}, rank)',
                          'label_values(jobtrace_step{job=~"$job"}, node)')
    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "refresh": 1,
         "current": {"text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}, "options": [], "hide": 0},
        {"name": "logs", "label": "Loki (findings)", "type": "datasource", "query": "loki", "refresh": 1,
         "options": [], "hide": 0, "description": "Optional: the Loki jobtrace ships to, for the findings annotations"},
        {"name": "job", "label": "Job", "type": "query", "datasource": DS, "query": jobs, "definition": jobs,
         "refresh": 2, "sort": 1, "multi": True, "includeAll": False, "options": []},
        {"name": "rank", "label": "Rank", "type": "query", "datasource": DS, "query": ranks, "definition": ranks,
         "refresh": 2, "sort": 3, "multi": True, "includeAll": True, "allValue": ".+",
         "current": {"text": "All", "value": "$__all"}, "options": []},
        {"name": "node", "label": "Node", "type": "query", "datasource": DS, "query": nodes, "definition": nodes,
         "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".+",
         "current": {"text": "All", "value": "$__all"}, "options": []},
    ]


def _annotations() -> list[dict[str, Any]]:
    """Alerts firing from jobtrace's Prometheus rules, and what jobtrace flagged in the job's logs (the Loki
    boards' "jobtrace findings": the library's ``findings`` query)."""
    import loki

    return [
        {"name": "jobtrace alerts", "enable": True, "hide": False, "iconColor": "red", "datasource": DS,
         "expr": 'ALERTS{alertname=~"Jobtrace.*", alertstate="firing", job=~"$job"}',
         "titleFormat": "{{alertname}}", "textFormat": "rank {{rank}} {{node}}", "useValueForTime": False,
         "step": "60s"},
        {"name": "jobtrace findings", "enable": True, "hide": False, "iconColor": "orange", "datasource": LOGS_DS,
         "expr": loki.library().grafana("findings"), "titleFormat": "{{level}}: rank {{rank}} on {{node}}",
         "textFormat": "{{msg}}", "tagKeys": "level,node,logger"},
    ]


def _panel(pid: int, x: int, y: int, title: str, kind: str, w: int, h: int, unit: str,
           queries: list[tuple[str, str]], options: dict[str, Any]) -> dict[str, Any]:
    targets = [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend,
                "editorMode": "code", "range": True, "exemplar": kind == "heatmap" and "bucket" in expr,
                **({"format": "heatmap"} if "_bucket" in expr else {})}
               for i, (expr, legend) in enumerate(queries)]
    panel: dict[str, Any] = {
        "id": pid, "type": kind, "title": title, "datasource": DS, "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets, "fieldConfig": {"defaults": {"unit": unit, "links": [] if "DCGM" in queries[0][0]
                                                         else [_LOGS_LINK]}, "overrides": []},
    }
    if options:
        panel["options"] = options
    return panel


def dashboard() -> dict[str, Any]:
    panels, y, pid = [], 0, 1
    for row in PANELS:
        if sum(p[2] for p in row) != 24:
            raise ValueError(f"a row of panels is {sum(p[2] for p in row)} wide, not 24")
        x = 0
        for title, kind, w, h, unit, queries, options in row:
            panels.append(_panel(pid, x, y, title, kind, w, h, unit, queries, options))
            pid, x = pid + 1, x + w
        y += max(p[3] for p in row)
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus",
                      "pluginName": "Prometheus", "description": "The Prometheus that scrapes `jobtrace metrics`"}],
        "__requires": [{"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
        "id": None, "uid": "jobtrace-metrics", "title": "jobtrace: training metrics",
        "description": "Per-rank step time, throughput, loss, memory, collective wait and the GPUs, from "
                       "`jobtrace metrics` (and dcgm-exporter). A point's link opens that rank's logs.",
        "tags": ["jobtrace", "prometheus", "training"], "timezone": "browser", "editable": True, "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "schemaVersion": 39, "version": 1,
        "templating": {"list": _variables()},
        "annotations": {"list": _annotations()},
        "links": [_link("jobtrace: logs with trace links", "/d/jobtrace-logs",
                        "The job's logs and timeline on Loki", keep=True)],
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    """``python -m metrics build`` writes the dashboard; ``check`` exits 1 when the committed one is stale."""
    if argv[:1] == ["build"]:
        DASHBOARD_PATH.parent.mkdir(exist_ok=True)
        DASHBOARD_PATH.write_text(render())
        print(f"wrote {DASHBOARD_PATH}")
        return 0
    if argv[:1] == ["check"]:
        stale = not DASHBOARD_PATH.exists() or DASHBOARD_PATH.read_text() != render()
        print(f"{DASHBOARD_PATH}: {'stale (python -m metrics build)' if stale else 'current'}")
        return 1 if stale else 0
    print("usage: python -m metrics build|check", file=sys.stderr)
    return 2
