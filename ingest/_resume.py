"""Reading each source once: what the ingest ledger says about a file decides whether, and from where, it is read.

With a :class:`SourceBook` (the command line always gives one; a library caller may), an
ingest looks every source file up in the job's ledger (:mod:`jobtrace.store`) before
reading it:

* the same content already ingested, under this name or another: skipped, and said so;
* a file that continues what was read of it (it grew, a follow resumes, or the last
  ingest stopped part way): read from the recorded offset, the checkpoint;
* a file whose content changed otherwise (rewritten, rotated): not read, an error that
  names ``--replace`` and ``--append``;
* anything else: read from its start.

``reuse="replace"`` forgets the target's records first (the embedded store's ingested
files are removed too, by the caller that owns them); ``reuse="append"`` reads every file
whole and adds its events whatever the ledger says.

When the last ingest into the embedded store stopped without finishing (killed, say), the
job's ingested files are first cut back to their size at its last checkpoint, so that the
files read again from their checkpoints are neither lost nor doubled. A server cannot be
cut back: what was sent before the stop is sent again (Elasticsearch/OpenSearch and Loki
keep one copy of an identical event, VictoriaLogs keeps both), and the summary says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from jobtrace.store import IngestLedger, SourceRecord, fingerprint

from ._sources import Source

__all__ = ["Reuse", "SourceBook", "SourcePlan"]

Reuse = Literal["check", "replace", "append"]


@dataclass(slots=True)
class SourcePlan:
    """What the ingest does with one source: read it from ``start`` (recording into ``record``), or not."""

    source: Source
    read: bool = True
    start: int = 0
    record: SourceRecord | None = None
    note: str | None = None
    """Said in the summary: why it was skipped, or from where it is read."""
    error: str | None = None


@dataclass
class SourceBook:
    """The job's ledger as one ingest uses it: its target, how earlier ingests count, and the store's files.

    ``store_files`` lists the embedded store's files that ingests write (``None`` for a server).
    """

    ledger: IngestLedger
    target: str
    reuse: Reuse = "check"
    store_files: Callable[[], list[Path]] | None = None
    checkpoint_every_s: float = 0.5
    _last_saved: float = field(default=0.0, init=False)
    _stopped_at: dict[str, float] = field(default_factory=dict, init=False)
    """Per path, how far the ingest that stopped had read (before the store is cut back to its checkpoint)."""

    # ---- before reading ------------------------------------------------------------
    def plan(self, sources: list[Source]) -> list[SourcePlan]:
        """Decide for every source; cuts the embedded store back first where the last ingest died part way."""
        if self.reuse == "replace":
            self.ledger.forget(self.target)
        records = {r.path: r for r in self.ledger.records(self.target)}
        self._stopped_at = {r.path: r.percent() for r in records.values() if r.stopped()}
        if self.reuse == "check" and self._stopped_at:
            self._roll_back(list(records.values()))
        return [self._plan(s, records) for s in sources]

    def plan_more(self, source: Source) -> SourcePlan:
        """Decide for a file that appeared while following (the store is not cut back again mid-ingest)."""
        return self._plan(source, {r.path: r for r in self.ledger.records(self.target)})

    def _plan(self, source: Source, records: dict[str, SourceRecord]) -> SourcePlan:
        if source.is_stdin or source.temp:
            return SourcePlan(source)  # no identity to keep: read as given
        path = os.path.abspath(source.path)
        try:
            st = os.stat(path)
            content = fingerprint(path)
        except OSError as exc:
            return SourcePlan(source, error=f"cannot read {source.display}: {exc.strerror or exc}", read=False)
        record = SourceRecord(path, self.target, content.size, content.head, content.tail, st.st_ino,
                              st.st_mtime_ns, _compressed(path))
        plan = SourcePlan(source, record=record)
        if self.reuse != "check":
            return plan
        old = records.get(path)
        if old is None:
            same = next((r for r in records.values() if r.state == "complete" and r.content == content), None)
            if same is not None:
                plan.read, plan.note = False, (f"{source.display}: skipped, the same content as "
                                               f"{same.path} ingested at {_when(same.updated)}")
            return plan
        if old.state == "running" and not old.stopped():
            plan.read, plan.error = False, (f"{source.display} is being ingested now (pid {old.pid}); "
                                            "wait for it, or stop it first")
            return plan
        if old.state == "complete" and old.content == content:
            plan.read, plan.note = False, (f"{source.display}: already ingested at {_when(old.updated)} (same "
                                           "content); nothing new. --replace reads it again")
            return plan
        if _continues(path, old, record):
            plan.start = 0 if record.compressed else old.offset
            self._carry_checkpoint(record, old, plan.start)
            if old.state == "complete":
                plan.note = (f"{source.display}: grew by {content.size - old.size:,} bytes since its ingest; "
                             "reading the new lines")
            else:
                where = f"from {plan.start / content.size:.0%}" if plan.start else "again from its start"
                stopped_at = self._stopped_at.get(path, old.percent())
                plan.note = f"{source.display}: the last ingest stopped at {stopped_at:.0f} %; reading it {where}"
                if self.store_files is None and old.read > plan.start:
                    plan.note += (" (what was sent then is sent again: Elasticsearch/OpenSearch and Loki keep one "
                                  "copy of an identical event, VictoriaLogs keeps both)")
            return plan
        plan.read, plan.error = False, (f"{source.display} changed since it was ingested at {_when(old.updated)} "
                                        "(it does not continue what was read): --replace reads the job's files "
                                        "again, --append adds this one as well")
        return plan

    @staticmethod
    def _carry_checkpoint(record: SourceRecord, old: SourceRecord, start: int) -> None:
        record.offset, record.read = start, start
        if start:
            record.offset_head, record.offset_tail = old.offset_head, old.offset_tail

    def _roll_back(self, records: list[SourceRecord]) -> None:
        """Cut the store's ingested files back to the last checkpoint (their lines after it are read again)."""
        if self.store_files is not None:
            sizes = self.ledger.store_sizes()
            for path in self.store_files():
                keep = sizes.get(path.name, 0)
                if path.stat().st_size > keep:
                    with open(path, "r+b") as fh:
                        fh.truncate(keep)
                    for segment in path.parent.glob(path.name + ".*.parquet"):
                        segment.unlink()  # made from the longer file: stale now
        for r in records:
            if r.stopped():
                r.state, r.read = "incomplete", r.offset
        self.ledger.progress([r for r in records if r.state == "incomplete"])

    # ---- while reading ---------------------------------------------------------------
    def begin(self, record: SourceRecord) -> None:
        """The file is opened: its record, marked running by this process, replaces any earlier one."""
        self.ledger.begin(record)

    def progress(self, records: list[SourceRecord], force: bool = False) -> None:
        """Save how far the files have been read, at most every ``checkpoint_every_s``."""
        now = time.monotonic()
        if records and (force or now - self._last_saved >= self.checkpoint_every_s):
            self._last_saved = now
            self.ledger.progress(records)

    def checkpoint(self, done: Sequence[tuple[SourceRecord, int]], complete: Sequence[SourceRecord] = ()) -> None:
        """Everything read of these files is written: ``(record, offset)`` pairs, and the files read to the end."""
        for record, offset in done:
            if offset != record.offset and not record.compressed:
                mark = fingerprint(record.path, offset)
                record.offset, record.offset_head, record.offset_tail = offset, mark.head, mark.tail
        for record in complete:
            record.state = "complete"
            record.read = record.size = max(record.size, record.offset)
            if record.compressed:
                record.offset, record.offset_head, record.offset_tail = record.size, record.head, record.tail
            else:
                whole = fingerprint(record.path, record.offset)
                record.size, record.head, record.tail = whole.size, whole.head, whole.tail
        records = [r for r, _ in done] + [r for r in complete if all(r is not d for d, _ in done)]
        self.ledger.checkpoint(records, self.store_files() if self.store_files is not None else None)
        self._last_saved = time.monotonic()

    def stopped(self, records: list[SourceRecord]) -> None:
        """The ingest ends before these files did (interrupted, or an error): they stay incomplete."""
        for r in records:
            if r.state == "running":
                r.state = "incomplete"
        if records:
            self.ledger.progress(records)


def _continues(path: str, old: SourceRecord, new: SourceRecord) -> bool:
    """Whether the file still starts with what was recorded of it (its checkpoint)."""
    if new.compressed or old.compressed:
        return old.state != "complete" and new.compressed == old.compressed and _same_start(path, old)
    if new.size < old.offset:
        return False
    if old.offset == 0:
        return _same_start(path, old) if old.state != "complete" else False
    try:
        return fingerprint(path, old.offset) == old.checkpoint
    except OSError:
        return False


def _same_start(path: str, old: SourceRecord) -> bool:
    """The file's first bytes are those of the recorded file (its head, as far as both reach)."""
    try:
        return fingerprint(path, min(old.size, 64 * 1024)).head == old.head
    except OSError:
        return False


def _compressed(path: str) -> bool:
    with open(path, "rb") as fh:
        magic = fh.read(4)
    return magic[:2] == b"\x1f\x8b" or magic == b"\x28\xb5\x2f\xfd"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
