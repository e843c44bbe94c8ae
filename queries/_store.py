"""Reading a job's events into DuckDB, from the embedded store or from any backend.

Every backend ends in the same place: a DuckDB table ``events`` with the canonical
columns (see :data:`COLUMNS`). The analysis only ever queries that table, so the
same verdict comes out whichever store the events came from.

DuckDB was chosen over Polars for the columnar engine because it reads
newline-delimited JSON from thousands of files in one parallel scan with an explicit
schema, and the analysis is naturally SQL (window functions, medians per group).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from jobtrace import config
from jobtrace.errors import JobNotFound, QueryError
from jobtrace.events import COLUMNS
from jobtrace.store import (
    build_tables,
    cache_dir,
    count_lines,
    job_dir,
    job_files,
    json_scan_sql,
    list_jobs,
    literal,
    literal_list,
)

__all__ = ["COLUMNS", "JobData", "ReadStats", "load_local", "load_events", "list_local_jobs"]



@dataclass
class ReadStats:
    """What reading found besides events: evidence that nothing was silently skipped."""

    files: int = 0
    lines: int = 0
    events: int = 0
    torn_lines: int = 0
    corrupt_lines: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    fetched_events: int | None = None
    """Where a server aggregated the job: the events fetched whole (the others were read as per-step rows)."""


@dataclass
class JobData:
    """A DuckDB connection holding one job's ``events`` table, and how it was read."""

    job_id: str
    con: duckdb.DuckDBPyConnection
    stats: ReadStats
    source: str
    derive_from: str = "events"
    """The relation the derived tables are built from: ranks whose rollup is not in :attr:`rollups`."""
    rollups: dict[str, list[str]] = field(default_factory=dict)
    """Per derived table, the rollup files that ranks wrote at exit (see :mod:`._segments`)."""
    prebuilt: dict[str, str] = field(default_factory=dict)
    """Per derived table, a relation a log server already aggregated its rows into (see :mod:`._server_tables`);
    ``events`` then holds only the events the checks read directly."""
    sources: dict[str, str] = field(default_factory=dict)
    """Per derived table, another relation than :attr:`derive_from` for its statement to read."""
    appended: dict[str, str] = field(default_factory=dict)
    """Per derived table, a relation of rows that ranks packed at exit (see :mod:`._packed`); ``events`` then
    holds, for those ranks, only the events the checks read directly."""

    def build_tables(self) -> None:
        """(Re)create the derived tables every check reads (see :func:`jobtrace.store.build_tables`)."""
        build_tables(self.con, self.derive_from, self.rollups, prebuilt=self.prebuilt, sources=self.sources,
                     appended=self.appended)

    def writable(self) -> None:
        """Turn ``events`` into a table (if it is a read-only view over Parquet) so events can be added.

        Added events may belong to any rank, so the ranks' rollups no longer tell the
        whole story: everything is derived from ``events`` from then on.
        """
        if self.prebuilt or self.appended:
            raise QueryError("this job was read as a server's aggregates; read it whole to add events to it")
        self.derive_from, self.rollups = "events", {}
        kind = self.con.execute(
            "SELECT table_type FROM information_schema.tables WHERE table_name = 'events'").fetchone()
        if kind and kind[0] == "VIEW":
            self.con.execute("CREATE TABLE events_copy AS SELECT * FROM events")
            self.con.execute("DROP VIEW events")
            self.con.execute("ALTER TABLE events_copy RENAME TO events")


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    # Large jobs: let DuckDB spill to disk instead of needing the whole job in memory.
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")  # a library must not draw on the user's terminal
    limit = config.get_str(config.MEMORY_LIMIT)
    if limit:
        con.execute(f"SET memory_limit = {literal(limit)}")
    threads = config.get_int(config.THREADS, minimum=1)
    if threads:
        con.execute(f"SET threads = {threads}")
    return con


def list_local_jobs(data_dir: str | os.PathLike[str]) -> list[str]:
    """The jobs in the embedded store at ``data_dir``."""
    return list_jobs(data_dir)


_SETTLED_S = 60.0
"""A job whose files have not changed for this long is treated as finished and gets a columnar cache."""


def _signature(paths: list[str]) -> tuple[str, bool]:
    """A hash of the store's files (name, size, mtime) and whether they have settled."""
    h = hashlib.sha256()
    newest = 0
    for path in paths:
        st = os.stat(path)
        newest = max(newest, st.st_mtime_ns)
        h.update(f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns};".encode())
    settle_s = config.get_float(config.CACHE_SETTLED_S, default=_SETTLED_S, minimum=0.0) or 0.0
    return h.hexdigest()[:16], (time.time_ns() - newest) / 1e9 > settle_s


def load_local(data_dir: str | os.PathLike[str], job_id: str, *, verify: bool = True, cache: bool = True) -> JobData:
    """Load a job from the embedded store; torn and corrupt lines are skipped and counted.

    Each rank that exited cleanly left a Parquet segment of its lines (see
    :mod:`jobtrace.store`); those are queried in place, and only the other ranks'
    JSON lines (a crashed or killed rank, a job still running) are parsed. The first
    read of a finished job that needed parsing keeps a zstd Parquet copy of the whole
    job in ``<job>/.cache/``, so ``trace-job`` on a 1,000-rank job is fast the second
    time and the events never have to fit in memory. The cache is keyed by every
    file's size and mtime, so any new line invalidates it; a running job is never cached.
    """
    directory = job_dir(data_dir, job_id)
    files = job_files(directory)
    if not files.lines and not files.segments:
        known = list_local_jobs(data_dir)
        hint = f"; jobs in {data_dir}: {', '.join(known[:10])}" if known else f"; {data_dir} holds no jobs"
        raise JobNotFound(f"no events for job {job_id!r} in {directory}{hint}")
    con = _connect()
    sig, settled = _signature(files.all)
    cached = cache_dir(directory) / f"events-{sig}.parquet"
    stats_file = cached.with_suffix(".stats.json")
    if cache and files.lines and cached.exists() and stats_file.exists():
        try:
            con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({literal(cached)})")
            stats = ReadStats(**orjson.loads(stats_file.read_bytes()))
            return JobData(job_id, con, stats, f"local:{directory}")
        except (duckdb.Error, orjson.JSONDecodeError, TypeError):
            con = _connect()  # a damaged cache: read the JSON again
    try:
        if files.lines:
            con.execute(f"CREATE TABLE events_lines AS SELECT * FROM {json_scan_sql()} "
                        "WHERE kind IS NOT NULL AND ts IS NOT NULL", [files.lines])
        _union_view(con, "events", files.lines, files.segments)
        _union_view(con, "events_unrolled", files.lines, files.unrolled)
    except duckdb.Error as exc:
        raise QueryError(f"cannot read the store at {directory}: {exc}") from exc
    stats = ReadStats(files=len(files.lines) + len(files.segments))
    stats.events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    if verify:
        # A segment exists only for a file whose every line parsed: its lines are its events.
        line_events = con.execute("SELECT count(*) FROM events_lines").fetchone()[0] if files.lines else 0  # type: ignore[index]
        counts = [count_lines(p) for p in files.lines]
        lines, stats.torn_lines = sum(n for n, _ in counts), sum(torn for _, torn in counts)
        stats.lines = lines + stats.events - line_events
        stats.corrupt_lines = max(0, stats.lines - stats.events)
        if stats.torn_lines:
            stats.skipped["torn last line (crash mid-write)"] = stats.torn_lines
        if stats.corrupt_lines:
            stats.skipped["not a valid event"] = stats.corrupt_lines
    if cache and settled and files.lines:
        _write_cache(con, cached, stats_file, stats)
    return JobData(job_id, con, stats, f"local:{directory}", "events_unrolled", files.rollups)


def _union_view(con: duckdb.DuckDBPyConnection, name: str, lines: list[str], segments: list[str]) -> None:
    """``name`` = the parsed lines plus the segments given (an empty relation of the right shape if neither)."""
    parts = ["SELECT * FROM events_lines"] if lines else []
    if segments:
        parts.append(f"SELECT {', '.join(COLUMNS)} FROM read_parquet({literal_list(segments)})")
    if not parts:
        cols = ", ".join(f"NULL::{t} AS {k}" for k, t in COLUMNS.items())
        parts.append(f"SELECT {cols} WHERE false")
    con.execute(f"CREATE VIEW {name} AS " + " UNION ALL ".join(parts))


def _write_cache(con: duckdb.DuckDBPyConnection, cached: Path, stats_file: Path, stats: ReadStats) -> None:
    """Best effort: a read-only store simply goes without a cache."""
    try:
        cached.parent.mkdir(exist_ok=True)
        for old in cached.parent.glob("events-*"):
            old.unlink(missing_ok=True)
        tmp = cached.with_suffix(".tmp")
        con.execute(f"COPY events TO {literal(tmp)} (FORMAT parquet, COMPRESSION zstd)")
        os.replace(tmp, cached)
        stats_file.write_bytes(orjson.dumps(asdict(stats)))
    except (OSError, duckdb.Error):
        pass


def load_events(job_id: str, events: Iterable[Mapping[str, Any]], source: str, stats: ReadStats | None = None, *,
                empty_ok: bool = False) -> JobData:
    """Load canonical event dicts (from a log server) into the same ``events`` table.

    Rows are staged as JSON lines in a temporary file so DuckDB parses them with the
    same schema and the same rules as the embedded store, in bounded Python memory.
    """
    import tempfile

    con = _connect()
    stats = stats or ReadStats()
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as tmp:
        n = 0
        for ev in events:
            tmp.write(orjson.dumps(ev, option=orjson.OPT_APPEND_NEWLINE))
            n += 1
        path = tmp.name
    try:
        if n == 0 and not empty_ok:
            raise JobNotFound(f"no events for job {job_id!r} in {source}")
        con.execute(
            f"CREATE TABLE events AS SELECT * FROM {json_scan_sql()} WHERE kind IS NOT NULL AND ts IS NOT NULL",
            [path],
        )
    finally:
        os.unlink(path)
    stats.events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    stats.lines = stats.lines or n
    if n > stats.events:
        stats.skipped["not a valid event"] = stats.skipped.get("not a valid event", 0) + n - stats.events
    return JobData(job_id, con, stats, source)


def load_wrapped_events(job_id: str, files: list[str], field: str, source: str, stats: ReadStats,
                        lines: int | None = None) -> tuple[JobData, int]:
    """Load events whose canonical JSON is the text of ``field`` in each line of ``files`` (VictoriaLogs'
    ``_msg``), parsed by DuckDB: Python never holds one of them, so a million events cost seconds and
    little memory. Returns the job and the number of lines whose ``field`` held no event at all (a
    server that parsed the messages itself: the caller rebuilds those from the fields).

    Lines of another job are dropped and counted, as are events without a kind or a time. ``lines``
    (how many the files hold, where the caller counted them) spares a scan: only when some line did
    not become an event are the files read again, to say why.
    """
    con = _connect()
    structure = literal(orjson.dumps(dict(COLUMNS)).decode())
    if files:
        scan = (f"(SELECT \"{field}\" AS m FROM read_json({literal_list(files)}, format='newline_delimited', "
                f"columns={{{literal(field)}: 'VARCHAR'}}, ignore_errors=true, maximum_object_size=16777216))")
    else:
        scan = "(SELECT NULL::VARCHAR AS m WHERE false)"
    parsed = f"CASE WHEN json_valid(m) AND json_type(m) = 'OBJECT' THEN json_transform(m, {structure}) END"
    con.execute(f"CREATE TABLE events AS SELECT e.* FROM (SELECT {parsed} AS e FROM {scan}) "
                "WHERE e.kind IS NOT NULL AND e.ts IS NOT NULL AND e.job = ?", [job_id])
    stats.events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    if lines is None:
        lines = con.execute(f"SELECT count(*) FROM {scan}").fetchone()[0]  # type: ignore[index]
    stats.lines += lines
    unparsed = 0
    if lines != stats.events:
        unparsed, other = con.execute(
            f"SELECT count(*) FILTER (WHERE e IS NULL OR e.kind IS NULL), "
            f"count(*) FILTER (WHERE e.kind IS NOT NULL AND e.job IS DISTINCT FROM ?) "
            f"FROM (SELECT {parsed} AS e FROM {scan})", [job_id]).fetchone()  # type: ignore[misc]
        if other:
            stats.skipped["not a jobtrace event of this job"] = (
                stats.skipped.get("not a jobtrace event of this job", 0) + other)
        invalid = lines - unparsed - other - stats.events
        if invalid > 0:
            stats.skipped["not a valid event"] = stats.skipped.get("not a valid event", 0) + invalid
    return JobData(job_id, con, stats, source), unparsed
