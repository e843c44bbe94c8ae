"""Views of a job anyone can open: a self-contained HTML timeline (and, until it moves, a Perfetto trace).

:func:`write_timeline_html` writes one HTML file with no external resources, meant to be kept open
while a job is looked into (see ``docs/timeline.md``):

* a swim-lane per rank, *every* rank: far out each lane is its steps, aggregated per pixel;
  zoomed in, each step's phases and collectives; a collective's time before its last rank
  arrived is drawn as *waiting* (hatched), the rest as the transfer, and the ranks a hang
  leaves waiting in a collective are drawn waiting to the end of the log;
* matched collectives (same group and sequence number) linked across the ranks;
* a heatmap of ranks × steps (each rank's own time per step: the step minus its waiting);
* loss, grad norm, learning rate and memory curves on the lanes' time axis;
* findings listed and marked on the axis; a default view that fits the training steps, not
  the start-up; an axis whose ticks are distinct at every zoom.

Nothing is silently dropped: step blocks are kept for every rank and step; the detail (phases,
collectives, user spans) is kept for as many whole steps as ``max_spans`` allows, the same
steps on every rank (the findings' steps first), and the page says how many; so do the warning
ticks (``max_marks``).

Everything in the page comes from the job's own text (log lines, job id, node, span and logger
names), so none of it is ever markup: the data sits in a JSON ``<script>`` block with every
``<``, ``>`` and ``&`` written as a ``\\u`` escape (no ``</script>`` or ``<!--`` can end or bend
the block, and the JSON stays valid), the script puts it in the DOM only through ``textContent``
and element properties, never ``innerHTML``, and a finding's link becomes an ``<a>`` only when it
parses as an absolute http(s) URL; anything else (``javascript:``, ``data:``) is shown as text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson

from ._model import Report, rows

__all__ = ["timeline_data", "write_timeline_html"]

_EVIDENCE_SHOWN = 20
"""Evidence entries (log lines, tracebacks) a finding shows in the page; the report keeps them all."""

_CULPRIT_KINDS = frozenset({"stalled_rank", "collective_mismatch", "slow_rank", "slow_node", "slow_episode",
                            "late_arrival", "data_wait", "memory_leak", "nan_loss",
                            "intermittent_stall", "transient_stall"})

_CURVES = (("loss", "loss"), ("grad_norm", "grad norm"), ("lr", "learning rate"), ("rss_bytes", "host memory (RSS)"),
           ("cuda_allocated_bytes", "CUDA memory allocated"))
"""The metric curves the page draws, in order: column of ``mets`` and the panel's title."""

_SERIES_RANKS = 8
"""Ranks (those findings name) whose own curve is drawn over the band of all ranks."""

_SERIES_KINDS = {"memory_leak": ("rss_bytes", "cuda_allocated_bytes"), "nan_loss": ("loss",), "loss_spike": ("loss",),
                 "divergence": ("loss",), "grad_explosion": ("grad_norm",), "grad_norm_high": ("grad_norm",),
                 "lr_anomaly": ("lr",)}
"""Which curve a finding of each kind singles its ranks out on."""

_HUNG = frozenset({"waiting", "stalled", "silent", "mismatch"})
"""Statuses of a rank a hang left where it was: drawn with a bar from its last progress to its last sign of life."""


def _rank_clock(con: Any, report: Report) -> None:
    """``rank_off``: each rank's clock offset (ns), by its node, so every event lands on the reference clock."""
    applied = report.clocks.get("applied", []) if report.clocks else []
    con.execute("CREATE OR REPLACE TEMP TABLE clock_off AS SELECT * FROM (VALUES (NULL::VARCHAR, 0::BIGINT)) t(node, off) "
                "WHERE false")
    if applied:
        con.executemany("INSERT INTO clock_off VALUES (?, ?)",
                        [[n, int(report.clocks["offsets_ns"][n])] for n in applied])
    con.execute("""CREATE OR REPLACE TEMP TABLE rank_off AS
                   SELECT r.rank, any_value(coalesce(o.off, 0)) AS off FROM (SELECT DISTINCT rank, node FROM ranks) r
                   LEFT JOIN clock_off o USING (node) GROUP BY r.rank""")


def _waits(con: Any) -> None:
    """``coll_wait``: per collective record, how long it waited for the last member of its instance to arrive.

    An instance is a group's sequence number; its last arrival is the latest start among the
    ranks that recorded it (on the reference clock). What a rank spent in the collective before
    that is waiting on a peer, the rest is the transfer: that split is what the lanes draw.
    """
    con.execute("""CREATE OR REPLACE TEMP TABLE coll_wait AS
        WITH c AS (SELECT c.rank, c.step, c.span_id, c.grp, c.seq, c.start - o.off AS st, c.dur, c.is_async
                   FROM colls c JOIN rank_off o USING (rank) WHERE c.seq IS NOT NULL AND c.start IS NOT NULL),
        la AS (SELECT grp, seq, max(st) AS last FROM c GROUP BY grp, seq HAVING count(*) > 1)
        SELECT c.rank, c.step, c.span_id, c.st, c.is_async, least(greatest(la.last - c.st, 0), c.dur) AS w
        FROM c JOIN la USING (grp, seq)""")


def _blocks(con: Any, t0: int) -> dict[int, dict[str, list[int]]]:
    """Per rank, its steps as columns (µs since ``t0``): step, start, duration, waiting, waiting's offset."""
    out: dict[int, dict[str, list[int]]] = {}
    cur = con.execute(f"""
        WITH w AS (SELECT rank, step, sum(w) AS w, min(st) FILTER (WHERE w > 0) AS ws FROM coll_wait
                   WHERE step IS NOT NULL AND NOT is_async GROUP BY rank, step),
        b AS (SELECT s.rank, s.step, s.t0 - o.off AS a, s.t1 - s.t0 AS d, coalesce(w.w, 0) AS w, w.ws
              FROM steps s JOIN rank_off o USING (rank) LEFT JOIN w USING (rank, step) WHERE s.t0 IS NOT NULL)
        SELECT rank, list(step ORDER BY a), list(CAST(round((a - {int(t0)}) / 1000) AS BIGINT) ORDER BY a),
               list(CAST(round(d / 1000) AS BIGINT) ORDER BY a),
               list(CAST(round(least(w, d) / 1000) AS BIGINT) ORDER BY a),
               list(CAST(round(coalesce(greatest(ws - a, 0), -1000) / 1000) AS BIGINT) ORDER BY a)
        FROM b GROUP BY rank""")
    for rank, step, s, d, w, wo in cur.fetchall():
        out[int(rank)] = {"step": step, "s": s, "d": d, "w": w, "wo": wo}
    return out


def _detail_steps(con: Any, report: Report, budget: int) -> tuple[list[int], bool, int, int, int]:
    """Which steps keep their detail spans (on every rank): the findings' first, then evenly spread.

    Returns the steps, whether the spans outside any step are kept, the spans kept, all of them,
    and how many steps there are. Whole steps on every rank, so that a zoomed-in step is complete
    and comparable across ranks, never one rank whole and the others empty.
    """
    counts = {r[0]: int(r[1]) for r in con.execute(
        "SELECT step, count(*) FROM events WHERE kind = 'span' AND start IS NOT NULL GROUP BY step").fetchall()}
    total = sum(counts.values())
    stepped = sorted(s for s in counts if s is not None)
    order: list[Any] = [None]
    named = sorted({s for f in report.findings for s in f.steps})
    for s in named:
        order += [s - 1, s, s + 1]
    order += stepped[:3] + stepped[-3:]
    # Then halving the gaps, coarse to fine: wherever the budget runs out, what it kept is spread evenly.
    gap = float(len(stepped))
    while stepped and gap >= 0.5:
        order += [stepped[int(k * gap)] for k in range(int(len(stepped) / gap) + 1) if int(k * gap) < len(stepped)]
        gap /= 2
    kept: list[int] = []
    seen: set[Any] = set()
    used, with_none = 0, False
    for s in order:
        if s in seen or s not in counts:
            continue
        seen.add(s)
        if used + counts[s] > budget:
            continue
        used += counts[s]
        if s is None:
            with_none = True
        else:
            kept.append(int(s))
    return sorted(kept), with_none, used, total, len(stepped)


def _detail(con: Any, t0: int, steps: list[int], with_none: bool) -> list[dict[str, Any]]:
    """The kept steps' spans (steps, phases, collectives, user spans) (µs since ``t0``), by rank and start."""
    con.execute("CREATE OR REPLACE TEMP TABLE detail_steps AS SELECT unnest(?::BIGINT[]) AS step", [steps])
    none = "OR e.step IS NULL" if with_none else ""
    return rows(
        con,
        f"""SELECT e.rank, (e.start - o.off - {int(t0)}) / 1000.0 AS s, e.dur / 1000.0 AS d, e.name, e.cat, e.step,
                   e.span_id, json_extract_string(e.attrs, '$.seq') AS seq,
                   coalesce(json_extract_string(e.attrs, '$.group'), CASE WHEN e.cat = 'collective' THEN 'default' END)
                       AS grp,
                   w.w / 1000.0 AS w
            FROM events e JOIN rank_off o USING (rank)
            LEFT JOIN coll_wait w ON e.cat = 'collective' AND w.rank = e.rank AND w.span_id = e.span_id
            WHERE e.kind = 'span' AND e.start IS NOT NULL AND (e.step IN (SELECT step FROM detail_steps) {none})
            ORDER BY e.rank, e.start, e.dur DESC""",
    )


def _open_bars(con: Any, report: Report, t0: int) -> list[dict[str, Any]]:
    """What each rank a hang left behind was still doing: from its last progress to its last sign of life.

    A rank the hang's wavefront lists as waiting in a collective is ``wait`` (drawn like the
    waiting inside a collective); one that never joined, or stalled elsewhere, is ``stuck``;
    one silent to the end is ``silent`` (its bar runs to the job's last event).
    """
    waves = report.collectives.get("waves", []) if report.collectives else []
    waiting: dict[int, str] = {}
    for wv in waves:
        for r in wv.get("waiting", []):
            waiting[int(r)] = f"waiting in {wv.get('op')} #{wv.get('seq')} (group {wv.get('group')})"
    by_rank = {p.rank: p for p in report.per_rank}
    doing = {r: str(f.details.get("doing") or f.kind) for f in report.findings
             if f.kind in ("stalled_rank", "collective_mismatch", "hang") for r in f.ranks}
    out = []
    for row in rows(con, "SELECT r.rank, r.last_progress - o.off AS p, r.last_ts - o.off AS l "
                         "FROM ranks r JOIN rank_off o USING (rank) ORDER BY r.rank"):
        rank = int(row["rank"])
        summary = by_rank.get(rank)
        if summary is None or summary.status not in _HUNG or row["p"] is None:
            continue
        end = report.t_max if summary.status == "silent" else max(int(row["l"]), int(row["p"]))
        if rank in waiting or summary.status == "waiting":
            kind, name = "wait", waiting.get(rank, "waiting for its peers")
        elif summary.status == "silent":
            kind, name = "silent", doing.get(rank, "silent: no event at all")
        else:
            kind, name = "stuck", doing.get(rank, f"no progress ({summary.status})")
        out.append({"rank": rank, "s": (int(row["p"]) - t0) / 1000.0, "d": (end - int(row["p"])) / 1000.0,
                    "name": name, "kind": kind})
    return out


def _curves(con: Any, report: Report, t0: int) -> list[dict[str, Any]]:
    """Per metric, per step across ranks: its time, the lowest, median and highest finite value, and where any was not.

    Ranks a finding singles out on a metric (fewer than half the job's) also get their own line.
    """
    out = []
    n_ranks = max(1, len(report.per_rank))
    for col, title in _CURVES:
        series_ranks = sorted({r for f in report.findings if col in _SERIES_KINDS.get(f.kind, ())
                               and len(f.ranks) < n_ranks / 2 for r in f.ranks})[:_SERIES_RANKS]
        agg = rows(con, f"""SELECT step, median(m.ts - o.off) AS t,
                                   min({col}) FILTER (WHERE isfinite({col})) AS lo,
                                   median({col}) FILTER (WHERE isfinite({col})) AS mid,
                                   max({col}) FILTER (WHERE isfinite({col})) AS hi,
                                   count(*) FILTER (WHERE NOT isfinite({col})) AS bad
                            FROM mets m JOIN rank_off o USING (rank) WHERE {col} IS NOT NULL
                            GROUP BY step ORDER BY step""")
        if not agg:
            continue
        series = []
        for rank in series_ranks:
            pts = rows(con, f"""SELECT (m.ts - o.off - {int(t0)}) / 1000.0 AS t, {col} AS v FROM mets m
                                JOIN rank_off o USING (rank) WHERE m.rank = ? AND isfinite({col}) ORDER BY step""",
                       [rank])
            if pts:
                series.append({"rank": rank, "t": [p["t"] for p in pts], "v": [p["v"] for p in pts]})
        out.append({"key": col, "title": title, "step": [a["step"] for a in agg],
                    "t": [(float(a["t"]) - t0) / 1000.0 for a in agg],
                    "lo": [a["lo"] for a in agg], "mid": [a["mid"] for a in agg], "hi": [a["hi"] for a in agg],
                    "bad": [int(a["bad"]) for a in agg], "series": series})
    return out


def timeline_data(job: Any, report: Report, *, max_spans: int = 150_000, max_marks: int = 5_000,
                  per_rank_metrics: bool = False) -> dict[str, Any]:
    """Everything the views draw, as plain data; times in microseconds since the job's first event.

    ``blocks`` holds every rank's every step (columns per rank); ``spans`` the detail of the
    steps in ``detail['steps']`` on every rank, as many whole steps as ``max_spans`` spans allow;
    ``marks`` at most ``max_marks`` warning and error lines, ``marks_total`` all of them.
    ``per_rank_metrics`` adds ``metrics``, one row per rank and step (the Perfetto writer's counters).
    """
    con = job.con
    # A finding that names every rank singles none out (NaN loss everywhere): only the others mark lanes.
    culprits = {r for f in report.findings if f.kind in _CULPRIT_KINDS and len(f.ranks) < len(report.per_rank)
                for r in f.ranks}
    by_rank = {p.rank: p for p in report.per_rank}
    first_start = con.execute("SELECT min(start) FROM events WHERE kind = 'span'").fetchone()[0]
    t0 = min(report.t_min, first_start) if first_start is not None else report.t_min
    _rank_clock(con, report)
    _waits(con)
    blocks = _blocks(con, t0)
    steps, with_none, kept, total, n_steps = _detail_steps(con, report, max_spans)
    spans = _detail(con, t0, steps, with_none)
    marks_total = con.execute("SELECT count(*) FROM events WHERE kind = 'log' "
                              "AND (level IN ('WARNING', 'ERROR', 'CRITICAL') OR exc IS NOT NULL)").fetchone()[0]
    marks = rows(
        con,
        f"""SELECT rank, (ts - o.off - {int(t0)}) / 1000.0 AS t, level, logger, msg, step, span_id, exc IS NOT NULL AS has_exc
            FROM events JOIN rank_off o USING (rank) WHERE kind = 'log'
              AND (level IN ('WARNING', 'ERROR', 'CRITICAL') OR exc IS NOT NULL)
            ORDER BY level = 'WARNING', ts LIMIT {int(max_marks)}""",
    )
    marks.sort(key=lambda m: m["t"])
    open_bars = _open_bars(con, report, t0)
    curves = _curves(con, report, t0)
    ranks = sorted(set(by_rank) | set(blocks))
    # The default view: the training steps, not the start-up before them; a hang after them gets a
    # quarter more (its bars run on past the view's edge: they are the evidence, not the scale).
    starts = [b["s"][0] for b in blocks.values() if b["s"]]
    ends = [b["s"][-1] + b["d"][-1] for b in blocks.values() if b["s"]]
    t_max_us = (report.t_max - t0) / 1000.0
    if starts:
        lo, hi = float(min(starts)), float(max(ends))
        after = max([o["s"] + o["d"] for o in open_bars], default=hi)
        if after > hi:
            hi = min(after, hi + max((hi - lo) * 0.25, 1000.0))
        pad = max((hi - lo) * 0.01, 10.0)
        view = [max(lo - pad, 0.0), hi + pad]
    else:
        view = [0.0, max(t_max_us, 1.0)]
    data: dict[str, Any] = {
        "job": report.job_id,
        "trace_ids": report.trace_ids,
        "t_min_ns": t0,
        "t_max_us": t_max_us,
        "healthy": report.healthy,
        "view": view,
        "lanes": [{"rank": r, "node": by_rank[r].node if r in by_rank else "", "status":
                   by_rank[r].status if r in by_rank else "ok", "culprit": r in culprits} for r in ranks],
        "lanes_total": len(ranks),
        "blocks": blocks,
        "spans": spans,
        "detail": {"steps": steps, "steps_total": n_steps, "spans": kept, "spans_total": total,
                   "outside_steps": with_none},
        "truncated": kept < total,
        "marks": marks,
        "marks_total": int(marks_total),
        "open": open_bars,
        "curves": curves,
        "findings": [{"kind": f.kind, "severity": f.severity, "summary": f.summary, "ranks": f.ranks,
                      "steps": f.steps, "t": [(x - t0) / 1000.0 for x in f.time_range],
                      "evidence": f.evidence[:_EVIDENCE_SHOWN], "links": f.links}
                     for f in report.findings],
    }
    if per_rank_metrics:
        data["metrics"] = rows(
            con,
            f"""SELECT rank, (ts - o.off - {int(t0)}) / 1000.0 AS t, loss, grad_norm, rss_bytes, cuda_allocated_bytes
                FROM mets JOIN rank_off o USING (rank) ORDER BY rank, step""")
    return data


def write_perfetto(job: Any, report: Report, path: str | os.PathLike[str], **kw: Any) -> Path:
    """The job as a Chrome trace-event JSON file, capped like the page's spans.

    Superseded by :func:`queries._perfetto.write_perfetto` (complete, protobuf); kept only as
    ``benchmarks/bench_perfetto.py``'s baseline, measured in the same run.
    """
    data = timeline_data(job, report, per_rank_metrics=True, **kw)
    nodes = sorted({lane["node"] for lane in data["lanes"]})
    pid = {n: i + 1 for i, n in enumerate(nodes)}
    node_of = {lane["rank"]: lane["node"] for lane in data["lanes"]}
    ev: list[dict[str, Any]] = []
    for n in nodes:
        ev.append({"ph": "M", "name": "process_name", "pid": pid[n], "tid": 0, "args": {"name": f"node {n}"}})
    for lane in data["lanes"]:
        p = pid[lane["node"]]
        label = f"rank {lane['rank']}" + (f" ({lane['status']})" if lane["status"] != "ok" else "")
        ev.append({"ph": "M", "name": "thread_name", "pid": p, "tid": lane["rank"], "args": {"name": label}})
        ev.append({"ph": "M", "name": "thread_sort_index", "pid": p, "tid": lane["rank"],
                   "args": {"sort_index": lane["rank"]}})
    for s in data["spans"]:
        args = {k: s[k] for k in ("step", "span_id", "seq", "grp") if s.get(k) is not None}
        ev.append({"ph": "X", "name": s["name"], "cat": s["cat"], "ts": s["s"], "dur": max(s["d"], 0.001),
                   "pid": pid[node_of[s["rank"]]], "tid": s["rank"], "args": args})
    for o in data["open"]:
        ev.append({"ph": "X", "name": f"still: {o['name']}", "cat": "stuck", "ts": o["s"], "dur": max(o["d"], 0.001),
                   "pid": pid[node_of[o["rank"]]], "tid": o["rank"], "args": {}})
    for m in data["marks"]:
        ev.append({"ph": "i", "s": "t", "name": f"{m['level']} {m['logger']}", "cat": "log", "ts": m["t"],
                   "pid": pid[node_of[m["rank"]]], "tid": m["rank"], "args": {"msg": m["msg"], "step": m["step"]}})
    for m in data["metrics"]:
        for key in ("loss", "grad_norm"):
            if m[key] is not None and m[key] == m[key]:
                ev.append({"ph": "C", "name": f"{key} rank {m['rank']}", "ts": m["t"], "pid": pid[node_of[m["rank"]]],
                           "args": {key: m[key]}})
    for f in data["findings"]:
        ts = f["t"][0] if f["t"] else 0.0
        ev.append({"ph": "i", "s": "g", "name": f"{f['severity']}: {f['kind']}", "cat": "finding", "ts": ts,
                   "pid": 0, "tid": 0, "args": {"summary": f["summary"], "ranks": f["ranks"], "steps": f["steps"]}})
    out = {"traceEvents": ev, "displayTimeUnit": "ms",
           "otherData": {"job": data["job"], "trace_ids": ",".join(data["trace_ids"]),
                         "t0_unix_ns": str(data["t_min_ns"]), "truncated": str(data["truncated"])}}
    target = Path(path)
    target.write_bytes(orjson.dumps(out))
    return target


def write_timeline_html(job: Any, report: Report, path: str | os.PathLike[str], **kw: Any) -> Path:
    """The job as one self-contained interactive HTML page (``kw`` goes to :func:`timeline_data`)."""
    data = timeline_data(job, report, **kw)
    fill = {"__TITLE__": _escape(f"jobtrace timeline: {report.job_id}"), "__DATA__": _script_json(_page_data(data))}
    # One pass over the template: a job id holding "__DATA__" must not pull the data into the title.
    html = re.sub("__TITLE__|__DATA__", lambda m: fill[m.group(0)], _PAGE)
    target = Path(path)
    target.write_text(html, encoding="utf-8")
    return target


def _deltas(values: list[int]) -> list[int]:
    """Each value minus the one before (the first as is): short numbers, so a 1,000,000-step page parses fast."""
    return [b - a for a, b in zip([0, *values[:-1]], values)]


def _page_data(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` packed for the page: columns instead of objects, integers instead of floats, deltas.

    A 1,024-rank × 1,000-step job is a million step blocks; as objects they would be ~100 MB of
    JSON, as delta-coded columns ~20 MB, which Chromium parses in a fraction of a second.
    Blocks are whole microseconds, detail spans tenths of one (both exact as integers, so the
    page's running sums give back exactly these values).
    """
    page = {k: v for k, v in data.items() if k not in ("blocks", "spans", "metrics")}
    lane_of = {lane["rank"]: i for i, lane in enumerate(data["lanes"])}
    packed: list[dict[str, list[int]]] = []
    for lane in data["lanes"]:
        b = data["blocks"].get(lane["rank"])
        if not b:
            packed.append({"k": [], "g": [], "d": [], "w": [], "o": []})
            continue
        ends = [0] + [s + d for s, d in zip(b["s"][:-1], b["d"][:-1])]
        packed.append({"k": _deltas(b["step"]), "g": [s - e for s, e in zip(b["s"], ends)], "d": b["d"], "w": b["w"],
                       "o": b["wo"]})
    page["blocks"] = packed
    names: dict[str, int] = {}
    groups: dict[str, int] = {}
    spans = [s for s in data["spans"] if s["cat"] != "step" and s["rank"] in lane_of]  # steps are the blocks
    spans.sort(key=lambda s: (lane_of[s["rank"]], s["s"]))
    starts = [round(s["s"] * 10) for s in spans]
    page["spans"] = {
        "l": _deltas([lane_of[s["rank"]] for s in spans]),
        "s": _deltas(starts),
        "d": [round(s["d"] * 10) for s in spans],
        "n": [names.setdefault(f"{s['cat'] or ''}\x00{s['name'] or ''}", len(names)) for s in spans],
        "k": [s["step"] for s in spans],
        "q": [s["seq"] for s in spans],
        "g": [groups.setdefault(s["grp"], len(groups)) if s["grp"] is not None else -1 for s in spans],
        "w": [None if s["w"] is None else round(s["w"] * 10) for s in spans],
        "i": [s["span_id"] for s in spans],
    }
    page["names"] = [k.split("\x00", 1) for k in names]  # [category, name]
    page["groups"] = list(groups)
    return page


def _escape(text: str) -> str:
    """Text for an HTML text node or a quoted attribute value."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
            .replace("'", "&#39;"))


_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                   0x2028: "\\u2028", 0x2029: "\\u2029"}


def _script_json(data: Any) -> str:
    """``data`` as JSON that is inert inside ``<script type="application/json">``.

    These characters only occur inside JSON strings, where ``\\u`` escapes mean the same text, so
    ``JSON.parse`` gives back exactly the data, while the HTML parser never sees ``</script>``, ``<!--``
    or ``<script`` (which would end the block or switch it into the double-escaped state). Escaping only
    ``</`` is not enough, and ``<\\!--`` is not even valid JSON: one log line could break the page.
    """
    return orjson.dumps(data).decode().translate(_SCRIPT_ESCAPES)


_PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{margin:0;font:13px system-ui,sans-serif;color:#222;background:#fafafa}
header{padding:8px 12px;background:#263238;color:#fff;display:flex;gap:16px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:15px;margin:0}
#verdict.ok{color:#a5d6a7}#verdict.bad{color:#ef9a9a}
#findings{margin:0;padding:6px 12px;list-style:none;max-height:140px;overflow:auto;border-bottom:1px solid #ddd}
#findings li{padding:2px 4px;cursor:pointer;border-radius:3px}
#findings li:hover{background:#eceff1}
#findings .error{color:#b71c1c}#findings .warning{color:#8d6e00}#findings .info{color:#01579b}
.row{display:flex;position:relative}
.labels{flex:0 0 170px;width:170px;border-right:1px solid #ccc;background:#fff;overflow:hidden}
.lane{height:28px;line-height:28px;padding:0 6px;border-bottom:1px solid #eee;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis;box-sizing:border-box}
.lane.thin{font-size:0;line-height:0;padding:0;border:0}
.rtick{position:absolute;left:6px;font-size:11px;color:#555;border-top:1px solid #bbb;pointer-events:none}
.lane.culprit{background:#ffcdd2;color:#b71c1c;font-weight:bold}
.lane.dim{color:#888}
.panel{padding:2px 6px;box-sizing:border-box;overflow:hidden;border-bottom:1px solid #eee;font-size:12px}
.panel small{display:block;color:#666}
#lanesbox{max-height:61vh;overflow-y:auto;overflow-x:hidden;border-bottom:1px solid #ccc}
canvas{display:block}
#lanes,#heat{cursor:grab}
#tip{position:fixed;pointer-events:none;background:#263238;color:#fff;padding:4px 6px;border-radius:3px;
font-size:12px;display:none;max-width:480px;white-space:pre-wrap;z-index:10}
#legend{padding:4px 12px;color:#555}
#legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;vertical-align:middle}
#note{padding:0 12px;color:#8d6e00}
#note div{margin:1px 0}
#views{padding:2px 12px}#views button{font:12px system-ui}
h2{font-size:13px;margin:8px 12px 2px}
#heatnote{padding:0 12px;color:#555}
#detail{padding:4px 12px;border-bottom:1px solid #ddd;max-height:240px;overflow:auto;background:#fff}
#detail pre{margin:2px 0;white-space:pre-wrap;word-break:break-all;font:12px ui-monospace,monospace}
#detail .links a,#detail .links span{margin-right:14px}
</style></head><body>
<header><h1 id="title"></h1><span id="verdict"></span><span id="meta"></span></header>
<ul id="findings"></ul>
<div id="detail" hidden></div>
<div id="legend"></div><div id="note"></div>
<div id="views"><button id="fit" type="button">fit the training</button> <button id="whole" type="button">whole job</button></div>
<div class="row"><div class="labels"><div id="axis-label" class="lane dim">time</div></div><canvas id="axis"></canvas></div>
<div id="lanesbox"><div class="row"><div id="labels" class="labels"></div><canvas id="lanes"></canvas></div></div>
<div class="row"><div id="curvelabels" class="labels"></div><canvas id="curves"></canvas></div>
<h2>Step-time heatmap: ranks × steps, each rank's own time per step (the step less its waiting); darker is slower</h2>
<div class="row"><div id="heatlabels" class="labels"></div><canvas id="heat"></canvas></div>
<div id="heatnote"></div>
<div id="tip"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const $ = (id) => document.getElementById(id);
  const NL = D.lanes.length;
  // Lanes as tall as 28 px, thinner to fit every rank in the lanes' box (60 % of the window), 2 px at least.
  const LANE = Math.max(2, Math.min(28, Math.floor(Math.max(240, window.innerHeight * 0.6) / Math.max(1, NL))));
  const THIN = LANE < 12;
  const COLORS = {step: "#78909c", wait: "#e57373", waitBg: "#ffcdd2", transfer: "#ffb74d", stuck: "#b71c1c",
                  silent: "#616161", data: "#9575cd", forward: "#42a5f5", backward: "#1e88e5", optimizer: "#26a69a",
                  phase: "#64b5f6", user: "#81c784", collective: "#ffb74d", stepBg: "#cfd8dc", link: "#4a148c",
                  band: "rgba(30,136,229,0.18)", median: "#1565c0", series: "#d32f2f", bad: "#d50000"};
  const SEV = {error: "#c62828", warning: "#f9a825", info: "#0277bd"};

  // ---- decoding: the columns back into typed arrays -----------------------------------------
  const B = D.blocks.map((b) => {
    const n = b.d.length, step = new Float64Array(n), s = new Float64Array(n);
    const d = Float64Array.from(b.d), w = Float64Array.from(b.w), o = Float64Array.from(b.o);
    let k = 0, t = 0;
    for (let i = 0; i < n; i++) { k += b.k[i]; step[i] = k; t += b.g[i]; s[i] = t; t += d[i]; }
    return {n: n, step: step, s: s, d: d, w: w, o: o};
  });
  const SP = D.spans, NS = SP.d.length;
  const spS = new Float64Array(NS), spD = new Float64Array(NS), spLane = new Int32Array(NS);
  const spOff = new Int32Array(NL + 1), spMax = new Float64Array(NL);
  {
    let acc = 0, lane = 0;
    for (let i = 0; i < NS; i++) {
      acc += SP.s[i]; lane += SP.l[i]; spS[i] = acc / 10; spD[i] = SP.d[i] / 10; spLane[i] = lane;
      spOff[lane + 1] = i + 1; if (spD[i] > spMax[lane]) spMax[lane] = spD[i];
    }
    for (let i = 1; i <= NL; i++) if (spOff[i] < spOff[i - 1]) spOff[i] = spOff[i - 1];
  }
  const detailSteps = new Set(D.detail.steps);
  function span(i) {
    const nc = D.names[SP.n[i]];
    return {rank: D.lanes[spLane[i]].rank, s: spS[i], d: spD[i], cat: nc[0], name: nc[1], step: SP.k[i], seq: SP.q[i],
            grp: SP.g[i] >= 0 ? D.groups[SP.g[i]] : null, w: SP.w[i] === null ? null : SP.w[i] / 10, span_id: SP.i[i]};
  }
  let instances = null;  // "group#seq" -> span indices of that collective instance, on every rank (built on first zoom-in)
  function instanceMap() {
    if (instances) return instances;
    instances = new Map();
    for (let i = 0; i < NS; i++) {
      if (SP.q[i] === null || D.names[SP.n[i]][0] !== "collective") continue;
      const key = SP.g[i] + "#" + SP.q[i];
      let list = instances.get(key); if (!list) { list = []; instances.set(key, list); } list.push(i);
    }
    return instances;
  }

  // ---- page furniture: title, findings, legend, what was left out ---------------------------
  $("title").textContent = "jobtrace: " + D.job;
  const v = $("verdict");
  v.textContent = D.healthy ? "HEALTHY" : "PROBLEM FOUND";
  v.className = D.healthy ? "ok" : "bad";
  $("meta").textContent = NL + " ranks, trace " + D.trace_ids.join(", ");
  const notes = [];
  const num = (n) => Number(n).toLocaleString("en-US");
  if (D.detail.spans < D.detail.spans_total) {
    notes.push("Detail (phases, collectives, user spans) is kept for " + num(D.detail.steps.length) + " of " +
      num(D.detail.steps_total) + " steps, on every rank: " + num(D.detail.spans) + " of " + num(D.detail.spans_total) +
      " spans (" + num(D.detail.spans_total - D.detail.spans) + " left out). The other steps are drawn whole, " +
      "with their waiting; trace-job --perfetto writes every span.");
  }
  if (D.marks.length < D.marks_total) {
    notes.push("Warning and error ticks: " + num(D.marks.length) + " of " + num(D.marks_total) + " shown (errors first).");
  }
  const beyond = D.open.filter((o) => o.s + o.d > D.view[1]);
  if (beyond.length) {
    const until = Math.max(...beyond.map((o) => o.s + o.d));
    notes.push(beyond.length + " of " + NL + " ranks were still waiting or stuck at the end of the log, " + fmt(until - D.view[1]) +
      " past this view: their bars run on to the right (“whole job” shows it all).");
  }
  if (THIN) notes.push(NL + " ranks at " + LANE + " px each: hover a lane for its rank, zoom in for its steps.");
  for (const text of notes) { const div = document.createElement("div"); div.textContent = text; $("note").appendChild(div); }
  const legend = $("legend");
  function swatch(label, color) {
    const sw = document.createElement("span"); sw.style.background = color; legend.appendChild(sw);
    legend.appendChild(document.createTextNode(label));
  }
  for (const [k, c] of [["step (own time)", COLORS.step], ["waiting for the last rank", COLORS.wait],
       ["collective transfer", COLORS.transfer], ["data", COLORS.data], ["forward", COLORS.forward],
       ["backward", COLORS.backward], ["optimizer", COLORS.optimizer], ["user", COLORS.user],
       ["stuck", COLORS.stuck], ["matched collective", COLORS.link]]) swatch(k, c);

  const laneIndex = new Map();
  const labels = $("labels");
  D.lanes.forEach((lane, i) => {
    laneIndex.set(lane.rank, i);
    const div = document.createElement("div");
    div.className = "lane" + (lane.culprit ? " culprit" : "") + (THIN ? " thin" : "");
    div.style.height = LANE + "px"; if (!THIN) div.style.lineHeight = LANE + "px";
    div.dataset.rank = String(lane.rank);
    div.dataset.status = lane.status;
    div.textContent = "rank " + lane.rank + " · " + lane.node + (lane.status !== "ok" ? " · " + lane.status : "");
    div.title = div.textContent;
    labels.appendChild(div);
  });
  if (THIN) {  // lanes too thin to carry their names: a rank scale beside them instead
    labels.style.position = "relative";
    const every = Math.ceil(32 / LANE);
    for (let i = 0; i < NL; i += every) {
      const tick = document.createElement("div"); tick.className = "rtick";
      tick.style.top = (i * LANE) + "px"; tick.textContent = "rank " + D.lanes[i].rank;
      labels.appendChild(tick);
    }
  }
  const marksByLane = D.lanes.map(() => []), openByLane = D.lanes.map(() => []);
  for (const m of D.marks) { const i = laneIndex.get(m.rank); if (i !== undefined) marksByLane[i].push(m); }
  for (const o of D.open) { const i = laneIndex.get(o.rank); if (i !== undefined) openByLane[i].push(o); }
  const list = $("findings");
  D.findings.forEach((f, i) => {
    const li = document.createElement("li");
    li.className = f.severity;
    li.dataset.kind = f.kind;
    li.textContent = (f.severity === "error" ? "● " : f.severity === "warning" ? "▲ " : "ℹ ") + f.kind + ": " + f.summary;
    li.addEventListener("click", () => focusFinding(i));
    list.appendChild(li);
  });
  if (!D.findings.length) { const li = document.createElement("li"); li.textContent = "no findings"; list.appendChild(li); }
  // A link only from an absolute http(s) URL, and then the URL as the parser read it; anything else
  // (javascript:, data:, a relative path) is shown as text. The URL parser, not a prefix test, decides,
  // so " JaVaScRiPt:" or a tab inside the scheme cannot slip through.
  function httpUrl(raw) {
    try { const u = new URL(String(raw)); return u.protocol === "http:" || u.protocol === "https:" ? u.href : null; }
    catch (e) { return null; }
  }
  const detail = $("detail");
  function showDetail(f) {
    detail.replaceChildren();
    const head = document.createElement("div");
    head.textContent = f.kind + ": " + f.summary;
    detail.appendChild(head);
    for (const line of f.evidence || []) {
      const pre = document.createElement("pre"); pre.textContent = String(line); detail.appendChild(pre);
    }
    const links = document.createElement("div"); links.className = "links";
    for (const [name, raw] of Object.entries(f.links || {})) {
      const url = httpUrl(raw);
      if (url) {
        const a = document.createElement("a");
        a.setAttribute("href", url); a.setAttribute("target", "_blank"); a.setAttribute("rel", "noopener noreferrer");
        a.textContent = name;
        links.appendChild(a);
      } else {
        const sp = document.createElement("span"); sp.textContent = name + ": " + String(raw); links.appendChild(sp);
      }
    }
    if (links.childNodes.length) detail.appendChild(links);
    detail.hidden = false;
  }

  // ---- geometry and the shared time axis ------------------------------------------------------
  const cv = $("lanes"), ax = $("axis"), cc = $("curves"), hc = $("heat"), tip = $("tip");
  const ctx = cv.getContext("2d"), actx = ax.getContext("2d"), cctx = cc.getContext("2d"), hctx = hc.getContext("2d");
  const state = {t0: D.view[0], t1: Math.max(D.view[1], D.view[0] + 10), highlight: null, hover: null};
  let W = 800;
  const PANEL = 64, curves = D.curves, curveGeo = [];
  const x = (t) => (t - state.t0) / (state.t1 - state.t0) * W;
  function hatch(fg, bg) {
    const p = document.createElement("canvas"); p.width = 6; p.height = 6;
    const g = p.getContext("2d"); g.fillStyle = bg; g.fillRect(0, 0, 6, 6);
    g.strokeStyle = fg; g.lineWidth = 2; g.beginPath(); g.moveTo(-1, 7); g.lineTo(7, -1); g.stroke();
    return ctx.createPattern(p, "repeat");
  }
  const WAIT = hatch(COLORS.wait, COLORS.waitBg);
  function rgb(hex) { return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)); }
  const STEP_RGB = rgb(COLORS.step), WAIT_RGB = rgb(COLORS.wait);
  const SHADE_RGB = [];  // far out: a column's colour by the share of its time spent waiting, in 9 levels
  for (let k = 0; k <= 8; k++) SHADE_RGB.push(STEP_RGB.map((a, j) => Math.round(a + (WAIT_RGB[j] - a) * k / 8)));
  function fmt(us) {
    const a = Math.abs(us);
    return a >= 1e6 ? (us / 1e6).toFixed(2) + " s" : a >= 1e3 ? (us / 1e3).toFixed(a >= 1e5 ? 0 : 1) + " ms" : us.toFixed(0) + " µs";
  }
  // Ticks at a round step, labelled with as many decimals as the step needs: never two ticks that read alike.
  function ticks() {
    const raw = (state.t1 - state.t0) / Math.max(2, Math.floor(W / 110)), p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
    const dec = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / 1e6) - 1e-9)));
    const out = [];
    for (let k = Math.ceil(state.t0 / step); k * step <= state.t1; k++) {
      const t = k * step; out.push({t: t, px: x(t), label: (t / 1e6).toFixed(dec) + " s"});
    }
    return out;
  }
  function drawAxis() {
    actx.clearRect(0, 0, ax.width, ax.height); actx.fillStyle = "#555"; actx.font = "11px system-ui";
    for (const tk of ticks()) { actx.fillRect(Math.round(tk.px), 14, 1, 8); actx.fillText(tk.label, tk.px + 2, 11); }
    D.findings.forEach((f) => {  // findings as markers: a flag where each starts, in its severity's colour
      if (!f.t || !f.t.length) return;
      const px = x(f.t[0]); if (px < -6 || px > W + 6) return;
      actx.fillStyle = SEV[f.severity] || "#555";
      actx.beginPath(); actx.moveTo(px - 5, 22); actx.lineTo(px + 5, 22); actx.lineTo(px, 13); actx.fill();
    });
  }
  // First index whose end is at or after t (blocks of a lane do not overlap, so ends are sorted too).
  function firstBlock(b, t) {
    let lo = 0, hi = b.n;
    while (lo < hi) { const m = (lo + hi) >> 1; if (b.s[m] + b.d[m] < t) lo = m + 1; else hi = m; }
    return lo;
  }
  function firstSpan(lane, t) {
    let lo = spOff[lane], hi = spOff[lane + 1];
    const from = t - spMax[lane];
    while (lo < hi) { const m = (lo + hi) >> 1; if (spS[m] < from) lo = m + 1; else hi = m; }
    return lo;
  }
  const depth = {phase: 1, user: 1, collective: 2};
  function spanColor(cat, name) { return cat === "phase" ? (COLORS[name] || COLORS.phase) : (COLORS[cat] || "#90a4ae"); }
  const stats = {binned: 0, blocks: 0, spans: 0, links: 0, detail: false};

  // ---- the lanes: far out aggregated per pixel column, closer whole steps, closest their spans ----
  function drawLanes() {
    const perPx = (state.t1 - state.t0) / W;
    const busy = new Float64Array(W + 1), wait = new Float64Array(W + 1);
    stats.binned = 0; stats.blocks = 0; stats.spans = 0; stats.links = 0;
    const hl = state.highlight;
    // Pass 1, straight into pixels: the culprits' tint and, far out, the steps narrower than 3 px added up
    // per column (a million steps as a million rectangles would take seconds; as pixels, milliseconds).
    const img = ctx.createImageData(W, cv.height), px = img.data;
    for (let i = 0; i < NL; i++) {
      const y = i * LANE, b = B[i], h = THIN ? LANE : LANE - 6, top = THIN ? y : y + 3;
      if (D.lanes[i].culprit) {
        for (let n = y * W * 4, end = (y + LANE) * W * 4; n < end; n += 4) { px[n] = 229; px[n + 1] = 57; px[n + 2] = 53; px[n + 3] = 20; }
      }
      busy.fill(0); wait.fill(0);
      let binned = false;
      for (let k = firstBlock(b, state.t0); k < b.n && b.s[k] <= state.t1; k++) {
        const s = b.s[k], d = b.d[k];
        if (d / perPx >= 3) continue;
        const a = Math.max(0, (s - state.t0) / perPx), e = Math.min(W, (s + d - state.t0) / perPx);
        const c0 = Math.floor(a), c1 = Math.min(W, Math.floor(e)), share = d > 0 ? b.w[k] / d : 0;
        for (let c = c0; c <= c1; c++) {
          const cover = Math.min(e, c + 1) - Math.max(a, c);
          if (cover > 0) { busy[c] += cover; wait[c] += cover * share; }
        }
        binned = true; stats.binned++;
      }
      if (!binned) continue;
      for (let c = 0; c < W; c++) {
        if (busy[c] <= 0) continue;
        const rgb_ = SHADE_RGB[Math.round(Math.min(1, wait[c] / busy[c]) * 8)];
        for (let r = top; r < top + h; r++) {
          const n = (r * W + c) * 4; px[n] = rgb_[0]; px[n + 1] = rgb_[1]; px[n + 2] = rgb_[2]; px[n + 3] = 255;
        }
      }
    }
    ctx.putImageData(img, 0, 0);
    // Pass 2: whole steps, spans, what a hang left running, log ticks.
    for (let i = 0; i < NL; i++) {
      const y = i * LANE, b = B[i];
      if (!THIN) { ctx.fillStyle = "#eee"; ctx.fillRect(0, y + LANE - 1, W, 1); }
      const h = THIN ? LANE : LANE - 6, top = THIN ? y : y + 3;
      for (let k = firstBlock(b, state.t0); k < b.n && b.s[k] <= state.t1; k++) {
        const s = b.s[k], d = b.d[k];
        if (d / perPx < 3) continue;
        stats.blocks++;
        const x0 = x(s), x1 = x(s + d);
        if (stats.detail && detailSteps.has(b.step[k])) {
          ctx.fillStyle = COLORS.stepBg; ctx.fillRect(x0, top, Math.max(1, x1 - x0), THIN ? h : 7);
          continue;  // its spans are drawn below
        }
        ctx.fillStyle = COLORS.step; ctx.fillRect(x0, top, Math.max(1, x1 - x0), h);
        if (b.w[k] > 0 && b.o[k] >= 0) {
          const w0 = x(s + b.o[k]), w1 = x(s + b.o[k] + b.w[k]);
          ctx.fillStyle = WAIT; ctx.fillRect(w0, top, Math.max(1, w1 - w0), h);
        }
      }
      // Detail spans: those outside any step always; the others where their step is wide enough.
      for (let j = firstSpan(i, state.t0); j < spOff[i + 1] && spS[j] <= state.t1; j++) {
        if (spS[j] + spD[j] < state.t0) continue;
        const pw = spD[j] / perPx, step = SP.k[j];
        if (step !== null && !zoomedIn(step)) continue;
        const nc = D.names[SP.n[j]], dd = THIN ? 0 : (depth[nc[0]] === undefined ? 1 : depth[nc[0]]);
        const x0 = x(spS[j]), wpx = Math.max(1, pw), sy = THIN ? y : y + 3 + dd * 7, sh = THIN ? LANE : 20 - dd * 7;
        ctx.fillStyle = spanColor(nc[0], nc[1]); ctx.fillRect(x0, sy, wpx, sh);
        if (nc[0] === "collective" && SP.w[j] > 0) {  // the part before the last rank arrived: waiting
          ctx.fillStyle = WAIT; ctx.fillRect(x0, sy, Math.max(1, Math.min(wpx, SP.w[j] / 10 / perPx)), sh);
        }
        stats.spans++;
      }
      for (const o of openByLane[i]) {  // what a hang left it doing, to its last sign of life
        if (o.s > state.t1 || o.s + o.d < state.t0) continue;
        const x0 = Math.max(-1, x(o.s)), x1 = Math.min(W + 1, x(o.s + o.d));
        ctx.fillStyle = o.kind === "wait" ? WAIT : o.kind === "silent" ? COLORS.silent : COLORS.stuck;
        ctx.fillRect(x0, top, Math.max(2, x1 - x0), h);
      }
      for (const m of marksByLane[i]) {
        if (m.t < state.t0 || m.t > state.t1) continue;
        ctx.fillStyle = m.level === "WARNING" ? "#f9a825" : "#c62828";
        ctx.fillRect(x(m.t) - 1, y, 2, Math.max(1, LANE - 1));
      }
    }
    drawLinks(perPx);
    if (hl) {
      ctx.strokeStyle = "#c62828"; ctx.lineWidth = 2;
      for (const r of hl.ranks) { const i = laneIndex.get(r); if (i !== undefined) ctx.strokeRect(1, i * LANE + 1, W - 2, Math.max(1, LANE - 2)); }
    }
    for (const f of D.findings) {  // each finding's start, through every lane
      if (!f.t || !f.t.length) continue;
      const px = x(f.t[0]); if (px < 0 || px > W) continue;
      ctx.fillStyle = SEV[f.severity] || "#555"; ctx.globalAlpha = 0.5; ctx.fillRect(Math.round(px), 0, 1, cv.height); ctx.globalAlpha = 1;
    }
  }
  // A step's spans are drawn (where kept) once the median step is 24 px wide on screen.
  function zoomedIn(step) { return stats.detail && detailSteps.has(step); }
  function stepWidthPx() {
    const b = B.find((q) => q.n > 0); if (!b) return 0;
    const ds = Array.from(b.d).sort((p, q) => p - q);
    return ds[ds.length >> 1] / ((state.t1 - state.t0) / W);
  }
  // Matched collectives linked across ranks: each instance's arrivals joined lane to lane, and a tick at
  // its last arrival (where every rank's waiting ends). Only when few enough are in view to read.
  function drawLinks(perPx) {
    if (!stats.detail || !NS) return;
    const inView = [];
    for (const [key, idx] of instanceMap()) {
      const first = spS[idx[0]];
      if (first > state.t1 || first + spD[idx[0]] < state.t0) continue;
      inView.push(idx);
      if (inView.length > 400) return;
    }
    ctx.lineWidth = 1;
    for (const idx of inView) {
      const hot = state.hover && idx.includes(state.hover.index);
      ctx.strokeStyle = COLORS.link; ctx.globalAlpha = hot ? 1 : 0.55; ctx.lineWidth = hot ? 2 : 1;
      // Lane to lane along the gap under each lane (down from one arrival, across, into the next), so the
      // links never cover what the lanes draw; thin lanes have no gap and get straight lines.
      const pts = idx.map((j) => [Math.round(x(spS[j])) + 0.5, spLane[j] * LANE + LANE / 2, spLane[j]]).sort((p, q) => p[1] - q[1]);
      ctx.beginPath();
      pts.forEach((p, n) => {
        if (!n) { ctx.moveTo(p[0], p[1]); return; }
        const prev = pts[n - 1];
        if (!THIN) { const gap = prev[2] * LANE + LANE - 2.5; ctx.lineTo(prev[0], gap); ctx.lineTo(p[0], gap); }
        ctx.lineTo(p[0], p[1]);
      });
      ctx.stroke();
      let last = -Infinity; for (const j of idx) last = Math.max(last, spS[j]);
      ctx.globalAlpha = 1; ctx.fillStyle = COLORS.link; ctx.fillRect(Math.round(x(last)), pts[0][1] - LANE / 2, 1, pts[pts.length - 1][1] - pts[0][1] + LANE);
      stats.links++;
    }
    ctx.globalAlpha = 1; ctx.lineWidth = 1;
  }

  // ---- loss, grad norm, learning rate and memory on the same time axis ----------------------
  function scaleLabel(key, v) {
    if (key.endsWith("_bytes")) return (v / 1073741824).toFixed(v >= 1073741824 * 10 ? 1 : 3) + " GiB";
    return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-2 && v !== 0) ? v.toExponential(2) : String(+v.toPrecision(4));
  }
  const curveLabels = $("curvelabels");
  curves.forEach((c, n) => {
    let lo = Infinity, hi = -Infinity;
    for (const a of c.lo) if (a !== null && a < lo) lo = a;
    for (const a of c.hi) if (a !== null && a > hi) hi = a;
    for (const s of c.series) for (const a of s.v) { if (a < lo) lo = a; if (a > hi) hi = a; }
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi === lo) { const p = Math.abs(hi) * 0.05 || 1; lo -= p; hi += p; }
    curveGeo.push({key: c.key, top: n * PANEL, h: PANEL, lo: lo, hi: hi});
    const div = document.createElement("div"); div.className = "panel"; div.style.height = PANEL + "px";
    div.textContent = c.title;
    const small = document.createElement("small");
    small.textContent = scaleLabel(c.key, lo) + " – " + scaleLabel(c.key, hi) +
      (c.bad.some((k) => k > 0) ? " · ✕ non-finite" : "") + (c.series.length ? " · red: rank " + c.series.map((s) => s.rank).join(", ") : "");
    div.appendChild(small); curveLabels.appendChild(div);
  });
  const cy = (g, v) => g.top + 4 + (1 - (v - g.lo) / (g.hi - g.lo)) * (g.h - 8);
  function drawCurves() {
    cctx.clearRect(0, 0, cc.width, cc.height);
    curves.forEach((c, n) => {
      const g = curveGeo[n];
      cctx.fillStyle = "#eee"; cctx.fillRect(0, g.top + g.h - 1, W, 1);
      let a = 0; while (a < c.t.length - 1 && c.t[a + 1] < state.t0) a++;
      let e = c.t.length - 1; while (e > 0 && c.t[e - 1] > state.t1) e--;
      const pts = []; for (let k = a; k <= e; k++) if (c.mid[k] !== null) pts.push(k);
      if (pts.length) {
        cctx.fillStyle = COLORS.band; cctx.beginPath();
        pts.forEach((k, m) => (m ? cctx.lineTo(x(c.t[k]), cy(g, c.hi[k])) : cctx.moveTo(x(c.t[k]), cy(g, c.hi[k]))));
        for (let m = pts.length - 1; m >= 0; m--) cctx.lineTo(x(c.t[pts[m]]), cy(g, c.lo[pts[m]]));
        cctx.closePath(); cctx.fill();
        cctx.strokeStyle = COLORS.median; cctx.lineWidth = 1.5; cctx.beginPath();
        pts.forEach((k, m) => (m ? cctx.lineTo(x(c.t[k]), cy(g, c.mid[k])) : cctx.moveTo(x(c.t[k]), cy(g, c.mid[k]))));
        if (pts.length === 1) cctx.lineTo(x(c.t[pts[0]]) + 1, cy(g, c.mid[pts[0]]));
        cctx.stroke();
      }
      for (const s of c.series) {
        cctx.strokeStyle = COLORS.series; cctx.lineWidth = 1.5; cctx.beginPath();
        let started = false;
        for (let k = 0; k < s.t.length; k++) {
          if (s.t[k] < state.t0 - (state.t1 - state.t0) || s.t[k] > state.t1 + (state.t1 - state.t0)) continue;
          if (started) cctx.lineTo(x(s.t[k]), cy(g, s.v[k])); else { cctx.moveTo(x(s.t[k]), cy(g, s.v[k])); started = true; }
        }
        cctx.stroke();
      }
      cctx.fillStyle = COLORS.bad; cctx.font = "11px system-ui";
      for (let k = a; k <= e; k++) if (c.bad[k] > 0) cctx.fillRect(Math.round(x(c.t[k])) - 1, g.top, 3, 7);
    });
    cctx.lineWidth = 1;
  }

  // ---- the heatmap: ranks × steps, each cell the rank's own time in the step -------------------
  let heat = null;
  function buildHeat() {
    let s0 = Infinity, s1 = -Infinity;
    for (const b of B) if (b.n) { s0 = Math.min(s0, b.step[0]); s1 = Math.max(s1, b.step[b.n - 1]); }
    if (!isFinite(s0)) return null;
    const nSteps = s1 - s0 + 1, cols = Math.max(1, Math.min(nSteps, W)), rows = Math.max(1, Math.min(NL, 360));
    const cellH = Math.max(1, Math.min(12, Math.floor(360 / NL))), H = rows === NL ? NL * cellH : rows;
    const val = new Float64Array(cols * rows).fill(-1);
    let vmin = Infinity, vmax = -Infinity;
    for (let i = 0; i < NL; i++) {
      const b = B[i], row = Math.floor(i * rows / NL);
      for (let k = 0; k < b.n; k++) {
        const own = Math.max(0, b.d[k] - b.w[k]), col = Math.floor((b.step[k] - s0) * cols / nSteps), at = row * cols + col;
        if (own > val[at]) val[at] = own;
      }
    }
    for (const a of val) if (a >= 0) { if (a < vmin) vmin = a; if (a > vmax) vmax = a; }
    const img = new ImageData(cols, rows), px = img.data;
    const LIGHT = [255, 247, 236], DARK = [127, 0, 0];
    for (let n = 0; n < val.length; n++) {
      const a = val[n];
      if (a < 0) { px[4 * n + 3] = 0; continue; }
      const f = vmax > vmin ? (a - vmin) / (vmax - vmin) : 0.5;
      for (let j = 0; j < 3; j++) px[4 * n + j] = Math.round(LIGHT[j] + (DARK[j] - LIGHT[j]) * f);
      px[4 * n + 3] = 255;
    }
    const off = document.createElement("canvas"); off.width = cols; off.height = rows; off.getContext("2d").putImageData(img, 0, 0);
    const laneStep = Math.ceil(NL / rows), stepBin = Math.ceil(nSteps / cols);
    $("heatnote").textContent = "Steps " + s0 + "–" + s1 + " left to right; ranks top to bottom; own time " + fmt(vmin) + " (lightest) to " + fmt(vmax) + " (darkest)" +
      (laneStep > 1 || stepBin > 1 ? ". Each cell is the slowest of " + (stepBin > 1 ? "up to " + stepBin + " steps" : "its step") +
        (laneStep > 1 ? " on up to " + laneStep + " ranks" : "") : "") + ". Click a cell to zoom the lanes to that step.";
    return {off: off, s0: s0, s1: s1, nSteps: nSteps, cols: cols, rows: rows, H: H, val: val, vmin: vmin, vmax: vmax};
  }
  function drawHeat() {
    if (!heat) return;
    hctx.imageSmoothingEnabled = false;
    hctx.clearRect(0, 0, hc.width, hc.height);
    hctx.drawImage(heat.off, 0, 0, W, heat.H);
    // the steps in view, outlined
    let a = Infinity, e = -Infinity;
    for (const b of B) { if (!b.n) continue; const k = firstBlock(b, state.t0); if (k < b.n) { a = Math.min(a, b.step[k]); }
      for (let m = Math.min(b.n - 1, k + 100000); m >= k; m--) { if (b.s[m] <= state.t1) { e = Math.max(e, b.step[m]); break; } } break; }
    if (isFinite(a) && isFinite(e) && (a > heat.s0 || e < heat.s1)) {
      hctx.strokeStyle = "#1565c0"; hctx.lineWidth = 1;
      hctx.strokeRect((a - heat.s0) / heat.nSteps * W + 0.5, 0.5, Math.max(2, (e - a + 1) / heat.nSteps * W - 1), heat.H - 1);
    }
  }

  // ---- drawing, zooming, pointing --------------------------------------------------------------
  function layout() {
    const box = $("lanesbox");
    W = Math.max(200, box.clientWidth - 171);
    for (const c of [cv, ax, cc, hc]) { c.width = W; c.style.width = W + "px"; }
    cv.height = Math.max(LANE, NL * LANE); ax.height = 22; cc.height = Math.max(1, curves.length * PANEL);
    heat = heat && heat.cols === Math.max(1, Math.min(heat.nSteps, W)) ? heat : buildHeat();
    hc.height = heat ? heat.H : 1;
    const hl = $("heatlabels"); hl.replaceChildren(); hl.style.height = hc.height + "px";
    const hdiv = document.createElement("div"); hdiv.className = "panel"; hdiv.textContent = "rank " + (NL ? D.lanes[0].rank : "") + " (top) … rank " + (NL ? D.lanes[NL - 1].rank : "") + " (bottom)";
    hl.appendChild(hdiv);
  }
  function draw() {
    stats.detail = stepWidthPx() >= 24;
    drawLanes(); drawAxis(); drawCurves(); drawHeat();
  }
  function resize() { layout(); draw(); }
  function zoom(t0, t1) {
    const min = 10; if (t1 - t0 < min) { const c = (t0 + t1) / 2; t0 = c - min / 2; t1 = c + min / 2; }
    state.t0 = t0; state.t1 = t1; draw();
  }
  function focusFinding(i) {
    const f = D.findings[i];
    state.highlight = f;
    showDetail(f);
    if (f.t && f.t.length === 2) { const pad = Math.max((f.t[1] - f.t[0]) * 0.2, 1000); zoom(f.t[0] - pad, f.t[1] + pad); }
    else { draw(); }
  }
  function onWheel(e) {
    e.preventDefault();
    const rect = e.currentTarget.getBoundingClientRect(), f = (e.clientX - rect.left) / rect.width;
    const at = state.t0 + f * (state.t1 - state.t0), k = e.deltaY < 0 ? 0.8 : 1.25;
    zoom(at - (at - state.t0) * k, at + (state.t1 - at) * k);
  }
  for (const c of [cv, ax, cc]) c.addEventListener("wheel", onWheel, {passive: false});
  let drag = null;
  cv.addEventListener("mousedown", (e) => { drag = {x: e.clientX, t0: state.t0, t1: state.t1}; cv.style.cursor = "grabbing"; });
  window.addEventListener("mouseup", () => { drag = null; cv.style.cursor = "grab"; });
  window.addEventListener("mousemove", (e) => {
    if (drag) { const dt = (e.clientX - drag.x) / W * (drag.t1 - drag.t0); zoom(drag.t0 - dt, drag.t1 - dt); }
  });
  function reset() { state.highlight = null; detail.hidden = true; zoom(D.view[0], Math.max(D.view[1], D.view[0] + 10)); }
  cv.addEventListener("dblclick", reset);
  $("fit").addEventListener("click", reset);
  $("whole").addEventListener("click", () => zoom(0, Math.max(D.t_max_us, 10)));
  ax.addEventListener("click", (e) => {  // a finding's marker on the axis focuses it
    const px = e.clientX - ax.getBoundingClientRect().left;
    let best = -1, dist = 7;
    D.findings.forEach((f, i) => { if (f.t && f.t.length) { const dd = Math.abs(x(f.t[0]) - px); if (dd < dist) { dist = dd; best = i; } } });
    if (best >= 0) focusFinding(best);
  });
  // What is under the pointer: a tick (log line) within 4 px first, as ticks are drawn over the spans,
  // then the deepest drawn span, then the step, then a stuck bar.
  function hitSpan(i, t) {
    let hit = -1;
    for (let j = firstSpan(i, t); j < spOff[i + 1] && spS[j] <= t; j++) {
      if (spS[j] + spD[j] < t) continue;
      if (SP.k[j] !== null && !zoomedIn(SP.k[j])) continue;
      const dj = depth[D.names[SP.n[j]][0]] || 0;
      if (hit < 0 || dj >= (depth[D.names[SP.n[hit]][0]] || 0)) hit = j;
    }
    return hit;
  }
  function tipText(i, t, perPx) {
    if (i < 0 || i >= NL) return null;
    let mark = null;
    for (const m of marksByLane[i]) {
      if (Math.abs(m.t - t) <= 4 * perPx && (!mark || Math.abs(m.t - t) < Math.abs(mark.t - t))) mark = m;
    }
    if (mark) {
      return mark.level + " " + (mark.logger || "") + "  rank " + mark.rank + (mark.step !== null ? "  step " + mark.step : "") +
        (mark.has_exc ? "  (traceback)" : "") + "\n" + (mark.msg || "");
    }
    const j = hitSpan(i, t);
    if (j >= 0) {
      const h = span(j);
      return h.name + " (" + h.cat + ")  rank " + h.rank + (h.step !== null ? "  step " + h.step : "") +
        "\n" + fmt(h.d) + (h.w ? "  (waiting " + fmt(h.w) + " for the last rank)" : "") +
        (h.seq ? "  #" + h.seq + " " + (h.grp || "") : "") + (h.span_id ? "\nspan " + h.span_id : "");
    }
    const o = openByLane[i].find((q) => q.s <= t && t <= q.s + q.d);
    if (o) return "still " + o.name + "  rank " + o.rank + "\n" + fmt(o.d) + " to its last sign of life";
    const b = B[i], k = firstBlock(b, t);
    if (k < b.n && b.s[k] <= t + 2 * perPx) {
      return "rank " + D.lanes[i].rank + "  step " + b.step[k] + "\n" + fmt(b.d[k]) + ": own time " + fmt(b.d[k] - b.w[k]) +
        ", waiting " + fmt(b.w[k]);
    }
    return "rank " + D.lanes[i].rank + " · " + D.lanes[i].node;
  }
  function showTip(e, text) {
    if (text === null) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px"; tip.style.display = "block";
  }
  cv.addEventListener("mousemove", (e) => {
    if (drag) return;
    const rect = cv.getBoundingClientRect(), px = e.clientX - rect.left, i = Math.floor((e.clientY - rect.top) / LANE);
    const perPx = (state.t1 - state.t0) / rect.width, t = state.t0 + px * perPx;
    showTip(e, tipText(i, t, perPx));
    const j = stats.detail && i >= 0 && i < NL ? hitSpan(i, t) : -1;
    const hov = j >= 0 && SP.q[j] !== null ? {index: j} : null;
    if ((hov && hov.index) !== (state.hover && state.hover.index)) { state.hover = hov; drawLanes(); }
  });
  cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  function heatCell(e) {
    if (!heat) return null;
    const rect = hc.getBoundingClientRect();
    const col = Math.floor((e.clientX - rect.left) / W * heat.cols), row = Math.floor((e.clientY - rect.top) / heat.H * heat.rows);
    if (col < 0 || col >= heat.cols || row < 0 || row >= heat.rows) return null;
    return {col: col, row: row, step: heat.s0 + Math.floor(col * heat.nSteps / heat.cols), lane: Math.floor(row * NL / heat.rows)};
  }
  hc.addEventListener("mousemove", (e) => {
    const c = heatCell(e); if (!c) { tip.style.display = "none"; return; }
    const a = heat.val[c.row * heat.cols + c.col];
    showTip(e, "rank " + D.lanes[c.lane].rank + (heat.rows < NL ? " (and neighbours)" : "") + "  step " + c.step +
      (heat.cols < heat.nSteps ? " (and following)" : "") + "\nown time " + (a >= 0 ? fmt(a) : "none"));
  });
  hc.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  hc.addEventListener("click", (e) => {
    const c = heatCell(e); if (!c) return;
    const b = B[c.lane]; let k = 0; while (k < b.n && b.step[k] < c.step) k++;
    if (k < b.n) { const pad = b.d[k] * 0.25; zoom(b.s[k] - pad, b.s[k] + b.d[k] + pad); }
  });
  window.addEventListener("resize", resize);
  window.jobtrace = {data: D, state: state, zoom: zoom, focusFinding: focusFinding, redraw: draw, reset: reset,
                     lane: LANE, span: span, blocks: B, ticks: ticks, curves: curveGeo, colors: COLORS, stats: stats,
                     heat: () => heat, width: () => W};
  resize();
  window.jobtrace.drawnMs = performance.now();
  document.body.dataset.drawn = "1";
  document.body.dataset.ready = "1";
})();
</script></body></html>
"""
