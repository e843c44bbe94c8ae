"""Who a shipper ships for: the process's labels and where its spool lives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessInfo"]


@dataclass(frozen=True)
class ProcessInfo:
    """What a shipper needs to know about the process it ships for (labels, spool location)."""

    job_id: str
    node: str
    rank: int
    pid: int
    spool_root: Path
    spool_override: Path | None = None  # replaying one given spool directory

    def spool_dir(self, backend: str) -> Path:
        return self.spool_override or self.spool_root / f"{backend}-r{self.rank}"
