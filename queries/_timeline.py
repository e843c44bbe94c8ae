"""Views of a job anyone can open: a self-contained HTML timeline and a Perfetto/Chrome trace.

* :func:`write_timeline_html` writes one HTML file with no external resources: per-rank
  swim-lanes of steps, phases and collectives (and, for a stuck rank, what it is still
  inside), warnings and stack dumps as ticks, findings listed and marked (culprit lanes
  in red). Wheel zooms around the pointer, dragging pans, a finding zooms to its events,
  double-click resets; hovering a span, a tick or a stuck bar shows what it is, clicking a
  finding shows its evidence and links. Everything in the page comes from the job's own text
  (log lines, job id, node, span and logger names), so none of it is ever markup: the data sits
  in a JSON ``<script>`` block with every ``<``, ``>`` and ``&`` written as a ``\\u`` escape (no
  ``</script>`` or ``<!--`` can end or bend the block, and the JSON stays valid), the script puts
  it in the DOM only through ``textContent`` and element properties, never ``innerHTML``, and a
  finding's link becomes an ``<a>`` only when it parses as an absolute http(s) URL; anything else
  (``javascript:``, ``data:``) is shown as text.
* :func:`write_perfetto` writes the Chrome trace-event JSON format (``traceEvents`` with
  ``X`` complete events, ``i`` instants, ``C`` counters, ``M`` names) that the Perfetto UI
  and ``chrome://tracing`` open: one process per node, one thread per rank.

Large jobs are cut to ``max_lanes`` ranks (every rank a finding names first, then the
lowest) and ``max_spans`` spans, and the page says so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson

from ._model import Report, rows

__all__ = ["timeline_data", "write_perfetto", "write_timeline_html"]

_EVIDENCE_SHOWN = 20
"""Evidence entries (log lines, tracebacks) a finding shows in the page; the report keeps them all."""

_CULPRIT_KINDS = frozenset({"stalled_rank", "collective_mismatch", "slow_rank", "slow_node", "slow_episode",
                            "late_arrival", "data_wait", "memory_leak", "nan_loss",
                            "intermittent_stall", "transient_stall"})


def _lanes(report: Report, max_lanes: int) -> tuple[list[int], set[int]]:
    culprits = {r for f in report.findings if f.kind in _CULPRIT_KINDS for r in f.ranks}
    flagged = culprits | {p.rank for p in report.per_rank if p.status not in ("ok",)}
    ranks = sorted(p.rank for p in report.per_rank)
    chosen = sorted(flagged)[:max_lanes]
    for r in ranks:
        if len(chosen) >= max_lanes:
            break
        if r not in flagged:
            chosen.append(r)
    return sorted(chosen), culprits


def timeline_data(job: Any, report: Report, *, max_lanes: int = 64, max_spans: int = 300_000) -> dict[str, Any]:
    """Everything both views draw, as plain data; times in microseconds since the job's first event."""
    con = job.con
    lanes, culprits = _lanes(report, max_lanes)
    first_start = con.execute("SELECT min(start) FROM events WHERE kind = 'span'").fetchone()[0]
    t0 = min(report.t_min, first_start) if first_start is not None else report.t_min
    lane_sql = ",".join(str(int(r)) for r in lanes) or "NULL"
    # Every node's events on the reference node's clock (report.clocks): a rank's offset, by its node.
    applied = report.clocks.get("applied", []) if report.clocks else []
    con.execute("CREATE OR REPLACE TEMP TABLE clock_off AS SELECT * FROM (VALUES (NULL::VARCHAR, 0::BIGINT)) t(node, off) "
                "WHERE false")
    if applied:
        con.executemany("INSERT INTO clock_off VALUES (?, ?)",
                        [[n, int(report.clocks["offsets_ns"][n])] for n in applied])
    con.execute("""CREATE OR REPLACE TEMP TABLE rank_off AS
                   SELECT r.rank, coalesce(o.off, 0) AS off FROM (SELECT DISTINCT rank, node FROM ranks) r
                   LEFT JOIN clock_off o USING (node)""")
    spans = rows(
        con,
        f"""SELECT rank, (start - o.off - {t0}) / 1000.0 AS s, dur / 1000.0 AS d, name, cat, step, span_id,
                   json_extract_string(attrs, '$.seq') AS seq, json_extract_string(attrs, '$.group') AS grp
            FROM events JOIN rank_off o USING (rank) WHERE kind = 'span' AND rank IN ({lane_sql}) AND start IS NOT NULL
            ORDER BY rank, start LIMIT {int(max_spans) + 1}""",
    )
    truncated = len(spans) > max_spans
    spans = spans[:max_spans]
    marks = rows(
        con,
        f"""SELECT rank, (ts - o.off - {t0}) / 1000.0 AS t, level, logger, msg, step, span_id, exc IS NOT NULL AS has_exc
            FROM events JOIN rank_off o USING (rank) WHERE kind = 'log' AND rank IN ({lane_sql})
              AND (level IN ('WARNING', 'ERROR', 'CRITICAL') OR exc IS NOT NULL)
            ORDER BY ts LIMIT 5000""",
    )
    open_spans = []
    by_rank = {p.rank: p for p in report.per_rank}
    for f in report.findings:
        if f.kind in ("stalled_rank", "collective_mismatch", "hang"):
            for r in f.ranks:
                if r in lanes and f.time_range:
                    open_spans.append({"rank": r, "s": (f.time_range[0] - t0) / 1000.0,
                                       "d": (f.time_range[1] - f.time_range[0]) / 1000.0,
                                       "name": f.details.get("doing") or f.kind})
    metrics = rows(
        con,
        f"""SELECT rank, (ts - o.off - {t0}) / 1000.0 AS t, loss, grad_norm, rss_bytes, cuda_allocated_bytes
            FROM mets JOIN rank_off o USING (rank) WHERE rank IN ({lane_sql}) ORDER BY rank, step LIMIT 200000""",
    )
    return {
        "job": report.job_id,
        "trace_ids": report.trace_ids,
        "t_min_ns": t0,
        "t_max_us": (report.t_max - t0) / 1000.0,
        "healthy": report.healthy,
        "lanes": [{"rank": r, "node": by_rank[r].node if r in by_rank else "", "status":
                   by_rank[r].status if r in by_rank else "ok", "culprit": r in culprits} for r in lanes],
        "lanes_total": len(report.per_rank),
        "spans": spans,
        "truncated": truncated,
        "marks": marks,
        "open": open_spans,
        "metrics": metrics,
        "findings": [{"kind": f.kind, "severity": f.severity, "summary": f.summary, "ranks": f.ranks,
                      "steps": f.steps, "t": [(x - t0) / 1000.0 for x in f.time_range],
                      "evidence": f.evidence[:_EVIDENCE_SHOWN], "links": f.links}
                     for f in report.findings],
    }


def write_perfetto(job: Any, report: Report, path: str | os.PathLike[str], **kw: Any) -> Path:
    """The job as a Chrome/Perfetto trace-event JSON file."""
    data = timeline_data(job, report, **kw)
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
    """The job as one self-contained interactive HTML page."""
    data = timeline_data(job, report, **kw)
    fill = {"__TITLE__": _escape(f"jobtrace timeline: {report.job_id}"), "__DATA__": _script_json(data)}
    # One pass over the template: a job id holding "__DATA__" must not pull the data into the title.
    html = re.sub("__TITLE__|__DATA__", lambda m: fill[m.group(0)], _PAGE)
    target = Path(path)
    target.write_text(html, encoding="utf-8")
    return target


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
#findings{margin:0;padding:6px 12px;list-style:none;max-height:160px;overflow:auto;border-bottom:1px solid #ddd}
#findings li{padding:2px 4px;cursor:pointer;border-radius:3px}
#findings li:hover{background:#eceff1}
#findings .error{color:#b71c1c}#findings .warning{color:#8d6e00}#findings .info{color:#01579b}
#main{display:flex;position:relative}
#labels{flex:0 0 170px;border-right:1px solid #ccc;background:#fff}
.lane{height:28px;line-height:28px;padding:0 6px;border-bottom:1px solid #eee;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis}
.lane.culprit{background:#ffcdd2;color:#b71c1c;font-weight:bold}
.lane.dim{color:#888}
#view{flex:1;position:relative;overflow:hidden}
canvas{display:block;cursor:grab}
#axis{height:22px}
#tip{position:fixed;pointer-events:none;background:#263238;color:#fff;padding:4px 6px;border-radius:3px;
font-size:12px;display:none;max-width:480px;white-space:pre-wrap;z-index:10}
#legend{padding:4px 12px;color:#555}
#legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;vertical-align:middle}
#note{padding:0 12px;color:#8d6e00}
#detail{padding:4px 12px;border-bottom:1px solid #ddd;max-height:240px;overflow:auto;background:#fff}
#detail pre{margin:2px 0;white-space:pre-wrap;word-break:break-all;font:12px ui-monospace,monospace}
#detail .links a,#detail .links span{margin-right:14px}
</style></head><body>
<header><h1 id="title"></h1><span id="verdict"></span><span id="meta"></span></header>
<ul id="findings"></ul>
<div id="detail" hidden></div>
<div id="legend"></div><div id="note"></div>
<div id="main"><div id="labels"><div id="axis-label" class="lane dim">time</div></div>
<div id="view"><canvas id="axis"></canvas><canvas id="lanes"></canvas></div></div>
<div id="tip"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const LANE = 28;
  const COLORS = {step: "#b0bec5", phase: "#64b5f6", collective: "#ffb74d", user: "#81c784", stuck: "#e53935",
                  data: "#9575cd", forward: "#42a5f5", backward: "#1e88e5", optimizer: "#26a69a"};
  const $ = (id) => document.getElementById(id);
  $("title").textContent = "jobtrace: " + D.job;
  const v = $("verdict");
  v.textContent = D.healthy ? "HEALTHY" : "PROBLEM FOUND";
  v.className = D.healthy ? "ok" : "bad";
  $("meta").textContent = D.lanes.length + " of " + D.lanes_total + " ranks shown, trace " + D.trace_ids.join(", ");
  if (D.truncated) { $("note").textContent = "Spans were cut at the limit: zoom in with trace-job --perfetto for all."; }
  const legend = $("legend");
  for (const [k, c] of Object.entries({step: COLORS.step, data: COLORS.data, forward: COLORS.forward,
       backward: COLORS.backward, optimizer: COLORS.optimizer, collective: COLORS.collective, stuck: COLORS.stuck})) {
    const sw = document.createElement("span"); sw.style.background = c; legend.appendChild(sw);
    legend.appendChild(document.createTextNode(k));
  }
  const laneIndex = new Map();
  const labels = $("labels");
  D.lanes.forEach((lane, i) => {
    laneIndex.set(lane.rank, i);
    const div = document.createElement("div");
    div.className = "lane" + (lane.culprit ? " culprit" : "");
    div.dataset.rank = String(lane.rank);
    div.dataset.status = lane.status;
    div.textContent = "rank " + lane.rank + " · " + lane.node + (lane.status !== "ok" ? " · " + lane.status : "");
    div.title = div.textContent;
    labels.appendChild(div);
  });
  // Per lane, spans sorted by start; phase/collective drawn over their step.
  const byLane = D.lanes.map(() => []), marksByLane = D.lanes.map(() => []), openByLane = D.lanes.map(() => []);
  for (const s of D.spans) { const i = laneIndex.get(s.rank); if (i !== undefined) byLane[i].push(s); }
  for (const m of D.marks) { const i = laneIndex.get(m.rank); if (i !== undefined) marksByLane[i].push(m); }
  for (const o of D.open) { const i = laneIndex.get(o.rank); if (i !== undefined) openByLane[i].push(o); }
  const depth = {step: 0, phase: 1, user: 1, collective: 2};
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
        const span = document.createElement("span"); span.textContent = name + ": " + String(raw); links.appendChild(span);
      }
    }
    if (links.childNodes.length) detail.appendChild(links);
    detail.hidden = false;
  }
  const cv = $("lanes"), ax = $("axis"), view = $("view"), tip = $("tip");
  const ctx = cv.getContext("2d"), actx = ax.getContext("2d");
  const state = {t0: 0, t1: Math.max(D.t_max_us, 1), highlight: null};
  function resize() {
    const w = Math.max(200, view.clientWidth || 800);
    cv.width = w; cv.height = Math.max(LANE, D.lanes.length * LANE); ax.width = w; ax.height = 22;
    draw();
  }
  const x = (t) => (t - state.t0) / (state.t1 - state.t0) * cv.width;
  function color(s) { return s.cat === "phase" ? (COLORS[s.name] || COLORS.phase) : (COLORS[s.cat] || "#90a4ae"); }
  function draw() {
    ctx.clearRect(0, 0, cv.width, cv.height);
    D.lanes.forEach((lane, i) => {
      if (lane.culprit) { ctx.fillStyle = "rgba(229,57,53,0.08)"; ctx.fillRect(0, i * LANE, cv.width, LANE); }
      ctx.fillStyle = "#eee"; ctx.fillRect(0, (i + 1) * LANE - 1, cv.width, 1);
    });
    byLane.forEach((spans, i) => {
      for (const s of spans) {
        if (s.s + s.d < state.t0 || s.s > state.t1) continue;
        const d = depth[s.cat] === undefined ? 1 : depth[s.cat];
        const x0 = x(s.s), w = Math.max(1, x(s.s + s.d) - x0);
        ctx.fillStyle = color(s);
        ctx.fillRect(x0, i * LANE + 3 + d * 7, w, 20 - d * 7);
      }
    });
    for (const o of D.open) {
      const i = laneIndex.get(o.rank); if (i === undefined) continue;
      ctx.fillStyle = COLORS.stuck; ctx.globalAlpha = 0.5;
      ctx.fillRect(x(o.s), i * LANE + 4, Math.max(2, x(o.s + o.d) - x(o.s)), LANE - 8); ctx.globalAlpha = 1;
    }
    for (const m of D.marks) {
      const i = laneIndex.get(m.rank); if (i === undefined) continue;
      ctx.fillStyle = m.level === "WARNING" ? "#f9a825" : "#c62828";
      ctx.fillRect(x(m.t) - 1, i * LANE, 2, LANE - 1);
    }
    if (state.highlight) {
      const h = state.highlight;
      ctx.strokeStyle = "#c62828"; ctx.lineWidth = 2;
      for (const r of h.ranks) { const i = laneIndex.get(r); if (i !== undefined) ctx.strokeRect(1, i * LANE + 1, cv.width - 2, LANE - 2); }
    }
    drawAxis();
  }
  function fmt(us) { const a = Math.abs(us); return a >= 1e6 ? (us / 1e6).toFixed(2) + " s" : a >= 1e3 ? (us / 1e3).toFixed(1) + " ms" : us.toFixed(0) + " µs"; }
  function drawAxis() {
    actx.clearRect(0, 0, ax.width, ax.height); actx.fillStyle = "#555"; actx.font = "11px system-ui";
    const raw = (state.t1 - state.t0) / 8 || 1, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
    const first = Math.ceil(state.t0 / step) * step;
    for (let t = first; t <= state.t1; t += step) { const px = x(t); actx.fillRect(px, 14, 1, 8); actx.fillText(fmt(t), px + 2, 11); }
  }
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
  cv.addEventListener("wheel", (e) => {
    e.preventDefault();
    const rect = cv.getBoundingClientRect(), f = (e.clientX - rect.left) / rect.width;
    const at = state.t0 + f * (state.t1 - state.t0), k = e.deltaY < 0 ? 0.8 : 1.25;
    zoom(at - (at - state.t0) * k, at + (state.t1 - at) * k);
  }, {passive: false});
  let drag = null;
  cv.addEventListener("mousedown", (e) => { drag = {x: e.clientX, t0: state.t0, t1: state.t1}; cv.style.cursor = "grabbing"; });
  window.addEventListener("mouseup", () => { drag = null; cv.style.cursor = "grab"; });
  window.addEventListener("mousemove", (e) => {
    if (drag) { const dt = (e.clientX - drag.x) / cv.width * (drag.t1 - drag.t0); zoom(drag.t0 - dt, drag.t1 - dt); return; }
  });
  cv.addEventListener("dblclick", () => {
    state.highlight = null; detail.hidden = true; zoom(0, Math.max(D.t_max_us, 1));
  });
  // What is under the pointer: a tick (log line) within 4 px first, as ticks are drawn over the spans,
  // then the deepest span, then a stuck bar.
  function tipText(i, t, perPx) {
    let mark = null;
    for (const m of marksByLane[i] || []) {
      if (Math.abs(m.t - t) <= 4 * perPx && (!mark || Math.abs(m.t - t) < Math.abs(mark.t - t))) mark = m;
    }
    if (mark) {
      return mark.level + " " + (mark.logger || "") + "  rank " + mark.rank + (mark.step !== null ? "  step " + mark.step : "") +
        (mark.has_exc ? "  (traceback)" : "") + "\n" + (mark.msg || "");
    }
    let hit = null;
    for (const s of byLane[i] || []) { if (s.s <= t && t <= s.s + s.d && (!hit || (depth[s.cat] || 1) >= (depth[hit.cat] || 1))) hit = s; }
    if (hit) {
      return hit.name + " (" + hit.cat + ")  rank " + hit.rank + (hit.step !== null ? "  step " + hit.step : "") +
        "\n" + fmt(hit.d) + (hit.seq ? "  #" + hit.seq + " " + (hit.grp || "") : "") + (hit.span_id ? "\nspan " + hit.span_id : "");
    }
    const o = (openByLane[i] || []).find((b) => b.s <= t && t <= b.s + b.d);
    return o ? "still inside: " + o.name + "  rank " + o.rank + "\n" + fmt(o.d) : null;
  }
  cv.addEventListener("mousemove", (e) => {
    if (drag) return;
    const rect = cv.getBoundingClientRect(), px = e.clientX - rect.left, i = Math.floor((e.clientY - rect.top) / LANE);
    const perPx = (state.t1 - state.t0) / rect.width, text = tipText(i, state.t0 + px * perPx, perPx);
    if (text === null) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px"; tip.style.display = "block";
  });
  cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  window.addEventListener("resize", resize);
  window.jobtrace = {data: D, state: state, zoom: zoom, focusFinding: focusFinding, redraw: draw};
  resize();
  document.body.dataset.ready = "1";
})();
</script></body></html>
"""
