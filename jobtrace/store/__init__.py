"""The store layer: how a job's events lie on disk, for the side that writes and the side that reads.

Below both the shippers (``shippers.LocalStoreSink`` writes a rank's lines and, at exit,
its segment) and the queries (``queries.load_local`` reads them), so that neither has to
know the other:

* :mod:`._layout`: the job directory, file names, cache, spool and golden directories;
* :mod:`._segments`: a rank's Parquet segment and rollup, written at exit, and lines
  rebuilt from a segment;
* :mod:`._tables`: the derived tables' SQL (``colls``, ``steps``, ``mets``, ``ranks``)
  that rollups hold and every reader builds;
* :mod:`._packs`: a rank's rollup as records for a log server (its *pack*), and back;
* :mod:`._files`: which files stand for which rank;
* :mod:`._ledger`: which source files an ingest read into the job, how far, and whether it finished;
* :mod:`._prune`: raw-line retention (``jobtrace prune``): lines whose segment stands for them go;
* :mod:`._archive`: a job's store in object storage (``jobtrace archive``) and back;
* :mod:`._sql`: SQL literals for the statements DuckDB takes no parameters in.

DuckDB is imported only when a segment is written or read, never at import.
"""

from __future__ import annotations

from ._archive import ArchiveReport, archive_job, parse_s3_url, restore_job
from ._files import JobFiles, job_files
from ._layout import (
    DEFAULT_DATA_DIR,
    RANK_IN_NAME,
    SEGMENT_RE,
    cache_dir,
    golden_dir,
    job_dir,
    list_jobs,
    newest_write_ns,
    process_file_name,
    safe_name,
    spool_root,
)
from ._ledger import LEDGER_NAME, Fingerprint, IngestLedger, SourceRecord, fingerprint, ingest_caveats
from ._packs import PACK_KIND, PACK_TABLES, PART_BYTES, Packs, pack_lines, pack_records, unpack
from ._prune import PruneReport, prune
from ._segments import (
    compact,
    count_lines,
    json_scan_sql,
    orphan_segments,
    refresh_rollup,
    rollup_paths,
    segment_for,
    segment_lines,
)
from ._sql import literal, literal_list
from ._tables import DERIVED, METRICS, ROLLUP_KEY, build_tables

__all__ = [
    "ArchiveReport",
    "DEFAULT_DATA_DIR",
    "DERIVED",
    "Fingerprint",
    "IngestLedger",
    "JobFiles",
    "LEDGER_NAME",
    "METRICS",
    "PACK_KIND",
    "PACK_TABLES",
    "PART_BYTES",
    "Packs",
    "PruneReport",
    "RANK_IN_NAME",
    "ROLLUP_KEY",
    "SourceRecord",
    "SEGMENT_RE",
    "archive_job",
    "build_tables",
    "cache_dir",
    "compact",
    "fingerprint",
    "count_lines",
    "golden_dir",
    "ingest_caveats",
    "job_dir",
    "job_files",
    "json_scan_sql",
    "list_jobs",
    "literal",
    "literal_list",
    "newest_write_ns",
    "orphan_segments",
    "pack_lines",
    "pack_records",
    "process_file_name",
    "parse_s3_url",
    "prune",
    "refresh_rollup",
    "restore_job",
    "rollup_paths",
    "safe_name",
    "segment_for",
    "segment_lines",
    "spool_root",
    "unpack",
]
