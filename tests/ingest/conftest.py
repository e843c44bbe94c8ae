"""Helpers for the ingest tests: run an ingest into memory and look at the events."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from ingest import IngestConfig, Ingestor, MemorySink
from ingest.parsers import _util
from tests.ingest.paths import assert_same_as_general


class Captured:
    """Events an ingest wrote, per (node, rank) and in all."""

    def __init__(self) -> None:
        self.sinks: dict[tuple[str, int], MemorySink] = {}

    def factory(self, node: str, rank: int) -> MemorySink:
        sink = self.sinks[(node, rank)] = MemorySink()
        return sink

    @property
    def events(self) -> list[dict]:
        return [orjson.loads(line) for sink in self.sinks.values() for line in sink.lines]

    def of(self, kind: str, **match) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    def by_rank(self) -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = defaultdict(list)
        for e in self.events:
            out[e["rank"]].append(e)
        return out


def run_ingest(tmp_path: Path, files: dict[str, list[str] | bytes], **cfg):
    """Write ``files`` (name → lines or raw bytes) under tmp_path and ingest them into memory."""
    root = tmp_path / "logs"
    root.mkdir(exist_ok=True)
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else ("\n".join(content) + "\n").encode())
    cap = Captured()
    cfg.setdefault("job", "test-job")
    start = _util.span_id_counter()
    summary = Ingestor(IngestConfig(**cfg), cap.factory).run([str(root)])
    assert summary.lines == summary.parsed + summary.skipped_total
    # every fixture also checks that the fast paths write what the general per-line path writes
    assert_same_as_general([str(root)], summary, {k: list(s.lines) for k, s in cap.sinks.items()}, start, **cfg)
    return summary, cap


@pytest.fixture
def ingest_files(tmp_path):
    def go(files, **cfg):
        return run_ingest(tmp_path, files, **cfg)

    return go
