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
from rich.padding import Padding
from rich.panel import Panel
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ._analysis import Report
from ._text import count, shares

__all__ = ["format_json", "print_report"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS = {"ok": "green", "slow": "yellow", "failed": "bold red", "stalled": "bold red", "silent": "bold red", "waiting": "magenta",
           "mismatch": "bold red", "late": "yellow", "data": "yellow", "stalls": "yellow"}
_ICON = {"error": "●", "warning": "▲", "info": "ℹ"}


def format_json(report: Report) -> str:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _warmup(report: Report) -> int:
    """Steps the per-rank medians leave out at the start (the warm-up), read from the ranks' step counts."""
    counted = max((r.steps for r in report.per_rank), default=0)
    return report.steps - counted if counted and report.steps > counted else 0


def _first(n: int) -> str:
    return "the first step" if n == 1 else f"the first {n:,} steps"


def _time_shares(b: dict[str, Any]) -> str:
    """The step-time split as percentages that add up to 100 (or say what they add up to, and why).

    compute is what a step leaves after its collectives and data wait, so the three cover the step; "idle"
    (time outside any phase span) is not a fourth share: it overlaps them (collectives issued between phases
    are both), so it is stated apart rather than summed in (issue 25 saw 53 + 44 + 3 + 29 = 129 %).
    """
    pct = shares({"compute": b["compute_share"], "communication": b["comm_share"], "data": b["data_share"]})
    text = ", ".join(f"{k} {v}%" for k, v in pct.items()) + " of step time"
    total = sum(pct.values())
    if total != 100:
        text += f" (they add up to {total}%: some collectives overlap the data wait)" if total > 100 else \
            f" (they add up to {total}%)"
    if b.get("idle_share") is not None and round(b["idle_share"] * 100) > 0:
        text += f"; {round(b['idle_share'] * 100)}% of it outside any phase span (part of the above, not added)"
    return text


def _summary(report: Report) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()

    def row(label: str | Text, value: str | Text) -> None:  # Text: log text and names are never read as markup
        t.add_row(label, value if isinstance(value, Text) else Text(value))

    row("job", report.job_id)
    row("trace id", ", ".join(report.trace_ids) or "-")
    row("source", report.source)
    row("ranks", f"{report.ranks:,} of world size {report.world_size:,} on {count(len(report.nodes), 'node')}")
    steps = f"{report.steps:,}" + (f" ({report.first_step}–{report.last_step})" if report.steps else "")
    if warm := _warmup(report):
        steps += f"; the per-rank medians leave out {_first(warm)} (warm-up)"
    row("steps", steps)
    row("wall time", f"{report.wall_s:.1f} s")
    if report.step_ms_median is not None:
        rate = f"median step {report.step_ms_median:.1f} ms, {report.steps_per_s:.2f} steps/s"
        for key, value in report.throughput.items():
            rate += f", {value:,.0f} {key.replace('_per_s', '')}/s"
        row("throughput", rate)
    row("events", f"{report.events:,}")
    if report.breakdown:
        row("time shares", _time_shares(report.breakdown))
    clocks = report.clocks
    if clocks and clocks.get("applied"):
        shifts = ", ".join(f"{n} {clocks['offsets_ms'][n]:+.1f} ms" for n in clocks["applied"])
        row("clocks", f"aligned to {clocks['reference']}'s: {shifts}")
    if report.golden:
        row("compared with", ", ".join(report.golden) + (f" ({report.golden_choice})" if report.golden_choice else ""))
    if report.skipped:
        row("skipped", ", ".join(f"{why}: {n:,}" for why, n in report.skipped.items()))  # not "2 blank line"
    for caveat in report.caveats:
        row(Text("caveat", style="bold yellow"), Text(caveat, style="yellow"))
    return t


def _indented(text: Text) -> Padding:
    """Evidence under its finding's summary, its wrapped lines indented too (not back at the panel's edge)."""
    return Padding(text, (0, 0, 0, 2))


def _finding(f: Any, evidence_lines: int) -> Table:
    """One finding: its icon in a column of its own, so the summary and evidence wrap under their first word."""
    body: list[Any] = [Text(f"{f.kind}: ", style=_STYLE.get(f.severity, "")) + Text(f.summary)]
    shown = 0
    for line in f.evidence:
        lines = line.split("\n")
        if shown + len(lines) > evidence_lines:
            lines = lines[: max(1, evidence_lines - shown)] + ["…"]
        body.append(_indented(Text("\n".join(lines), style="dim")))
        shown += len(lines)
        if shown >= evidence_lines:
            break
    if f.refs:
        r0 = f.refs[0]
        cite = f"rank {r0['rank']}" + (f", step {r0['step']}" if r0.get("step") is not None else "")
        cite += f", span {r0['span_id']}" if r0.get("span_id") else ""
        more = f" (+{len(f.refs) - 1} more)" if len(f.refs) > 1 else ""
        body.append(_indented(Text(f"events: {cite}{more}", style="dim")))
    for name, url in f.links.items():  # a Style object: a URL is never parsed as a style string
        body.append(_indented(Text(f"{name}: ", style="dim") + Text(url, style=Style(link=url))))
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row(Text(_ICON.get(f.severity, "●"), style=_STYLE.get(f.severity, "")), Group(*body))
    return grid


def _findings(report: Report, evidence_lines: int = 40) -> Any:
    parts: list[Any] = []
    if report.healthy:
        parts.append(Text("healthy: no slow, stalled or failing rank found", style="bold green"))
    parts += [_finding(f, evidence_lines) for f in report.findings]
    return Group(*parts)


#: the per-rank table's columns, most wanted first: a narrow terminal (or a pipe: 80 columns) drops from the end
_RANK_COLUMNS: Final = ("rank", "status", "step ms", "compute ms", "collective ms", "node", "score", "last step",
                        "data ms", "last arr.", "steps")
_LEGEND: Final = {
    "compute ms": "ms columns: each its own median over the steps, so they need not add up to step ms",
    "score": "score: the fastest rank's median compute time ÷ this rank's (1.00 = the fastest; lower is slower)",
    "last arr.": "last arr.: collectives this rank arrived at last (the others waited for it)",
    "steps": "steps: the steps in this rank's medians",
}
_NODE_COLUMNS: Final = ("node", "ranks", "compute ms", "score", "flagged ranks", "last arrivals")
_NODE_LEGEND: Final = {"score": "score (per node): the fastest node's median compute time ÷ this node's"}


def _rank_cells(r: Any) -> dict[str, Any]:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    return {"rank": str(r.rank), "node": Text(r.node), "steps": str(r.steps), "step ms": f(r.step_ms),
            "compute ms": f(r.compute_ms), "collective ms": f(r.collective_ms), "data ms": f(r.data_ms),
            "score": "-" if r.score is None else f"{r.score:.2f}", "last arr.": str(r.last_arrivals),
            "last step": "-" if r.last_step is None else str(r.last_step),
            "status": Text(r.status, style=_STATUS.get(r.status, ""))}


def _fit(columns: tuple[str, ...], cells: list[dict[str, Any]], width: int, title: str,
         left: tuple[str, ...]) -> tuple[Table, list[str]]:
    """A table of ``columns`` (most wanted first) that fits ``width``: the least wanted columns dropped whole,
    never a header or a value cut ("ste…"); and the names of those dropped."""
    need = {c: max([len(c)] + [len(str(row[c])) for row in cells]) for c in columns}
    kept: list[str] = []
    used = 1  # the table's left border
    for col in columns:
        if used + need[col] + 3 > width and len(kept) >= 2:  # padding on both sides and a border
            break  # this one and every later (less wanted) one
        kept.append(col)
        used += need[col] + 3
    t = Table(title=title, show_lines=False)
    for col in kept:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=True, min_width=need[col])
    for row in cells:
        t.add_row(*(row[c] for c in kept))
    return t, [c for c in columns if c not in kept]


def _ranks_table(report: Report, limit: int = 32, width: int = 120) -> tuple[Table, list[str]]:
    """The per-rank table that fits ``width``: columns dropped by :data:`_RANK_COLUMNS`' priority, never a
    header or a value cut; and the legend lines (what its terms mean, what was dropped)."""
    rows = report.per_rank
    if len(rows) > limit:
        flagged = [r for r in rows if r.status != "ok"]
        rows = flagged[:limit] + [r for r in rows if r.status == "ok"][: max(0, limit - len(flagged))]
        rows.sort(key=lambda r: r.rank)
    cells = [_rank_cells(r) for r in rows]
    shown = (f"{count(len(report.per_rank), 'rank')}" if len(rows) == len(report.per_rank)
             else f"{len(rows)} of {count(len(report.per_rank), 'rank')}, the flagged first")
    t, dropped = _fit(_RANK_COLUMNS, cells, width, f"per rank (median per step; {shown})", ("node", "status"))
    legend = [text for col, text in _LEGEND.items() if col not in dropped]
    if "steps" not in dropped and (warm := _warmup(report)):
        legend[-1] += f" ({_first(warm)} of the job, the warm-up, left out)"
    if dropped:
        legend.append(f"not shown at this width: {', '.join(dropped)} (a wider terminal, or --json, has them)")
    return t, legend


def _nodes_table(report: Report, limit: int = 16, width: int = 120) -> tuple[Table, list[str]] | None:
    if len(report.per_node) < 2:
        return None
    nodes = sorted(report.per_node, key=lambda n: (n.score if n.score is not None else 1.0))[:limit]
    cells = [{"node": Text(n.node), "ranks": str(len(n.ranks)),
              "compute ms": "-" if n.compute_ms is None else f"{n.compute_ms:.1f}",
              "score": "-" if n.score is None else f"{n.score:.2f}", "last arrivals": str(n.last_arrivals),
              "flagged ranks": Text(",".join(map(str, n.slow_ranks)) or "-")} for n in nodes]
    title = (f"per node ({count(len(nodes), 'node')})" if len(nodes) == len(report.per_node)
             else f"per node (the slowest {len(nodes)} of {count(len(report.per_node), 'node')})")
    t, dropped = _fit(_NODE_COLUMNS, cells, width, title, ("node", "flagged ranks"))
    legend = [text for col, text in _NODE_LEGEND.items() if col not in dropped]
    if dropped:
        legend.append(f"not shown at this width: {', '.join(dropped)}")
    return t, legend


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
    console.print(Panel(_summary(report), title=Text(f"trace-job {report.job_id}: {verdict}"), border_style=style))
    console.print(Panel(_findings(report), title="findings", border_style=style))
    table, legend = _ranks_table(report, width=console.width)
    console.print(table)
    for line in legend:
        console.print(Text(line, style="dim"), soft_wrap=False)
    nodes = _nodes_table(report, width=console.width)
    if nodes is not None:
        console.print(nodes[0])
        for line in nodes[1]:
            console.print(Text(line, style="dim"), soft_wrap=False)
