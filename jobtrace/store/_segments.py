"""Columnar segments: each rank turns its own JSON-lines file into Parquet when it exits cleanly.

Why the rank does it, and not ``trace-job``:

* Parsing JSON and deriving per-step tables is most of the cost of reading a job (a
  1,024-rank job is ~2.7 GB of lines). Done by each rank at exit it costs tens of
  milliseconds of that rank's time, in parallel over every node, instead of half a
  minute in the one process that reads the whole job.
* A rank writes two things: its *segment* (its events, typed) and its *rollup* (its
  rows of the derived tables ``colls``, ``steps`` and ``mets``, see :mod:`._tables`;
  each of those rows depends on one rank's events only). The reader then scans the
  segments for the checks that need events and appends the rollups instead of
  deriving those ranks again.
* The JSON-lines file stays the durable record (crash-safe, greppable, what the
  shippers send). A segment names the byte length and mtime of the file it was made
  from (``<file>.<bytes>-<mtime ns>.parquet``), so a reader uses it only while the file
  is unchanged and falls back to the lines otherwise (a copy that did not keep mtimes
  only costs speed). If the JSON file is later removed (short raw retention), the
  segment alone still serves. Rollup names carry :data:`ROLLUP_KEY`, a hash of the
  derived tables' SQL, so another version's rollups are ignored, not misread.
* A segment is written only when every line parsed (no torn or invalid line), so a
  reader can take ``lines == events`` from it and its accounting stays exact.

Everything here is best effort: a segment that cannot be written is simply absent.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import orjson

from jobtrace.events import COLUMNS

from ._layout import SEGMENT_RE
from ._sql import literal, literal_list
from ._tables import DERIVED, ROLLUP_KEY, build_tables

_JSON_COLUMNS = ("attrs", "metrics")
"""Columns a segment keeps as JSON text, turned back into objects when lines are rebuilt."""

_MEMORY_LIMIT = "256MB"
"""DuckDB's memory while it writes a segment: an exiting rank or an ingest stays this small, spilling past it."""

__all__ = ["compact", "count_lines", "json_scan_sql", "orphan_segments", "refresh_rollup", "rollup_paths", "segment_for",
           "segment_lines"]


def json_scan_sql(files: str = "?") -> str:
    """DuckDB's scan of canonical JSON lines, schema fixed; ``files``: SQL for the file list (default: a parameter).

    A fixed schema makes every reader agree on types whatever keys a file happens to
    contain; invalid lines become NULL rows, which callers drop and count.
    """
    cols = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"
    return (f"read_json({files}, format='newline_delimited', columns={cols}, ignore_errors=true, "
            f"maximum_object_size=16777216)")


def _segment_name(name: str, st: os.stat_result) -> str:
    return f"{name}.{st.st_size}-{st.st_mtime_ns}.parquet"


def segment_for(path: Path) -> Path | None:
    """The segment that still matches ``path``'s current length and mtime, if there is one."""
    try:
        st = path.stat()
    except OSError:
        return None
    seg = path.with_name(_segment_name(path.name, st))
    return seg if seg.exists() else None


def orphan_segments(directory: Path, names: set[str]) -> dict[str, Path]:
    """Segments whose JSON-lines file (not in ``names``) is gone: raw lines pruned, the segment stands alone.

    Keyed by the pruned file's name. A file rewritten before it was pruned left several
    segments; the last one sorted (the newest length and mtime) stands for it.
    """
    orphans: dict[str, Path] = {}
    for seg in sorted(directory.glob("*.jsonl.*.parquet")):
        m = SEGMENT_RE.match(seg.name)
        if m and m["source"] not in names:
            orphans[m["source"]] = seg
    return orphans


def rollup_paths(segment: Path) -> dict[str, Path]:
    """Where the rollup of ``segment`` lives, one file per derived table."""
    stem = segment.name[: -len(".parquet")]
    return {t: segment.with_name(f"{stem}.{t}-{ROLLUP_KEY}.parquet") for t in DERIVED}


def count_lines(path: str | os.PathLike[str]) -> tuple[int, bool]:
    """Complete lines, and whether the file ends in a torn line."""
    lines = 0
    tail = b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            lines += chunk.count(b"\n")
            tail = chunk[-1:]
    return lines, tail != b"\n"


def compact(path: str | os.PathLike[str]) -> Path | None:
    """Write the segment and rollup of one rank's JSON-lines file; ``None`` when they were not written.

    Streamed, in bounded memory whatever the file's size: the lines go straight from the
    JSON scan into the segment file (never a table in memory), the rollup is derived from
    that file, and DuckDB may spill to a temporary directory past :data:`_MEMORY_LIMIT`.
    The segment is renamed into place last: readers key off it.
    """
    src = Path(path)
    tmp: Path | None = None
    try:
        before = src.stat()
        if before.st_size == 0:
            return None
        lines, torn = count_lines(src)
        if torn:
            return None
        import duckdb  # only now: a rank that never exits cleanly never pays for the import

        seg = src.with_name(_segment_name(src.name, before))
        tmp = seg.with_name(seg.name + ".tmp")
        con = duckdb.connect(":memory:")
        con.execute("SET threads = 1")  # the node's cores belong to the other ranks still training
        con.execute(f"SET memory_limit = '{_MEMORY_LIMIT}'")
        con.execute(f"SET temp_directory = {literal(Path(tempfile.gettempdir()) / f'jobtrace-duckdb-{os.getpid()}')}")
        con.execute(f"COPY (SELECT * FROM {json_scan_sql(literal_list([src]))} WHERE kind IS NOT NULL AND ts IS NOT NULL) "
                    f"TO {literal(tmp)} (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 32768)")
        con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({literal(tmp)})")
        events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
        if events != lines or _segment_name(src.name, src.stat()) != _segment_name(src.name, before):
            con.close()
            return None  # an invalid line (its accounting needs the raw read) or the file changed meanwhile
        build_tables(con)
        _write_tables(con, rollup_paths(seg), f"{glob.escape(src.name)}.*.parquet", last=(tmp, seg))
        tmp = None
        return seg
    except Exception:  # noqa: BLE001 - a missing segment only costs the reader time
        return None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _write_tables(con: Any, outputs: Mapping[str, Path], stale: str, last: tuple[Path, Path] | None = None) -> None:
    """Write each table to its file (atomically, in order), then rename ``last`` (a file already
    written, to its final name), close ``con``, and delete the files matching the glob ``stale``
    (next to the outputs) that were not just written."""
    for table, out in outputs.items():
        tmp = out.with_name(out.name + ".tmp")
        con.execute(f"COPY {table} TO {literal(tmp)} (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 32768)")
        os.replace(tmp, out)
    keep = set(outputs.values())
    if last is not None:
        os.replace(*last)
        keep.add(last[1])
    con.close()
    for old in next(iter(keep)).parent.glob(stale):
        if old not in keep:
            old.unlink(missing_ok=True)


def refresh_rollup(segment: str | os.PathLike[str]) -> bool:
    """Write the rollup of a segment whose rollup is missing or from another version.

    The segment holds the rank's events, so its raw lines are not needed: a store whose
    raw logs were pruned can still be brought up to this version's derived tables
    (otherwise every read derives those ranks' rows from their events).
    """
    seg = Path(segment)
    try:
        import duckdb

        con = duckdb.connect(":memory:")
        con.execute("SET threads = 1")
        con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({literal(seg)})")
        build_tables(con)
        stem = seg.name[: -len(".parquet")]
        _write_tables(con, rollup_paths(seg), f"{glob.escape(stem)}.*-*.parquet")  # and drop other versions' rollups
        return True
    except Exception:  # noqa: BLE001 - the reader derives what is missing
        return False


def segment_lines(path: str | os.PathLike[str], batch: int = 20_000) -> Generator[list[bytes], None, None]:
    """Canonical lines rebuilt from a segment's typed columns (NULL columns are absent keys), in batches.

    Every canonical key has its own typed column, so a rank whose JSON lines were pruned
    (short raw retention) can still be sent or read as lines.
    """
    import duckdb

    from jobtrace.events import encode_lines

    con = duckdb.connect()
    try:
        cur = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
        names = [d[0] for d in cur.description]
        while rows := cur.fetchmany(batch):
            dicts = []
            for row in rows:
                d = {k: v for k, v in zip(names, row) if v is not None}
                for k in _JSON_COLUMNS:
                    if isinstance(d.get(k), str):
                        d[k] = orjson.loads(d[k])
                dicts.append(d)
            yield encode_lines(dicts)
    finally:
        con.close()
