"""Rebuilding a job from its events and naming the slow or stalled rank.

    from queries import load_local, analyze
    report = analyze(load_local("jobtrace-data", "my-job"))
"""

from __future__ import annotations

from ._analysis import AnalysisConfig, Finding, RankSummary, Report, analyze
from ._render import format_json, print_report
from ._store import JobData, ReadStats, list_local_jobs, load_events, load_local

__all__ = [
    "AnalysisConfig",
    "Finding",
    "JobData",
    "RankSummary",
    "ReadStats",
    "Report",
    "analyze",
    "format_json",
    "list_local_jobs",
    "load_events",
    "load_local",
    "print_report",
]
