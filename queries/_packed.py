"""A job read from a log server through the packs its ranks shipped at exit (docs/server-scale.md).

A rank that exited cleanly shipped its *pack* (:mod:`jobtrace.store._packs`): its rows of the
derived tables, and the few events the checks read directly. A server reader fetches the packs
(a few records per rank), then reads whole only the events of the ranks that left none (a killed
rank, a running job) and of ranks whose pack does not stand for all their events on the server
(:func:`unpacked_ranks`). :func:`with_packs` then joins the two: the packed ranks' rows are
appended to the tables derived from the other ranks' events (:attr:`JobData.appended`), exactly
as the embedded store appends the rollups of its ranks, and ``analyze()`` runs unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobtrace.store import DERIVED, Packs, literal_list

from ._store import JobData

__all__ = ["unpacked_ranks", "with_packs"]


def unpacked_ranks(packs: Packs, counts: Mapping[int, int]) -> list[int]:
    """The ranks (of ``counts``: the server's events per rank) to read from their events.

    A rank with no pack, or with more events on the server than its pack stands for: another
    life of a restarted rank that left no pack (its crash is evidence), or lines a server stored
    twice. A rank with fewer events on the server than its pack keeps the pack: lines lost on the
    way are still in it.
    """
    return sorted(r for r, n in counts.items() if r not in packs.events or n > packs.events[r])


def with_packs(job: JobData, packs: Packs, total_events: int) -> JobData:
    """``job`` (the events read whole: those of the ranks without a usable pack) joined with ``packs``.

    Consumes ``packs``: their files are copied into DuckDB, then removed. ``total_events`` is the
    job's size on the server, what the report says it read.
    """
    con = job.con
    try:
        used = sorted(packs.ranks)
        con.execute("CREATE TEMP TABLE packed_ranks AS SELECT unnest(?::INTEGER[]) AS rank", [used])
        # Events of a rank read whole too (more on the server than in its pack) stay the read ones.
        con.execute("DELETE FROM packed_ranks WHERE rank IN (SELECT DISTINCT rank FROM events WHERE rank IS NOT NULL)")
        kept = "(SELECT rank FROM packed_ranks)"
        if packs.tables.get("events"):
            con.execute(f"INSERT INTO events BY NAME SELECT * FROM read_parquet({literal_list(packs.tables['events'])}, "
                        f"union_by_name = true) WHERE rank IN {kept}")
        for table in DERIVED:
            files = packs.tables.get(table)
            if files:
                con.execute(f"CREATE TEMP TABLE pack_{table} AS SELECT * FROM read_parquet({literal_list(files)}) "
                            f"WHERE rank IN {kept}")
                job.appended[table] = f"pack_{table}"
        n_packed = con.execute("SELECT count(*) FROM packed_ranks").fetchone()[0]  # type: ignore[index]
    finally:
        packs.close()
    con.execute(f"CREATE VIEW events_unpacked AS SELECT * FROM events WHERE rank IS NULL OR rank NOT IN {kept}")
    job.derive_from = "events_unpacked"
    job.sources["scaling"] = "events"  # packs hold the fp16 loss-scale metrics themselves, not their rows
    fetched = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    job.stats.events = job.stats.lines = total_events
    job.stats.fetched_events = fetched
    job.source = (f"{job.source} ({n_packed:,} ranks read from the rollups they shipped at exit; {fetched:,} of "
                  f"{total_events:,} events read whole)")
    return job
