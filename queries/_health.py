"""Training health per rank and step: the anomalies that are not about speed between ranks.

Rules (thresholds in :class:`AnalysisConfig`):

* ``nan_loss``: the first step a rank reported a non-finite loss or grad norm (a NaN gradient
  is the same failure one step earlier: the update is lost either way); else a log record that
  says so (apex's ``NaN or Inf found in input tensor``, Megatron's ``found NaN in local grad norm``).
* ``loss_spike``: Megatron's rule, a loss above ``spike_factor`` × the max |loss| of the
  previous ``spike_window`` values; or the robust rule, a loss ``spike_z`` robust standard
  deviations (IQR / 1.349) above the trailing median and ``spike_min_rel`` above it. The
  robust rule needs one earlier value (a real log often shows two or three before the jump);
  below ``spike_factor`` × the median its finding is ``info``.
* ``divergence``: a loss that rose and stayed up: the last ``divergence_tail`` values all at
  least ``divergence_factor`` × the lowest before them, or a rise at every one of the last
  ``divergence_tail`` + 1 values ending ``divergence_factor`` × above where it began.
* ``grad_norm_high`` (above ``grad_norm_max`` when set) and ``grad_explosion``
  (``grad_explode_factor`` × the trailing median of at least one earlier value).
* ``loss_scale_collapse``: the fp16 loss scale at or below ``loss_scale_min`` after it had
  been above it or after an overflow (a constant 1.0 is bf16 or fp32: nothing fell).
* ``overflow_cascade``: ``overflow_cascade_min`` or more overflow skips in a row once training
  had settled (after the first loss or step), where a row allows ``overflow_gap_steps`` logged
  steps between skips. The skips of the start-up search for a loss scale, before any step
  completes, are normal.
* ``lr_anomaly``: a non-finite or negative learning rate, ranks that disagree on it at
  the same step, or a jump of ``lr_jump_factor`` × between consecutive steps.
* ``memory_leak``: memory (CUDA allocated, else host RSS) whose *floor* (the lowest value
  from a step on, so memory that is later freed does not count) rises by at least
  ``leak_min_mb`` and ``leak_min_frac`` of its baseline, in several increments; it began
  where a flat-then-rising line fits the samples best (a least-squares hinge: noise in
  the flat part does not pull the start early, as a first crossing of the floor would).
* ``throughput_drop``: the job's step time (median over ranks), smoothed with a centred
  rolling median, ``throughput_drop`` above the best it had been before, for a window, and
  ``throughput_spread_z`` robust standard deviations (IQR / 1.349) of the steps before it
  above their median (a noisy job's swings are not a drop).
* ``data_wait``: ranks spending ``data_wait_frac`` of their step in the ``data`` phase.
* ``comm_share_rising``: the transfer share of step time (the least any rank spent in a
  step's collectives, so waiting for stragglers is not counted) rising by ``comm_rise``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from typing import TYPE_CHECKING, Any, Final

from ._model import AFTER_WARMUP, AnalysisConfig, AnalysisContext, EventRef, Finding, ids, ms, rows
from ._text import count, num, step_range, template, times
from ._text import ranks as ranks_text

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["analyze_health", "breakdown", "rolling_median"]


def analyze_health(ctx: AnalysisContext) -> list[Finding]:
    """Every rule of the module docstring, in its order; each reads what it needs from ``ctx``."""
    con, cfg = ctx.con, ctx.cfg
    out: list[Finding] = []
    out += _first_nonfinite(con) or _nonfinite_messages(con)
    out += _loss_spikes(con, cfg)
    out += _divergence(con, cfg)
    out += _grad_norm(con, cfg)
    out += _loss_scale(con, cfg)
    out += _overflow_cascade(con, cfg)
    out += _lr(con, cfg)
    out += _leaks(ctx)
    out += _data_wait(ctx)
    out += _throughput(ctx)
    out += _comm_trend(ctx)
    return out


def _metric_refs(con: DuckDBPyConnection, where: str, params: list[Any], limit: int = 10) -> list[EventRef]:
    out = rows(con, f"SELECT rank, step, ts, span_id FROM mets WHERE {where} ORDER BY step, rank LIMIT {int(limit)}",
               params)
    return [EventRef(r["rank"], int(r["ts"]), "metric", r["step"], r["span_id"]) for r in out]


def _nonfinite(con: DuckDBPyConnection, col: str, what: str) -> list[Finding]:
    bad = f"(isnan({col}) OR isinf({col}))"
    first = rows(con, f"""SELECT min(step) AS step, count(*) AS n, list(DISTINCT node) AS nodes
                          FROM mets WHERE {col} IS NOT NULL AND {bad}""")[0]
    if not first["n"]:
        return []
    ranks = rows(con, f"SELECT list(DISTINCT rank ORDER BY rank) AS r FROM mets WHERE {bad} AND step = ?",
                 [first["step"]])[0]["r"]
    all_ranks = rows(con, f"SELECT list(DISTINCT rank ORDER BY rank) AS r FROM mets WHERE {bad}")[0]["r"]
    f = Finding("nan_loss", "error", _say_nonfinite(what, first["step"], ranks, first["n"], len(all_ranks)),
                ranks, sorted(first["nodes"]), [first["step"]], [],
                {"metric": col, "count": first["n"], "all_ranks": all_ranks})
    return [f.cite(_metric_refs(con, f"{bad} AND step = ?", [first["step"]]))]


def _first_nonfinite(con: DuckDBPyConnection) -> list[Finding]:
    """One ``nan_loss`` finding: the loss's or the grad norm's, whichever went first (the loss on a tie)."""
    found = _nonfinite(con, "loss", "loss is NaN/Inf") + _nonfinite(con, "grad_norm", "gradient norm is NaN/Inf")
    if len(found) < 2:
        return found
    first, other = sorted(found, key=lambda f: f.steps[0])  # stable: the loss first on a tie
    first.summary += f"; {other.summary.split(' (')[0]}"
    first.details["also"] = {"metric": other.details["metric"], "step": other.steps[0]}
    return [first]


_NONFINITE_MESSAGES: Final = ("NaN or Inf found in input tensor", "found NaN in local grad norm")
"""Records that say a training value went non-finite where no metric shows it (apex, Megatron-LM)."""


def _nonfinite_messages(con: DuckDBPyConnection) -> list[Finding]:
    found = rows(con, """SELECT rank, node, ts, step, span_id, msg FROM events
                         WHERE kind = 'log' AND msg IS NOT NULL AND (contains(msg, $a) OR contains(msg, $b))
                         ORDER BY ts, rank LIMIT 20""",
                 {"a": _NONFINITE_MESSAGES[0], "b": _NONFINITE_MESSAGES[1]})
    if not found:
        return []
    first = found[0]
    ranks = sorted({r["rank"] for r in found if r["ts"] == first["ts"]})
    f = Finding("nan_loss", "error",
                _say_nonfinite_messages(first["msg"], len(found), sorted({r["rank"] for r in found})),
                ranks, sorted({r["node"] for r in found if r["node"]}), [first["step"]] if first["step"] is not None else [],
                [], {"metric": "log", "count": len(found)})
    return [f.cite([EventRef(r["rank"], int(r["ts"]), "log", r["step"], r["span_id"]) for r in found])]


def _loss_spikes(con: DuckDBPyConnection, cfg: AnalysisConfig) -> list[Finding]:
    n = int(cfg.spike_window)
    spikes = rows(
        con,
        f"""WITH x AS (SELECT rank, step, ts, span_id, loss FROM mets WHERE loss IS NOT NULL AND isfinite(loss)),
            w AS (
              SELECT *, max(abs(loss)) OVER win AS recent_max, quantile_cont(loss, [0.25, 0.5, 0.75]) OVER win AS q,
                     count(loss) OVER win AS n
              FROM x WINDOW win AS (PARTITION BY rank ORDER BY step ROWS BETWEEN {n} PRECEDING AND 1 PRECEDING)),
            s AS (
              SELECT *, n >= 5 AND recent_max > 0 AND loss > ? * recent_max AS megatron,
                     n >= 1 AND q[2] > 0 AND loss > q[2] + ? * greatest((q[3] - q[1]) / 1.349, 1e-3 * abs(q[2]))
                       AND loss >= (1 + ?) * q[2] AS robust
              FROM w)
            SELECT step, list(DISTINCT rank ORDER BY rank) AS ranks, max(loss) AS loss, min(q[2]) AS recent,
                   max(recent_max) AS recent_max, bool_or(megatron) AS megatron, bool_or(robust) AS robust,
                   list(ts ORDER BY rank) AS tss, list(span_id ORDER BY rank) AS sids, list(rank ORDER BY rank) AS rs
            FROM s WHERE megatron OR robust GROUP BY step ORDER BY step LIMIT {int(cfg.max_findings_per_kind)}""",
        [cfg.spike_factor, cfg.spike_z, cfg.spike_min_rel],
    )
    out = []
    for s in spikes:
        rules = [r for r, on in (("megatron_10x", s["megatron"]), ("robust", s["robust"])) if on]
        ratio = s["loss"] / s["recent"] if s["recent"] else float("inf")
        # The stated rule (README, alert rules): a spike is >= spike_factor x the recent median or max. A
        # robust-only jump below that (a 2-4x wiggle of a noisy loss) is shown, as info, and keeps exit 0.
        severity = "warning" if s["megatron"] or ratio >= cfg.spike_factor else "info"
        f = Finding("loss_spike", severity,
                    _say_loss_spike(s["step"], s["loss"], ratio, s["recent"], int(cfg.spike_window), s["recent_max"],
                                    rules, s["ranks"]),
                    s["ranks"], [], [s["step"]], [],
                    {"loss": s["loss"], "recent_median": s["recent"], "recent_max": s["recent_max"], "rules": rules})
        out.append(f.cite([EventRef(r, int(t), "metric", s["step"], sid) for r, t, sid in
                           zip(s["rs"], s["tss"], s["sids"])]))
    return out


def _grad_norm(con: DuckDBPyConnection, cfg: AnalysisConfig) -> list[Finding]:
    out = []
    if cfg.grad_norm_max is not None:
        hi = rows(con, """SELECT min(step) AS step, count(*) AS n, list(DISTINCT rank ORDER BY rank) AS ranks,
                                 max(grad_norm) AS worst FROM mets WHERE isfinite(grad_norm) AND grad_norm > ?""",
                  [cfg.grad_norm_max])[0]
        if hi["n"]:
            f = Finding("grad_norm_high", "warning",
                        _say_grad_norm_high(cfg.grad_norm_max, hi["step"], hi["n"], hi["worst"], hi["ranks"]),
                        hi["ranks"], [], [hi["step"]], [], {"count": hi["n"], "max": hi["worst"],
                                                            "threshold": cfg.grad_norm_max})
            out.append(f.cite(_metric_refs(con, "isfinite(grad_norm) AND grad_norm > ?", [cfg.grad_norm_max])))
    n = int(cfg.spike_window)
    ex = rows(
        con,
        f"""WITH w AS (SELECT rank, step, grad_norm,
                              median(grad_norm) OVER (PARTITION BY rank ORDER BY step ROWS BETWEEN {n} PRECEDING
                                                      AND 1 PRECEDING) AS med,
                              count(grad_norm) OVER (PARTITION BY rank ORDER BY step ROWS BETWEEN {n} PRECEDING
                                                     AND 1 PRECEDING) AS n
                       FROM mets WHERE grad_norm IS NOT NULL AND isfinite(grad_norm))
            SELECT min(step) AS step, count(*) AS n, list(DISTINCT rank ORDER BY rank) AS ranks,
                   max(grad_norm / med) AS ratio, arg_max(grad_norm, grad_norm / med) AS worst,
                   list(DISTINCT step ORDER BY step) AS steps
            FROM w WHERE n >= 1 AND med > 0 AND grad_norm >= ? * med""",
        [cfg.grad_explode_factor],
    )[0]
    if ex["n"]:
        f = Finding("grad_explosion", "warning",
                    _say_grad_explosion(ex["step"], ex["ratio"], ex["worst"], ex["n"], ex["ranks"]),
                    ex["ranks"], [], ex["steps"][:20], [], {"count": ex["n"], "max_ratio": ex["ratio"]})
        out.append(f.cite(_metric_refs(con, "step = ? AND grad_norm IS NOT NULL", [ex["step"]])))
    return out


def _loss_scale(con: DuckDBPyConnection, cfg: AnalysisConfig) -> list[Finding]:
    ls = rows(con, """SELECT min(ts) FILTER (WHERE loss_scale <= $floor) AS ts, count(*) FILTER (WHERE loss_scale <= $floor) AS n,
                             max(greatest(coalesce(loss_scale, -1e308), coalesce(attempted_loss_scale, -1e308))) AS peak,
                             count(*) FILTER (WHERE overflow > 0) AS overflows,
                             list(DISTINCT rank ORDER BY rank) FILTER (WHERE loss_scale <= $floor) AS ranks,
                             arg_min(loss_scale, ts) FILTER (WHERE loss_scale <= $floor) AS first_value,
                             arg_min(step, ts) FILTER (WHERE loss_scale <= $floor) AS step,
                             min(loss_scale) AS lowest
                      FROM scaling""", {"floor": cfg.loss_scale_min})[0]
    if not ls["n"] or (ls["peak"] <= cfg.loss_scale_min and not ls["overflows"]):
        return []  # never above the floor and never overflowing: bf16 and fp32 runs report a constant 1.0
    f = Finding("loss_scale_collapse", "error",
                _say_loss_scale_collapse(ls["first_value"], ls["step"], ls["peak"], ls["lowest"], ls["ranks"]),
                ls["ranks"], [], [ls["step"]] if ls["step"] is not None else [], [],
                {"peak": ls["peak"], "count": ls["n"], "lowest": ls["lowest"], "overflows": ls["overflows"]})
    refs = rows(con, """SELECT rank, ts, step, span_id FROM scaling WHERE loss_scale <= ? ORDER BY ts, rank LIMIT 10""",
                [cfg.loss_scale_min])
    return [f.cite([EventRef(r["rank"], int(r["ts"]), "metric", r["step"], r["span_id"]) for r in refs])]


def _overflow_cascade(con: DuckDBPyConnection, cfg: AnalysisConfig) -> list[Finding]:
    """Overflow skips in a row after training had settled (the module docstring's rule)."""
    skips = rows(con, """SELECT rank, node, ts, step, span_id, loss_scale, attempted_loss_scale FROM scaling
                         WHERE overflow > 0 ORDER BY ts, rank, step, span_id""")
    if len(skips) < cfg.overflow_cascade_min:
        return []
    settled = rows(con, """SELECT least(min(ts) FILTER (WHERE kind = 'metric' AND contains(metrics, '"loss"')),
                                        min(ts) FILTER (WHERE kind = 'span' AND cat = 'step')) AS t FROM events""")[0]["t"]
    if settled is None:
        return []  # no step ever completed: every skip so far is the start-up search for a scale
    logged = [int(r["ts"]) for r in rows(con, "SELECT min(ts) AS ts FROM mets GROUP BY step ORDER BY ts")]
    runs: list[list[dict[str, Any]]] = []
    seen: set[tuple[Any, ...]] = set()
    for sk in skips:
        if sk["ts"] < settled:
            continue
        key = (sk["rank"], sk["step"], sk["loss_scale"], sk["attempted_loss_scale"])
        if key in seen:  # the same skip printed again (by each process of a console, or twice by DeepSpeed)
            continue
        seen.add(key)
        if runs and _logged_between(logged, runs[-1][-1]["ts"], sk["ts"]) <= cfg.overflow_gap_steps:
            runs[-1].append(sk)
        else:
            runs.append([sk])
    out = []
    for run in runs:
        if len(run) < cfg.overflow_cascade_min:
            continue
        scales = [x for sk in run for x in (sk["attempted_loss_scale"], sk["loss_scale"]) if x is not None]
        ranks = sorted({sk["rank"] for sk in run})
        steps = sorted({sk["step"] for sk in run if sk["step"] is not None})
        f = Finding("overflow_cascade", "warning",
                    _say_overflow_cascade(len(run), steps[0] if steps else None, scales[0] if scales else None,
                                          scales[-1] if scales else None, ranks),
                    ranks, sorted({sk["node"] for sk in run if sk["node"]}), steps[:20], [],
                    {"count": len(run), "loss_scale_start": scales[0] if scales else None,
                     "loss_scale_end": scales[-1] if scales else None})
        out.append(f.cite([EventRef(sk["rank"], int(sk["ts"]), "metric", sk["step"], sk["span_id"]) for sk in run]))
    return out[: cfg.max_findings_per_kind]


def _diverged(v: list[float], tail: int, factor: float) -> tuple[int, float, str] | None:
    """Where a loss series diverged (index, the level it left, which rule), or ``None``.

    "stays": from some value on, every value is at least ``factor`` × the lowest before it and above
    the highest before it (so the noise of a small, jumpy loss does not count), for ``tail`` values or
    more. "rising": each of the last ``tail`` + 1 values higher than the one before, the last
    ``factor`` × the first of them and ``factor`` × every earlier value (four rises in a row are one
    chance in 24 on pure noise: a short, jumpy series must also leave its earlier range well behind).
    """
    n = len(v)
    suffix_min = list(itertools.accumulate(reversed(v), min))[::-1]  # suffix_min[i] = min(v[i:])
    lo = hi = v[0] if v else 0.0
    for i in range(1, n - tail + 1):  # before = v[:i] (lowest lo, highest hi), after = v[i:]
        if lo > 0 and suffix_min[i] >= factor * lo and suffix_min[i] > hi:
            return i, lo, "stays"
        lo, hi = min(lo, v[i]), max(hi, v[i])
    rise = v[-tail - 1:]
    if (len(rise) == tail + 1 and rise[0] > 0 and all(b > a for a, b in zip(rise, rise[1:]))
            and rise[-1] >= factor * rise[0] and rise[-1] >= factor * max(v[:-tail - 1], default=rise[0])):
        return len(v) - tail, rise[0], "rising"
    return None


def _logged_between(logged: list[int], t0: int, t1: int) -> int:
    """How many logged steps began strictly between two moments (``logged`` sorted)."""
    return max(bisect.bisect_left(logged, t1) - bisect.bisect_right(logged, t0), 0)


def _divergence(con: DuckDBPyConnection, cfg: AnalysisConfig) -> list[Finding]:
    """A loss that rose and stayed up (the module docstring's two rules), per rank, reported once per job."""
    series = rows(con, """SELECT rank, list(loss ORDER BY step) AS losses, list(step ORDER BY step) AS steps
                          FROM mets WHERE loss IS NOT NULL AND isfinite(loss) GROUP BY rank ORDER BY rank""")
    tail, factor = int(cfg.divergence_tail), cfg.divergence_factor
    hits = []
    for s in series:
        v, steps = s["losses"], s["steps"]
        found = _diverged(v, tail, factor)
        if found is not None:
            at, base, rule = found
            hits.append((s["rank"], steps[at], base, v[-1], steps[-1], rule))
    if not hits:
        return []
    ranks = [h[0] for h in hits]
    rank, step, base, last, last_step, rule = hits[0]
    f = Finding("divergence", "warning", _say_divergence(step, base, last, last_step, rule, ranks),
                ranks, [], [step], [], {"loss_before": base, "loss_last": last, "last_step": last_step, "rule": rule})
    return [f.cite(_metric_refs(con, "step >= ? AND loss IS NOT NULL", [step]))]


def _lr(con: DuckDBPyConnection, cfg: AnalysisConfig) -> list[Finding]:
    out = []
    bad = rows(con, """SELECT min(step) AS step, count(*) AS n, list(DISTINCT rank ORDER BY rank) AS ranks
                       FROM mets WHERE lr IS NOT NULL AND (NOT isfinite(lr) OR lr < 0)""")[0]
    if bad["n"]:
        f = Finding("lr_anomaly", "error", _say_lr_invalid(bad["step"], bad["ranks"]), bad["ranks"], [], [bad["step"]], [],
                    {"reason": "invalid", "count": bad["n"]})
        out.append(f.cite(_metric_refs(con, "lr IS NOT NULL AND (NOT isfinite(lr) OR lr < 0)", [])))
    dis = rows(con, """SELECT step, min(lr) AS lo, max(lr) AS hi, mode(lr) AS common, count(*) AS n
                       FROM mets WHERE lr IS NOT NULL AND isfinite(lr) GROUP BY step
                       HAVING max(lr) - min(lr) > 1e-9 * greatest(abs(max(lr)), 1e-30) ORDER BY step LIMIT 1""")
    if dis:
        d = dis[0]
        odd = rows(con, "SELECT list(rank ORDER BY rank) AS r FROM mets WHERE step = ? AND lr <> ?",
                   [d["step"], d["common"]])[0]["r"]
        f = Finding("lr_anomaly", "warning", _say_lr_disagree(d["step"], odd, d["common"], d["lo"], d["hi"]),
                    odd, [], [d["step"]], [], {"reason": "ranks_disagree", "common": d["common"]})
        out.append(f.cite(_metric_refs(con, "step = ? AND lr <> ?", [d["step"], d["common"]])))
    jumps = rows(
        con,
        """WITH x AS (SELECT rank, step, lr, lag(lr) OVER (PARTITION BY rank ORDER BY step) AS prev FROM mets
                      WHERE lr IS NOT NULL AND isfinite(lr))
           SELECT step, max(lr / prev) AS ratio, list(DISTINCT rank ORDER BY rank) AS ranks, max(prev) AS prev,
                  max(lr) AS lr
           FROM x WHERE prev > 0 AND lr >= ? * prev GROUP BY step ORDER BY step LIMIT 5""",
        [cfg.lr_jump_factor],
    )
    for j in jumps:
        f = Finding("lr_anomaly", "info", _say_lr_jump(j["ratio"], j["step"], j["prev"], j["lr"]),
                    j["ranks"], [], [j["step"]], [], {"reason": "jump", "ratio": j["ratio"]})
        out.append(f.cite(_metric_refs(con, "step = ? AND lr IS NOT NULL", [j["step"]])))
    return out


def _leaks(ctx: AnalysisContext) -> list[Finding]:
    con, cfg = ctx.con, ctx.cfg
    has = rows(con, "SELECT count(cuda_allocated_bytes) AS cuda, count(rss_bytes) AS rss FROM mets")[0]
    if has["cuda"]:
        col, label = "cuda_allocated_bytes", "CUDA allocated memory"
    elif has["rss"]:
        col, label = "rss_bytes", "host RSS"
    else:
        return []
    min_bytes = cfg.leak_min_mb * 1024 * 1024
    leaks = rows(
        con,
        f"""WITH x AS (SELECT rank, node, step, ts, span_id, {col} AS m FROM mets
                       WHERE {col} IS NOT NULL AND {AFTER_WARMUP}),
            f AS (SELECT *, min(m) OVER (PARTITION BY rank ORDER BY step DESC
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS floor FROM x),
            g AS (SELECT *, floor - lag(floor) OVER (PARTITION BY rank ORDER BY step) AS inc FROM f),
            r AS (SELECT rank, any_value(node) AS node, arg_min(floor, step) AS f0, arg_max(floor, step) AS f1,
                         max(inc) AS max_inc, count(*) FILTER (WHERE inc > 0) AS n_inc, min(step) AS s0,
                         max(step) AS s1, arg_max(m, step) AS last_m
                  FROM g GROUP BY rank),
            l AS (SELECT * FROM r WHERE f1 - f0 >= greatest($min_bytes, $min_frac * f0) AND max_inc <= 0.5 * (f1 - f0)
                                  AND n_inc >= 3),
            y AS (SELECT g.rank, g.step, lead(g.step) OVER (PARTITION BY g.rank ORDER BY g.step) AS next_step,
                         (g.step - l.s0)::DOUBLE AS x, (g.m - l.f0) / 1048576.0 AS y
                  FROM g JOIN l USING (rank)),
            t AS (SELECT rank, count(*) AS n, sum(y) AS sy FROM y GROUP BY rank),
            h AS (SELECT y.rank, y.step, y.next_step, y.x AS k, t.n, t.sy,
                         count(*) OVER w AS c, coalesce(sum(y.x) OVER w, 0) AS s1,
                         coalesce(sum(y.x * y.x) OVER w, 0) AS s2, coalesce(sum(y.y) OVER w, 0) AS sy_after,
                         coalesce(sum(y.x * y.y) OVER w, 0) AS sxy
                  FROM y JOIN t USING (rank)
                  WINDOW w AS (PARTITION BY y.rank ORDER BY y.step DESC
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
            fit AS (SELECT rank, next_step,
                           (sxy - k * sy_after) - (s1 - k * c) * sy / n AS cxy,
                           (s2 - 2 * k * s1 + k * k * c) - (s1 - k * c) * (s1 - k * c) / n AS cxx
                    FROM h WHERE c >= 2 AND n - c >= 2),
            start AS (SELECT rank, arg_max(next_step, cxy * cxy / cxx) AS start
                      FROM fit WHERE cxx > 0 AND cxy > 0 GROUP BY rank)
            SELECT l.rank, l.node, l.f0, l.f1, l.s1, l.n_inc, coalesce(start.start, l.s0) AS start
            FROM l LEFT JOIN start USING (rank) ORDER BY l.rank""",
        ctx.warm_params(min_bytes=min_bytes, min_frac=cfg.leak_min_frac),
    )
    if not leaks:
        return []
    start = min(r["start"] for r in leaks)
    growth = statistics.median(r["f1"] - r["f0"] for r in leaks)
    end = max(r["s1"] for r in leaks)
    rates = [(r["f1"] - r["f0"]) / max(1, r["s1"] - r["start"] + 1) for r in leaks]
    ranks = [r["rank"] for r in leaks]
    f = Finding("memory_leak", "warning",
                _say_memory_leak(ranks, label, statistics.median(rates) / 2**20, start, growth / 2**20, end),
                ranks, sorted({r["node"] for r in leaks}), [start], [],
                {"metric": col, "start_step": start, "growth_mb": round(growth / 2**20, 1),
                 "mb_per_step": round(statistics.median(rates) / 2**20, 2),
                 "per_rank": {str(r["rank"]): {"start_step": r["start"], "growth_mb": round((r["f1"] - r["f0"]) / 2**20, 1)}
                              for r in leaks}})
    refs = _metric_refs(con, f"rank IN ({ids(ranks[:5])}) AND step IN (?, ?) AND {col} IS NOT NULL", [start, end])
    return [f.cite(refs)]


def _data_wait(ctx: AnalysisContext) -> list[Finding]:
    con, cfg, by_rank = ctx.con, ctx.cfg, ctx.by_rank
    per = rows(
        con,
        f"""SELECT rank, any_value(node) AS node, median(data_ns) AS data_ns, median(step_ns) AS step_ns,
                   count(*) FILTER (WHERE data_ns >= 0.5 * step_ns) AS io_steps, count(*) AS n
            FROM steps WHERE {AFTER_WARMUP} GROUP BY rank ORDER BY rank""",
        ctx.warm_params(),
    )
    for p in per:
        if p["rank"] in by_rank and p["step_ns"]:
            by_rank[p["rank"]].data_share = round((p["data_ns"] or 0) / p["step_ns"], 3)
    slow = [p for p in per if p["step_ns"] and (p["data_ns"] or 0) >= cfg.data_wait_frac * p["step_ns"]
            and (p["data_ns"] or 0) >= cfg.data_wait_min_ms * 1e6]
    if not slow:
        return []
    ranks = [p["rank"] for p in slow]
    share = statistics.median(p["data_ns"] / p["step_ns"] for p in slow)
    data_ms = statistics.median(p["data_ns"] for p in slow) / 1e6
    everyone = len(slow) == len(per)
    others = [p for p in per if p["rank"] not in ranks]
    others_ms = statistics.median(p["data_ns"] or 0 for p in others) / 1e6 if others else None
    f = Finding("data_wait", "warning",
                _say_data_wait(ranks, everyone, share, data_ms, sum(p["io_steps"] for p in slow), others_ms),
                ranks, sorted({p["node"] for p in slow}), [], [],
                {"share": round(share, 3), "data_ms": round(data_ms, 3), "input_bound_job": everyone})
    for r in ranks:
        ctx.mark(r, "data")
    spans = rows(con, f"""SELECT rank, step, ts, span_id FROM events WHERE kind = 'span' AND cat = 'phase'
                          AND name = 'data' AND rank IN ({ids(ranks)}) ORDER BY dur DESC LIMIT 10""")
    return [f.cite([EventRef(s["rank"], int(s["ts"]), "span", s["step"], s["span_id"], "data") for s in spans])]


def rolling_median(values: list[float], width: int) -> list[float]:
    """Centred rolling median (shorter windows at the edges)."""
    h = max(1, width) // 2
    return [statistics.median(values[max(0, i - h): i + h + 1]) for i in range(len(values))]


def _throughput(ctx: AnalysisContext) -> list[Finding]:
    con, cfg, window = ctx.con, ctx.cfg, ctx.window
    per = rows(con, f"""SELECT step, median(step_ns) AS ns, max(t1) AS t1 FROM steps WHERE {AFTER_WARMUP}
                        GROUP BY step ORDER BY step""", ctx.warm_params())
    if len(per) < 4 * window:
        return []  # too short to tell a drop from noise
    smooth = rolling_median([p["ns"] for p in per], window)
    h = max(1, window) // 2
    best = math.inf
    start = None
    for i, v in enumerate(smooth):
        if i >= h and v >= (1 + cfg.throughput_drop) * best:
            start = i
            break
        if i >= h:
            best = min(best, v)
    if start is None:
        return []
    # The drop must last: at least a window of slow steps after its start.
    tail = smooth[start:start + window]
    if len(tail) < max(3, window // 2) or statistics.median(tail) < (1 + cfg.throughput_drop) * best:
        return []
    if statistics.median(tail) - best < cfg.throughput_min_ms * 1e6:
        return []
    # ...and beyond the run's own step-to-step spread: a noisy job (a busy host) swings by a third between
    # its best few steps and its worst without anything having changed
    raw_before = [p["ns"] for p in per[:start]]
    if len(raw_before) >= 4:
        q1, _, q3 = statistics.quantiles(raw_before, n=4)
        spread = (q3 - q1) / 1.349
        if statistics.median(tail) - statistics.median(raw_before) < cfg.throughput_spread_z * spread:
            return []
    back = next((j for j in range(start + window, len(smooth)) if smooth[j] < (1 + cfg.throughput_drop / 2) * best), None)
    after = statistics.median(smooth[start:back] if back else smooth[start:])
    s = per[start]["step"]
    f = Finding("throughput_drop", "warning",
                _say_throughput_drop(1 - best / after, s, after / 1e6, best / 1e6,
                                     per[back]["step"] if back is not None else None),
                [], [], [s] + ([per[back]["step"]] if back is not None else []), [],
                {"start_step": s, "before_ms": ms(best), "after_ms": ms(after),
                 "recovered_step": per[back]["step"] if back is not None else None})
    refs = rows(con, "SELECT rank, step, t1, span_id FROM steps WHERE step = ? ORDER BY step_ns DESC LIMIT 5", [s])
    return [f.cite([EventRef(r["rank"], int(r["t1"]), "span", r["step"], r["span_id"], "step") for r in refs])]


def breakdown(ctx: AnalysisContext) -> dict[str, Any]:
    """HTA-style temporal breakdown of the job, and the communication share per window."""
    con, window = ctx.con, ctx.window
    tot = rows(con, f"""SELECT sum(step_ns) AS step, sum(compute_ns) AS compute, sum(coll_ns) AS coll,
                               sum(data_ns) AS data, sum(idle_ns) AS idle FROM steps WHERE {AFTER_WARMUP}""",
               ctx.warm_params())[0]
    if not tot["step"]:
        return {}
    per_win = rows(
        con,
        f"""WITH p AS (SELECT step, min(coll_ns) AS transfer, median(step_ns) AS st, sum(coll_ns) AS coll,
                              sum(step_ns) AS total FROM steps WHERE {AFTER_WARMUP} GROUP BY step),
                 b AS (SELECT min(step) AS s0 FROM p)
            SELECT (step - b.s0) // {int(window)} AS win, min(step) AS s_lo, max(step) AS s_hi,
                   round(sum(coll) / sum(total), 4) AS comm_share, round(sum(transfer) / sum(st), 4) AS transfer_share
            FROM p, b GROUP BY win ORDER BY win""",
        ctx.warm_params(),
    )
    step = tot["step"]
    return {
        "compute_share": round(tot["compute"] / step, 4),
        "comm_share": round(tot["coll"] / step, 4),
        "data_share": round(tot["data"] / step, 4),
        "idle_share": round((tot["idle"] or 0) / step, 4) if tot["idle"] is not None else None,
        "windows": per_win,
        "overlap": None,  # synchronous collectives on the training thread cannot overlap compute
    }


def _comm_trend(ctx: AnalysisContext) -> list[Finding]:
    cfg = ctx.cfg
    b = breakdown(ctx)
    wins = b.get("windows", [])
    if len(wins) < 4:
        return []
    first, last = wins[0], wins[-1]
    base = first["transfer_share"] or 0
    # Sustained: the last two windows both above the first by the margin.
    if any((w["transfer_share"] or 0) - base < cfg.comm_rise or (w["transfer_share"] or 0) < 1.5 * base
           for w in wins[-2:]):
        return []
    return [Finding("comm_share_rising", "warning",
                    _say_comm_share_rising(first["transfer_share"] or 0.0, first["s_lo"], first["s_hi"],
                                           last["transfer_share"] or 0.0, last["s_lo"], last["s_hi"]),
                    [], [], [first["s_lo"], last["s_hi"]], [], {"windows": wins})]


# The findings' wording: plain values in, one phrase out (see queries._text; tests/queries/test_report_text.py
# renders each with singular, plural, zero and infinite values).


@template
def _say_nonfinite(what: str, step: int, ranks: list[int], values: int, on_ranks: int) -> str:
    return (f"{what} from step {step} on {ranks_text(ranks)} ({count(values, 'non-finite value')} in all, "
            f"on {count(on_ranks, 'rank')})")


@template
def _say_nonfinite_messages(msg: str, records: int, ranks: list[int]) -> str:
    return f"non-finite values in training: {msg.strip()[:160]!r} ({count(records, 'such record')} on {ranks_text(ranks)})"


@template
def _say_loss_spike(step: int, loss: float, ratio: float, median: float, window: int, recent_max: float,
                    rules: list[str], ranks: list[int]) -> str:
    return (f"loss spike at step {step}: {num(loss)}, {times(ratio, f'the recent median {num(median)}', 0)} (max of "
            f"the last {count(window, 'step')}: {num(recent_max)}; {'rule' if len(rules) == 1 else 'rules'}: "
            f"{', '.join(rules) or 'none'}; {ranks_text(ranks)})")


@template
def _say_grad_norm_high(threshold: float, step: int, values: int, worst: float, ranks: list[int]) -> str:
    return (f"gradient norm above {num(threshold, 'g')} from step {step} ({count(values, 'value')}, up to {num(worst)}; "
            f"{ranks_text(ranks)})")


@template
def _say_grad_explosion(step: int, ratio: float, worst: float, values: int, ranks: list[int]) -> str:
    return (f"gradient norm exploded from step {step}: up to {times(ratio, 'its recent median', 0)} ({num(worst)}; "
            f"{count(values, 'value')} on {ranks_text(ranks)})")


@template
def _say_loss_scale_collapse(value: float, step: int | None, peak: float, lowest: float, ranks: list[int]) -> str:
    at = f"step {step}" if step is not None else "its first record there"
    return (f"fp16 loss scale collapsed to {num(value, 'g')} at {at} (peak {num(peak, 'g')}, lowest "
            f"{num(lowest, 'g')}): gradients overflow every step, so updates are being skipped ({ranks_text(ranks)})")


@template
def _say_overflow_cascade(skips: int, step: int | None, scale_from: float | None, scale_to: float | None,
                          ranks: list[int]) -> str:
    fell = (f" from {num(scale_from, 'g')} to {num(scale_to, 'g')}" if scale_from is not None and scale_to is not None
            else "")
    return (f"{count(skips, 'fp16 overflow skip')} in a row after training had settled"
            f"{f' (from step {step})' if step is not None else ''}: the loss scale fell{fell}, and each skip "
            f"drops an update ({ranks_text(ranks)})")


@template
def _say_divergence(step: int, before: float, last: float, last_step: int, rule: str, ranks: list[int]) -> str:
    ratio = last / before if before else math.inf
    return (f"loss diverged from step {step}: {num(before)} → {num(last)} at step {last_step} "
            f"({times(ratio, 'where it was', 1)}; rule: {rule}; {ranks_text(ranks)})")


@template
def _say_lr_invalid(step: int, ranks: list[int]) -> str:
    return f"learning rate is negative or non-finite from step {step} ({ranks_text(ranks)})"


@template
def _say_lr_disagree(step: int, odd: list[int], common: float, lo: float, hi: float) -> str:
    verb = "differs" if len(set(odd)) <= 1 else "differ"
    return (f"ranks disagree on the learning rate from step {step}: {ranks_text(odd)} {verb} from {num(common)} "
            f"(range {num(lo)}" + (f"–{num(hi)}" if hi != lo else "") + "); a scheduler stepped unevenly?")


@template
def _say_lr_jump(ratio: float, step: int, before: float, after: float) -> str:
    return (f"learning rate jumped {times(ratio, 'its value before', 1)} at step {step} ({num(before)} → {num(after)}); "
            f"a schedule restart, or a resumed job with a reset scheduler?")


@template
def _say_memory_leak(ranks: list[int], label: str, mb_per_step: float, start: int, growth_mb: float, end: int) -> str:
    return (f"memory leak on {ranks_text(ranks)}: {label} grows {num(mb_per_step, '.1f')} MB/step from step {start} "
            f"(+{num(growth_mb, '.0f')} MB by step {end}) and is never released")


@template
def _say_data_wait(ranks: list[int], everyone: bool, share: float, data_ms: float, io_steps: int,
                   others_ms: float | None) -> str:
    one = len(set(ranks)) <= 1 and not everyone
    who = "every rank" if everyone else ranks_text(ranks)
    if everyone:
        tail = ": the job is input-bound (the data loader cannot keep up)"
    elif others_ms is not None:
        tail = (f": the other ranks wait for {'it' if one else 'them'} in the step's collectives "
                f"(their data wait: {num(others_ms, '.1f')} ms)")
    else:
        tail = ""
    return (f"{who} {'spends' if one or everyone else 'spend'} {num(share * 100, '.0f')}% of the step waiting for "
            f"data ({num(data_ms, '.1f')} ms per step, median; {count(io_steps, 'I/O-bound step')}){tail}")


@template
def _say_throughput_drop(drop: float, step: int, after_ms: float, before_ms: float, recovered: int | None) -> str:
    rec = f"; recovered at step {recovered}" if recovered is not None else "; it did not recover"
    return (f"throughput dropped {num(drop * 100, '.0f')}% from step {step}: median step {num(after_ms, '.1f')} ms vs "
            f"{num(before_ms, '.1f')} ms before{rec}")


@template
def _say_comm_share_rising(share_from: float, lo0: int, hi0: int, share_to: float, lo1: int, hi1: int) -> str:
    return (f"communication share of step time rose from {num(share_from * 100, '.0f')}% ({step_range(lo0, hi0)}) to "
            f"{num(share_to * 100, '.0f')}% ({step_range(lo1, hi1)}), not counting waits for stragglers: the network "
            f"or the payload grew")
