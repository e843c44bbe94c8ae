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
import os
from dataclasses import dataclass, field
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


def _columns_sql() -> str:
    return "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
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


def load_local(data_dir: str | os.PathLike[str], job_id: str, *, verify: bool = True) -> JobData:
    """Load a job from the embedded store; torn and corrupt lines are skipped and counted."""
    directory = job_dir(data_dir, job_id)
    paths = sorted(glob.glob(str(directory / "*.jsonl")))
    if not paths:
        known = list_local_jobs(data_dir)
        hint = f"; jobs in {data_dir}: {', '.join(known[:10])}" if known else f"; {data_dir} holds no jobs"
        raise JobNotFound(f"no events for job {job_id!r} in {directory}{hint}")
    con = _connect()
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
    return JobData(job_id, con, stats, f"local:{directory}")


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
