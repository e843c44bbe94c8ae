"""Where a job recorded no collective, find the phase in which its ranks wait for each other.

A job traced by another library (NVIDIA NeMo Lens spans, Megatron's timers turned into phases) may
carry steps and phases but no collective: its gradient all-reduce is hidden inside a phase such as
``optimizer``. Without it, every rank's step is all "compute", a slow rank holds the others back
unseen, and the straggler check has nothing to compare. A phase that contains a rendezvous betrays
itself: across ranks its **ends** line up (everyone leaves together) while its **starts** spread (the
slow rank arrives last). Such a phase is taken as the step's collective, grouped as
``phase:<name>`` and numbered by step, so that late arrival, the communication share and the compute
comparison work on it as on a recorded collective; the report says which phases it took.

Only when the job has no collective records at all (recorded ones always win), and only on measured
times: phases that ``jobtrace ingest`` laid out from a log line's durations (their step span says
``source: log``) have starts it computed, and the phase split of ``_straggler`` reads those instead. The test is per step,
on the ranks' own clocks (offsets between nodes larger than the start spread hide it, and then
nothing is inferred): in at least three steps the starts spread by more than 1 ms, and in 80 % of
those the ends spread by less than a quarter of the starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._model import rows

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["infer_sync_phases"]

MIN_SPREAD_NS: Final = 1_000_000
MIN_STEPS: Final = 3
SHARE: Final = 0.8
ALIGNED: Final = 4  # ends spread at most a quarter of the starts


def infer_sync_phases(con: DuckDBPyConnection) -> list[str]:
    """Phases taken as the steps' collectives (added to ``colls``, moved out of compute in ``steps``)."""
    if con.execute("SELECT count(*) FROM colls").fetchone()[0]:  # type: ignore[index]
        return []
    laid_out = con.execute("""SELECT count(*) FROM events WHERE kind = 'span' AND cat = 'step'
                              AND json_extract_string(attrs, '$.source') = 'log'""").fetchone()[0]  # type: ignore[index]
    if laid_out:  # phases from logged durations: their starts were laid out by ingest, not measured
        return []
    found = rows(
        con,
        f"""
        WITH p AS (SELECT rank, step, name, ts, start FROM events
                   WHERE kind = 'span' AND cat = 'phase' AND step IS NOT NULL AND start IS NOT NULL),
        nr AS (SELECT count(DISTINCT rank) AS n FROM p),
        g AS (SELECT name, step, count(DISTINCT rank) AS c, count(*) AS k,
                     max(ts) - min(ts) AS ends, max(start) - min(start) AS starts
              FROM p GROUP BY name, step)
        SELECT name, count(*) FILTER (WHERE starts > {MIN_SPREAD_NS}) AS spread,
               count(*) FILTER (WHERE starts > {MIN_SPREAD_NS} AND ends * {ALIGNED} < starts) AS aligned
        FROM g, nr WHERE nr.n >= 2 AND g.c = nr.n AND g.k = nr.n GROUP BY name ORDER BY name
        """,
    )
    names = [r["name"] for r in found if r["spread"] >= MIN_STEPS and r["aligned"] >= SHARE * r["spread"]]
    if not names:
        return []
    con.execute(
        """
        INSERT INTO colls BY NAME
        SELECT rank, node, step, ts, start, dur, span_id, name AS op, 'phase:' || name AS grp,
               CAST(step AS BIGINT) AS seq, CAST(NULL AS BIGINT) AS bytes,
               (SELECT count(DISTINCT rank) FROM events WHERE kind = 'span' AND cat = 'phase') AS gsize,
               false AS is_async, CAST(NULL AS VARCHAR) AS error, 'phase' AS source
        FROM events WHERE kind = 'span' AND cat = 'phase' AND step IS NOT NULL AND name IN (SELECT unnest(?))
        """,
        [names],
    )
    con.execute(
        """
        UPDATE steps SET coll_ns = c.ns, compute_ns = greatest(steps.step_ns - c.ns - steps.data_ns, 0)
        FROM (SELECT rank, step, sum(dur) AS ns FROM colls GROUP BY rank, step) c
        WHERE steps.rank = c.rank AND steps.step = c.step
        """
    )
    return names
