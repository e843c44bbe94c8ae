"""The ingest ledger: which source files a job's events came from, how far each was read, and whether it finished.

Why it exists: ``jobtrace ingest`` run twice over the same logs must not double the job,
and one that was killed at 92 % must not leave a partial job that reads as a whole one.
So every ingest records, per source file and target (the embedded store or one server):

* the file's identity: its path, inode and mtime, and its content fingerprint (size and
  the SHA-256 of its first and last 64 KiB), so that the same content is recognised
  under another name and a rewritten file is told from a grown one;
* ``offset``: how many of its bytes have been read *and written* (a checkpoint; every
  line before it is in the target), with the fingerprint of that prefix;
* ``read``: how many bytes had been read when it was last recorded (the progress shown
  when an ingest stopped part way), and its state: ``running``, ``complete`` or
  ``incomplete``.

Checkpoints are taken where the engine has written everything it read: at the end of
each file, and when a followed file has nothing new. For the embedded store a checkpoint
also records the size of each of the job's ingested files, so a run that resumes after
one that died first cuts those files back to the checkpoint and loses or repeats nothing.

The ledger is one small JSON file per job (``<data_dir>/<job>/.ingest-ledger.json``),
rewritten whole under a lock and renamed into place, so a reader never sees half of one.
It lives in the store layer because both sides use it: ingest writes it, ``trace-job``
reads it to say "ingest incomplete: 92 % of x.log".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final, Literal

from ._layout import job_dir

__all__ = ["LEDGER_NAME", "Fingerprint", "IngestLedger", "SourceRecord", "fingerprint", "ingest_caveats"]

LEDGER_NAME: Final = ".ingest-ledger.json"
_EDGE: Final = 64 * 1024
"""Bytes hashed at each end of a file: enough to tell files apart, cheap on a 50 GB log."""

State = Literal["running", "complete", "incomplete"]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The first ``size`` bytes of a file, in brief: their length and the hashes of their two ends."""

    size: int
    head: str
    tail: str


def fingerprint(path: str | os.PathLike[str], size: int | None = None) -> Fingerprint:
    """The fingerprint of ``path``'s first ``size`` bytes (all of it by default)."""
    with open(path, "rb") as fh:
        if size is None:
            size = os.fstat(fh.fileno()).st_size
        head = fh.read(min(size, _EDGE))
        if size > _EDGE:
            fh.seek(size - _EDGE)
            tail = fh.read(_EDGE)
        else:
            tail = head
    if len(head) < min(size, _EDGE):  # shorter than asked: the file shrank since
        raise OSError(f"{path} is shorter than {size} bytes")
    return Fingerprint(size, hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest())


@dataclass(slots=True)
class SourceRecord:
    """What the ledger knows of one source file in one target."""

    path: str
    target: str
    size: int
    head: str
    tail: str
    inode: int = 0
    mtime_ns: int = 0
    compressed: bool = False
    state: State = "running"
    offset: int = 0
    offset_head: str = ""
    offset_tail: str = ""
    read: int = 0
    pid: int = 0
    host: str = ""
    started: float = 0.0
    updated: float = 0.0

    @property
    def content(self) -> Fingerprint:
        return Fingerprint(self.size, self.head, self.tail)

    @property
    def checkpoint(self) -> Fingerprint:
        return Fingerprint(self.offset, self.offset_head, self.offset_tail)

    def percent(self) -> float:
        return 100.0 * min(self.read, self.size) / self.size if self.size else 100.0

    def stopped(self) -> bool:
        """Whether this record's ingest ended without finishing the file (it said so, or its process is gone)."""
        if self.state == "incomplete":
            return True
        return self.state == "running" and not _alive(self.pid, self.host)


def _alive(pid: int, host: str) -> bool:
    if host and host != socket.gethostname():
        return True  # another machine's process: it may well be running; never call it dead from here
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process nobody has reaped yet still answers signal 0: a zombie is gone all the same
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


@dataclass
class _Doc:
    version: int = 1
    sources: list[SourceRecord] = field(default_factory=list)
    store_sizes: dict[str, int] = field(default_factory=dict)
    """For the embedded store: the size of each ingested file at the last checkpoint."""


class IngestLedger:
    """One job's ledger in one data directory; every change is read-modify-write under the job's lock."""

    def __init__(self, data_dir: str | os.PathLike[str], job: str) -> None:
        self.dir = job_dir(data_dir, job)
        self.path = self.dir / LEDGER_NAME

    # ---- reading -----------------------------------------------------------------
    def records(self, target: str | None = None) -> list[SourceRecord]:
        """The records (of ``target`` only, when given)."""
        return [r for r in self._load().sources if target is None or r.target == target]

    def store_sizes(self) -> dict[str, int]:
        return dict(self._load().store_sizes)

    def _load(self) -> _Doc:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return _Doc()
        except (OSError, ValueError):
            return _Doc()  # unreadable: as if none (the next write replaces it whole)
        fields = set(SourceRecord.__dataclass_fields__)
        sources = [SourceRecord(**{k: v for k, v in s.items() if k in fields}) for s in raw.get("sources", [])
                   if isinstance(s, dict) and {"path", "target", "size", "head", "tail"} <= s.keys()]
        sizes = {str(k): int(v) for k, v in (raw.get("store_sizes") or {}).items()}
        return _Doc(int(raw.get("version", 1)), sources, sizes)

    # ---- writing -----------------------------------------------------------------
    @contextlib.contextmanager
    def _edit(self) -> Iterator[_Doc]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".ingest-ledger.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = self._load()
            yield doc
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(doc), indent=1))
            os.replace(tmp, self.path)

    def begin(self, record: SourceRecord) -> None:
        """Start (or restart) reading ``record``'s file: it replaces the file's earlier record in its target."""
        record.pid, record.host = os.getpid(), socket.gethostname()
        record.started = record.updated = time.time()
        record.state = "running"
        with self._edit() as doc:
            doc.sources = [r for r in doc.sources if not (r.path == record.path and r.target == record.target)]
            doc.sources.append(record)

    def progress(self, records: list[SourceRecord]) -> None:
        """Save how far ``records`` have been read (no checkpoint: what was read may not all be written yet)."""
        self._save(records, None)

    def checkpoint(self, records: list[SourceRecord], store_files: list[Path] | None) -> None:
        """Everything read of ``records`` is written: save their offsets (and the store files' sizes)."""
        sizes = None
        if store_files is not None:
            sizes = {p.name: p.stat().st_size for p in store_files if p.exists()}
        self._save(records, sizes)

    def _save(self, records: list[SourceRecord], sizes: dict[str, int] | None) -> None:
        now = time.time()
        for r in records:
            r.updated = now
        with self._edit() as doc:
            mine = {(r.path, r.target): r for r in records}
            doc.sources = [mine.pop((r.path, r.target), r) for r in doc.sources] + list(mine.values())
            if sizes is not None:
                doc.store_sizes = sizes

    def forget(self, target: str) -> None:
        """Drop every record of ``target`` (``--replace``: its events are read again)."""
        with self._edit() as doc:
            doc.sources = [r for r in doc.sources if r.target != target]
            if target == "local":
                doc.store_sizes = {}


def ingest_caveats(data_dir: str | os.PathLike[str], job: str, kind: str) -> list[str]:
    """What a report on ``job`` read from a ``kind`` of target (``local``, ``loki``…) must say about ingests
    that did not finish (the ledger kept in ``data_dir``; a server's job ingested elsewhere has none here)."""
    out = []
    for r in IngestLedger(data_dir, job).records():
        if r.state == "complete" or r.target.split(" ", 1)[0] != kind:
            continue
        name = os.path.basename(r.path)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.updated))
        if r.stopped():
            out.append(f"ingest incomplete: {r.percent():.0f} % of {name} (stopped at {when}; "
                       "the same ingest command again finishes it)")
        else:
            out.append(f"ingest still running: {r.percent():.0f} % of {name} read so far (pid {r.pid})")
    return out
