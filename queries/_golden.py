"""Golden runs: healthy jobs kept as references, and where a new job leaves their band.

A :class:`GoldenProfile` is a job reduced to per-step series (median over ranks): step
time and each phase, collective share, loss, grad norm, peak memory and throughput; and per
rank, the median and 90th percentile of each. It is small (a few numbers per step), so it
is stored as one JSON file and compared without the reference's events.

Comparison, per series, on the steps the job shares with its references: every series is
smoothed with a centred rolling median of ``golden_smooth_steps`` steps. The band at a step
runs up to the highest smoothed reference plus a headroom:

* with three references or more, the headroom is **learned**: the larger of three times
  the spread between the references (1.4826 x the median absolute deviation across runs at
  each step, pooled over steps as its median), :data:`LEARNED_REL` of the value, an
  absolute floor per series (1 ms, 0.02 of loss, 32 MB, 0.1 of comm share; for a phase, at
  least :data:`PHASE_BAND_SHARE` of the step) and three robust standard deviations of the new
  job's step-to-step noise;
* with one or two, there is no spread to learn: the larger of ``golden_tolerance`` x the
  value (a fifth of it for memory, twice it for grad norm), the same floor and three robust
  standard deviations of the noisier of the reference and the new job.

The new job **deviates** from the first step where it is above the band for at least
``golden_persist_steps`` steps in a row. Smoothing makes one long step invisible, but one
noisy step next to a real change can pull the smoothed onset a step or two early, so the
onset is then placed on the raw series: the step, within half a smoothing window of the
smoothed onset, that best splits the raw values around it into a level before and a level
after (least absolute deviation from each side's median). Only "worse" is reported (higher,
or lower for throughput): faster or lower-loss runs are not regressions.

The deviation score (:func:`deviation_score`) reads the same aligned series as robust z
scores, and each rank's quantiles against the references' same rank (:func:`rank_scores`).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jobtrace import store
from jobtrace.errors import QueryError

from ._model import AnalysisConfig, EventRef, Finding, rows
from ._text import count, num, template, times

__all__ = ["GoldenProfile", "choose_golden", "compare_to_golden", "deviation_score", "golden_dir", "leave_one_out",
           "list_golden", "load_golden", "profile_distance", "profile_job", "rank_scores", "remove_golden",
           "save_golden"]

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
    "throughput": ("/s", 0.0, 1.0),
}
LOWER_IS_WORSE = frozenset({"throughput"})
"""Series where a drop is the regression (compared negated, reported as they are)."""
LEARNED_REL = 0.03
"""With three references or more, the least headroom above the highest of them, relative to the value (x the
series' relative scale): the references' own spread decides beyond it."""
LEARNED_MIN_REFS = 3
PHASE_BAND_SHARE = 0.05
"""A phase's band is at least this share of the references' median step above them: what a phase adds matters
by what it costs the step (a 2 ms phase that waits on a busy peer doubles for a few steps and costs 4 %)."""


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
    ranks: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """rank -> series -> [median, 90th percentile] over its steps (entries made before it have none)."""

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> GoldenProfile:
        d = orjson.loads(data)
        return cls(name=d["name"], job_id=d["job_id"], steps=[int(s) for s in d["steps"]],
                   series={k: list(v) for k, v in d["series"].items()}, created=d.get("created", 0.0),
                   version=d.get("version", 1), patterns=d.get("patterns"), shape=dict(d.get("shape") or {}),
                   tags=[str(t) for t in d.get("tags") or []],
                   ranks={str(r): {k: [float(x) for x in q] for k, q in per.items()}
                          for r, per in (d.get("ranks") or {}).items()})

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
                             max(coalesce(cuda_allocated_bytes, rss_bytes)) / 1048576.0 AS memory_mb,
                             median(coalesce(tokens_per_s, samples_per_s)) AS throughput
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

    counts = rows(con, "SELECT count(DISTINCT rank) AS ranks, max(world) AS world, count(DISTINCT node) AS nodes "
                       "FROM events")[0]
    shape: dict[str, Any] = {k: int(v or 0) for k, v in counts.items()}
    shape.update(_run_env(con))
    return GoldenProfile(name or job.job_id, job.job_id, [int(r["step"]) for r in out], series,
                         patterns=log_patterns(con), shape=shape, ranks=_rank_quantiles(con))


def _run_env(con: Any) -> dict[str, Any]:
    """The model, configuration hash and framework versions the job's heartbeats said last (lowest rank first;
    ``init_tracing(model=, config=)``), where they said any."""
    got = rows(con, """SELECT CAST(attrs->'env' AS VARCHAR) AS env FROM events
                       WHERE kind = 'heartbeat' AND contains(CAST(attrs AS VARCHAR), '"env"')
                       ORDER BY rank NULLS LAST, ts DESC LIMIT 1""")
    if not got or not got[0]["env"]:
        return {}
    try:
        env = orjson.loads(got[0]["env"])
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(env, dict):
        return {}
    out: dict[str, Any] = {k: str(env[k]) for k in ("model", "config_hash") if env.get(k)}
    if isinstance(env.get("versions"), dict):
        out["versions"] = {str(k): str(v) for k, v in env["versions"].items()}
    return out


def _rank_quantiles(con: Any) -> dict[str, dict[str, list[float]]]:
    """Per rank, each series' median and 90th percentile over the job's steps (a rank score's inputs)."""
    out = rows(
        con,
        """WITH j AS (SELECT * FROM
                        (SELECT rank, step, step_ns / 1e6 AS step_ms, fwd_ns / 1e6 AS forward_ms,
                                bwd_ns / 1e6 AS backward_ms, opt_ns / 1e6 AS optimizer_ms, data_ns / 1e6 AS data_ms,
                                coll_ns / nullif(step_ns, 0) AS comm_share FROM steps) s
                      FULL JOIN
                        (SELECT rank, step, CASE WHEN isfinite(loss) THEN loss END AS loss,
                                CASE WHEN isfinite(grad_norm) THEN grad_norm END AS grad_norm,
                                coalesce(cuda_allocated_bytes, rss_bytes) / 1048576.0 AS memory_mb,
                                coalesce(tokens_per_s, samples_per_s) AS throughput FROM mets) m
                      USING (rank, step))
           SELECT rank, """ + ", ".join(f"quantile_cont({k}, [0.5, 0.9]) AS {k}" for k in SERIES)
        + " FROM j WHERE rank IS NOT NULL GROUP BY rank ORDER BY rank",
    )
    ranks: dict[str, dict[str, list[float]]] = {}
    for r in out:
        per = {k: [round(float(x), 6) for x in q] for k in SERIES
               if (q := r.get(k)) and all(x is not None and math.isfinite(x) for x in q)}
        if per:
            ranks[str(int(r["rank"]))] = per
    return ranks


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
    """The up to ``k`` entries most like ``new``: those of its shape (world size and nodes) first; among them those
    of its model, then of its configuration (where both runs say theirs), then the nearest by
    :func:`profile_distance`; and why, in words."""
    world, nodes = new.shape.get("world"), new.shape.get("nodes")
    same = [e for e in entries if e.shape.get("world") == world and e.shape.get("nodes") == nodes]
    pool = same or list(entries)
    shape = (f"{count(world, 'rank') if isinstance(world, int) else 'ranks unknown'} on "
             f"{count(nodes, 'node') if isinstance(nodes, int) else 'nodes unknown'}")
    why = f"same shape, {shape}" if same else f"no entry of this job's shape ({shape}); the nearest of all"

    def unlike(e: GoldenProfile, key: str) -> int:  # 0: both say the same; 1: one does not say; 2: they differ
        if not new.shape.get(key) or not e.shape.get(key):
            return 1
        return 0 if new.shape[key] == e.shape[key] else 2

    scored = sorted(((unlike(e, "model"), unlike(e, "config_hash"), profile_distance(new, e), e.name, e) for e in pool),
                    key=lambda t: t[:4])
    chosen = [(d, e) for _, _, d, _, e in scored[:k] if d != math.inf]
    for key, words in (("model", "model"), ("config_hash", "configuration")):
        if new.shape.get(key) and any(e.shape.get(key) == new.shape[key] for _, e in chosen):
            why += f", same {words} first" + (f" ({new.shape[key]})" if key == "model" else "")
    if not chosen:
        return [], why + "; none shares a series with this job"
    return [e for _, e in chosen], why + "; nearest by median profile: " + ", ".join(
        f"{e.name} ({d:.3f})" for d, e in chosen)


def _smooth(values: list[float | None], width: int) -> list[float | None]:
    h = max(1, width) // 2
    out: list[float | None] = []
    for i in range(len(values)):
        win = sorted(v for v in values[max(0, i - h): i + h + 1] if v is not None)
        n = len(win)
        out.append(None if not n else win[n // 2] if n % 2 else (win[n // 2 - 1] + win[n // 2]) / 2)
    return out


_SMOOTHED: OrderedDict[tuple[int, str, int, int], tuple[GoldenProfile, list[float | None], list[float | None], float]] = (
    OrderedDict())
"""Recently smoothed series, by (profile, series, steps, width): leave-one-out smooths each entry's series against
each subset of the others; the profile is held, so that its id cannot be reused while the entry lives."""


def _smoothed(profile: GoldenProfile, name: str, steps: list[int], key: int, sign: float, width: int
              ) -> tuple[list[float | None], list[float | None], float]:
    """``profile``'s series ``name`` on ``steps`` (signed): raw, smoothed, and its noise."""
    ck = (id(profile), name, key, width)
    hit = _SMOOTHED.get(ck)
    if hit is not None and hit[0] is profile:
        _SMOOTHED.move_to_end(ck)
        return hit[1], hit[2], hit[3]
    at = {s: i for i, s in enumerate(profile.steps)}
    values = profile.series[name]
    raw = [None if (i := at.get(s)) is None or (v := values[i]) is None else sign * v for s in steps]
    smooth = _smooth(raw, width)
    out = (raw, smooth, _noise(raw, smooth))
    _SMOOTHED[ck] = (profile, *out)
    if len(_SMOOTHED) > 512:
        _SMOOTHED.popitem(last=False)
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


#: series the deviation score weighs: (relative floor of the spread, absolute floor). The absolute floors are a
#: third of the band's (:data:`SERIES`): a departure the size of the band's least headroom scores about 3.
SCORE_SERIES: dict[str, tuple[float, float]] = {
    "step_ms": (0.02, 0.33), "forward_ms": (0.02, 0.33), "backward_ms": (0.02, 0.33), "optimizer_ms": (0.02, 0.33),
    "data_ms": (0.05, 0.33), "comm_share": (0.0, 0.033), "loss": (0.01, 0.0067), "grad_norm": (0.05, 0.017),
    "memory_mb": (0.01, 10.7),
}
"""Throughput is not scored: it is the step time seen from the other side, and would count the same departure twice."""
PHASE_STEP_SHARE = 0.02
"""A phase's spread is at least this share of the references' median step: a millisecond that a 2 ms phase
gains in a 45 ms step costs the job 2 %, not the 50 % it is of the phase."""
#: points a log-template finding adds to the score
PATTERN_POINTS: dict[str, float] = {"new_log_pattern": 3.0, "missing_log_pattern": 3.0, "log_pattern_rate": 2.0}
#: z scores below this are noise, not a contribution
MIN_POINTS = 1.0
#: a rank's series counts from this z: one rank's quantile across a few runs is noisier than the run's series
RANK_MIN_POINTS = 3.0


def deviation_score(new: GoldenProfile, refs: Sequence[GoldenProfile], patterns: Sequence[Finding] = (),
                    cfg: AnalysisConfig | None = None) -> tuple[float, list[dict[str, Any]]]:
    """One number for how far ``new`` departs from ``refs``, and its contributions, largest first.

    Per series of :data:`SCORE_SERIES`, on the steps both have (aligned and smoothed as the band is): at each
    step the robust z of the run against the references, ``(mine - their median) / spread``, the spread being
    the references' pooled spread across runs but at least the series' relative floor of their median, its
    absolute floor (for a phase, also :data:`PHASE_STEP_SHARE` of the step) and the run's own step-to-step noise (with fewer than three references, also a third of
    the ``golden_tolerance`` headroom). The series scores the highest z the run holds for
    ``golden_persist_steps`` steps in a row, with the step range where it holds above half that. Each
    log-template finding adds :data:`PATTERN_POINTS`. The score is the sum: 0 for a run like its references,
    about 3 per clear departure. Only "worse" counts.
    """
    cfg = cfg or AnalysisConfig()
    parts: list[dict[str, Any]] = []
    phase_floor = _phase_floor(refs, PHASE_STEP_SHARE)
    for name, (rel, floor) in SCORE_SERIES.items():
        if name.endswith("_ms") and name != "step_ms":
            floor = max(floor, phase_floor)
        al = _align(new, refs, name, cfg)
        if al is None or not al.refs:
            continue
        z: list[float | None] = []
        for mine, vals in zip(al.new, zip(*al.refs)):
            theirs = sorted(v for v in vals if v is not None)
            if mine is None or not theirs:
                z.append(None)
                continue
            centre = _median_sorted(theirs)
            spread = max(al.spread, rel * abs(centre), floor, al.noise, 1e-12)
            if len(al.refs) < LEARNED_MIN_REFS:
                spread = max(spread, cfg.golden_tolerance * SERIES[name][2] * abs(centre) / 3)
            z.append((mine - centre) / spread)
        held = _held(z, max(1, cfg.golden_persist_steps))
        if held is None or held[0] < MIN_POINTS:
            continue
        points, lo, hi = held
        s0, s1 = al.steps[lo], al.steps[hi]
        mine_med = statistics.median(v for v in al.new[lo:hi + 1] if v is not None)
        theirs_med = statistics.median(v for r in al.refs for v in r[lo:hi + 1] if v is not None)
        parts.append({"what": name, "points": round(points, 2), "step": s0, "steps": [s0, s1],
                      "detail": f"steps {s0}-{s1}: {_plain_number(al.sign * mine_med)} vs "
                                f"{_plain_number(al.sign * theirs_med)}"})
    for f in patterns:
        if f.kind in PATTERN_POINTS:
            parts.append({"what": f.kind, "points": PATTERN_POINTS[f.kind],
                          "detail": str(f.details.get("template", ""))[:200],
                          **({"step": f.steps[0]} if f.steps else {})})
    parts.sort(key=lambda p: -float(p["points"]))
    return round(sum(float(p["points"]) for p in parts), 2), parts


def _phase_floor(refs: Sequence[GoldenProfile], share: float) -> float:
    """``share`` of the references' median step time: the least a phase's departure counts for."""
    step_ms = [m for r in refs if (m := r.median("step_ms")) is not None]
    return share * statistics.median(step_ms) if step_ms else 0.0


def _held(z: list[float | None], persist: int) -> tuple[float, int, int] | None:
    """The highest z held ``persist`` steps in a row (the least of the best window), and the stretch of steps
    around that window where z stays above half of it."""
    best: tuple[float, int] | None = None
    for i in range(len(z) - persist + 1):
        win = z[i:i + persist]
        if any(v is None for v in win):
            continue
        low = min(v for v in win if v is not None)
        if best is None or low > best[0]:
            best = (low, i)
    if best is None:
        return None
    points, lo = best
    hi = lo + persist - 1
    half = points / 2
    while lo > 0 and (v := z[lo - 1]) is not None and v > half:
        lo -= 1
    while hi + 1 < len(z) and (v := z[hi + 1]) is not None and v > half:
        hi += 1
    return points, lo, hi


def rank_scores(new: GoldenProfile, refs: Sequence[GoldenProfile]) -> list[dict[str, Any]]:
    """Per rank of ``new``, how far its quantiles (:attr:`GoldenProfile.ranks`) depart from the references':
    the same rank's where a reference has the same world size, else every rank of it. Per series, the larger
    robust z of its median and 90th percentile (spread floored as :func:`deviation_score`'s); a rank's score
    is the sum over series of those at :data:`RANK_MIN_POINTS` or more. Ranks with a score, highest first."""
    out: list[dict[str, Any]] = []
    world = new.shape.get("world")
    phase_floor = _phase_floor(refs, PHASE_STEP_SHARE)
    for rank, mine in new.ranks.items():
        parts: list[dict[str, Any]] = []
        for name, (rel, floor) in SCORE_SERIES.items():
            if name not in mine:
                continue
            if name.endswith("_ms") and name != "step_ms":
                floor = max(floor, phase_floor)
            sign = -1.0 if name in LOWER_IS_WORSE else 1.0
            best: tuple[float, str] | None = None
            for qi, qname in enumerate(("p50", "p90")):
                theirs = []
                for r in refs:
                    pool = [r.ranks[rank]] if r.shape.get("world") == world and rank in r.ranks else list(r.ranks.values())
                    theirs += [sign * q[name][qi] for q in pool if name in q]
                if not theirs:
                    continue
                centre = statistics.median(theirs)
                spread = max(1.4826 * statistics.median(abs(t - centre) for t in theirs), rel * abs(centre), floor,
                             1e-12)
                z = (sign * mine[name][qi] - centre) / spread
                if best is None or z > best[0]:
                    best = (z, f"{qname} {_plain_number(mine[name][qi])} vs {_plain_number(sign * centre)}")
            if best is not None and best[0] >= RANK_MIN_POINTS:
                parts.append({"what": name, "points": round(best[0], 2), "detail": best[1]})
        if parts:
            parts.sort(key=lambda p: -p["points"])
            out.append({"rank": int(rank), "score": round(sum(p["points"] for p in parts), 2), "contributions": parts})
    out.sort(key=lambda r: (-r["score"], r["rank"]))
    return out


def leave_one_out(refs: Sequence[GoldenProfile], gate: float, cfg: AnalysisConfig | None = None) -> dict[str, Any]:
    """Each reference scored against the others: how often ``gate`` would fail a run known to be good."""
    from ._patterns import compare_patterns

    scores = []
    for i, r in enumerate(refs):
        others = [o for j, o in enumerate(refs) if j != i]
        with_patterns = [(o.name, o.patterns) for o in others if o.patterns]
        pats = compare_patterns(r.patterns, with_patterns) if r.patterns and with_patterns else []
        scores.append(deviation_score(r, others, pats, cfg)[0])
    above = sum(1 for x in scores if x > gate)
    return {"runs": len(scores), "above_gate": above, "false_alarm_rate": round(above / len(scores), 3) if scores
            else None, "scores": scores}


@dataclass
class _Aligned:
    """One series of a run and its references on their shared steps (after warm-up), smoothed; negated where
    lower is worse, so that "above" always means "worse"."""

    steps: list[int]
    raw: list[float | None]
    new: list[float | None]
    refs: list[list[float | None]]
    ref_noise: list[float]
    noise: float
    spread: float
    sign: float


def _align(new: GoldenProfile, refs: Sequence[GoldenProfile], name: str, cfg: AnalysisConfig) -> _Aligned | None:
    if name not in new.series:
        return None
    first = min(new.steps, default=0) + cfg.warmup_steps
    ref_steps = set().union(*(set(r.steps) for r in refs)) if refs else set()
    common = [s for s in new.steps if s in ref_steps and s >= first]
    if len(common) < max(3, cfg.golden_persist_steps):
        return None
    k = cfg.golden_smooth_steps
    key = hash(tuple(common))
    sign = -1.0 if name in LOWER_IS_WORSE else 1.0
    raw, smooth, noise = _smoothed(new, name, common, key, sign, k)
    ref_series: list[list[float | None]] = []
    ref_noise: list[float] = []
    for ref in refs:
        if name not in ref.series:
            continue
        r_raw, r_smooth, r_noise = _smoothed(ref, name, common, key, sign, k)
        if sum(v is not None for v in r_raw) < 3:
            continue
        ref_series.append(r_smooth)
        ref_noise.append(r_noise)
    spread = 0.0
    if len(ref_series) >= 2:
        per_step = []
        for vals in zip(*ref_series):
            got = sorted(v for v in vals if v is not None)
            if len(got) >= 2:
                c = _median_sorted(got)
                per_step.append(1.4826 * _median_sorted(sorted(abs(v - c) for v in got)))
        spread = statistics.median(per_step) if per_step else 0.0
    return _Aligned(common, raw, smooth, ref_series, ref_noise, noise, spread, sign)


def _median_sorted(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _signed(v: float | None, sign: float) -> float | None:
    return None if v is None else sign * v


def _score_finding(new: GoldenProfile, refs: list[GoldenProfile], patterns: list[Finding],
                   cfg: AnalysisConfig) -> list[Finding]:
    gate = cfg.golden_gate
    if gate is None:
        return []  # the score is asked for with a gate (--gate): the band and template findings say the rest
    score, parts = deviation_score(new, refs, patterns, cfg)
    top = [f"{p['what']} +{num(p['points'], 'g')} ({p['detail']})" for p in parts[:3]]
    by_rank = rank_scores(new, refs)
    details: dict[str, Any] = {"score": score, "contributions": parts, "gate": gate,
                               "references": [r.name for r in refs], "ranks": by_rank[:16]}
    over = score > gate
    worst = None
    if by_rank and over:
        r0 = by_rank[0]
        worst = f"rank {r0['rank']} ({num(r0['score'], 'g')}: {r0['contributions'][0]['what']} " \
                f"{r0['contributions'][0]['detail']})"
    above = runs = None
    if len(refs) >= 2:
        loo = leave_one_out(refs, gate, cfg)
        details["leave_one_out"] = loo
        above, runs = loo["above_gate"], loo["runs"]
    steps = sorted({p["step"] for p in parts if p.get("step") is not None})
    ranks = [r["rank"] for r in by_rank[:3]] if over else []
    return [Finding("golden_score", "error" if over else "info", _say_golden_score(score, gate, worst, above, runs, top),
                    ranks, [], steps, [],
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
                    _say_regression(mine, change, ref, pct, len(refs)), [], [], [], [],
                    {"step_ms": round(mine, 3), "golden_step_ms": round(ref, 3), "regression_pct": round(change, 2),
                     "allowed_pct": pct, "references": [r.name for r in refs]})]


def _series_findings(job: Any, new: GoldenProfile, refs: list[GoldenProfile], cfg: AnalysisConfig) -> list[Finding]:
    persist = cfg.golden_persist_steps
    out = []
    phase_floor = _phase_floor(refs, PHASE_BAND_SHARE)
    for name, (unit, abs_tol, rel_scale) in SERIES.items():
        if name.endswith("_ms") and name != "step_ms":
            abs_tol = max(abs_tol, phase_floor)
        al = _align(new, refs, name, cfg)
        if al is None or not al.refs:
            continue
        learned = len(al.refs) >= LEARNED_MIN_REFS
        n = len(al.steps)
        upper: list[float | None] = [None] * n
        at_step: list[list[float]] = [[] for _ in range(n)]
        for r_smooth, r_noise in zip(al.refs, al.ref_noise):
            for i, v in enumerate(r_smooth):
                if v is None:
                    continue
                if learned:
                    room = max(3 * al.spread, LEARNED_REL * rel_scale * abs(v), abs_tol, 3 * al.noise)
                else:
                    room = max(cfg.golden_tolerance * rel_scale * abs(v), abs_tol, 3 * max(r_noise, al.noise))
                u = v + room
                upper[i] = u if upper[i] is None else max(upper[i], u)  # type: ignore[type-var]
                at_step[i].append(v)
        centre = [statistics.median(vs) if vs else None for vs in at_step]
        above = [u is not None and v is not None and v > u for v, u in zip(al.new, upper)]
        start = next((i for i in range(len(above) - persist + 1) if all(above[i:i + persist])), None)
        if start is None:
            continue
        end = start
        while end + 1 < len(above) and above[end + 1]:
            end += 1
        start = _onset(al.raw, start, end, max(1, cfg.golden_smooth_steps) // 2)
        s0, s1 = al.steps[start], al.steps[end]
        sign = al.sign
        got = sign * statistics.median(v for v in al.new[start:end + 1] if v is not None)
        want = sign * statistics.median(v for v in centre[start:end + 1] if v is not None)
        band = sign * statistics.median(u for u in upper[start:end + 1] if u is not None)
        ratio = got / want if want else float("inf")
        fmt: Callable[[float], str] = functools.partial(_with_unit, unit=unit) if unit else _plain_number
        limit = "band down to" if sign < 0 else "band up to"
        f = Finding(
            "golden_deviation", "warning",
            _say_golden_deviation(name, [r.name for r in refs], s0, s1, fmt(got), fmt(want), ratio, limit, fmt(band),
                                  learned),
            [], [], [s0, s1], [],
            {"metric": name, "golden": [r.name for r in refs], "golden_jobs": [r.job_id for r in refs],
             "start_step": s0, "end_step": s1, "value": round(got, 6), "reference": round(want, 6),
             "band_upper" if sign > 0 else "band_lower": round(band, 6), "ratio": round(ratio, 3),
             "band": "learned" if learned else "tolerance"},
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


# The findings' wording: plain values in, one phrase out (see queries._text; tests/queries/test_report_text.py
# renders each with singular, plural, zero and infinite values).


@template
def _say_golden_score(score: float, gate: float, worst: str | None, above: int | None, runs: int | None,
                      top: list[str]) -> str:
    text = f"deviation from the golden runs: score {num(score, 'g')} (gate {num(gate, 'g')})"
    if worst:
        text += f"; most departing {worst}"
    if above is not None and runs is not None:
        text += f"; leave-one-out, {above:,} of {count(runs, 'golden run')} {'scores' if above == 1 else 'score'} above it"
    return f"{text}: {'; '.join(top) or 'nothing departs'}"


@template
def _say_regression(step_ms: float, change_pct: float, golden_ms: float, allowed_pct: float, runs: int) -> str:
    theirs = "the golden run's" if runs == 1 else "the golden runs'"
    return (f"median step {num(step_ms, '.1f')} ms is {num(change_pct, '.1f')}% slower than {theirs} "
            f"{num(golden_ms, '.1f')} ms (allowed: {num(allowed_pct, 'g')}%)")


@template
def _say_golden_deviation(name: str, runs: list[str], first: int, last: int, got: str, want: str, ratio: float,
                          limit: str, band: str, learned: bool) -> str:
    many = len(runs) != 1
    names = f"golden run{'s' if many else ''} " + ", ".join(f"'{r}'" for r in runs) if runs else "the golden runs"
    return (f"{name} deviates from {names} from step {first}: {got} vs {want} in the "
            f"reference{'s' if many else ''} ({times(ratio, 'the reference', 2)}; {limit} {band}"
            + (", learned from their spread" if learned else "") + ")"
            + (f", through step {last}" if last != first else ""))
