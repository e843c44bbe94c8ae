"""Where a job lives on disk: the embedded store's directory layout and file names.

    <data_dir>/<job>/<node>.r<rank>.p<pid>.jsonl      one append-only file per process
    <data_dir>/<job>/<file>.<bytes>-<mtime>.parquet   its segment (and rollups), see :mod:`._segments`
    <data_dir>/<job>/.cache/                          a parsed job kept for the next read
    <data_dir>/<job>/.spool/<backend>-r<rank>/        what a shipper has not sent yet
    <data_dir>/.golden/                               reference runs

Why one file per process: ranks never share a file, so no locking is needed even on
NFS/Lustre where ``O_APPEND`` is not atomic across clients, and a restarted rank (new
pid) never interleaves with its earlier life. The writer (``shippers.LocalStoreSink``)
and every reader (``queries``, ``shippers.export_job``) take these names from here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_DATA_DIR",
    "RANK_IN_NAME",
    "SEGMENT_RE",
    "cache_dir",
    "golden_dir",
    "job_dir",
    "list_jobs",
    "newest_write_ns",
    "process_file_name",
    "safe_name",
    "spool_root",
]

DEFAULT_DATA_DIR: Final = "jobtrace-data"
"""The embedded store's directory when neither an argument nor ``JOBTRACE_DATA_DIR`` names one."""

RANK_IN_NAME: Final = re.compile(r"\.r(-?\d+)\.p\d+\.jsonl")
"""The rank in a process file's name (``node.r3.p1234.jsonl`` → 3)."""

SEGMENT_RE: Final = re.compile(r"^(?P<source>.+\.jsonl)\.(?P<bytes>\d+)-(?P<mtime>\d+)\.parquet$")
"""A segment's file name: the JSON-lines file it was made from, and that file's length and mtime then."""

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._=-]")


def safe_name(part: str) -> str:
    """A path component that cannot escape the data directory."""
    cleaned = _UNSAFE.sub("_", part).lstrip(".")
    return cleaned or "_"


def job_dir(data_dir: str | os.PathLike[str], job_id: str) -> Path:
    """The directory that holds ``job_id``'s files."""
    return Path(data_dir) / safe_name(job_id)


def process_file_name(node: str, rank: int, pid: int) -> str:
    """The JSON-lines file one process of the job writes."""
    return f"{safe_name(node)}.r{rank}.p{pid}.jsonl"


def cache_dir(directory: Path) -> Path:
    """Where a reader keeps the parsed copy of the job in ``directory``."""
    return directory / ".cache"


def spool_root(data_dir: str | os.PathLike[str], job_id: str) -> Path:
    """Where the shippers of ``job_id``'s processes spool what they have not sent."""
    return job_dir(data_dir, job_id) / ".spool"


def golden_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Where reference (golden) runs are kept."""
    return Path(data_dir) / ".golden"


def list_jobs(data_dir: str | os.PathLike[str]) -> list[str]:
    """The jobs in the store: directories holding JSON lines or segments, sorted by name."""
    root = Path(data_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and (any(p.glob("*.jsonl"))
                                     or any(SEGMENT_RE.match(s.name) for s in p.glob("*.jsonl.*.parquet"))))


def newest_write_ns(directory: str | os.PathLike[str]) -> int:
    """When a job directory's files were last written (its newest file's mtime, ns); 0 if none or unreadable.
    How ``jobtrace prune`` and the metrics sidecar tell a quiet job from a running one."""
    newest = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.is_file():
                    newest = max(newest, entry.stat().st_mtime_ns)
    except OSError:
        return 0
    return newest
