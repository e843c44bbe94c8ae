"""Which files stand for which rank: a job directory's JSON lines, segments and rollups, each rank once.

A rank that exited cleanly left a segment of its JSON-lines file (and a rollup of its
derived rows); a rank that was killed or is still running left only lines. A reader
takes each rank's data once: the segment while it still matches its file (same length
and mtime), else the lines; a segment whose file was pruned stands alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ._layout import RANK_IN_NAME
from ._segments import orphan_segments, rollup_paths, segment_for

__all__ = ["JobFiles", "job_files"]


@dataclass
class JobFiles:
    """A job directory's files, each rank's data taken once: from its segment when it matches, else its lines."""

    lines: list[str] = field(default_factory=list)
    """JSON-lines files to parse (no segment stands for them)."""
    segments: list[str] = field(default_factory=list)
    """Segments to read in place."""
    unrolled: list[str] = field(default_factory=list)
    """Segments without a complete rollup: their ranks' derived rows must be built from their events."""
    rollups: dict[str, list[str]] = field(default_factory=dict)
    """Per derived table, the rollup files that ranks wrote at exit."""

    @property
    def all(self) -> list[str]:
        return sorted(self.lines + self.segments)

    def add_segment(self, seg: Path, rollup_ok: bool) -> None:
        self.segments.append(str(seg))
        rollup = rollup_paths(seg)
        if rollup_ok and all(p.exists() for p in rollup.values()):
            for table, p in rollup.items():
                self.rollups.setdefault(table, []).append(str(p))
        else:
            self.unrolled.append(str(seg))


def job_files(directory: Path) -> JobFiles:
    """JSON-lines files without a matching segment, and the segments that stand for the rest.

    A segment stands for its JSON file only while the file has the length and mtime the
    segment was made from; a segment whose JSON file is gone (raw logs pruned) stands alone.
    """
    files = JobFiles()
    jsonl = sorted(directory.glob("*.jsonl"))
    names = {p.name for p in jsonl}
    orphans = orphan_segments(directory, names)
    # A rank that restarted has a file per life; its per-step rows must be derived over all of them.
    lives = Counter(m[1] for n in [*names, *orphans] if (m := RANK_IN_NAME.search(n)))
    for path in jsonl:
        segment = segment_for(path)
        if segment:
            files.add_segment(segment, _one_life(path.name, lives))
        else:
            files.lines.append(str(path))
    for source, seg in orphans.items():
        files.add_segment(seg, _one_life(source, lives))
    return files


def _one_life(name: str, lives: Counter[str]) -> bool:
    m = RANK_IN_NAME.search(name)
    return m is None or lives[m[1]] == 1
