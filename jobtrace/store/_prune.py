"""Raw-line retention for the embedded store: ``jobtrace prune --older-than 7d``.

A job's JSON-lines files are its raw record; its Parquet segments and rollups hold the same events,
typed, and are all ``trace-job`` reads once the lines are gone (:func:`._segments.orphan_segments`).
Pruning a job that has been quiet longer than the cut-off deletes each lines file whose segment matches
it, after writing the segment where a rank died before writing its own; a file that cannot become a
segment (a torn or invalid line) is kept, and said. The derived cache goes too (it is rebuilt). The
spool of lines not yet shipped to a server, Flight Recorder dumps, the ingest ledger and golden runs
are never touched: they are not copies of anything.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

from ._layout import cache_dir, job_dir, list_jobs, newest_write_ns
from ._segments import compact, segment_for

__all__ = ["PruneReport", "prune"]


@dataclass
class PruneReport:
    """What :func:`prune` did (or, with ``dry_run``, would do)."""

    jobs: list[str] = field(default_factory=list)
    """Jobs quiet longer than the cut-off, whose raw lines were pruned."""
    files_removed: int = 0
    bytes_freed: int = 0
    segments_written: int = 0
    """Segments written for ranks that had none (killed, hung), so that their lines could go."""
    kept: list[str] = field(default_factory=list)
    """Lines files kept because no segment can stand for them (a torn or invalid line)."""
    skipped_recent: int = 0


def prune(data_dir: str | os.PathLike[str], older_than_s: float, *, dry_run: bool = False,
          now_ns: int | None = None) -> PruneReport:
    """Prune the raw lines of every job in ``data_dir`` whose newest file is older than ``older_than_s``."""
    report = PruneReport()
    cutoff = (now_ns or time.time_ns()) - int(older_than_s * 1e9)
    for job in list_jobs(data_dir):
        directory = job_dir(data_dir, job)
        if newest_write_ns(directory) >= cutoff:
            report.skipped_recent += 1
            continue
        pruned = False
        for lines in sorted(directory.glob("*.jsonl")):
            if segment_for(lines) is None:
                if not dry_run and compact(lines) is None:
                    report.kept.append(str(lines))
                    continue
                report.segments_written += 1  # (a dry run assumes it can be written)
            size = lines.stat().st_size
            if not dry_run:
                lines.unlink()
            report.files_removed += 1
            report.bytes_freed += size
            pruned = True
        cache = cache_dir(directory)
        if cache.is_dir():
            size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
            if not dry_run:
                shutil.rmtree(cache, ignore_errors=True)
            report.bytes_freed += size
            pruned = True
        if pruned:
            report.jobs.append(job)
    return report
