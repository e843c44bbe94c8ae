"""Stragglers: who is slow, how much, since when, and whether it is chronic or a one-off.

Definitions (all on the ``steps`` and ``colls`` tables, so any backend gives the same):

* **Compute** of a rank in a step is the step span minus the synchronous collective time
  minus the ``data`` phase: the time it spent on its own work. Collective time is mostly
  waiting for the slowest rank, so it is excluded from the rank's own speed.
* **Relative score** (NVRx): the fastest rank's median compute ÷ this rank's median, per
  sliding window of ``window_steps`` steps and over the whole job. 1 is the fastest rank.
* **Individual score** (NVRx): the rank's best window median ÷ its latest window median;
  below the threshold the rank got slower than it used to be.
* A rank is **flagged in a window** when its relative score is below ``straggler_score``,
  its median is at least ``slow_factor`` times the median rank's and ``min_excess_ms``
  longer (ratios of tiny steps are noise). Flagged in at least ``chronic_fraction`` of the
  windows, or in every window from some step to the end, it is **chronic** (``slow_rank``,
  or ``slow_node`` when every rank of one node is, and not every node); flagged in fewer it
  had a **slow episode**. Window medians ignore a single long step, so a one-off stall
  never makes a rank chronic: such steps are reported apart as ``transient_stall``.
* **Late arrival** (HTA's and DeepSpeed's idea, made clock-free): the ranks of one
  collective instance (same group and sequence number) leave it together, so the rank
  that waited least arrived last, and the median rank arrived ``median wait − its wait``
  earlier. No cross-node clock comparison is needed.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from ._model import (
    AFTER_WARMUP,
    AnalysisConfig,
    AnalysisContext,
    EventRef,
    Finding,
    NodeSummary,
    RankSummary,
    ids,
    ms,
    rows,
)
from ._text import count, num, rank_on, step_range, template, times, windows
from ._text import ranks as ranks_text

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["analyze_stragglers", "late_arrivals", "window_size"]


def window_size(cfg: AnalysisConfig, n_steps: int) -> int:
    """Steps per sliding window: ``window_steps`` when set, else an eighth of the job within 5–100."""
    if cfg.window_steps > 0:
        return cfg.window_steps
    return max(5, min(100, n_steps // 8))


def late_arrivals(con: DuckDBPyConnection, n_ranks: int) -> dict[str, Any]:
    """Per collective instance, who arrived last and by how much; summed per rank and op."""
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE inst AS
        SELECT grp, seq, count(*) AS n, min(dur) AS dmin, median(dur) AS dmed, arg_min(rank, dur) AS last_rank,
               any_value(op) AS op, count(DISTINCT op) AS n_ops, min(step) AS step, max(ts) AS ts
        FROM colls WHERE NOT is_async AND seq IS NOT NULL AND (gsize IS NULL OR gsize > 1)
        GROUP BY grp, seq HAVING count(*) >= 2
        """
    )
    per_rank = {
        r["rank"]: r
        for r in rows(
            con,
            """SELECT last_rank AS rank, count(*) AS n_last, median(dmed - dmin) AS lead_ns,
                      sum(dmed - dmin) AS lead_total_ns
               FROM inst GROUP BY last_rank""",
        )
    }
    total = rows(con, "SELECT count(*) AS n FROM inst")[0]["n"]
    ops = rows(
        con,
        """SELECT i.op, count(*) AS instances, round(median(c.dur) / 1e6, 3) AS median_ms,
                  round(median(c.dur - i.dmin) / 1e6, 3) AS median_wait_ms
           FROM inst i JOIN colls c ON c.grp = i.grp AND c.seq = i.seq AND NOT c.is_async
           GROUP BY i.op ORDER BY sum(c.dur) DESC LIMIT 10""",
    ) if total else []
    return {"instances": total, "per_rank": per_rank, "ops": ops, "ranks": n_ranks}


def _late_threshold(cfg: AnalysisConfig, n_ranks: int) -> float:
    # With few ranks someone is always last; demand more than chance.
    return max(cfg.late_share, min(0.9, 2.0 / max(n_ranks, 1)))


def analyze_stragglers(ctx: AnalysisContext) -> tuple[list[Finding], list[NodeSummary], dict[str, Any]]:
    """Slow ranks/nodes, slow episodes and one-off stalls; node summaries; window info for the report.

    Late arrivers get their findings from :func:`late_arrival_findings` once every other check
    has run, since only the ranks nothing else explains are reported as late.
    """
    con, cfg, by_rank, late = ctx.con, ctx.cfg, ctx.by_rank, ctx.late
    findings: list[Finding] = []
    timed = [r for r in ctx.ranks if r["compute_ns"] is not None]
    w = ctx.window
    info: dict[str, Any] = {"window_steps": w}
    # Late arrival counts go on every rank, whether or not it is slow.
    for rank, lr in late["per_rank"].items():
        if rank in by_rank:
            by_rank[rank].last_arrivals = int(lr["n_last"])
            by_rank[rank].late_ms = ms(lr["lead_ns"])
    nodes = _node_summaries(timed, late, by_rank)
    if len(timed) < 2:
        return findings, nodes, info
    fastest = min(r["compute_ns"] for r in timed) or 1
    for r in timed:
        by_rank[r["rank"]].score = round(fastest / r["compute_ns"], 3) if r["compute_ns"] else 1.0

    per_rank_win = _windows(ctx)
    for rank, rw in per_rank_win.items():
        if rank in by_rank:
            by_rank[rank].individual_score = None if rw["ind_last"] is None else round(rw["ind_last"], 3)
            by_rank[rank].slow_windows = int(rw["nf"] or 0)
            by_rank[rank].windows = int(rw["nw"] or 0)
    chronic: list[dict[str, Any]] = []
    episodic: list[dict[str, Any]] = []
    ref = statistics.median(r["compute_ns"] for r in timed)
    if ref <= 0:  # the median rank's steps are all collective: no compute to compare
        return findings, nodes, info
    for r in timed:
        wr = per_rank_win.get(r["rank"])
        if not wr or not wr["nf"]:
            continue
        tail = wr["last_ok_win"] is None or wr["last_ok_win"] < wr["first_flag_win"]
        if tail and wr["nf"] >= 2:
            chronic.append(r | {"_w": wr})  # slow from some step on (or throughout)
        elif wr["nf"] / wr["nw"] >= cfg.chronic_fraction:
            # Slow over the whole run only if the whole run says so too: a few short windows over the
            # threshold (a busy machine, a rank whose data wait leaves its caches cold) are not a culprit.
            if r["compute_ns"] >= cfg.slow_factor * ref:
                chronic.append(r | {"_w": wr})
        elif wr["nf"] >= 2:  # one window of a few steps is noise or a one-off stall, reported apart
            episodic.append(r | {"_w": wr})
    if chronic:
        findings += _chronic(ctx, chronic, timed, ref)
    for r in episodic:
        wr = r["_w"]
        f = Finding(
            "slow_episode", "warning",
            _say_slow_episode(r["rank"], r["node"], wr["first_slow"], wr["last_slow"], wr["min_rel"], wr["max_ratio"],
                              wr["nf"], wr["nw"], w),
            [r["rank"]], [r["node"]], [wr["first_slow"], wr["last_slow"]], [],
            {"min_score": round(wr["min_rel"], 3), "windows_slow": wr["nf"], "windows": wr["nw"],
             "window_steps": w, "chronic": False},
        )
        findings.append(f.cite(_step_refs(con, [r["rank"]], wr["first_slow"], wr["last_slow"])))
        ctx.mark(r["rank"], "slow")
    if not chronic and not episodic:
        findings += _phase_split(ctx)
    named = {x for f in findings for x in f.ranks}
    findings += _one_offs(ctx, named)
    info["reference_compute_ms"] = ms(ref)
    info["fastest_compute_ms"] = ms(fastest)
    return findings, nodes, info


_PHASES = (("forward", "fwd_ns"), ("backward", "bwd_ns"), ("optimizer", "opt_ns"))
_EPISODE_STEPS = 5
"""Consecutive flagged steps that make a slow episode of the phase split (fewer are a busy machine's noise)."""


def _phase_split(ctx: AnalysisContext) -> list[Finding]:
    """The straggler of a synchronised job whose steps say only how long each phase took.

    In data-parallel training every rank leaves the gradient all-reduce together, so step times
    are the same on every rank and "compute" (step minus collectives minus data) is too when the
    log names no collective: a slow rank's long forward is matched by the others' long backward,
    where they wait for it. Per step, a rank is the straggler when one phase of it is at least
    ``slow_factor`` x and ``min_excess_ms`` (and a tenth of the step) over the median rank's, and a later phase of the
    other ranks is longer than its own by at least half that excess (the wait moved there).
    Flagged in ``chronic_fraction`` of the steps: ``slow_rank``; in a run of :data:`_EPISODE_STEPS` or more: ``slow_episode``.
    """
    cfg = ctx.cfg
    data = rows(ctx.con, f"SELECT rank, step, step_ns, fwd_ns, bwd_ns, opt_ns FROM steps WHERE {AFTER_WARMUP} "
                         "AND fwd_ns IS NOT NULL AND bwd_ns IS NOT NULL AND coll_ns = 0 ORDER BY step, rank",
                ctx.warm_params())
    by_step: dict[int, dict[int, dict[str, Any]]] = {}
    for r in data:
        by_step.setdefault(r["step"], {})[r["rank"]] = r
    flagged: dict[int, list[tuple[int, str, float]]] = {}
    steps = sorted(s for s, rs in by_step.items() if len(rs) >= 2)
    for step in steps:
        ranks = by_step[step]
        # an excess under a tenth of the step is the noise of a busy machine, not a rank the job waits for
        floor = max(cfg.min_excess_ms * 1e6, 0.1 * statistics.median(v["step_ns"] or 0 for v in ranks.values()))
        for i, (phase, col) in enumerate(_PHASES[:-1]):
            vals = {r: v[col] or 0 for r, v in ranks.items()}
            med = statistics.median(vals.values())
            rank = max(vals, key=lambda r: (vals[r], -r))
            excess = vals[rank] - med
            if excess < floor or vals[rank] < cfg.slow_factor * med:
                continue
            later = [c for _, c in _PHASES[i + 1:]]
            others = [r for r in ranks if r != rank]
            wait = statistics.median(sum(ranks[o][c] or 0 for c in later) for o in others) \
                - sum(ranks[rank][c] or 0 for c in later)
            if wait >= excess / 2:
                flagged.setdefault(rank, []).append((step, phase, excess))
                break
    out = []
    for rank, hits in sorted(flagged.items()):
        hit_steps = [h[0] for h in hits]
        phase = statistics.mode(h[1] for h in hits)
        excess_ms = statistics.median(h[2] for h in hits) / 1e6
        node = ctx.by_rank[rank].node if rank in ctx.by_rank else ""
        run = _longest_run(hit_steps, steps)
        share = len(hits) / len(steps)
        if share >= cfg.chronic_fraction:
            kind = "slow_rank"
        elif len(run) >= _EPISODE_STEPS:
            kind = "slow_episode"
        else:
            continue
        f = Finding(kind, "warning",
                    _say_phase_split(rank, node, phase, kind == "slow_rank", len(hits), len(steps), run[0], run[-1],
                                     excess_ms),
                    [rank], [node], [run[0], run[-1]] if kind == "slow_episode" else [], [],
                    {"phase": phase, "excess_ms": round(excess_ms, 3), "steps_flagged": len(hits),
                     "steps": len(steps), "rule": "phase split", "chronic": kind == "slow_rank"})
        out.append(f.cite(_step_refs(ctx.con, [rank], hit_steps[0], hit_steps[-1])))
        ctx.mark(rank, "slow")
    return out


def _longest_run(hits: list[int], steps: list[int]) -> list[int]:
    """The longest run of ``hits`` that are consecutive among ``steps`` (the steps every rank logged)."""
    pos = {s: i for i, s in enumerate(steps)}
    best: list[int] = []
    cur: list[int] = []
    for s in hits:
        cur = cur + [s] if cur and pos[s] == pos[cur[-1]] + 1 else [s]
        if len(cur) > len(best):
            best = cur
    return best


def _job_time_ns(ctx: AnalysisContext) -> float:
    """The job's stepping time on its median rank (median step × steps); 0 where no steps are timed."""
    timed = [r for r in ctx.ranks if r.get("step_ns") and r.get("n")]
    if not timed:
        return 0.0
    return float(statistics.median(r["step_ns"] * r["n"] for r in timed))


def late_arrival_findings(ctx: AnalysisContext, named: set[int]) -> list[Finding]:
    """Ranks that arrive last at most collectives and that no other finding explains (``named`` are explained)."""
    cfg, late, by_rank = ctx.cfg, ctx.late, ctx.by_rank
    total = late["instances"]
    if total < 10:  # too few collectives to call a habit
        return []
    thr = _late_threshold(cfg, late["ranks"])
    job_ns = _job_time_ns(ctx)
    out = []
    for rank, lr in sorted(late["per_rank"].items()):
        share = lr["n_last"] / total
        if rank in named or share < thr or (lr["lead_ns"] or 0) < cfg.min_excess_ms * 1e6:
            continue
        if job_ns and (lr["lead_total_ns"] or 0) < cfg.late_cost_share * job_ns:
            continue  # last often, but the waits it causes are too small to matter
        node = by_rank[rank].node if rank in by_rank else ""
        out.append(Finding(
            "late_arrival", "warning",
            _say_late_arrival(rank, node, lr["n_last"], total, share, lr["lead_ns"] / 1e6),
            [rank], [node], [], [], {"last_arrivals": lr["n_last"], "instances": total, "share": round(share, 3),
                                     "late_ms": ms(lr["lead_ns"]),
                                     "imposed_wait_ms": ms(lr["lead_total_ns"])},
        ))
        if rank in by_rank:
            ctx.mark(rank, "late")
    return out


def _windows(ctx: AnalysisContext) -> dict[int, dict[str, Any]]:
    """Per rank, its windows' verdicts (flagged or not), from the ``rank_windows`` table built here."""
    con, cfg, w = ctx.con, ctx.cfg, ctx.window
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE rank_windows AS
        WITH b AS (SELECT min(step) AS s0 FROM steps WHERE {AFTER_WARMUP}),
        x AS (SELECT rank, (step - b.s0) // {int(w)} AS win, min(step) AS s_lo, max(step) AS s_hi,
                     median(compute_ns) AS c, count(*) AS n
              FROM steps, b WHERE {AFTER_WARMUP} GROUP BY rank, win),
        ref AS (SELECT win, min(c) AS fast, median(c) AS med FROM x GROUP BY win),
        best AS (SELECT rank, min(c) AS best FROM x GROUP BY rank)
        SELECT x.*, ref.fast, ref.med, ref.fast / nullif(x.c, 0) AS rel, best.best / nullif(x.c, 0) AS ind,
               coalesce(x.c >= {cfg.slow_factor} * ref.med AND x.c - ref.med >= {cfg.min_excess_ms * 1e6}
                        AND ref.fast / nullif(x.c, 0) < {cfg.straggler_score}, false) AS flagged
        FROM x JOIN ref USING (win) JOIN best USING (rank)
        """,
        ctx.warm_params(),
    )
    out = rows(
        con,
        """SELECT rank, count(*) AS nw, count(*) FILTER (WHERE flagged) AS nf,
                  min(win) FILTER (WHERE flagged) AS first_flag_win, max(win) FILTER (WHERE NOT flagged) AS last_ok_win,
                  min(s_lo) FILTER (WHERE flagged) AS first_slow, max(s_hi) FILTER (WHERE flagged) AS last_slow,
                  min(rel) AS min_rel, max(c / nullif(med, 0)) FILTER (WHERE flagged) AS max_ratio,
                  median(c / nullif(med, 0)) FILTER (WHERE flagged) AS ratio_flagged,
                  median(rel) FILTER (WHERE flagged) AS score_flagged,
                  arg_max(ind, win) AS ind_last
           FROM rank_windows GROUP BY rank""",
    )
    return {r["rank"]: r for r in out}


def _node_summaries(timed: list[dict[str, Any]], late: dict[str, Any], by_rank: dict[int, RankSummary]) -> list[NodeSummary]:
    per_node: dict[str, list[dict[str, Any]]] = {}
    for r in timed:
        per_node.setdefault(r["node"], []).append(r)
    meds = {n: statistics.median(r["compute_ns"] for r in rs) for n, rs in per_node.items()}
    fastest = min(meds.values()) if meds else None
    out = []
    for n in sorted(per_node):
        members = sorted(r["rank"] for r in per_node[n])
        out.append(NodeSummary(
            node=n, ranks=members, compute_ms=ms(meds[n]),
            score=round(fastest / meds[n], 3) if fastest and meds[n] else None,
            last_arrivals=sum(int(late["per_rank"].get(r, {}).get("n_last", 0)) for r in members),
        ))
    return out


def _chronic(ctx: AnalysisContext, slow: list[dict[str, Any]], timed: list[dict[str, Any]],
             ref: float) -> list[Finding]:
    """One finding per slow node (every rank of it slow, not every node) and per other chronically slow rank."""
    con, cfg, by_rank, late = ctx.con, ctx.cfg, ctx.by_rank, ctx.late
    slow_ids = {r["rank"] for r in slow}
    ranks_per_node: dict[str, list[int]] = {}
    for r in timed:
        ranks_per_node.setdefault(r["node"], []).append(r["rank"])
    slow_nodes = [
        n for n, rs in ranks_per_node.items() if len(rs) > 1 and set(rs) <= slow_ids and len(ranks_per_node) > 1
    ]
    others = [r for r in timed if r["rank"] not in slow_ids]
    other_coll = statistics.median(r["coll_ns"] or 0 for r in others) if others else 0
    top_op = rows(
        con,
        f"""SELECT op AS name, sum(dur) AS t FROM colls WHERE NOT is_async AND rank NOT IN ({ids(sorted(slow_ids))})
            GROUP BY op ORDER BY t DESC LIMIT 1""",
    )
    op = top_op[0]["name"] if top_op else None
    groups: list[tuple[str, list[dict[str, Any]]]] = [
        (f"node {n}", [r for r in slow if r["node"] == n]) for n in sorted(slow_nodes)
    ]
    grouped = {r["rank"] for _, rs in groups for r in rs}
    groups += [(f"rank {r['rank']} on node {r['node']}", [r]) for r in slow if r["rank"] not in grouped]
    total = late["instances"]
    findings = []
    for label, members in groups:
        member_ids = [r["rank"] for r in members]
        own = statistics.median(r["compute_ns"] for r in members)
        ratio = own / ref
        steps = _slow_steps(con, member_ids, cfg.slow_factor)
        since = _onset(steps, min(r["_w"]["first_slow"] for r in members), cfg)
        onset = all(r["_w"]["nf"] / r["_w"]["nw"] < cfg.chronic_fraction for r in members)
        if onset:  # slow only from some step on: describe the slow part, not the whole job
            ratio = statistics.median(r["_w"]["ratio_flagged"] for r in members)
            own = ratio * ref
            steps = [s for s in steps if s >= since]
        imposed = _imposed_wait(con, member_ids, steps)
        if imposed is not None and imposed < cfg.imposed_wait_share:
            # Slower, but the others do not wait for it: its own collective wait shrinks by what it
            # loses in compute (a busy core, a rank with more host work), so the job is not slowed.
            continue
        coll_self = statistics.median(r["coll_ns"] or 0 for r in members)
        scores = [s for s in (by_rank[i].score for i in member_ids) if s is not None]
        score = min(scores) if scores else None
        if onset:
            score = round(min(r["_w"]["score_flagged"] for r in members), 3)
        nf = sum(r["_w"]["nf"] for r in members)
        nw = sum(r["_w"]["nw"] for r in members)
        lasts = sum(int(late["per_rank"].get(i, {}).get("n_last", 0)) for i in member_ids)
        kind = "slow_node" if label.startswith("node") else "slow_rank"
        summary = _say_chronic(
            label.removeprefix("node ") if kind == "slow_node" else None, member_ids, members[0]["node"], ratio,
            steps[0] if steps else None, steps[-1] if steps else None, since if onset else None, own / 1e6,
            ref / 1e6, op if op and other_coll > coll_self else None, other_coll / 1e6, coll_self / 1e6, score, nf, nw,
            lasts, total)
        for r in members:
            ctx.mark(r["rank"], "slow")
        f = Finding(
            kind, "warning", summary, member_ids, sorted({r["node"] for r in members}),
            [steps[0], steps[-1]] if steps else [], [],
            {"ratio": round(ratio, 3), "median_rank_compute_ms": ms(ref), "slow_steps": len(steps),
             "others_wait_op": op, "others_wait_ms": ms(other_coll), "score": score, "chronic": True,
             "since_step": since, "windows_slow": nf, "windows": nw, "last_arrivals": lasts,
             "collectives": total, "imposed_wait_share": None if imposed is None else round(imposed, 2)},
        )
        worst = steps[-5:] if steps else []
        findings.append(f.cite(_step_refs(con, member_ids, since, None, limit=10, only=worst)))
    return findings


def _imposed_wait(con: DuckDBPyConnection, ranks: list[int], steps: list[int]) -> float | None:
    """Share of the ranks' extra compute that the other ranks spend waiting in collectives, per step of ``steps``.

    A straggler's extra compute reappears as the others' extra collective wait (1.0: all of it);
    a rank that is merely slower, and waits less itself, imposes nothing (about 0). ``None`` when
    the steps carry no collective timings (logs only), where compute alone has to decide.
    """
    if not steps:
        return None
    out = rows(
        con,
        f"""WITH s AS (SELECT step, rank IN ({ids(ranks)}) AS member, compute_ns, coll_ns FROM steps
                       WHERE step IN ({ids(steps)})),
            per AS (SELECT step,
                           median(compute_ns) FILTER (WHERE member) - median(compute_ns) AS excess,
                           median(coll_ns) FILTER (WHERE NOT member) - median(coll_ns) FILTER (WHERE member) AS imposed,
                           count(coll_ns) AS n_coll
                    FROM s GROUP BY step)
            SELECT median(imposed / excess) FILTER (WHERE excess > 0 AND imposed IS NOT NULL) AS share,
                   sum(n_coll) AS n_coll FROM per""",
    )[0]
    # The median step, not the sum: one step whose collective waited on something else (the first
    # step's broadcast while other ranks still start up, a hang's last collective) must not decide.
    if not out["n_coll"] or out["share"] is None:
        return None
    return float(out["share"])


def _onset(slow_steps: list[int], window_start: int, cfg: AnalysisConfig) -> int:
    """The first step of a run of slow steps that leads into the first slow window."""
    run = set(slow_steps)
    k = 5
    w = cfg.window_steps or 100
    for s in slow_steps:
        if s >= window_start - w and all(s + i in run for i in range(k)):
            return min(s, window_start)
    return window_start


def _slow_steps(con: DuckDBPyConnection, ranks: list[int], factor: float) -> list[int]:
    out = rows(
        con,
        f"""WITH m AS (SELECT step, median(compute_ns) AS med FROM steps GROUP BY step)
            SELECT DISTINCT s.step FROM steps s JOIN m USING (step)
            WHERE s.rank IN ({ids(ranks)}) AND s.compute_ns >= ? * m.med
            ORDER BY s.step""",
        [factor],
    )
    return [r["step"] for r in out]


def _step_refs(con: DuckDBPyConnection, ranks: list[int], lo: int | None, hi: int | None, limit: int = 10,
               only: list[int] | None = None) -> list[EventRef]:
    where = f"rank IN ({ids(ranks)})"
    if only:
        where += f" AND step IN ({ids(only)})"
    else:
        if lo is not None:
            where += f" AND step >= {int(lo)}"
        if hi is not None:
            where += f" AND step <= {int(hi)}"
    out = rows(con, f"SELECT rank, step, t1, span_id FROM steps WHERE {where} ORDER BY compute_ns DESC LIMIT {int(limit)}")
    return [EventRef(r["rank"], int(r["t1"]), "span", r["step"], r["span_id"], "step") for r in out]


def _one_offs(ctx: AnalysisContext, named: set[int]) -> list[Finding]:
    """Single long steps of a rank that is otherwise not slow (not in ``named``): a one-off stall, not chronic lag."""
    con, cfg, by_rank, n_steps = ctx.con, ctx.cfg, ctx.by_rank, ctx.n_steps
    out = rows(
        con,
        f"""WITH r AS (SELECT rank, median(step_ns - coll_ns) AS own_med FROM steps WHERE {AFTER_WARMUP} GROUP BY rank),
                 op AS (SELECT step, arg_max(op, dur) AS op, max(dur) AS wait FROM colls WHERE NOT is_async GROUP BY step)
            SELECT s.rank, s.node, s.step, s.step_ns - s.coll_ns AS own, r.own_med, s.t1, s.span_id, op.op, op.wait
            FROM steps s JOIN r USING (rank) LEFT JOIN op USING (step)
            WHERE {AFTER_WARMUP} AND s.step_ns - s.coll_ns >= $factor * r.own_med
              AND s.step_ns - s.coll_ns - r.own_med >= $min_ns
            ORDER BY s.step_ns - s.coll_ns - r.own_med DESC LIMIT 500""",
        ctx.warm_params(factor=cfg.one_off_factor, min_ns=cfg.one_off_min_ms * 1e6),
    )
    if not out:
        return []
    n_ranks = len(by_rank)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in out:
        by_step.setdefault(r["step"], []).append(r)
    findings: list[Finding] = []
    job_wide = {s for s, rs in by_step.items() if n_ranks > 1 and len(rs) * 2 > n_ranks}
    for s in sorted(job_wide)[: cfg.max_findings_per_kind]:
        rs = by_step[s]
        excess = statistics.median(r["own"] - r["own_med"] for r in rs)
        f = Finding(
            "job_pause", "info",
            _say_job_pause(len(rs), n_ranks, s, excess / 1e9),
            sorted(r["rank"] for r in rs), sorted({r["node"] for r in rs}), [s], [], {"excess_ms": ms(excess)},
        )
        findings.append(f.cite([EventRef(r["rank"], int(r["t1"]), "span", s, r["span_id"], "step") for r in rs]))
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for r in out:
        if r["step"] not in job_wide and r["rank"] not in named:
            per_rank.setdefault(r["rank"], []).append(r)
    for rank, rs in sorted(per_rank.items())[: cfg.max_findings_per_kind]:
        rs.sort(key=lambda r: r["step"])
        worst = max(rs, key=lambda r: r["own"] - r["own_med"])
        rsum = by_rank[rank]
        many = len(rs) > max(3, n_steps // 10)
        kind, sev = ("intermittent_stall", "warning") if many else ("transient_stall", "info")
        f = Finding(
            kind, sev,
            _say_stalls(rank, rsum.node, [r["step"] for r in rs], (worst["own"] - worst["own_med"]) / 1e9,
                        worst["own"] / 1e6, worst["own_med"] / 1e6, worst["op"], rsum.score, rsum.slow_windows,
                        rsum.windows),
            [rank], [rsum.node], [r["step"] for r in rs], [],
            {"chronic": False, "stall_ms": ms(worst["own"] - worst["own_med"]), "count": len(rs),
             "score": rsum.score, "windows_slow": rsum.slow_windows, "windows": rsum.windows},
        )
        findings.append(f.cite([EventRef(rank, int(r["t1"]), "span", r["step"], r["span_id"], "step") for r in rs]))
        if many:
            ctx.mark(rank, "stalls")
    return findings


# The findings' wording: plain values in, one phrase out (see queries._text; tests/queries/test_report_text.py
# renders each with singular, plural, zero and infinite values).


def _score(score: float | None, scale: bool = True) -> str:
    """``straggler score 0.50 (fastest rank = 1)``; ``scale=False`` inside a parenthesis (no nested brackets)."""
    if score is None:
        return "no straggler score"
    return f"straggler score {num(score, '.2f')}" + (" (fastest rank = 1)" if scale else " of 1")


@template
def _say_slow_episode(rank: int, node: str, first: int, last: int, score: float, ratio: float, slow_windows: int,
                      windows_: int, window_steps: int) -> str:
    return (f"{rank_on(rank, node)} was slow over {step_range(first, last)} ({_score(score, scale=False)}, compute "
            f"{times(ratio, 'the median rank')}) and recovered: {windows(slow_windows, windows_, window_steps)}")


@template
def _say_phase_split(rank: int, node: str, phase: str, chronic: bool, flagged: int, steps: int, first: int, last: int,
                     excess_ms: float) -> str:
    what = f"on {flagged:,} of {count(steps, 'step')}" if chronic else f"over {step_range(first, last)} and recovered"
    return (f"{rank_on(rank, node)} is slow in {phase} {what}: {num(excess_ms, '.1f')} ms over the median rank "
            f"(median), while the others wait for it in the phases after (their step times match: the job is "
            f"synchronised)")


@template
def _say_late_arrival(rank: int, node: str, last: int, total: int, share: float, late_ms: float) -> str:
    return (f"{rank_on(rank, node)} arrives last at {last:,} of {count(total, 'collective')} "
            f"({num(share * 100, '.0f')}%), {num(late_ms, '.1f')} ms after the median rank (median); the others "
            f"wait for it")


@template
def _say_chronic(node: str | None, ranks: list[int], rank_node: str, ratio: float, first: int | None,
                 last: int | None, since: int | None, own_ms: float, ref_ms: float, op: str | None, others_ms: float,
                 self_ms: float, score: float | None, slow_windows: int, windows_: int, last_arrivals: int,
                 collectives: int) -> str:
    one = len(set(ranks)) == 1
    if node is not None:
        label = f"node {node} ({ranks_text(ranks)}, {'its only rank' if one else 'all of its ranks'})"
    else:
        label = rank_on(ranks[0], rank_node) if ranks else f"a rank on node {rank_node}"
    if since is not None:
        over = (f"steps {since}–{last if last is not None else 'the end'}" if last != since else f"step {since}")
        over += f" (slow since step {since}, not before)"
    else:
        over = step_range(first, last) if first is not None and last is not None else "most steps"
    wait = (f"; the other ranks spend that time waiting in {op} ({num(others_ms, '.1f')} ms per step vs "
            f"{num(self_ms, '.1f')} ms on {'this rank' if one else 'these ranks'})" if op else "")
    late = (f"; {'arrives' if one else 'they arrive'} last at {last_arrivals:,} of {count(collectives, 'collective')}"
            if collectives and last_arrivals else "")
    return (f"{label}: compute (forward+backward+optimizer) {times(ratio, 'the median rank')} over {over} "
            f"({num(own_ms, '.1f')} ms vs {num(ref_ms, '.1f')} ms per step){wait}; {_score(score)}, "
            f"{windows(slow_windows, windows_)}{late}")


@template
def _say_job_pause(paused: int, ranks: int, step: int, seconds: float) -> str:
    return (f"{paused:,} of {count(ranks, 'rank')} paused together at step {step} for {num(seconds, '.2f')} s (a "
            f"checkpoint, evaluation or garbage collection?); a one-off, not a straggler")


@template
def _say_stalls(rank: int, node: str, steps: list[int], longest_s: float, own_ms: float, median_ms: float,
                op: str | None, score: float | None, slow_windows: int, windows_: int) -> str:
    if len(steps) > 1:
        listed = ", ".join(str(s) for s in steps[:8]) + (", …" if len(steps) > 8 else "")
        what = f"{count(len(steps), 'long step')} ({listed}), the longest"
    else:
        what = f"a one-off stall at step {steps[0]}," if steps else "a one-off stall,"
    wait = f"; the others waited in {op}" if op else ""
    return (f"{rank_on(rank, node)}: {what} {num(longest_s, '.2f')} s over its median ({num(own_ms, '.1f')} ms vs "
            f"{num(median_ms, '.1f')} ms of own time){wait}; not chronic: {_score(score)}, "
            f"{windows(slow_windows, windows_)}")
