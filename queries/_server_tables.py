"""The derived tables from a log server's aggregates, not from every event (issue 26, tier A).

Pulling every event of a 1,000-rank job out of a log server costs minutes and gigabytes
(docs/server-scale.md). But nine tenths of a job's events are spans and metrics, and the
checks read those only through the derived tables (:func:`jobtrace.store.build_tables`):
``step_spans`` and ``phase_sums`` (sums per rank and step), ``colls`` (one row per
collective), ``mets`` (the last value of each metric per rank and step) and ``ranks``. A
server reader therefore asks the server for those rows, stages the answers here as JSON
lines, and fetches as events only what the checks read directly: every log and heartbeat,
the fp16 loss-scale metrics, each rank's ten longest ``data`` spans, and the job's first
step span and first loss. :func:`load_aggregated` then builds the same tables the
embedded store would, and ``analyze()`` runs unchanged on them.

Each reader writes one JSON object per row into these relations (:data:`RELATIONS`), values
as JSON strings or numbers (integers exact: nanoseconds do not fit a double); a column that
had no value is absent, empty or null. Every sum comes with the count of values it summed,
so that "no value" (SQL NULL) stays apart from zero:

* ``step_rows``, per rank and step, over spans with a step: ``n_step`` step spans,
  ``step_ns``/``n_step_dur`` (sum of their ``dur``), ``t0`` (min ``start``), ``t1`` (max ``ts``),
  ``step_span_ids`` (their span ids, a JSON list), ``n_phase`` phase spans, ``phase_ns``/
  ``n_phase_dur``, and ``data_ns``/``n_data``, ``fwd_ns``/``n_fwd``, ``bwd_ns``/``n_bwd``,
  ``opt_ns``/``n_opt`` for the phases named data, forward, backward and optimizer; ``node``.
* ``coll_rows``: every collective span: ``rank, node, step, ts, start, dur, span_id, name`` and
  its ``attrs`` ``group, seq, bytes, group_size, async, error, source``.
* ``met_rows``, per rank and step, over metric events with a step: ``ts`` (max), ``span_id``
  (of the latest), ``node``, and per metric of :data:`jobtrace.store.METRICS` its latest value.
* ``rank_rows``, per rank, over its spans and metrics: ``first_ts``, ``last_ts``, ``progress_ts``
  (latest that was progress: not a failed collective), ``last_step``, ``world``, ``traces`` (a JSON
  list), ``n``, ``n_est`` (events whose rank was estimated), ``node``, and its last span by
  ``(ts, dur, span_id)``: ``ls_ts, ls_dur, ls_name, ls_cat, ls_span_id, ls_error, ls_step``.

The ``ranks`` statement then runs on the fetched events plus a few stand-in rows per rank
made from ``rank_rows`` (one per aggregate it takes), so its rules stay written once.
Column types come from the derived tables themselves, built empty first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from jobtrace.store import METRICS, build_tables, literal, literal_list

from ._store import JobData, ReadStats, load_events

__all__ = ["RELATIONS", "Staging", "load_aggregated", "with_aggregates"]

RELATIONS: Final = ("step_rows", "coll_rows", "met_rows", "rank_rows")
"""What a server reader stages, one JSON object per row (the module docstring gives the columns)."""

_PHASES: Final = {"data": "data", "fwd": "forward", "bwd": "backward", "opt": "optimizer"}

_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "step_rows": ("rank", "step", "node", "n_step", "step_ns", "n_step_dur", "t0", "t1", "step_span_ids", "n_phase",
                  "phase_ns", "n_phase_dur", *(c for p in _PHASES for c in (f"{p}_ns", f"n_{p}"))),
    "coll_rows": ("rank", "node", "step", "ts", "start", "dur", "span_id", "name", "group", "seq", "bytes",
                  "group_size", "async", "error", "source"),
    "met_rows": ("rank", "step", "node", "ts", "span_id", *METRICS),
    "rank_rows": ("rank", "node", "first_ts", "last_ts", "progress_ts", "last_step", "world", "traces", "n", "n_est",
                  "ls_ts", "ls_dur", "ls_name", "ls_cat", "ls_span_id", "ls_error", "ls_step"),
}


class Staging:
    """JSON-lines files, one set per relation, that a reader's threads append server answers to.

    Answers are written as the server sent them (no parsing in Python), so a million rows
    cost what DuckDB's reader costs. The directory goes away with :meth:`close`.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobtrace-rollup-"))
        self._lock = threading.Lock()
        # "events": answers whose ``_msg`` is a whole canonical event (VictoriaLogs), for load_wrapped_events
        self._files: dict[str, list[str]] = {name: [] for name in (*RELATIONS, "events")}
        self.rows: dict[str, int] = dict.fromkeys(self._files, 0)
        self.bytes = 0

    def add(self, relation: str, body: bytes, rows: int) -> None:
        """One answer (JSON lines) for ``relation``."""
        if relation not in self._files:
            raise ValueError(f"unknown relation {relation!r}")
        with self._lock:
            path = self.dir / f"{relation}-{len(self._files[relation])}.jsonl"
            self._files[relation].append(str(path))
            self.rows[relation] += rows
            self.bytes += len(body)
        path.write_bytes(body)

    def files(self, relation: str) -> list[str]:
        return list(self._files[relation])

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _scan(con: Any, staging: Staging, relation: str) -> str:
    """A view of ``relation``'s staged rows, every column as text (an empty view when none were staged)."""
    cols = _COLUMNS[relation]
    view = f"srv_{relation}_text"
    files = [f for f in staging.files(relation) if os.path.getsize(f)]
    if files:
        spec = "{" + ", ".join(f"{literal(c)}: 'VARCHAR'" for c in cols) + "}"
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM read_json({literal_list(files)}, "
                    f"format='newline_delimited', columns={spec}, maximum_object_size=16777216)")
    else:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT "
                    + ", ".join(f'NULL::VARCHAR AS "{c}"' for c in cols) + " WHERE false")
    return view


def _types(con: Any) -> dict[str, dict[str, str]]:
    """Each derived table's column types, from building them on no events (one definition of the types)."""
    build_tables(con, "(SELECT * FROM events WHERE false)")
    return {t: dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {t})").fetchall())
            for t in ("colls", "step_spans", "phase_sums", "mets")}


def _cast(expr: str, sql_type: str) -> str:
    """Text → ``sql_type``; a value that is not one becomes NULL (as ``json_transform`` makes it)."""
    if sql_type in ("BIGINT", "INTEGER", "HUGEINT", "DOUBLE"):
        return f"TRY_CAST(nullif({expr}, '') AS {sql_type})"
    if sql_type == "BOOLEAN":
        return f"TRY_CAST(nullif({expr}, '') AS BOOLEAN)"
    return f"nullif({expr}, '')"


def _select(types: Mapping[str, str], exprs: Mapping[str, str]) -> str:
    return ", ".join(f"{_cast(exprs[c], t) if c in exprs else f'NULL::{t}'} AS {c}" for c, t in types.items())


def _n(col: str) -> str:
    return f"coalesce(TRY_CAST(nullif({col}, '') AS BIGINT), 0)"


def _tables(con: Any, staging: Staging) -> dict[str, str]:
    """The staged rows as the derived tables' relations (``prebuilt`` for :func:`build_tables`)."""
    types = _types(con)
    steps, colls, mets = (_scan(con, staging, r) for r in ("step_rows", "coll_rows", "met_rows"))
    with_step = "nullif(step, '') IS NOT NULL"
    step_spans = {"rank": "rank", "step": "step", "node": "node", "t0": "t0", "t1": "t1",
                  "step_ns": f"CASE WHEN {_n('n_step_dur')} > 0 THEN step_ns END",
                  "span_id": "list_min(TRY_CAST(step_span_ids AS VARCHAR[]))"}
    phase_sums = {"rank": "rank", "step": "step", "phase_ns": f"CASE WHEN {_n('n_phase_dur')} > 0 THEN phase_ns END",
                  **{f"{p}_ns": f"CASE WHEN {_n(f'n_{p}')} > 0 THEN {p}_ns END" for p in _PHASES}}
    coll = {c: c for c in ("rank", "node", "step", "ts", "start", "dur", "span_id", "seq", "bytes", "error", "source")}
    coll |= {"op": "name", "grp": "coalesce(nullif(\"group\", ''), 'default')", "gsize": "group_size",
             "is_async": "coalesce(nullif(async, ''), 'false')"}
    met = {c: c for c in ("rank", "node", "step", "ts", "span_id", *METRICS)}
    for table, relation, exprs, where in (
        ("step_spans", steps, step_spans, f"{_n('n_step')} > 0 AND {with_step}"),
        ("phase_sums", steps, phase_sums, f"{_n('n_phase')} > 0 AND {with_step}"),
        ("colls", colls, coll, "true"),
        ("mets", mets, met, with_step),
    ):
        con.execute(f"CREATE TEMP TABLE srv_{table} AS SELECT {_select(types[table], exprs)} FROM {relation} "
                    f"WHERE {where}")
    _rank_standins(con, staging)
    return {t: f"srv_{t}" for t in ("colls", "step_spans", "phase_sums", "mets")}


def _rank_standins(con: Any, staging: Staging) -> None:
    """``ranks_source``: the fetched events plus, per rank, one row for each aggregate the ranks statement takes.

    A row of kind ``log`` from logger ``jobtrace.rollup`` counts for first/last time, step,
    world and trace ids only (jobtrace's own logs are not progress); one of kind ``metric``
    carries the latest progress; and the last span is the server's own row, its error kept
    so that a failed collective still is not progress.
    """
    # A reader may stage a rank's aggregates and its last span as separate rows: one row per rank.
    text = _scan(con, staging, "rank_rows")
    con.execute("CREATE TEMP TABLE srv_rank_rows AS SELECT rank, "
                + ", ".join(f"max({c}) AS {c}" for c in _COLUMNS["rank_rows"] if c != "rank")
                + f" FROM {text} GROUP BY rank")
    r = "srv_rank_rows"
    rank, node = "TRY_CAST(nullif(rank, '') AS INTEGER)", "nullif(node, '')"
    est = f"({_n('n_est')} = {_n('n')} AND {_n('n')} > 0)"
    traces = "TRY_CAST(traces AS VARCHAR[])"

    def ns(col: str) -> str:
        return f"TRY_CAST(nullif({col}, '') AS BIGINT)"

    common = f"{rank} AS rank, {node} AS node, TRY_CAST(nullif(world, '') AS INTEGER) AS world, {est} AS rank_est"
    con.execute(f"""CREATE TEMP TABLE srv_rank_standins AS
        SELECT {common}, 'log' AS kind, 'jobtrace.rollup' AS logger, {ns('last_ts')} AS ts,
               {ns('last_step')} AS step, list_min({traces}) AS trace_id FROM {r} WHERE {ns('last_ts')} IS NOT NULL
        UNION ALL BY NAME SELECT {common}, 'log' AS kind, 'jobtrace.rollup' AS logger, {ns('first_ts')} AS ts,
               list_max({traces}) AS trace_id FROM {r} WHERE {ns('first_ts')} IS NOT NULL
        UNION ALL BY NAME SELECT {common}, 'metric' AS kind, {ns('progress_ts')} AS ts
               FROM {r} WHERE {ns('progress_ts')} IS NOT NULL
        UNION ALL BY NAME SELECT {common}, 'span' AS kind, {ns('ls_ts')} AS ts, {ns('ls_dur')} AS dur,
               nullif(ls_name, '') AS name, nullif(ls_cat, '') AS cat, nullif(ls_span_id, '') AS span_id,
               {ns('ls_step')} AS step,
               CASE WHEN nullif(ls_error, '') IS NOT NULL THEN to_json({{'error': ls_error}}) END AS attrs
               FROM {r} WHERE {ns('ls_ts')} IS NOT NULL""")
    con.execute("CREATE TEMP VIEW ranks_source AS SELECT * FROM events UNION ALL BY NAME SELECT * FROM srv_rank_standins")


def load_aggregated(job_id: str, events: Iterable[Mapping[str, Any]], staging: Staging, source: str,
                    stats: ReadStats, total_events: int) -> JobData:
    """A :class:`JobData` whose derived tables come from ``staging`` and whose ``events`` are the ones fetched.

    ``total_events`` is the job's size on the server (what the report says it read).
    """
    return with_aggregates(load_events(job_id, events, source, stats, empty_ok=True), staging, total_events)


def with_aggregates(job: JobData, staging: Staging, total_events: int) -> JobData:
    """``job`` (the events fetched whole, loaded) given the derived tables staged by its server."""
    try:
        job.prebuilt = _tables(job.con, staging)
    finally:
        staging.close()  # DuckDB has copied every staged row into the tables above
    job.sources = {"ranks": "ranks_source"}
    fetched = job.stats.events
    job.stats.events = job.stats.lines = total_events
    job.stats.fetched_events = fetched
    job.source = (f"{job.source} (spans and metrics summed on the server; {fetched:,} of {total_events:,} events "
                  "read whole)")
    return job
