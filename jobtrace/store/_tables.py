"""Derived tables every check reads: one scan of ``events`` each, then only small tables.

* ``colls``: one row per collective record, its JSON attributes parsed once.
* ``steps``: one row per rank and step: step time, each phase, synchronous collective
  time, data wait, compute (step minus collective minus data) and idle (step not covered
  by any phase).
* ``mets``: one row per rank and step with the metrics the health checks know, the
  last reported value winning when a step reports one twice.
* ``ranks``: one row per rank: first and last event, last progress, last heartbeat
  and span, last step, whether it stopped cleanly (the stall and summary checks).

All four are built from the ``events`` table only, so they come out the same whichever
backend loaded the job. Each row depends on one rank's events only, so a rank can build
its own rows when it exits (its *rollup*, see :mod:`._segments`); the reader then
derives only the ranks that left none and appends the rollups' rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from ._sql import literal_list

__all__ = ["BUILD_ORDER", "DERIVED", "METRICS", "ROLLUP_KEY", "build_tables"]

# json_transform parses each document once into typed fields (a value of the wrong type becomes NULL),
# ~1.6x faster than extracting strings and casting them.
_COLL_ATTRS: Final = orjson.dumps({"group": "VARCHAR", "seq": "BIGINT", "bytes": "BIGINT", "group_size": "INTEGER",
                                   "async": "BOOLEAN", "error": "VARCHAR", "source": "VARCHAR"}).decode()

_SCALING: Final = orjson.dumps({"overflow": "DOUBLE", "loss_scale": "DOUBLE", "attempted_loss_scale": "DOUBLE"}).decode()

METRICS = (
    "loss",
    "grad_norm",
    "lr",
    "loss_scale",
    "rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "tokens_per_s",
    "samples_per_s",
)


def build_tables(con: Any, source: str = "events", rollups: Mapping[str, Sequence[str]] | None = None, *,
                 prebuilt: Mapping[str, str] | None = None, sources: Mapping[str, str] | None = None,
                 appended: Mapping[str, str] | None = None) -> None:
    """Create the derived tables from the ``source`` relation plus the rollup files given.

    ``prebuilt`` names, per table, a relation that already holds its rows (a log server aggregated
    them: see ``queries._server_tables``); it is copied instead of derived. ``sources`` gives one
    table's statement another relation to read than ``source``. ``appended`` names, per table, a
    relation of rollup rows to add, like ``rollups`` (ranks' packs read from a log server, see
    :mod:`._packs`). Copies, not the relations themselves, because the checks may add rows
    (inferred collectives), and a second build must start afresh.
    """
    prebuilt, sources = prebuilt or {}, sources or {}
    for name in BUILD_ORDER:
        if name in prebuilt:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {prebuilt[name]}")
        else:
            con.execute(dict(zip(BUILD_ORDER, _statements(sources.get(name, source)), strict=True))[name])
    for table, paths in (rollups or {}).items():
        if paths:
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet({literal_list(paths)})")
    for table, relation in (appended or {}).items():
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {relation}")


BUILD_ORDER: Final = ("colls", "step_spans", "phase_sums", "steps", "ranks", "mets", "scaling")
"""The statements of :func:`_statements`, in order (``steps`` reads ``colls``, ``step_spans`` and ``phase_sums``)."""


def _statements(source: str) -> list[str]:
    spec = orjson.dumps({m: "DOUBLE" for m in METRICS}).decode()
    cols = ",\n".join(f"max_by(m.{name}, ts) FILTER (WHERE m.{name} IS NOT NULL) AS {name}" for name in METRICS)
    return [
        f"""
        CREATE OR REPLACE TEMP TABLE colls AS
        WITH c AS (
            SELECT rank, node, step, ts, start, dur, span_id, name AS op, json_transform(attrs, '{_COLL_ATTRS}') AS a
            FROM {source} WHERE kind = 'span' AND cat = 'collective')
        SELECT rank, node, step, ts, start, dur, span_id, op,
               coalesce(a."group", 'default') AS grp, a.seq AS seq, a.bytes AS bytes,
               a.group_size AS gsize, coalesce(a.async, false) AS is_async,
               a.error AS error, a.source AS source
        FROM c
        """,
        # Three narrow scans and a join beat one wide GROUP BY with string aggregates by ~3x.
        f"""
        CREATE OR REPLACE TEMP TABLE step_spans AS
        SELECT rank, step, any_value(node) AS node, sum(dur) AS step_ns, min(start) AS t0, max(ts) AS t1,
               min(span_id) AS span_id
        FROM {source} WHERE kind = 'span' AND cat = 'step' AND step IS NOT NULL GROUP BY rank, step
        """,
        f"""
        CREATE OR REPLACE TEMP TABLE phase_sums AS
        SELECT rank, step,
               sum(dur) FILTER (WHERE name = 'data') AS data_ns,
               sum(dur) FILTER (WHERE name = 'forward') AS fwd_ns,
               sum(dur) FILTER (WHERE name = 'backward') AS bwd_ns,
               sum(dur) FILTER (WHERE name = 'optimizer') AS opt_ns,
               sum(dur) AS phase_ns
        FROM {source} WHERE kind = 'span' AND cat = 'phase' AND step IS NOT NULL GROUP BY rank, step
        """,
        """
        CREATE OR REPLACE TEMP TABLE steps AS
        WITH p AS (SELECT * FROM phase_sums),
        -- Time with a collective in flight inside the step span (a barrier after the loop keeps the last step
        -- number): the union of their intervals, since DDP's buckets and FSDP's prefetches overlap each other.
        -- Sorted by start, each adds what it reaches past the latest end before it.
        ci AS (
            SELECT c.rank, c.step, c.start AS s, c.ts AS e,
                   max(c.ts) OVER (PARTITION BY c.rank, c.step ORDER BY c.start, c.ts
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
            FROM colls c JOIN step_spans s USING (rank, step)
            WHERE NOT c.is_async AND c.start >= s.t0 AND c.ts <= s.t1),
        c AS (
            SELECT rank, step, sum(greatest(e - greatest(s, coalesce(prev_e, s)), 0)) AS coll_ns, count(*) AS n_coll
            FROM ci GROUP BY rank, step),
        n AS (SELECT rank, any_value(node) AS node FROM step_spans GROUP BY rank)
        SELECT s.rank, coalesce(n.node, '') AS node, s.step, s.step_ns, s.t0, s.t1, s.span_id,
               coalesce(c.coll_ns, 0) AS coll_ns, coalesce(p.data_ns, 0) AS data_ns,
               p.fwd_ns, p.bwd_ns, p.opt_ns,
               greatest(s.step_ns - coalesce(c.coll_ns, 0) - coalesce(p.data_ns, 0), 0) AS compute_ns,
               CASE WHEN p.phase_ns IS NULL THEN NULL ELSE greatest(s.step_ns - p.phase_ns, 0) END AS idle_ns
        FROM step_spans s LEFT JOIN p USING (rank, step) LEFT JOIN c USING (rank, step) LEFT JOIN n USING (rank)
        """,
        # What each rank was last doing and when: the stall, hang and summary checks' one pass over events.
        f"""
        CREATE OR REPLACE TEMP TABLE ranks AS
        WITH r AS (
            SELECT rank, any_value(node) AS node, max(ts) AS last_ts, min(ts) AS first_ts, max(world) AS world,
                   min(trace_id) AS trace_lo, max(trace_id) AS trace_hi,
                   -- a collective that failed (its peer gone, the job being stopped) is no progress either
                   max(ts) FILTER (WHERE kind <> 'heartbeat' AND (kind <> 'log' OR NOT starts_with(logger, 'jobtrace'))
                                   AND (cat IS DISTINCT FROM 'collective' OR NOT contains(CAST(attrs AS VARCHAR), '"error":')))
                       AS last_progress,
                   arg_max(attrs, ts) FILTER (WHERE kind = 'heartbeat') AS beat,
                   max(ts) FILTER (WHERE kind = 'heartbeat') AS beat_ts,
                   -- one arg_max over a struct with a tie-break, so name, category and id
                   -- come from the same span even when several spans end in the same nanosecond
                   arg_max({{'name': name, 'cat': cat, 'id': span_id}}, (ts, coalesce(dur, 0), span_id))
                       FILTER (WHERE kind = 'span') AS last_span_row,
                   max(ts) FILTER (WHERE kind = 'span') AS last_span_ts,
                   max(step) AS last_step,
                   bool_or(kind = 'log' AND logger = 'jobtrace.lifecycle' AND msg = 'stop') AS stopped,
                   coalesce(bool_and(coalesce(rank_est, false)), false) AS rank_est
            FROM {source} GROUP BY rank)
        SELECT r.* EXCLUDE (last_span_row), r.last_span_row.name AS last_span, r.last_span_row.cat AS last_span_cat,
               r.last_span_row.id AS last_span_id
        FROM r
        """,
        f"""
        CREATE OR REPLACE TEMP TABLE mets AS
        WITH m AS (SELECT rank, node, step, ts, span_id, json_transform(metrics, '{spec}') AS m
                   FROM {source} WHERE kind = 'metric' AND step IS NOT NULL)
        SELECT rank, any_value(node) AS node, step, max(ts) AS ts, arg_max(span_id, ts) AS span_id,
               {cols}
        FROM m GROUP BY rank, step
        """,
        # fp16 loss scaling, step or not (apex and DeepSpeed's overflow lines often have none): the
        # overflow-cascade and loss-scale checks order it by time. Few rows: a prefilter on the text
        # skips every other metric before its JSON is parsed.
        f"""
        CREATE OR REPLACE TEMP TABLE scaling AS
        WITH m AS (SELECT rank, node, step, ts, span_id, json_transform(metrics, '{_SCALING}') AS m
                   FROM {source} WHERE kind = 'metric'
                     AND (contains(metrics, '"overflow"') OR contains(metrics, '"loss_scale"')))
        SELECT rank, node, step, ts, span_id, m.overflow AS overflow, m.loss_scale AS loss_scale,
               m.attempted_loss_scale AS attempted_loss_scale
        FROM m WHERE m.overflow IS NOT NULL OR m.loss_scale IS NOT NULL
        """,
    ]


DERIVED: Final = ("colls", "steps", "mets", "ranks", "scaling")
"""The derived tables a rank's rollup holds (``step_spans`` and ``phase_sums`` only serve to build ``steps``)."""

ROLLUP_KEY: Final = hashlib.sha256("".join(_statements("events")).encode()).hexdigest()[:8]
"""Changes whenever the derived tables' SQL does, so rollups from another version are never trusted."""
