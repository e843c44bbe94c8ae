"""Reading a job's events into DuckDB, from the embedded store or from any backend.

Every backend ends in the same place: a DuckDB table ``events`` with the canonical
columns (see :data:`COLUMNS`). The analysis only ever queries that table, so the
same verdict comes out whichever store the events came from.

DuckDB was chosen over Polars for the columnar engine because it reads
newline-delimited JSON from thousands of files in one parallel scan with an explicit
schema, and the analysis is naturally SQL (window functions, medians per group).
"""

from __future__ import annotations

import glob
import hashlib
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import duckdb
import orjson

from jobtrace.errors import JobNotFound, QueryError
from shippers._local import job_dir

__all__ = ["COLUMNS", "JobData", "ReadStats", "load_local", "load_events", "list_local_jobs"]

COLUMNS: dict[str, str] = {
    "ts": "BIGINT",
    "kind": "VARCHAR",
    "job": "VARCHAR",
    "trace_id": "VARCHAR",
    "rank": "INTEGER",
    "local_rank": "INTEGER",
    "world": "INTEGER",
    "node": "VARCHAR",
    "pid": "BIGINT",
    "span_id": "VARCHAR",
    "parent_id": "VARCHAR",
    "step": "BIGINT",
    "level": "VARCHAR",
    "logger": "VARCHAR",
    "msg": "VARCHAR",
    "exc": "VARCHAR",
    "name": "VARCHAR",
    "cat": "VARCHAR",
    "start": "BIGINT",
    "dur": "BIGINT",
    "attrs": "JSON",
    "metrics": "JSON",
    "est": "BOOLEAN",
    "v": "INTEGER",
}


@dataclass
class ReadStats:
    """What reading found besides events: evidence that nothing was silently skipped."""

    files: int = 0
    lines: int = 0
    events: int = 0
    torn_lines: int = 0
    corrupt_lines: int = 0
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass
class JobData:
    """A DuckDB connection holding one job's ``events`` table, and how it was read."""

    job_id: str
    con: duckdb.DuckDBPyConnection
    stats: ReadStats
    source: str

    def writable(self) -> None:
        """Turn ``events`` into a table if it is a read-only view over the Parquet cache."""
        kind = self.con.execute(
            "SELECT table_type FROM information_schema.tables WHERE table_name = 'events'").fetchone()
        if kind and kind[0] == "VIEW":
            self.con.execute("CREATE TABLE events_copy AS SELECT * FROM events")
            self.con.execute("DROP VIEW events")
            self.con.execute("ALTER TABLE events_copy RENAME TO events")


def _columns_sql() -> str:
    return "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    # Large jobs: let DuckDB spill to disk instead of needing the whole job in memory.
    con.execute("SET preserve_insertion_order = false")
    limit = os.environ.get("JOBTRACE_MEMORY_LIMIT")
    if limit:
        con.execute(f"SET memory_limit = '{_sql_str(limit)}'")
    threads = os.environ.get("JOBTRACE_THREADS")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def list_local_jobs(data_dir: str | os.PathLike[str]) -> list[str]:
    root = Path(data_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.jsonl")))


def _count_lines(paths: Iterable[str]) -> tuple[int, int]:
    """Complete lines and torn tails (a last line without newline: a crash mid-write)."""
    lines = torn = 0
    for path in paths:
        with open(path, "rb") as fh:
            tail = b"\n"
            while chunk := fh.read(1 << 22):
                lines += chunk.count(b"\n")
                tail = chunk[-1:]
            if tail != b"\n":
                torn += 1
    return lines, torn


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
    settle_s = float(os.environ.get("JOBTRACE_CACHE_SETTLED_S", _SETTLED_S))
    return h.hexdigest()[:16], (time.time_ns() - newest) / 1e9 > settle_s


def load_local(data_dir: str | os.PathLike[str], job_id: str, *, verify: bool = True, cache: bool = True) -> JobData:
    """Load a job from the embedded store; torn and corrupt lines are skipped and counted.

    The first read of a finished job parses its JSON lines (the crash-safe format ranks
    write) and keeps a zstd Parquet copy in ``<job>/.cache/``; later reads query that
    copy in place, so ``trace-job`` on a 1,000-rank job is fast the second time and the
    events never have to fit in memory. The cache is keyed by every file's size and
    mtime, so any new line invalidates it; a running job is never cached.
    """
    directory = job_dir(data_dir, job_id)
    paths = sorted(glob.glob(str(directory / "*.jsonl")))
    if not paths:
        known = list_local_jobs(data_dir)
        hint = f"; jobs in {data_dir}: {', '.join(known[:10])}" if known else f"; {data_dir} holds no jobs"
        raise JobNotFound(f"no events for job {job_id!r} in {directory}{hint}")
    con = _connect()
    sig, settled = _signature(paths)
    cached = directory / ".cache" / f"events-{sig}.parquet"
    stats_file = cached.with_suffix(".stats.json")
    if cache and cached.exists() and stats_file.exists():
        try:
            con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{_sql_str(cached)}')")
            stats = ReadStats(**orjson.loads(stats_file.read_bytes()))
            return JobData(job_id, con, stats, f"local:{directory}")
        except (duckdb.Error, orjson.JSONDecodeError, TypeError):
            con = _connect()  # a damaged cache: read the JSON again
    try:
        con.execute(
            f"""CREATE TABLE events AS SELECT * FROM read_json(?, format='newline_delimited',
                columns={_columns_sql()}, ignore_errors=true, maximum_object_size=16777216)
                WHERE kind IS NOT NULL AND ts IS NOT NULL""",
            [paths],
        )
    except duckdb.Error as exc:
        raise QueryError(f"cannot read the store at {directory}: {exc}") from exc
    stats = ReadStats(files=len(paths))
    stats.events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    if verify:
        stats.lines, stats.torn_lines = _count_lines(paths)
        stats.corrupt_lines = max(0, stats.lines - stats.events)
        if stats.torn_lines:
            stats.skipped["torn last line (crash mid-write)"] = stats.torn_lines
        if stats.corrupt_lines:
            stats.skipped["not a valid event"] = stats.corrupt_lines
    if cache and settled:
        _write_cache(con, cached, stats_file, stats)
    return JobData(job_id, con, stats, f"local:{directory}")


def _sql_str(path: os.PathLike[str] | str) -> str:
    return str(path).replace("'", "''")


def _write_cache(con: duckdb.DuckDBPyConnection, cached: Path, stats_file: Path, stats: ReadStats) -> None:
    """Best effort: a read-only store simply goes without a cache."""
    try:
        cached.parent.mkdir(exist_ok=True)
        for old in cached.parent.glob("events-*"):
            old.unlink(missing_ok=True)
        tmp = cached.with_suffix(".tmp")
        con.execute(f"COPY events TO '{_sql_str(tmp)}' (FORMAT parquet, COMPRESSION zstd)")
        os.replace(tmp, cached)
        stats_file.write_bytes(orjson.dumps(asdict(stats)))
    except (OSError, duckdb.Error):
        pass


def load_events(job_id: str, events: Iterable[Mapping[str, Any]], source: str, stats: ReadStats | None = None) -> JobData:
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
        if n == 0:
            raise JobNotFound(f"no events for job {job_id!r} in {source}")
        con.execute(
            f"""CREATE TABLE events AS SELECT * FROM read_json(?, format='newline_delimited',
                columns={_columns_sql()}, ignore_errors=true) WHERE kind IS NOT NULL AND ts IS NOT NULL""",
            [path],
        )
    finally:
        os.unlink(path)
    stats.events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    stats.lines = stats.lines or n
    if n > stats.events:
        stats.skipped["not a valid event"] = stats.skipped.get("not a valid event", 0) + n - stats.events
    return JobData(job_id, con, stats, source)
