"""Turning a :class:`Report` into text: rich for people, JSON for machines.

``format_*`` functions return renderables or strings; ``print_report`` writes them to
one injected ``Console`` so tests can capture exactly what a user sees.
"""

from __future__ import annotations

from typing import Any

import orjson
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._analysis import Report

__all__ = ["format_json", "print_report"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS = {"ok": "green", "slow": "yellow", "stalled": "bold red", "silent": "bold red", "waiting": "magenta"}


def format_json(report: Report) -> str:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _summary(report: Report) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("job", report.job_id)
    t.add_row("trace id", ", ".join(report.trace_ids) or "-")
    t.add_row("source", report.source)
    t.add_row("ranks", f"{report.ranks} of world size {report.world_size} on {len(report.nodes)} node(s)")
    steps = f"{report.steps}" + (f" ({report.first_step}–{report.last_step})" if report.steps else "")
    t.add_row("steps", steps)
    t.add_row("wall time", f"{report.wall_s:.1f} s")
    if report.step_ms_median is not None:
        rate = f"median step {report.step_ms_median:.1f} ms, {report.steps_per_s:.2f} steps/s"
        for key, value in report.throughput.items():
            rate += f", {value:,.0f} {key.replace('_per_s', '')}/s"
        t.add_row("throughput", rate)
    t.add_row("events", f"{report.events:,}")
    if report.skipped:
        t.add_row("skipped", ", ".join(f"{n} {why}" for why, n in report.skipped.items()))
    return t


def _findings(report: Report) -> Any:
    if not report.findings:
        return Text("healthy: no slow, stalled or failing rank found", style="bold green")
    parts = []
    for f in report.findings:
        parts.append(Text(f"● {f.kind}: ", style=_STYLE.get(f.severity, "")) + Text(f.summary))
        for line in f.evidence:
            parts.append(Text("    " + line.replace("\n", "\n    "), style="dim"))
    return Group(*parts)


def _ranks_table(report: Report, limit: int = 32) -> Table:
    rows = report.per_rank
    if len(rows) > limit:
        flagged = [r for r in rows if r.status != "ok"]
        rows = flagged[:limit] + [r for r in rows if r.status == "ok"][: max(0, limit - len(flagged))]
        rows.sort(key=lambda r: r.rank)
    t = Table(title=f"per rank (median per step; {len(report.per_rank)} ranks)", show_lines=False)
    for col in ("rank", "node", "steps", "step ms", "compute ms", "collective ms", "data ms", "last step", "status"):
        t.add_column(col, justify="right" if col not in ("node", "status") else "left")

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    for r in rows:
        t.add_row(str(r.rank), r.node, str(r.steps), f(r.step_ms), f(r.compute_ms), f(r.collective_ms),
                  f(r.data_ms), "-" if r.last_step is None else str(r.last_step),
                  Text(r.status, style=_STATUS.get(r.status, "")))
    return t


def print_report(report: Report, console: Console) -> None:
    verdict = "HEALTHY" if report.healthy else "PROBLEM FOUND"
    style = "green" if report.healthy else "red"
    console.print(Panel(_summary(report), title=f"trace-job {report.job_id}: {verdict}", border_style=style))
    console.print(Panel(_findings(report), title="findings", border_style=style))
    console.print(_ranks_table(report))
