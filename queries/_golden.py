"""Golden runs: a healthy job kept as a reference, and where a new job leaves its band.

A :class:`GoldenProfile` is a job reduced to per-step series (median over ranks): step
time and each phase, collective share, loss, grad norm and peak memory. It is small (a
few numbers per step), so it is stored as one JSON file and compared without the
reference's events.

Comparison, per series: each reference is smoothed with a centred rolling median of
``golden_smooth_steps`` steps; the band at a step runs up to the highest smoothed
reference plus a tolerance, the larger of ``golden_tolerance`` × that value (a fifth of it
for memory, twice it for grad norm), an absolute floor per series (1 ms, 0.02 of loss,
32 MB, 0.1 of comm share) and three robust standard deviations of the step-to-step noise
of the reference or of the new job, whichever is noisier. The new job is smoothed
the same way; it **deviates** from the first step where it is above the band for at
least ``golden_persist_steps`` steps in a row. Smoothing makes one long step invisible,
but one noisy step next to a real change can pull the smoothed onset a step or two
early, so the onset is then placed on the raw series: the step, within half a smoothing
window of the smoothed onset, that best splits the raw values around it into a level
before and a level after (least absolute deviation from each side's median). Only
"worse" (higher) is reported: faster or lower-loss runs are not regressions.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jobtrace import store
from jobtrace.errors import QueryError

from ._model import AnalysisConfig, EventRef, Finding, rows

__all__ = ["GoldenProfile", "choose_golden", "compare_to_golden", "deviation_score", "golden_dir", "leave_one_out",
           "list_golden", "load_golden", "profile_distance", "profile_job", "remove_golden", "save_golden"]

#: series name -> (unit, absolute tolerance, multiple of ``golden_tolerance`` allowed relative to the reference)
SERIES: dict[str, tuple[str, float, float]] = {
    "step_ms": ("ms", 1.0, 1.0),
    "forward_ms": ("ms", 1.0, 1.0),
    "backward_ms": ("ms", 1.0, 1.0),
    "optimizer_ms": ("ms", 1.0, 1.0),
    "data_ms": ("ms", 1.0, 1.0),
    "comm_share": ("", 0.1, 1.0),
    "loss": ("", 0.02, 1.0),
    "grad_norm": ("", 0.05, 2.0),
    "memory_mb": ("MB", 32.0, 0.2),  # memory is steady: 5% (by default) above the reference is already news
}


@dataclass
class GoldenProfile:
    """A job's compact features: per-step series, its log templates (:mod:`._patterns`) and its shape
    (ranks, world size, nodes), never its lines. Version 1 files (series only) still load."""

    name: str
    job_id: str
    steps: list[int]
    series: dict[str, list[float | None]]
    created: float = field(default_factory=time.time)
    version: int = 2
    patterns: dict[str, Any] | None = None
    shape: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> GoldenProfile:
        d = orjson.loads(data)
        return cls(name=d["name"], job_id=d["job_id"], steps=[int(s) for s in d["steps"]],
                   series={k: list(v) for k, v in d["series"].items()}, created=d.get("created", 0.0),
                   version=d.get("version", 1), patterns=d.get("patterns"), shape=dict(d.get("shape") or {}),
                   tags=[str(t) for t in d.get("tags") or []])

    def median(self, series: str) -> float | None:
        values = [v for v in self.series.get(series, []) if v is not None]
        return statistics.median(values) if values else None


def profile_job(job: Any, name: str | None = None) -> GoldenProfile:
    """Reduce a loaded job (its ``steps``/``mets`` tables must exist; ``analyze`` builds them)."""
    con = job.con
    out = rows(
        con,
        """WITH s AS (SELECT step, median(step_ns) / 1e6 AS step_ms, median(fwd_ns) / 1e6 AS forward_ms,
                             median(bwd_ns) / 1e6 AS backward_ms, median(opt_ns) / 1e6 AS optimizer_ms,
                             median(data_ns) / 1e6 AS data_ms, sum(coll_ns) / nullif(sum(step_ns), 0) AS comm_share
                      FROM steps GROUP BY step),
                m AS (SELECT step, avg(loss) FILTER (WHERE isfinite(loss)) AS loss,
                             median(grad_norm) FILTER (WHERE isfinite(grad_norm)) AS grad_norm,
                             max(coalesce(cuda_allocated_bytes, rss_bytes)) / 1048576.0 AS memory_mb
                      FROM mets GROUP BY step)
           SELECT * FROM s FULL JOIN m USING (step) ORDER BY step""",
    )
    series: dict[str, list[float | None]] = {k: [] for k in SERIES}
    for r in out:
        for k in SERIES:
            v = r.get(k)
            series[k].append(None if v is None or (isinstance(v, float) and not math.isfinite(v)) else round(float(v), 6))
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    from ._patterns import log_patterns

    shape = rows(con, "SELECT count(DISTINCT rank) AS ranks, max(world) AS world, count(DISTINCT node) AS nodes "
                      "FROM events")[0]
    return GoldenProfile(name or job.job_id, job.job_id, [int(r["step"]) for r in out], series,
                         patterns=log_patterns(con), shape={k: int(v or 0) for k, v in shape.items()})


def golden_dir(data_dir: str | os.PathLike[str]) -> Path:
    """References live beside the jobs, in a folder no job id can name (ids never start with a dot)."""
    return store.golden_dir(data_dir)


def _path(directory: str | os.PathLike[str], name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "._=-" else "_" for c in name).lstrip(".") or "_"
    return Path(directory) / f"{safe}.json"


def save_golden(profile: GoldenProfile, directory: str | os.PathLike[str]) -> Path:
    path = _path(directory, profile.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(profile.to_json())
    os.replace(tmp, path)
    return path


def load_golden(directory: str | os.PathLike[str], name: str) -> GoldenProfile:
    path = Path(name) if name.endswith(".json") and Path(name).is_file() else _path(directory, name)
    try:
        return GoldenProfile.from_json(path.read_bytes())
    except FileNotFoundError:
        known = list_golden(directory)
        raise QueryError(f"no golden run {name!r} in {directory}" + (f"; known: {', '.join(known)}" if known else "")
                         ) from None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise QueryError(f"golden run {path} is unreadable: {exc}") from exc


def list_golden(directory: str | os.PathLike[str]) -> list[str]:
    d = Path(directory)
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def remove_golden(directory: str | os.PathLike[str], name: str) -> Path:
    path = _path(directory, name)
    if not path.is_file():
        known = list_golden(directory)
        raise QueryError(f"no golden run {name!r} in {directory}" + (f"; known: {', '.join(known)}" if known else ""))
    path.unlink()
    return path


#: the series the distance between two runs looks at (their medians)
DISTANCE_SERIES = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms", "data_ms", "loss", "memory_mb")


def profile_distance(a: GoldenProfile, b: GoldenProfile) -> float:
    """How unlike two runs are: the mean, over :data:`DISTANCE_SERIES` both have, of ``|ln(median_a /
    median_b)|`` (0: alike; 0.1: about 10 % apart). ``inf`` when they share no series."""
    terms = []
    for name in DISTANCE_SERIES:
        x, y = a.median(name), b.median(name)
        if x is not None and y is not None and x > 0 and y > 0:
            terms.append(abs(math.log(x / y)))
    return sum(terms) / len(terms) if terms else math.inf


def choose_golden(new: GoldenProfile, entries: Sequence[GoldenProfile], k: int = 5
                  ) -> tuple[list[GoldenProfile], str]:
    """The up to ``k`` entries most like ``new``: those of its shape (world size and nodes) first, then the
    nearest by :func:`profile_distance`; and why, in words."""
    world, nodes = new.shape.get("world"), new.shape.get("nodes")
    same = [e for e in entries if e.shape.get("world") == world and e.shape.get("nodes") == nodes]
    pool = same or list(entries)
    why = (f"same shape, {world} ranks on {nodes} node(s)" if same
           else f"no entry of this job's shape ({world} ranks on {nodes} node(s)); the nearest of all")
    scored = sorted(((profile_distance(new, e), e.name, e) for e in pool), key=lambda t: (t[0], t[1]))
    chosen = [(d, e) for d, _, e in scored[:k] if d != math.inf]
    if not chosen:
        return [], why + "; none shares a series with this job"
    return [e for _, e in chosen], why + "; nearest by median profile: " + ", ".join(
        f"{e.name} ({d:.3f})" for d, e in chosen)


def _smooth(values: list[float | None], width: int) -> list[float | None]:
    h = max(1, width) // 2
    out: list[float | None] = []
    for i in range(len(values)):
        win = [v for v in values[max(0, i - h): i + h + 1] if v is not None]
        out.append(statistics.median(win) if win else None)
    return out


def _noise(raw: list[float | None], smooth: list[float | None]) -> float:
    res = [abs(a - b) for a, b in zip(raw, smooth) if a is not None and b is not None]
    return 1.4826 * statistics.median(res) if res else 0.0


def _onset(raw: list[float | None], start: int, end: int, half: int) -> int:
    """The raw change point nearest the smoothed onset ``start`` (see the module docstring)."""
    lo, hi = max(0, start - 2 * half - 1), min(len(raw), end + 1, start + 2 * half + 2)
    best, best_cost = start, math.inf
    for j in range(max(lo + 1, start - half), min(hi - 1, start + half) + 1):
        before = [v for v in raw[lo:j] if v is not None]
        after = [v for v in raw[j:hi] if v is not None]
        if not before or not after:
            continue
        mb, ma = statistics.median(before), statistics.median(after)
        if ma <= mb:
            continue
        cost = sum(abs(v - mb) for v in before) + sum(abs(v - ma) for v in after)
        if cost < best_cost:
            best, best_cost = j, cost
    return best


def compare_to_golden(job: Any, refs: GoldenProfile | Sequence[GoldenProfile], cfg: AnalysisConfig,
                      profile: GoldenProfile | None = None) -> list[Finding]:
    """Findings for every series of ``job`` that leaves the references' band, from the step it left, and for
    every log template that departs from theirs (:func:`._patterns.compare_patterns`)."""
    refs = [refs] if isinstance(refs, GoldenProfile) else list(refs)
    if not refs:
        return []
    new = profile or profile_job(job)
    from ._patterns import compare_patterns

    with_patterns = [(r.name, r.patterns) for r in refs if r.patterns]
    patterns = compare_patterns(new.patterns, with_patterns) if new.patterns and with_patterns else []
    score = _score_finding(new, refs, patterns, cfg)
    return _regression(new, refs, cfg) + _series_findings(job, new, refs, cfg) + patterns + score


#: series the deviation score weighs: (relative floor of the spread, absolute floor)
SCORE_SERIES: dict[str, tuple[float, float]] = {
    "step_ms": (0.02, 0.05), "forward_ms": (0.02, 0.05), "backward_ms": (0.02, 0.05), "optimizer_ms": (0.02, 0.05),
    "data_ms": (0.05, 0.05), "comm_share": (0.0, 0.01), "loss": (0.01, 0.005), "grad_norm": (0.05, 0.01),
    "memory_mb": (0.01, 8.0),
}
#: points a log-template finding adds to the score
PATTERN_POINTS: dict[str, float] = {"new_log_pattern": 3.0, "missing_log_pattern": 3.0, "log_pattern_rate": 2.0}


def deviation_score(new: GoldenProfile, refs: Sequence[GoldenProfile],
                    patterns: Sequence[Finding] = ()) -> tuple[float, list[dict[str, Any]]]:
    """One number for how far ``new`` departs from ``refs``, and its contributions, largest first.

    Per series of :data:`SCORE_SERIES`, the robust z of the run's median against the references' medians:
    ``(mine - median) / spread``, the spread being 1.4826 x their median absolute deviation but at least
    the series' relative floor of the median and its absolute floor (so three identical references do not
    make noise infinite); only "worse" (positive) counts. Each log-template finding adds
    :data:`PATTERN_POINTS`. The score is the sum: 0 for a run like its references, about 3 per clear departure.
    """
    parts: list[dict[str, Any]] = []
    for name, (rel, floor) in SCORE_SERIES.items():
        mine = new.median(name)
        theirs = [m for r in refs if (m := r.median(name)) is not None]
        if mine is None or not theirs:
            continue
        centre = statistics.median(theirs)
        mad = statistics.median(abs(m - centre) for m in theirs)
        spread = max(1.4826 * mad, rel * abs(centre), floor)
        z = (mine - centre) / spread
        if z > 0.5:
            parts.append({"what": name, "points": round(z, 2),
                          "detail": f"median {_plain_number(mine)} vs {_plain_number(centre)} (spread "
                                    f"{_plain_number(spread)})"})
    for f in patterns:
        if f.kind in PATTERN_POINTS:
            parts.append({"what": f.kind, "points": PATTERN_POINTS[f.kind],
                          "detail": str(f.details.get("template", ""))[:200],
                          **({"step": f.steps[0]} if f.steps else {})})
    parts.sort(key=lambda p: -float(p["points"]))
    return round(sum(float(p["points"]) for p in parts), 2), parts


def leave_one_out(refs: Sequence[GoldenProfile], gate: float) -> dict[str, Any]:
    """Each reference scored against the others: how often ``gate`` would fail a run known to be good."""
    from ._patterns import compare_patterns

    scores = []
    for i, r in enumerate(refs):
        others = [o for j, o in enumerate(refs) if j != i]
        with_patterns = [(o.name, o.patterns) for o in others if o.patterns]
        pats = compare_patterns(r.patterns, with_patterns) if r.patterns and with_patterns else []
        scores.append(deviation_score(r, others, pats)[0])
    above = sum(1 for x in scores if x > gate)
    return {"runs": len(scores), "above_gate": above, "false_alarm_rate": round(above / len(scores), 3) if scores
            else None, "scores": scores}


def _score_finding(new: GoldenProfile, refs: list[GoldenProfile], patterns: list[Finding],
                   cfg: AnalysisConfig) -> list[Finding]:
    gate = cfg.golden_gate
    if gate is None:
        return []  # the score is asked for with a gate (--gate): the band and template findings say the rest
    score, parts = deviation_score(new, refs, patterns)
    top = "; ".join(f"{p['what']} +{p['points']:g} ({p['detail']})" for p in parts[:3]) or "nothing departs"
    details: dict[str, Any] = {"score": score, "contributions": parts, "gate": gate,
                               "references": [r.name for r in refs]}
    over = score > gate
    summary = f"deviation from the golden runs: score {score:g} (gate {gate:g})"
    if len(refs) >= 2:
        loo = leave_one_out(refs, gate)
        details["leave_one_out"] = loo
        summary += f"; leave-one-out, {loo['above_gate']} of {loo['runs']} golden runs score above it"
    steps = sorted({p["step"] for p in parts if p.get("step") is not None})
    return [Finding("golden_score", "error" if over else "info", f"{summary}: {top}", [], [], steps, [],
                    details)]


def _regression(new: GoldenProfile, refs: list[GoldenProfile], cfg: AnalysisConfig) -> list[Finding]:
    pct = cfg.max_step_time_regression_pct
    mine = new.median("step_ms")
    theirs = [m for r in refs if (m := r.median("step_ms")) is not None]
    if pct is None or mine is None or not theirs:
        return []
    ref = statistics.median(theirs)
    change = (mine / ref - 1) * 100 if ref > 0 else 0.0
    if change <= pct:
        return []
    return [Finding("step_time_regression", "error",
                    f"median step {mine:.1f} ms is {change:.1f}% slower than the golden runs' {ref:.1f} ms "
                    f"(allowed: {pct:g}%)", [], [], [], [],
                    {"step_ms": round(mine, 3), "golden_step_ms": round(ref, 3), "regression_pct": round(change, 2),
                     "allowed_pct": pct, "references": [r.name for r in refs]})]


def _series_findings(job: Any, new: GoldenProfile, refs: list[GoldenProfile], cfg: AnalysisConfig) -> list[Finding]:
    k = cfg.golden_smooth_steps
    persist = cfg.golden_persist_steps
    first = min(new.steps, default=0) + cfg.warmup_steps
    ref_steps = set().union(*(set(r.steps) for r in refs))
    common = [s for s in new.steps if s in ref_steps and s >= first]
    if len(common) < max(3, persist):
        return []
    new_at = {s: i for i, s in enumerate(new.steps)}
    names = ", ".join(f"'{r.name}'" for r in refs)
    out = []
    for name, (unit, abs_tol, rel_scale) in SERIES.items():
        if name not in new.series:
            continue
        new_raw = [new.series[name][new_at[s]] for s in common]
        new_s = _smooth(new_raw, k)
        new_noise = _noise(new_raw, new_s)
        upper: list[float | None] = [None] * len(common)
        centre: list[float | None] = [None] * len(common)
        for ref in refs:
            if name not in ref.series:
                continue
            at = {s: i for i, s in enumerate(ref.steps)}
            raw = [ref.series[name][at[s]] if s in at else None for s in common]
            if sum(v is not None for v in raw) < 3:
                continue
            smooth = _smooth(raw, k)
            noise = max(_noise(raw, smooth), new_noise)
            for i, v in enumerate(smooth):
                if v is None:
                    continue
                u = v + max(cfg.golden_tolerance * rel_scale * abs(v), abs_tol, 3 * noise)
                upper[i] = u if upper[i] is None else max(upper[i], u)  # type: ignore[type-var]
                centre[i] = v if centre[i] is None else max(centre[i], v)  # type: ignore[type-var]
        above = [u is not None and v is not None and v > u for v, u in zip(new_s, upper)]
        start = next((i for i in range(len(above) - persist + 1) if all(above[i:i + persist])), None)
        if start is None:
            continue
        end = start
        while end + 1 < len(above) and above[end + 1]:
            end += 1
        start = _onset(new_raw, start, end, max(1, k) // 2)
        s0, s1 = common[start], common[end]
        got = statistics.median(v for v in new_s[start:end + 1] if v is not None)
        want = statistics.median(v for v in centre[start:end + 1] if v is not None)
        band = statistics.median(u for u in upper[start:end + 1] if u is not None)
        ratio = got / want if want else float("inf")
        fmt: Callable[[float], str] = functools.partial(_with_unit, unit=unit) if unit else _plain_number
        f = Finding(
            "golden_deviation", "warning",
            f"{name} deviates from golden run{'s' if len(refs) > 1 else ''} {names} from step {s0}: {fmt(got)} vs "
            f"{fmt(want)} in the reference ({ratio:.1f}x; band up to {fmt(band)})"
            + (f", through step {s1}" if s1 != s0 else ""),
            [], [], [s0, s1], [],
            {"metric": name, "golden": [r.name for r in refs], "golden_jobs": [r.job_id for r in refs],
             "start_step": s0, "end_step": s1, "value": round(got, 6), "reference": round(want, 6),
             "band_upper": round(band, 6), "ratio": round(ratio, 3)},
        )
        out.append(f.cite(_refs(job, name, s0)))
    out.sort(key=lambda f: f.details["start_step"])
    return out


def _refs(job: Any, name: str, step: int) -> list[EventRef]:
    if name.endswith("_ms") or name == "comm_share":
        out = rows(job.con, "SELECT rank, step, t1 AS ts, span_id FROM steps WHERE step = ? ORDER BY rank LIMIT 8", [step])
        return [EventRef(r["rank"], int(r["ts"]), "span", r["step"], r["span_id"], "step") for r in out]
    out = rows(job.con, "SELECT rank, step, ts, span_id FROM mets WHERE step = ? ORDER BY rank LIMIT 8", [step])
    return [EventRef(r["rank"], int(r["ts"]), "metric", r["step"], r["span_id"]) for r in out]


def _with_unit(x: float, unit: str) -> str:
    return f"{x:.1f} {unit}".strip()


def _plain_number(x: float) -> str:
    return f"{x:.4g}"
