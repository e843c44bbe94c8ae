"""The disk spool that makes network shipping lossless, and the dead-letter file.

Every line a network sink accepts is first appended here, then sent from here; the
read position advances (and is persisted) only after the server accepted a batch.
Hence:

* a server outage of any length costs disk, not memory: only one batch is in RAM;
* order is preserved: lines are sent in the order they were appended;
* a process that dies with unsent lines leaves them on disk; the next shipper that
  opens the same spool directory (or ``jobtrace replay DIR``) sends them first;
* nothing is sent twice except a batch whose acceptance was not yet persisted when
  the process died (at-least-once); the encoders make those replays idempotent
  where the backend allows (Elasticsearch document ids, Loki's own de-duplication).

Layout: ``seg-000000000001.jsonl`` … segment files of whole lines, and ``cursor``
holding ``<segment number> <byte offset>``, replaced atomically with ``os.replace``.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from jobtrace.errors import ShipperError

__all__ = ["Batch", "DeadLetter", "Spool"]

_SEG = "seg-{:012d}.jsonl"


@dataclass(frozen=True)
class Batch:
    lines: list[bytes]
    end: tuple[int, int]  # (segment, offset) just past the last line


class Spool:
    """An append-only, replayable queue of lines on disk for one sender."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int = 64 << 20) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            # a user-facing refusal (``jobtrace replay`` on a live spool), so part of the exception tree
            raise ShipperError(f"spool {self.dir} is in use by another process") from None
        self._segment_bytes = segment_bytes
        self._mutex = threading.Lock()
        self.read_seg, self.read_off = self._load_cursor()
        segs = self._segments()
        self.write_seg = segs[-1] if segs else max(1, self.read_seg)
        self._write_fd = os.open(self.dir / _SEG.format(self.write_seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write_size = os.fstat(self._write_fd).st_size
        if self._write_size and not self._ends_with_newline(self.write_seg):
            # A crash tore the last append; start a fresh segment so whole lines stay whole.
            self._roll()

    # ---- cursor ------------------------------------------------------------------------------
    def _load_cursor(self) -> tuple[int, int]:
        try:
            seg, off = (self.dir / "cursor").read_text().split()
            return int(seg), int(off)
        except (OSError, ValueError):
            segs = self._segments()
            return (segs[0] if segs else 1), 0

    def _segments(self) -> list[int]:
        out = []
        for p in self.dir.glob("seg-*.jsonl"):
            try:
                out.append(int(p.stem[4:]))
            except ValueError:
                continue
        return sorted(out)

    def _ends_with_newline(self, seg: int) -> bool:
        with open(self.dir / _SEG.format(seg), "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    # ---- writer side (export thread) ------------------------------------------------------
    def append(self, lines: Sequence[bytes]) -> None:
        data = b"".join(lines)
        with self._mutex:
            view = memoryview(data)
            while view:
                view = view[os.write(self._write_fd, view):]
            self._write_size += len(data)
            if self._write_size >= self._segment_bytes:
                self._roll()

    def _roll(self) -> None:
        os.close(self._write_fd)
        self.write_seg += 1
        self._write_fd = os.open(self.dir / _SEG.format(self.write_seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write_size = 0

    # ---- reader side (sender thread) --------------------------------------------------------
    def read_batch(self, max_lines: int, max_bytes: int) -> Batch:
        """Whole lines from the committed position, at most ``max_lines`` and about ``max_bytes``.

        The first line is always taken, even when it alone exceeds ``max_bytes``, so an
        oversized line reaches the encoder (which dead-letters it) instead of blocking.
        """
        seg, off = self.read_seg, self.read_off
        lines: list[bytes] = []
        size = 0
        while True:
            try:
                fh = open(self.dir / _SEG.format(seg), "rb")  # noqa: SIM115 - closed by the `with fh` below
            except FileNotFoundError:
                fh = None
            if fh is not None:
                with fh:
                    fh.seek(off)
                    while len(lines) < max_lines and size < max_bytes:
                        line = fh.readline()
                        if not line.endswith(b"\n"):
                            break  # end of segment, or a line still being written
                        lines.append(line)
                        off += len(line)
                        size += len(line)
            if len(lines) >= max_lines or size >= max_bytes:
                break
            with self._mutex:
                newer = seg < self.write_seg
            if not newer:
                break
            seg, off = seg + 1, 0
        return Batch(lines, (seg, off))

    def commit(self, end: tuple[int, int]) -> None:
        """Persist that everything before ``end`` was accepted, and drop finished segments."""
        seg, off = end
        tmp = self.dir / "cursor.tmp"
        tmp.write_text(f"{seg} {off}\n")
        os.replace(tmp, self.dir / "cursor")
        for old in self._segments():
            if old < seg:
                (self.dir / _SEG.format(old)).unlink(missing_ok=True)
        self.read_seg, self.read_off = seg, off

    def pending_bytes(self) -> int:
        """Bytes not yet accepted. Safe beside the sender thread: a segment it drops (:meth:`commit`)
        between the listing and its size was accepted, so it counts nothing."""
        total = 0
        read_seg, read_off = self.read_seg, self.read_off
        for seg in self._segments():
            if seg < read_seg:
                continue
            try:
                size = (self.dir / _SEG.format(seg)).stat().st_size
            except FileNotFoundError:
                continue
            total += max(size - (read_off if seg == read_seg else 0), 0)
        return total

    def close(self) -> None:
        with self._mutex:
            if self._write_fd >= 0:
                os.close(self._write_fd)
                self._write_fd = -1
        if self.pending_bytes() == 0:
            for seg in self._segments():
                (self.dir / _SEG.format(seg)).unlink(missing_ok=True)
            (self.dir / "cursor").unlink(missing_ok=True)
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)


class DeadLetter:
    """Lines a backend refused for good (400-class), with its reason, so nothing vanishes silently."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.count = 0

    def write(self, line: bytes, status: int | None, reason: str, backend: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"time": time.time(), "backend": backend, "status": status, "reason": reason[:2000],
                  "line": line.rstrip(b"\n").decode("utf-8", "replace")}
        with open(self.path, "ab") as fh:
            fh.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        self.count += 1
