"""Export: a job already in the embedded store, sent to Loki or Elasticsearch/OpenSearch.

Why this exists: the embedded store is the default (a job needs no server to be traced),
and the wish to see a job in Grafana Explore or Kibana often comes afterwards. The job
is sent with the same shippers as a live job (batching, retries, spool, dead letter), so
the server ends up with exactly what live shipping would have given it.

* Each rank's JSON-lines file is the durable record and is sent as it is, in order. A
  torn last line (a rank killed mid-write) and a line that is not a JSON object are
  skipped and counted, as the store's reader does, so the server ends up with exactly
  the events ``trace-job`` counts locally (the skipped lines stay in the store).
* A rank whose JSON lines were pruned (short raw retention) but whose columnar segment
  remains is rebuilt from the segment: every canonical key has its own typed column.
* Lines are redacted on the way (:class:`jobtrace.redact.Redactor`, as live shipping does), so a job
  stored with ``JOBTRACE_REDACT=0``, or before redaction existed, reaches no server with its secrets
  (unless this process has ``JOBTRACE_REDACT=0`` too).
* Reading waits while more than ``max_spool_bytes`` are spooled and unsent, so a large
  job never doubles its size on disk and a dead server stops the export early. What is
  not accepted by the deadline is reported; sending again is safe, since Elasticsearch
  documents take their id from the line's hash and Loki drops exact duplicates.
* After the events, each rank whose segment has a complete rollup gets its *pack* sent too
  (:func:`jobtrace.store.pack_lines`), where the shipper takes packs (``takes_packs``), as a
  rank that exits while shipping live sends it: a job exported later reads as fast as one
  shipped live. A pack is Parquet inside the line, out of the redactor's reach; so a rank
  whose lines the redactor changed on the way gets no pack (its events, redacted, stand for it).
  Packs sent twice are harmless: readers drop duplicate parts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jobtrace.errors import JobNotFound
from jobtrace.redact import RedactState, redactor_from_env
from jobtrace.store import job_dir, job_files, orphan_segments, pack_lines, segment_for, segment_lines, spool_root

from ._local import takes_packs
from ._process import ProcessInfo
from ._registry import open_shipper
from ._sender import SpoolingSender

__all__ = ["ExportSummary", "export_job"]

_CHUNK = 4 << 20


@dataclass
class ExportSummary:
    """What an export did; ``complete`` is what a script should check."""

    job: str
    backend: str
    files: int = 0
    from_segments: int = 0
    lines: int = 0
    """Lines handed to the shipper (read from files or rebuilt from segments)."""
    sent: int = 0
    """Event lines the server accepted (packs are counted apart)."""
    refused: int = 0
    """Event lines the server refused for good (kept in the dead-letter file)."""
    torn: int = 0
    """Torn last lines skipped (a rank killed mid-write)."""
    corrupt: int = 0
    """Lines skipped because they are not a JSON object (they stay in the store)."""
    unread_files: list[str] = field(default_factory=list)
    """Files not read because the deadline passed while the server was not taking lines."""
    left_bytes: int = 0
    """Spooled bytes the server had not accepted when the export ended (``jobtrace replay`` sends them)."""
    packs: int = 0
    """Pack lines handed to the shipper (a few per packed rank; 0 where the backend takes none)."""
    packs_refused: int = 0
    """Pack lines the server refused for good (dead-lettered; those ranks are read from their events)."""
    packed_ranks: int = 0
    packs_skipped: dict[str, int] = field(default_factory=dict)
    """Ranks that got no pack, by reason (a reader sums their events instead)."""
    spool: str = ""
    dead_letter: str = ""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.unread_files and self.left_bytes == 0 and self.refused == 0

    @property
    def packs_text(self) -> str:
        """``packs: N records for M ranks`` (and why others got none), for the export's report."""
        text = f"packs: {self.packs} records for {self.packed_ranks} ranks"
        if self.packs_refused:
            text += f", {self.packs_refused} refused"
        if self.packs_skipped:
            text += " (none for " + ", ".join(f"{n} {why}" for why, n in sorted(self.packs_skipped.items())) + ")"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}


def _sources(directory: Path) -> list[tuple[Path, bool]]:
    """(path, is_segment): every JSON-lines file, plus the segment of each file that was pruned."""
    lines = sorted(directory.glob("*.jsonl"))
    orphans = orphan_segments(directory, {p.name for p in lines})
    return [(p, False) for p in lines] + [(p, True) for p in sorted(orphans.values())]


def _file_lines(path: Path, summary: ExportSummary) -> Generator[list[bytes], None, None]:
    """Complete, valid lines of ``path`` in batches; torn and corrupt lines are counted, not sent."""
    rest = b""
    loads = orjson.loads
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            good = []
            for part in parts:
                if not part:
                    continue
                try:
                    ok = type(loads(part)) is dict
                except orjson.JSONDecodeError:
                    ok = False
                if ok:
                    good.append(part + b"\n")
                else:
                    summary.corrupt += 1
            yield good
    if rest:
        summary.torn += 1


def _packable(directory: Path) -> set[Path]:
    """The segments whose rollup is complete (one life of the rank, every table): those a pack is made of."""
    files = job_files(directory)
    return {Path(p) for p in files.segments} - {Path(p) for p in files.unrolled}


def _skip(summary: ExportSummary, why: str) -> None:
    summary.packs_skipped[why] = summary.packs_skipped.get(why, 0) + 1


def _send_packs(shipper: SpoolingSender, segments: list[Path], summary: ExportSummary, max_spool_bytes: int,
                deadline: float) -> None:
    """Each segment's pack to ``shipper``, after every event (a reader that finds a pack trusts it stands for
    all of its rank's events). A pack that cannot be made is skipped: the rank's events are there."""
    for segment in segments:
        if not _room(shipper, max_spool_bytes, deadline):
            _skip(summary, "past the deadline")
            continue
        try:
            lines = pack_lines(segment)
        except Exception:  # noqa: BLE001 - a pack only saves a reader time
            lines = []
        if not lines:
            _skip(summary, "pack not made")
            continue
        shipper.write(lines)
        summary.packs += len(lines)
        summary.packed_ranks += 1


def _room(shipper: SpoolingSender, max_spool_bytes: int, deadline: float) -> bool:
    """Wait until the spool holds at most ``max_spool_bytes`` unsent; False when the deadline came first."""
    while shipper.spool.pending_bytes() > max_spool_bytes:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return time.monotonic() <= deadline


def export_job(data_dir: str | os.PathLike[str], job_id: str, backend: str, *, url: str | None = None,
               timeout_s: float = 600.0, max_spool_bytes: int = 256 << 20,
               progress: Callable[[int, int], None] | None = None, packs: bool = True) -> ExportSummary:
    """Send every event of ``job_id`` in the embedded store to ``backend``, then wait for it to be accepted.

    ``progress(done, total)`` is called with the number of source files done. ``packs=False`` sends the events
    only, no rank's pack (see the module docstring). Raises
    :class:`JobNotFound` when the store has no such job and :class:`ConfigError` for a
    backend that is not configured.
    """
    directory = job_dir(data_dir, job_id)
    sources = _sources(directory) if directory.is_dir() else []
    if not sources:
        raise JobNotFound(f"no job {job_id!r} in the embedded store at {data_dir}")
    redactor = redactor_from_env()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    info = ProcessInfo(job_id, "export", 0, os.getpid(), spool_root(data_dir, job_id) / f"export-{os.getpid()}")
    shipper = open_shipper(backend, info, url)
    summary = ExportSummary(job_id, backend, spool=str(shipper.spool.dir), dead_letter=str(shipper.dead_letter.path))
    packable = _packable(directory) if packs and takes_packs(shipper) else set()
    to_pack: list[Path] = []
    try:
        for i, (path, is_segment) in enumerate(sources):
            batches = segment_lines(path) if is_segment else _file_lines(path, summary)
            state = RedactState()
            redacted = False
            done = _room(shipper, max_spool_bytes, deadline)
            while done and (lines := next(batches, None)) is not None:
                if redactor is not None:
                    out = redactor.redact_lines(lines, state)
                    redacted = redacted or out != lines
                    lines = out
                shipper.write(lines)
                summary.lines += len(lines)
                done = _room(shipper, max_spool_bytes, deadline)
            batches.close()
            if not done:  # the server is not taking lines: stop; a rerun sends these files in full
                summary.unread_files = [str(p) for p, _ in sources[i:]]
                break
            summary.files += 1
            summary.from_segments += is_segment
            segment = path if is_segment else segment_for(path)
            if segment is not None and segment in packable:
                if redacted:
                    _skip(summary, "redacted on the way")
                else:
                    to_pack.append(segment)
            if progress:
                progress(i + 1, len(sources))
        # Packs only once the server holds every event: a reader trusts a pack to stand for its rank's events.
        # Waiting here also lets the counts tell events and packs apart (the sender counts lines, not kinds).
        events_done = shipper.wait_idle(max(0.0, deadline - time.monotonic())) and not summary.unread_files
        sent, refused = shipper.stats.sent, shipper.stats.rejected
        if to_pack and not events_done:
            summary.packs_skipped["events not all accepted by the deadline"] = len(to_pack)
        elif to_pack:
            _send_packs(shipper, to_pack, summary, max_spool_bytes, deadline)
            shipper.wait_idle(max(0.0, deadline - time.monotonic()))
    finally:
        shipper.shutdown_timeout_s = min(shipper.shutdown_timeout_s, max(0.0, deadline - time.monotonic()))
        shipper.close()
    if summary.packs:
        summary.packs_refused = shipper.stats.rejected - refused
    else:
        sent, refused = shipper.stats.sent, shipper.stats.rejected
    summary.sent, summary.refused = sent, refused
    summary.left_bytes = shipper.stats.spooled_bytes
    summary.seconds = round(time.monotonic() - t0, 3)
    return summary
