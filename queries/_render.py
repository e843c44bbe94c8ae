"""Turning a :class:`Report` into text: rich for people, JSON for machines.

``format_*`` functions return renderables or strings; ``print_report`` writes them to
one injected ``Console`` so tests can capture exactly what a user sees.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final

import orjson
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._analysis import Report

__all__ = ["format_json", "print_report"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS = {"ok": "green", "slow": "yellow", "failed": "bold red", "stalled": "bold red", "silent": "bold red", "waiting": "magenta",
           "mismatch": "bold red", "late": "yellow", "data": "yellow", "stalls": "yellow"}
_ICON = {"error": "●", "warning": "▲", "info": "ℹ"}


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
    b = report.breakdown
    if b:
        t.add_row("time shares", f"compute {b['compute_share']:.0%}, communication {b['comm_share']:.0%}, "
                                 f"data {b['data_share']:.0%}" + (f", idle {b['idle_share']:.0%}"
                                                                  if b.get("idle_share") is not None else ""))
    clocks = report.clocks
    if clocks and clocks.get("applied"):
        shifts = ", ".join(f"{n} {clocks['offsets_ms'][n]:+.1f} ms" for n in clocks["applied"])
        t.add_row("clocks", f"aligned to {clocks['reference']}'s: {shifts}")
    if report.golden:
        t.add_row("compared with", ", ".join(report.golden) + (f" ({report.golden_choice})" if report.golden_choice
                                                               else ""))
    if report.skipped:
        t.add_row("skipped", ", ".join(f"{n} {why}" for why, n in report.skipped.items()))
    for caveat in report.caveats:
        t.add_row(Text("caveat", style="bold yellow"), Text(caveat, style="yellow"))
    return t


def _findings(report: Report, evidence_lines: int = 40) -> Any:
    parts: list[Any] = []
    if report.healthy:
        parts.append(Text("healthy: no slow, stalled or failing rank found", style="bold green"))
    for f in report.findings:
        parts.append(Text(f"{_ICON.get(f.severity, '●')} {f.kind}: ", style=_STYLE.get(f.severity, "")) + Text(f.summary))
        shown = 0
        for line in f.evidence:
            lines = line.split("\n")
            if shown + len(lines) > evidence_lines:
                lines = lines[: max(1, evidence_lines - shown)] + ["…"]
            parts.append(Text("    " + "\n    ".join(lines), style="dim"))
            shown += len(lines)
            if shown >= evidence_lines:
                break
        if f.refs:
            r0 = f.refs[0]
            cite = f"rank {r0['rank']}" + (f" step {r0['step']}" if r0.get("step") is not None else "")
            cite += f" span {r0['span_id']}" if r0.get("span_id") else ""
            more = f" (+{len(f.refs) - 1} more)" if len(f.refs) > 1 else ""
            parts.append(Text(f"    events: {cite}{more}", style="dim"))
        for name, url in f.links.items():
            parts.append(Text(f"    {name}: ", style="dim") + Text(url, style="link " + url))
    return Group(*parts)


#: the per-rank table's columns, most wanted first: a narrow terminal (or a pipe: 80 columns) drops from the end
_RANK_COLUMNS: Final = ("rank", "status", "step ms", "compute ms", "collective ms", "node", "score", "last step",
                        "data ms", "last arr.", "steps")
_LEGEND: Final = {
    "score": "score: the fastest rank's median step ÷ this rank's (1.00 fastest; flagged below 0.75)",
    "last arr.": "last arr.: collectives this rank arrived at last (the others waited for it)",
}


def _rank_cells(r: Any) -> dict[str, Any]:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    return {"rank": str(r.rank), "node": r.node, "steps": str(r.steps), "step ms": f(r.step_ms),
            "compute ms": f(r.compute_ms), "collective ms": f(r.collective_ms), "data ms": f(r.data_ms),
            "score": "-" if r.score is None else f"{r.score:.2f}", "last arr.": str(r.last_arrivals),
            "last step": "-" if r.last_step is None else str(r.last_step),
            "status": Text(r.status, style=_STATUS.get(r.status, ""))}


def _ranks_table(report: Report, limit: int = 32, width: int = 120) -> tuple[Table, list[str]]:
    """The per-rank table that fits ``width``: columns dropped by :data:`_RANK_COLUMNS`' priority, never a
    header or a value cut; and the legend lines (what its terms mean, what was dropped)."""
    rows = report.per_rank
    if len(rows) > limit:
        flagged = [r for r in rows if r.status != "ok"]
        rows = flagged[:limit] + [r for r in rows if r.status == "ok"][: max(0, limit - len(flagged))]
        rows.sort(key=lambda r: r.rank)
    cells = [_rank_cells(r) for r in rows]
    need = {c: max([len(c)] + [len(str(row[c])) for row in cells]) for c in _RANK_COLUMNS}
    kept: list[str] = []
    used = 1  # the table's left border
    for col in _RANK_COLUMNS:
        if used + need[col] + 3 > width and len(kept) >= 2:  # padding on both sides and a border
            break  # this one and every later (less wanted) one
        kept.append(col)
        used += need[col] + 3
    t = Table(title=f"per rank (median per step; {len(report.per_rank)} ranks)", show_lines=False)
    for col in (c for c in _RANK_COLUMNS if c in kept):
        t.add_column(col, justify="left" if col in ("node", "status") else "right", no_wrap=True,
                     min_width=need[col])
    for row in cells:
        t.add_row(*(row[c] for c in _RANK_COLUMNS if c in kept))
    legend = [text for col, text in _LEGEND.items() if col in kept]
    dropped = [c for c in _RANK_COLUMNS if c not in kept]
    if dropped:
        legend.append(f"not shown at this width: {', '.join(dropped)} (a wider terminal, or --json, has them)")
    return t, legend


def _nodes_table(report: Report, limit: int = 16) -> Table | None:
    if len(report.per_node) < 2:
        return None
    nodes = sorted(report.per_node, key=lambda n: (n.score if n.score is not None else 1.0))[:limit]
    t = Table(title=f"per node (slowest {len(nodes)} of {len(report.per_node)})")
    for col in ("node", "ranks", "compute ms", "score", "last arrivals", "flagged ranks"):
        t.add_column(col, justify="left" if col in ("node", "flagged ranks") else "right")
    for n in nodes:
        t.add_row(n.node, str(len(n.ranks)), "-" if n.compute_ms is None else f"{n.compute_ms:.1f}",
                  "-" if n.score is None else f"{n.score:.2f}", str(n.last_arrivals),
                  ",".join(map(str, n.slow_ranks)) or "-")
    return t


_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    """``text`` with control characters written out (``\\x1b``): a log line's ``ESC]0;…BEL`` or ``ESC[2J``
    must not retitle or clear the reader's terminal (issue 20). Newlines and tabs stay."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _defanged(value: Any) -> Any:
    """A copy of a report's value (dataclasses, dicts, lists, strings) with every string :func:`_visible`."""
    if isinstance(value, str):
        return _visible(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _defanged(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, dict):
        return {_defanged(k): _defanged(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(_defanged(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_defanged(v) for v in value)
    return value


def print_report(report: Report, console: Console) -> None:
    report = _defanged(report)
    verdict = "HEALTHY" if report.healthy else "PROBLEM FOUND"
    style = "green" if report.healthy else "red"
    console.print(Panel(_summary(report), title=f"trace-job {report.job_id}: {verdict}", border_style=style))
    console.print(Panel(_findings(report), title="findings", border_style=style))
    table, legend = _ranks_table(report, width=console.width)
    console.print(table)
    for line in legend:
        console.print(Text(line, style="dim"), soft_wrap=False)
    nodes = _nodes_table(report)
    if nodes is not None:
        console.print(nodes)
