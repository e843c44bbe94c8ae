"""Rebuilding a job from its events and naming the slow or stalled rank, and why.

    from queries import load_local, analyze
    report = analyze(load_local("jobtrace-data", "my-job"))
"""

from __future__ import annotations

from ._alerts import Webhook, alertmanager_payload, slack_payload
from ._analysis import AnalysisConfig, EventRef, Finding, NodeSummary, RankSummary, Report, analyze
from ._backends import BACKENDS, TimeRange, load_job
from ._flight_recorder import add_flight_recorder, load_flight_recorder, read_flight_recorder
from ._golden import (
    GoldenProfile,
    choose_golden,
    compare_to_golden,
    deviation_score,
    golden_dir,
    leave_one_out,
    list_golden,
    load_golden,
    profile_distance,
    profile_job,
    remove_golden,
    save_golden,
)
from ._golden_library import FolderLibrary, GoldenLibrary, LokiLibrary, SearchLibrary, open_library
from ._links import LinkConfig, attach_links, grafana_explore_url, kibana_discover_url, kql_query, logql_query
from ._live import Alert, LiveConfig, LiveState
from ._outside import add_outside_evidence, classify_kernel_line, kernel_evidence, read_kernel_log, slurm_evidence
from ._perfetto import write_perfetto
from ._render import format_json, print_report
from ._server_jobs import SERVER_JOB_BACKENDS, list_server_jobs
from ._store import JobData, ReadStats, list_local_jobs, load_events, load_local
from ._tail import TAIL_BACKENDS, ElasticsearchTail, LocalTail, LokiTail, Tail, VictoriaLogsTail, open_tail
from ._timeline import timeline_data, write_timeline_html
from ._trace import TraceOptions, mark_golden, trace_job

__all__ = [
    "Alert",
    "AnalysisConfig",
    "BACKENDS",
    "ElasticsearchTail",
    "EventRef",
    "Finding",
    "FolderLibrary",
    "GoldenLibrary",
    "GoldenProfile",
    "JobData",
    "LinkConfig",
    "LiveConfig",
    "LiveState",
    "LocalTail",
    "LokiLibrary",
    "LokiTail",
    "NodeSummary",
    "RankSummary",
    "ReadStats",
    "Report",
    "SERVER_JOB_BACKENDS",
    "SearchLibrary",
    "TAIL_BACKENDS",
    "Tail",
    "TimeRange",
    "TraceOptions",
    "VictoriaLogsTail",
    "Webhook",
    "add_flight_recorder",
    "add_outside_evidence",
    "alertmanager_payload",
    "analyze",
    "attach_links",
    "choose_golden",
    "classify_kernel_line",
    "compare_to_golden",
    "deviation_score",
    "format_json",
    "golden_dir",
    "grafana_explore_url",
    "kernel_evidence",
    "kibana_discover_url",
    "kql_query",
    "leave_one_out",
    "list_golden",
    "list_local_jobs",
    "list_server_jobs",
    "load_events",
    "load_flight_recorder",
    "load_golden",
    "load_job",
    "load_local",
    "logql_query",
    "mark_golden",
    "open_library",
    "open_tail",
    "print_report",
    "profile_distance",
    "profile_job",
    "read_flight_recorder",
    "read_kernel_log",
    "remove_golden",
    "save_golden",
    "slack_payload",
    "slurm_evidence",
    "timeline_data",
    "trace_job",
    "write_perfetto",
    "write_timeline_html",
]
