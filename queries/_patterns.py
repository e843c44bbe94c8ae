"""Log patterns: a job's messages reduced to templates, and where a new job's templates depart from references.

"NCCL WARN Call to ibv_reg_mr failed with error 12 for buf 0x7f12ab" and the same line with another
errno and buffer are one template. The messages are first masked in DuckDB (numbers, hex and long ids,
IP addresses, paths), which collapses a job's millions of lines to its few hundred distinct shapes;
those are then clustered with Drain (``drain3``, the miner logpai's benchmarks made the usual choice),
which also folds words that vary between otherwise equal lines (a rank's hostname, an op name) into
``<*>``. A template keeps its highest level, its count, how many ranks said it and the first step.

Compared with references (:func:`compare_patterns`), three things are news:

* a template at warning level or above that no reference has (``new_log_pattern``);
* a template every reference has at least twice and the new job lacks (``missing_log_pattern``:
  checkpoint saves that stopped);
* a template whose rate per step is at least ``RATE_FACTOR`` times above (or below) every
  reference's, with at least ``MIN_COUNT`` lines on the high side (``log_pattern_rate``).

Two templates are the same when they have the same tokens, where ``<*>`` on either side matches any one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ._model import Finding, rows
from ._text import count, num, template

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["compare_patterns", "log_patterns", "same_template"]

_LEVELS: Final = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "WARN": 30, "ERROR": 40, "CRITICAL": 50, "FATAL": 50}
_MASKS: Final = (  # (regex in DuckDB's RE2, mask): the specific ones first
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<UUID>"),
    (r"0x[0-9a-fA-F]+", "<HEX>"),
    (r"\b[0-9a-f]{12,}\b", "<ID>"),
    (r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b", "<IP>"),
    (r"(/[\w.+-]+){2,}/?", "<PATH>"),
    (r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?", "<NUM>"),
)
WARNING: Final = 30
RATE_FACTOR: Final = 3.0
MIN_COUNT: Final = 5
MAX_SHAPES: Final = 20_000  # distinct masked messages mined; the rarest beyond are counted, not mined


def _masked_sql() -> str:
    expr = "msg"
    for pattern, mask in _MASKS:
        expr = f"regexp_replace({expr}, '{pattern}', '{mask}', 'g')"
    return expr


def log_patterns(con: DuckDBPyConnection) -> dict[str, Any]:
    """The job's templates (from its ``events``): ``{"templates": {text: {...}}, "steps": n, "lines": n}``."""
    from drain3 import TemplateMiner
    from drain3.template_miner_config import TemplateMinerConfig

    shapes = rows(
        con,
        f"""SELECT {_masked_sql()} AS shape, count(*) AS n,
                   count(DISTINCT rank) AS ranks, min(step) AS first_step,
                   arg_min(msg, ts) AS example, list(DISTINCT upper(coalesce(level, 'INFO'))) AS levels
            FROM events WHERE kind = 'log' AND msg IS NOT NULL AND msg <> ''
              AND coalesce(logger, '') NOT IN ('jobtrace.lifecycle', 'otlp')
            GROUP BY shape ORDER BY n DESC LIMIT {MAX_SHAPES}""",
    )
    steps = rows(con, "SELECT count(DISTINCT step) AS n FROM events WHERE step IS NOT NULL")[0]["n"] or 0
    cfg = TemplateMinerConfig()
    cfg.profiling_enabled = False
    miner = TemplateMiner(config=cfg)
    by_cluster: dict[int, dict[str, Any]] = {}
    for s in shapes:
        cluster = miner.add_log_message(s["shape"][:2000])["cluster_id"]
        level = max((_LEVELS.get(x, 20) for x in s["levels"] or []), default=20)
        got = by_cluster.get(cluster)
        if got is None:
            by_cluster[cluster] = {"level": level, "count": s["n"], "ranks": s["ranks"], "first_step": s["first_step"],
                                   "example": str(s["example"])[:300]}
        else:
            got["level"] = max(got["level"], level)
            got["count"] += s["n"]
            got["ranks"] = max(got["ranks"], s["ranks"])
            if s["first_step"] is not None and (got["first_step"] is None or s["first_step"] < got["first_step"]):
                got["first_step"] = s["first_step"]
    templates: dict[str, dict[str, Any]] = {}
    for cluster in miner.drain.clusters:
        info = by_cluster.get(cluster.cluster_id)
        if info is not None:
            text = cluster.get_template()
            prev = templates.get(text)
            templates[text] = info if prev is None else {**prev, "count": prev["count"] + info["count"]}
    return {"templates": templates, "steps": int(steps), "lines": sum(t["count"] for t in templates.values())}


def same_template(a: str, b: str) -> bool:
    """Token by token equal, ``<*>`` (Drain's wildcard) matching any one token on either side."""
    if a == b:
        return True
    ta, tb = a.split(), b.split()
    return len(ta) == len(tb) and all(x == y or x == "<*>" or y == "<*>" for x, y in zip(ta, tb))


def _find(text: str, templates: dict[str, Any]) -> dict[str, Any] | None:
    hit = templates.get(text)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    return next((v for k, v in templates.items() if same_template(text, k)), None)


def compare_patterns(new: dict[str, Any], refs: Sequence[tuple[str, dict[str, Any]]]) -> list[Finding]:
    """What the new job's templates say that its references' do not (see the module docstring)."""
    if not refs:
        return []
    names = ", ".join(name for name, _ in refs)
    findings: list[Finding] = []
    steps = max(new.get("steps") or 0, 1)
    for text, t in sorted(new["templates"].items(), key=lambda kv: -kv[1]["count"]):
        seen = [(name, hit) for name, p in refs if (hit := _find(text, p["templates"])) is not None]
        rate = t["count"] / steps
        if not seen:
            if t["level"] >= WARNING:
                findings.append(Finding(
                    "new_log_pattern", "warning",
                    _say_new_pattern(_level(t["level"]), t["count"], t["ranks"], t["first_step"], t["example"]),
                    [], [], [t["first_step"]] if t["first_step"] is not None else [], [t["example"]],
                    {"template": text, "count": t["count"], "level": _level(t["level"]), "references": names}))
            continue
        if len(seen) < len(refs):
            continue
        ref_rates = [hit["count"] / max(p.get("steps") or 0, 1) for (_, hit), (_, p) in zip(seen, refs)]
        hi, lo = max(ref_rates), min(ref_rates)
        if (rate >= RATE_FACTOR * hi and t["count"] >= MIN_COUNT) or (lo > 0 and rate * RATE_FACTOR <= lo
                                                                       and hi * steps >= MIN_COUNT):
            findings.append(Finding(
                "log_pattern_rate", "warning",
                _say_pattern_rate(rate, lo, hi, t["example"]),
                [], [], [], [t["example"]],
                {"template": text, "rate_per_step": round(rate, 4), "golden_rates": [round(r, 4) for r in ref_rates],
                 "references": names}))
    for text, t in refs[0][1]["templates"].items():
        counts = [hit["count"] for _, p in refs if (hit := _find(text, p["templates"])) is not None]
        if len(counts) == len(refs) and min(counts) >= 2 and _find(text, new["templates"]) is None:
            findings.append(Finding(
                "missing_log_pattern", "warning",
                _say_missing_pattern(min(counts), max(counts), t["example"]),
                [], [], [], [t["example"]], {"template": text, "golden_counts": counts, "references": names}))
    return findings


def _level(n: int) -> str:
    return {30: "warning", 40: "error", 50: "critical"}.get(n, "info")


# The findings' wording: plain values in, one phrase out (see queries._text; tests/queries/test_report_text.py
# renders each with singular, plural, zero and infinite values).


@template
def _say_new_pattern(level: str, lines: int, ranks: int, first_step: int | None, example: str) -> str:
    first = f", first at step {first_step}" if first_step is not None else ""
    return (f"{'an' if level[:1] in 'aeiou' else 'a'} {level} the golden runs never logged ({count(lines, 'line')} "
            f"on {count(ranks, 'rank')}{first}): {example}")


@template
def _say_pattern_rate(rate: float, lo: float, hi: float, example: str) -> str:
    more = rate > hi
    ratio = (rate / hi if hi else math.inf) if more else (lo / rate if rate else math.inf)
    band = f"{num(lo, '.2f')}" if lo == hi else f"{num(lo, '.2f')}–{num(hi, '.2f')}"
    how = (f"{ratio:.1f}× " if math.isfinite(ratio) else "") + f"{'more' if more else 'less'} often"
    return f"logged {how} than in the golden runs ({num(rate, '.2f')} per step vs {band}): {example}"


@template
def _say_missing_pattern(lo: int, hi: int, example: str) -> str:
    n = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
    return f"every golden run logged this ({n} {'time' if hi == 1 else 'times'}), this job never: {example}"
