"""From a job's ``events`` table to a verdict: who is slow, who is stalled, what went wrong, and why.

All heavy lifting is SQL over the columnar ``events`` table: four derived tables (see
:mod:`jobtrace.store`) are built with one scan each, and every check then reads those
or runs a small targeted query, so the cost grows with events in DuckDB and with ranks
(not events) in Python. Only the ``events`` table is read, so the embedded store and
every log server backend give the same verdict.

The checks, each documented in its module:

* :mod:`queries._hang`: stalled and silent ranks, the wavefront, collective mismatches;
* :mod:`queries._straggler`: relative and individual straggler scores per rank and node
  over sliding windows, chronic lag versus one-off stalls, late arrival at collectives;
* :mod:`queries._health`: NaN/Inf, loss spikes, grad-norm, loss scale, learning rate,
  memory leaks, throughput drops, data-loader waits, communication share;
* :mod:`queries._golden`: deviations from reference runs.

Definitions kept from the first version, so that a verdict can be checked by hand:
step time is the ``step`` span; collective wait the sum of synchronous collective spans
of the step; data wait the ``data`` phase; compute the rest. The first
``warmup_steps`` steps are left out of per-step statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobtrace.errors import JobNotFound

from ._clocks import APPLY_NS, node_offsets
from ._failures import analyze_failures
from ._golden import GoldenProfile, compare_to_golden
from ._hang import analyze_hang
from ._health import analyze_health, breakdown
from ._links import LinkConfig, attach_links
from ._model import (
    AFTER_WARMUP,
    AnalysisConfig,
    AnalysisContext,
    EventRef,
    Finding,
    NodeSummary,
    RankSummary,
    Report,
    ms,
    rows,
)
from ._store import JobData
from ._straggler import analyze_stragglers, late_arrival_findings, late_arrivals, window_size
from ._sync_phases import infer_sync_phases

__all__ = ["AnalysisConfig", "EventRef", "Finding", "NodeSummary", "RankSummary", "Report", "analyze"]

_SEVERITY = {"error": 0, "warning": 1, "info": 2}


def _training_ranks(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``ranks`` rows less a launcher's own stream, where the log tells the real ranks apart.

    In torchrun's ``--tee`` console the ranks' lines carry ``[defaultN]:``; the agent's own lines
    (its warnings, the failure summary) carry none and would become one more "rank", numbered by
    order of appearance. A stream whose rank was only guessed, that took no step and opened no span,
    beside streams whose rank the log said, is that: its lines still count (a failure on it is
    reported for ``rank ?``), but it is no rank of the job.
    """
    if all(r.get("rank_est") for r in ranks):
        return ranks
    kept = [r for r in ranks if not (r.get("rank_est") and not r["n"] and r["last_step"] is None
                                     and r["last_span"] is None)]
    return kept or ranks


def _clocks(con: Any, ranks: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, int]]:
    """The report's clock section and the offsets to apply (ns per node), for a job on several nodes."""
    nodes = {r["node"] for r in ranks}
    if len(nodes) < 2:
        return {}, {}
    reference = min(ranks, key=lambda r: r["rank"])["node"]
    found = node_offsets(con, reference)
    clock = {n: o["offset_ns"] for n, o in found.items() if abs(o["offset_ns"]) >= APPLY_NS}
    section = {"reference": reference, "offsets_ms": {n: round(o["offset_ns"] / 1e6, 3) for n, o in found.items()},
               "offsets_ns": {n: o["offset_ns"] for n, o in found.items()},
               "points": {n: o["points"] for n, o in found.items()}, "applied": sorted(clock),
               "unknown": sorted(nodes - set(found) - {reference})}
    return section, clock


def analyze(
    job: JobData,
    config: AnalysisConfig | None = None,
    *,
    golden: Sequence[GoldenProfile] = (),
    links: LinkConfig | None = None,
    profile: GoldenProfile | None = None,
) -> Report:
    """Diagnose one job.

    Args:
        job: the job's events, from :func:`load_local`, :func:`load_events` or a backend.
        config: thresholds (default :class:`AnalysisConfig()`).
        golden: reference runs to compare with (see :func:`load_golden`).
        profile: this job's own profile where the caller already made it (to choose ``golden``).
        links: where the user's backend is, to link every finding to its events.
    """
    cfg = config or AnalysisConfig()
    con = job.con
    job.build_tables()
    sync_phases = infer_sync_phases(con)
    step_info = rows(
        con, "SELECT count(DISTINCT step) AS n, min(step) AS lo, max(step) AS hi, median(step_ns) AS med FROM steps"
    )[0]
    n_steps = step_info["n"] or 0
    first_step = step_info["lo"]
    # Leave the warm-up steps out of per-step statistics, unless that would leave fewer than two steps.
    warm_from = int(first_step) + cfg.warmup_steps if n_steps >= cfg.warmup_steps + 2 else None

    ranks = rows(
        con,
        f"""
        WITH s AS (
            SELECT rank, count(*) AS n, median(step_ns) AS step_ns, median(compute_ns) AS compute_ns,
                   median(coll_ns) AS coll_ns, median(data_ns) AS data_ns, median(idle_ns) AS idle_ns,
                   sum(coll_ns) / nullif(sum(step_ns), 0) AS comm_share
            FROM steps WHERE {AFTER_WARMUP} GROUP BY rank)
        SELECT r.*, s.n, s.step_ns, s.compute_ns, s.coll_ns, s.data_ns, s.idle_ns, s.comm_share
        FROM ranks r LEFT JOIN s USING (rank) ORDER BY rank
        """,
        {"warm_from": warm_from},
    )
    ranks = _training_ranks(ranks)
    if not ranks:  # every line torn, corrupt or not a rank's: nothing to judge, and the user must hear why
        st = job.stats
        raise JobNotFound(f"job {job.job_id!r} has no readable rank events (lines skipped: "
                          f"{st.torn_lines:,} torn, {st.corrupt_lines:,} corrupt)")
    head = {
        "t_min": min(r["first_ts"] for r in ranks), "ranks": len(ranks),
        "world": max((r["world"] or 0) for r in ranks),
        "trace_ids": sorted({t for r in ranks for t in (r["trace_lo"], r["trace_hi"]) if t}),
    }
    nodes = sorted({r["node"] for r in ranks})
    clocks, clock = _clocks(con, ranks)
    t_max = max(r["last_ts"] - clock.get(r["node"], 0) for r in ranks)  # on the reference node's clock
    per_rank = [
        RankSummary(
            rank=r["rank"],
            node=r["node"],
            steps=r["n"] or 0,
            step_ms=ms(r["step_ns"]),
            compute_ms=ms(r["compute_ns"]),
            collective_ms=ms(r["coll_ns"]),
            data_ms=ms(r["data_ns"]),
            last_step=r["last_step"],
            last_seen_s=round((t_max + clock.get(r["node"], 0) - r["last_ts"]) / 1e9, 3),
            comm_share=None if r["comm_share"] is None else round(r["comm_share"], 3),
            idle_ms=ms(r["idle_ns"]),
        )
        for r in ranks
    ]
    by_rank = {p.rank: p for p in per_rank}
    ctx = AnalysisContext(con=con, cfg=cfg, ranks=ranks, by_rank=by_rank, t_max=t_max, n_steps=n_steps,
                          first_step=first_step, window=window_size(cfg, n_steps), warm_from=warm_from,
                          late=late_arrivals(con, len(ranks)), clock=clock)

    # A rank's status does not depend on the order below: each check proposes, STATUS_PRECEDENCE
    # decides. Late arrival comes last for its findings, which need to know what the others explain.
    findings: list[Finding] = analyze_failures(ctx)
    hang_findings, hang_info = analyze_hang(ctx)
    findings += hang_findings
    slow_findings, per_node, straggler_info = analyze_stragglers(ctx)
    findings += slow_findings
    findings += analyze_health(ctx)
    named = {r for f in findings if f.severity in ("error", "warning") for r in f.ranks}
    named |= {r for f in findings if f.kind in ("transient_stall", "job_pause") for r in f.ranks}
    findings += late_arrival_findings(ctx, named)
    for node in per_node:
        node.slow_ranks = [r for r in node.ranks if by_rank[r].status not in ("ok", "waiting")]
    findings += compare_to_golden(job, list(golden), cfg, profile)
    report_golden = [ref.name for ref in golden]
    findings.sort(key=lambda f: _SEVERITY.get(f.severity, 3))

    per_step = rows(
        con,
        """SELECT step, count(*) AS ranks, round(median(step_ns) / 1e6, 3) AS step_ms,
                  round(median(compute_ns) / 1e6, 3) AS compute_ms, round(median(coll_ns) / 1e6, 3) AS collective_ms,
                  round(median(data_ns) / 1e6, 3) AS data_ms, arg_max(rank, compute_ns) AS slowest_rank,
                  round(max(compute_ns) / 1e6, 3) AS slowest_compute_ms,
                  round(sum(coll_ns) / nullif(sum(step_ns), 0), 4) AS comm_share
           FROM steps GROUP BY step ORDER BY step""",
    )
    med = step_info["med"]
    throughput = {}
    for key in ("tokens_per_s", "samples_per_s"):
        # The job's rate: per rank, the median of its reported rate; summed over ranks.
        value = rows(con, f"SELECT sum(m) AS total FROM (SELECT rank, median({key}) AS m FROM mets "
                          f"WHERE {key} IS NOT NULL GROUP BY rank)")[0]["total"]
        if value is not None:
            throughput[key] = round(value, 1)
    collectives: dict[str, Any] = {"instances": ctx.late["instances"], "ops": ctx.late["ops"],
                                   "window_steps": straggler_info.get("window_steps")}
    if sync_phases:  # no collective recorded: these phases stood in for them (see _sync_phases)
        collectives["inferred_from_phases"] = sync_phases
    if hang_info:
        collectives["wavefront"] = hang_info.get("wavefront")
        collectives["waves"] = hang_info.get("waves")
    report = Report(
        job_id=job.job_id,
        trace_ids=head["trace_ids"],
        source=job.source,
        ranks=head["ranks"],
        world_size=head["world"] or head["ranks"],
        nodes=nodes,
        steps=n_steps,
        first_step=first_step,
        last_step=step_info["hi"],
        wall_s=round((t_max - head["t_min"]) / 1e9, 3),
        step_ms_median=ms(med),
        steps_per_s=round(1e9 / med, 3) if med else None,
        throughput=throughput,
        events=job.stats.events,
        skipped=dict(job.stats.skipped),
        per_rank=per_rank,
        per_step=per_step,
        findings=findings,
        per_node=per_node,
        breakdown=breakdown(ctx),
        collectives=collectives,
        golden=report_golden,
        t_min=head["t_min"],
        t_max=t_max,
        clocks=clocks,
    )
    if links is not None:
        attach_links(report, links)
    return report
