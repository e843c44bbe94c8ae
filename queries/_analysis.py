"""From a job's ``events`` table to a verdict: who is slow, who is stalled, and why.

All heavy lifting is SQL over the columnar ``events`` table (per rank and step
aggregates, medians); Python only looks at per-rank summary rows, so the cost grows
with events in DuckDB and with ranks (not events) in Python.

The definitions, so that a verdict can be checked by hand:

* step time: the ``step`` span; collective wait: the sum of synchronous collective
  spans recorded during the step; data wait: the ``data`` phase; compute: the rest.
* slow rank: its median compute per step (first step excluded as warm-up) is at
  least ``slow_factor`` times the median rank's and at least ``min_excess_ms``
  longer. All ranks of a node slow (and not every node) → the node is named.
* stalled: no progress (any event but heartbeats and jobtrace's own notes) for
  ``stall_s`` before the job's last event; silent: no event at all, heartbeats
  included, for that long. A hang's culprit is a silent rank, or a stuck rank that
  is not inside the collective the others wait in (the wavefront).
* loss NaN/Inf: the first step a rank reported a non-finite ``loss``; loss spike: a
  loss at least ``spike_factor`` times the median of the preceding window.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from ._store import JobData

__all__ = ["AnalysisConfig", "Finding", "RankSummary", "Report", "analyze"]


@dataclass(frozen=True)
class AnalysisConfig:
    stall_s: float = 300.0
    slow_factor: float = 1.3
    min_excess_ms: float = 2.0
    spike_factor: float = 10.0
    spike_window: int = 100


@dataclass
class Finding:
    """One verdict with the evidence behind it. ``kind`` is a stable identifier for machines."""

    kind: str
    severity: str
    summary: str
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankSummary:
    rank: int
    node: str
    steps: int
    step_ms: float | None
    compute_ms: float | None
    collective_ms: float | None
    data_ms: float | None
    last_step: int | None
    last_seen_s: float
    status: str = "ok"


@dataclass
class Report:
    job_id: str
    trace_ids: list[str]
    source: str
    ranks: int
    world_size: int
    nodes: list[str]
    steps: int
    first_step: int | None
    last_step: int | None
    wall_s: float
    step_ms_median: float | None
    steps_per_s: float | None
    throughput: dict[str, float]
    events: int
    skipped: dict[str, int]
    per_rank: list[RankSummary]
    per_step: list[dict[str, Any]]
    findings: list[Finding]

    @property
    def healthy(self) -> bool:
        return not any(f.severity in ("error", "warning") for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["healthy"] = self.healthy
        return d


def _rows(con: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _build_tables(con: Any) -> None:
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE steps AS
        WITH s AS (
            SELECT rank, any_value(node) AS node, step, sum(dur) AS step_ns, min(start) AS t0
            FROM events WHERE kind = 'span' AND cat = 'step' AND step IS NOT NULL GROUP BY rank, step),
        c AS (
            SELECT rank, step, sum(dur) AS coll_ns FROM events
            WHERE kind = 'span' AND cat = 'collective' AND step IS NOT NULL
              AND coalesce(TRY_CAST(json_extract(attrs, '$.async') AS BOOLEAN), false) = false
            GROUP BY rank, step),
        d AS (
            SELECT rank, step, sum(dur) AS data_ns FROM events
            WHERE kind = 'span' AND cat = 'phase' AND name = 'data' AND step IS NOT NULL GROUP BY rank, step)
        SELECT s.rank, s.node, s.step, s.step_ns, s.t0,
               coalesce(c.coll_ns, 0) AS coll_ns, coalesce(d.data_ns, 0) AS data_ns,
               greatest(s.step_ns - coalesce(c.coll_ns, 0) - coalesce(d.data_ns, 0), 0) AS compute_ns
        FROM s LEFT JOIN c USING (rank, step) LEFT JOIN d USING (rank, step)
        """
    )


def analyze(job: JobData, config: AnalysisConfig | None = None) -> Report:
    cfg = config or AnalysisConfig()
    con = job.con
    _build_tables(con)
    head = _rows(
        con,
        """SELECT min(ts) AS t_min, max(ts) AS t_max, count(DISTINCT rank) AS ranks, max(world) AS world,
                  list(DISTINCT trace_id) AS trace_ids FROM events""",
    )[0]
    t_max = head["t_max"]
    nodes = [r["node"] for r in _rows(con, "SELECT DISTINCT node FROM events ORDER BY node")]
    step_info = _rows(
        con, "SELECT count(DISTINCT step) AS n, min(step) AS lo, max(step) AS hi, median(step_ns) AS med FROM steps"
    )[0]
    first_step = step_info["lo"]
    warm = "step > (SELECT min(step) FROM steps) OR (SELECT count(DISTINCT step) FROM steps) < 3"

    ranks = _rows(
        con,
        f"""
        WITH r AS (
            SELECT rank, any_value(node) AS node, max(ts) AS last_ts,
                   max(ts) FILTER (WHERE kind <> 'heartbeat' AND coalesce(logger, '') NOT LIKE 'jobtrace%') AS last_progress,
                   arg_max(attrs, ts) FILTER (WHERE kind = 'heartbeat') AS beat,
                   max(ts) FILTER (WHERE kind = 'heartbeat') AS beat_ts,
                   arg_max(name, ts) FILTER (WHERE kind = 'span') AS last_span,
                   arg_max(cat, ts) FILTER (WHERE kind = 'span') AS last_span_cat,
                   max(step) AS last_step,
                   bool_or(kind = 'log' AND logger = 'jobtrace.lifecycle' AND msg = 'stop') AS stopped
            FROM events GROUP BY rank),
        s AS (
            SELECT rank, count(*) AS n, median(step_ns) AS step_ns, median(compute_ns) AS compute_ns,
                   median(coll_ns) AS coll_ns, median(data_ns) AS data_ns
            FROM steps WHERE {warm} GROUP BY rank)
        SELECT r.*, s.n, s.step_ns, s.compute_ns, s.coll_ns, s.data_ns FROM r LEFT JOIN s USING (rank) ORDER BY rank
        """,
    )
    per_rank = [
        RankSummary(
            rank=r["rank"],
            node=r["node"],
            steps=r["n"] or 0,
            step_ms=_ms(r["step_ns"]),
            compute_ms=_ms(r["compute_ns"]),
            collective_ms=_ms(r["coll_ns"]),
            data_ms=_ms(r["data_ns"]),
            last_step=r["last_step"],
            last_seen_s=round((t_max - r["last_ts"]) / 1e9, 3),
        )
        for r in ranks
    ]
    by_rank = {p.rank: p for p in per_rank}

    findings: list[Finding] = []
    findings += _stalls(con, cfg, ranks, t_max, by_rank)
    findings += _slow(con, cfg, ranks, by_rank, nodes)
    findings += _loss(con, cfg)

    per_step = _rows(
        con,
        """SELECT step, count(*) AS ranks, round(median(step_ns) / 1e6, 3) AS step_ms,
                  round(median(compute_ns) / 1e6, 3) AS compute_ms, round(median(coll_ns) / 1e6, 3) AS collective_ms,
                  round(median(data_ns) / 1e6, 3) AS data_ms, arg_max(rank, compute_ns) AS slowest_rank,
                  round(max(compute_ns) / 1e6, 3) AS slowest_compute_ms
           FROM steps GROUP BY step ORDER BY step""",
    )
    med = step_info["med"]
    throughput = {}
    for key in ("tokens_per_s", "samples_per_s"):
        # The job's rate: per rank, the median of its reported rate; summed over ranks.
        value = _rows(
            con,
            f"""SELECT sum(m) AS total FROM (
                  SELECT rank, median(TRY_CAST(json_extract_string(metrics, '$.{key}') AS DOUBLE)) AS m
                  FROM events WHERE kind = 'metric' AND json_extract(metrics, '$.{key}') IS NOT NULL GROUP BY rank)""",
        )[0]["total"]
        if value is not None:
            throughput[key] = round(value, 1)
    return Report(
        job_id=job.job_id,
        trace_ids=sorted(t for t in head["trace_ids"] if t),
        source=job.source,
        ranks=head["ranks"],
        world_size=head["world"] or head["ranks"],
        nodes=nodes,
        steps=step_info["n"] or 0,
        first_step=first_step,
        last_step=step_info["hi"],
        wall_s=round((t_max - head["t_min"]) / 1e9, 3),
        step_ms_median=_ms(med),
        steps_per_s=round(1e9 / med, 3) if med else None,
        throughput=throughput,
        events=job.stats.events,
        skipped=dict(job.stats.skipped),
        per_rank=per_rank,
        per_step=per_step,
        findings=findings,
    )


def _json(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, (bytes, str)):
        try:
            out = orjson.loads(value)
            return out if isinstance(out, dict) else {}
        except orjson.JSONDecodeError:
            return {}
    return dict(value)


def _doing(r: dict[str, Any]) -> str:
    beat = _json(r["beat"])
    if beat.get("in_op"):
        return f"waiting in {beat['in_op']} #{beat.get('in_seq')} (group {beat.get('in_group')})"
    if beat.get("in_span"):
        return f"in {beat.get('in_cat', 'span')} '{beat['in_span']}' for {beat.get('span_age_ms', 0) / 1000:.1f}s"
    if r["last_span"]:
        return f"last finished {r['last_span_cat']} '{r['last_span']}'"
    return "no span recorded"


def _stalls(con: Any, cfg: AnalysisConfig, ranks: list[dict[str, Any]], t_max: int, by_rank: dict[int, RankSummary]) -> list[Finding]:
    thr = cfg.stall_s * 1e9
    silent = [r for r in ranks if t_max - r["last_ts"] >= thr and not r["stopped"]]
    stuck = [r for r in ranks if r["last_progress"] is None or t_max - r["last_progress"] >= thr]
    if not silent and not stuck:
        return []
    waiting: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in stuck:
        beat = _json(r["beat"])
        if r not in silent and beat.get("in_op"):
            waiting.setdefault((beat["in_op"], str(beat.get("in_group"))), []).append(r | {"_seq": beat.get("in_seq")})
    wave_key = max(waiting, key=lambda k: len(waiting[k])) if waiting else None
    wave = waiting.get(wave_key, []) if wave_key else []
    wave_ranks = {r["rank"] for r in wave}
    max_seq = max((r["_seq"] or 0 for r in wave), default=0)
    culprits = [r for r in stuck if r["rank"] not in wave_ranks] + [r for r in silent if r not in stuck]
    culprits += [r for r in wave if (r["_seq"] or 0) < max_seq]  # behind the others in the same group
    findings: list[Finding] = []
    wave_txt = ""
    if wave_key:
        wave_txt = (
            f"ranks {_span_list(sorted(wave_ranks))} wait in {wave_key[0]} #{max_seq} (group {wave_key[1]})"
        )
    for r in sorted(culprits, key=lambda r: r["rank"]):
        by_rank[r["rank"]].status = "silent" if r in silent else "stalled"
        quiet_s = (t_max - (r["last_progress"] or r["last_ts"])) / 1e9
        how = "silent (no heartbeat or event)" if r in silent else "stalled (alive, no progress)"
        summary = (
            f"rank {r['rank']} on node {r['node']} {how} for {quiet_s:.0f}s at step {r['last_step']}: "
            f"{_doing(r)}" + (f"; {wave_txt}" if wave_txt else "")
        )
        evidence = _last_logs(con, r["rank"])
        details = {"doing": _doing(r), "quiet_s": round(quiet_s, 3), "last_step": r["last_step"], "wavefront": wave_txt}
        findings.append(
            Finding("stalled_rank", "error", summary, [r["rank"]], [r["node"]],
                    [r["last_step"]] if r["last_step"] is not None else [], evidence, details)
        )
    if not culprits and wave:
        for r in wave:
            by_rank[r["rank"]].status = "waiting"
        findings.append(
            Finding("hang", "error", f"job hung: {wave_txt}, and no rank is outside it (suspect the network or a "
                    "rank that left the group)", sorted(wave_ranks), sorted({r["node"] for r in wave}))
        )
    else:
        for r in wave:
            if r["rank"] in by_rank and by_rank[r["rank"]].status == "ok":
                by_rank[r["rank"]].status = "waiting"
    return findings


def _last_logs(con: Any, rank: int, n: int = 5) -> list[str]:
    rows = _rows(
        con,
        """SELECT ts, level, logger, msg, exc FROM events WHERE rank = ? AND kind = 'log'
           ORDER BY ts DESC LIMIT ?""",
        [rank, n],
    )
    out = []
    for row in reversed(rows):
        line = f"last log: {row['level']} {row['logger']}: {row['msg']}"
        if row["exc"] and row["logger"] == "jobtrace":
            line += "\n" + row["exc"].rstrip()
        out.append(line)
    return out


def _span_list(ranks: list[int]) -> str:
    """Compact ``0-3,5,7-9`` list of ranks."""
    parts: list[str] = []
    for r in ranks:
        if parts and isinstance(parts[-1], str) and parts[-1].split("-")[-1] == str(r - 1):
            start = parts[-1].split("-")[0]
            parts[-1] = f"{start}-{r}"
        else:
            parts.append(str(r))
    return ",".join(parts)


def _slow(con: Any, cfg: AnalysisConfig, ranks: list[dict[str, Any]], by_rank: dict[int, RankSummary], nodes: list[str]) -> list[Finding]:
    timed = [r for r in ranks if r["compute_ns"] is not None]
    if len(timed) < 2:
        return []
    ref = statistics.median(r["compute_ns"] for r in timed)
    slow = [
        r for r in timed
        if r["compute_ns"] >= cfg.slow_factor * ref and r["compute_ns"] - ref >= cfg.min_excess_ms * 1e6
    ]
    if not slow or len(slow) * 2 > len(timed):
        return []
    slow_ids = {r["rank"] for r in slow}
    ranks_per_node: dict[str, list[int]] = {}
    for r in timed:
        ranks_per_node.setdefault(r["node"], []).append(r["rank"])
    slow_nodes = [
        n for n, rs in ranks_per_node.items() if len(rs) > 1 and set(rs) <= slow_ids and len(ranks_per_node) > 1
    ]
    others = [r for r in timed if r["rank"] not in slow_ids]
    other_coll = statistics.median(r["coll_ns"] for r in others) if others else 0
    top_op = _rows(
        con,
        f"""SELECT name, sum(dur) AS t FROM events WHERE kind = 'span' AND cat = 'collective'
            AND rank NOT IN ({",".join(str(i) for i in slow_ids)}) GROUP BY name ORDER BY t DESC LIMIT 1""",
    )
    op = top_op[0]["name"] if top_op else None
    findings = []
    groups: list[tuple[str, list[dict[str, Any]]]] = [
        (f"node {n}", [r for r in slow if r["node"] == n]) for n in slow_nodes
    ]
    grouped = {r["rank"] for _, rs in groups for r in rs}
    groups += [(f"rank {r['rank']} on node {r['node']}", [r]) for r in slow if r["rank"] not in grouped]
    for label, members in groups:
        member_ids = [r["rank"] for r in members]
        ratio = statistics.median(r["compute_ns"] for r in members) / ref
        steps = _slow_steps(con, member_ids, cfg.slow_factor)
        step_txt = f"steps {steps[0]}–{steps[-1]}" if steps else "most steps"
        coll_self = statistics.median(r["coll_ns"] for r in members)
        wait_txt = (
            f"; the other ranks spend that time waiting in {op} ({other_coll / 1e6:.1f} ms per step vs "
            f"{coll_self / 1e6:.1f} ms on {'these ranks' if len(members) > 1 else 'this rank'})"
            if op and other_coll > coll_self else ""
        )
        kind = "slow_node" if label.startswith("node") else "slow_rank"
        summary = (
            f"{label}: compute (forward+backward+optimizer) {ratio:.1f}x the median rank over {step_txt} "
            f"({statistics.median(r['compute_ns'] for r in members) / 1e6:.1f} ms vs {ref / 1e6:.1f} ms per step)"
            f"{wait_txt}"
        )
        for r in members:
            if by_rank[r["rank"]].status == "ok":
                by_rank[r["rank"]].status = "slow"
        findings.append(
            Finding(kind, "warning", summary, member_ids, sorted({r["node"] for r in members}),
                    [steps[0], steps[-1]] if steps else [], [],
                    {"ratio": round(ratio, 3), "median_rank_compute_ms": _ms(ref), "slow_steps": len(steps),
                     "others_wait_op": op, "others_wait_ms": _ms(other_coll)})
        )
    return findings


def _slow_steps(con: Any, ranks: list[int], factor: float) -> list[int]:
    rows = _rows(
        con,
        f"""WITH m AS (SELECT step, median(compute_ns) AS med FROM steps GROUP BY step)
            SELECT DISTINCT s.step FROM steps s JOIN m USING (step)
            WHERE s.rank IN ({",".join(str(int(r)) for r in ranks)}) AND s.compute_ns >= ? * m.med
            ORDER BY s.step""",
        [factor],
    )
    return [r["step"] for r in rows]


def _loss(con: Any, cfg: AnalysisConfig) -> list[Finding]:
    con.execute(
        """CREATE OR REPLACE TEMP TABLE loss AS
           SELECT rank, node, step, ts, TRY_CAST(json_extract_string(metrics, '$.loss') AS DOUBLE) AS loss
           FROM events WHERE kind = 'metric' AND json_extract(metrics, '$.loss') IS NOT NULL"""
    )
    findings = []
    nan = _rows(
        con,
        """SELECT min(step) AS step, list(DISTINCT rank ORDER BY rank) AS ranks, list(DISTINCT node) AS nodes,
                  count(*) AS n
           FROM loss WHERE isnan(loss) OR isinf(loss)""",
    )[0]
    if nan["n"]:
        first = _rows(
            con,
            """SELECT list(DISTINCT rank ORDER BY rank) AS ranks FROM loss
               WHERE (isnan(loss) OR isinf(loss)) AND step = ?""",
            [nan["step"]],
        )[0]["ranks"]
        findings.append(
            Finding("loss_nan", "error",
                    f"loss is NaN/Inf from step {nan['step']} on ranks {_span_list(first)} "
                    f"({nan['n']} non-finite values in all)",
                    first, sorted(nan["nodes"]), [nan["step"]], [], {"count": nan["n"]})
        )
    spikes = _rows(
        con,
        f"""WITH w AS (
              SELECT rank, step, loss,
                     median(loss) OVER (PARTITION BY rank ORDER BY step ROWS BETWEEN {cfg.spike_window} PRECEDING
                                        AND 1 PRECEDING) AS recent,
                     count(loss) OVER (PARTITION BY rank ORDER BY step ROWS BETWEEN {cfg.spike_window} PRECEDING
                                       AND 1 PRECEDING) AS n
              FROM loss WHERE NOT (isnan(loss) OR isinf(loss)))
            SELECT step, list(DISTINCT rank ORDER BY rank) AS ranks, max(loss) AS loss, min(recent) AS recent
            FROM w WHERE n >= 5 AND recent > 0 AND loss >= ? * recent GROUP BY step ORDER BY step LIMIT 20""",
        [cfg.spike_factor],
    )
    for s in spikes:
        findings.append(
            Finding("loss_spike", "warning",
                    f"loss spike at step {s['step']}: {s['loss']:.4g}, {s['loss'] / s['recent']:.0f}x the recent "
                    f"median {s['recent']:.4g} (ranks {_span_list(s['ranks'])})",
                    s["ranks"], [], [s["step"]], [], {"loss": s["loss"], "recent_median": s["recent"]})
        )
    return findings
