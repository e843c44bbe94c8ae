"""Run one ingest through the general per-line path and through the fast paths, and compare.

The fast paths are the plain-line path (:mod:`ingest._plain`) and, where it is built,
the compiled fast lane (:mod:`ingest._lane`); the reference is the general per-line
path of the Python engine with both off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ingest import IngestConfig, Ingestor, IngestSummary, MemorySink
from ingest._lane import lane_module
from ingest.parsers import _util

Outputs = dict[tuple[str, int], list[bytes]]
NOT_BUILT = "the compiled ingest lane is not built (pip install -e . builds it where cargo is found; .ci/run does)"


def ingest_once(paths: list[str], fast: bool, span_start: int, native: bool = False,
                **cfg: Any) -> tuple[IngestSummary, Outputs]:
    """One ingest into memory, span ids counted from ``span_start`` so that two runs can be compared byte for byte."""
    sinks: dict[tuple[str, int], MemorySink] = {}

    def factory(node: str, rank: int) -> MemorySink:
        sinks[(node, rank)] = MemorySink()
        return sinks[(node, rank)]

    _util.set_span_id_counter(span_start)
    summary = Ingestor(IngestConfig(plain_fast_path=fast, native=native, **cfg), factory).run(paths)
    return summary, {key: list(sink.lines) for key, sink in sinks.items()}


def comparable(summary: IngestSummary) -> dict[str, Any]:
    d = summary.to_dict()
    for timing in ("seconds", "lines_per_s", "fast_lane"):
        d.pop(timing)
    return d


def assert_same_as_general(paths: list[str], summary: IngestSummary, outputs: Outputs, span_start: int,
                           **cfg: Any) -> None:
    """``summary``/``outputs`` of a default ingest (fast paths on, span ids from ``span_start``) are what the
    general per-line path writes for the same input."""
    general, general_out = ingest_once(paths, False, span_start, native=False, **cfg)
    assert general_out.keys() == outputs.keys()
    for key, lines in general_out.items():
        assert lines == outputs[key], f"sink {key} differs"
    assert comparable(general) == comparable(summary)


def assert_paths_agree(paths: list[str | Path], **cfg: Any) -> tuple[IngestSummary, Outputs]:
    """Ingest ``paths`` with and without the fast paths; the events (bytes, order per sink) and summaries must match."""
    cfg.setdefault("job", "paths")
    names = [str(p) for p in paths]
    start = _util.span_id_counter()
    fast, fast_out = ingest_once(names, True, start, **cfg)
    assert_same_as_general(names, fast, fast_out, start, **cfg)
    if lane_module() is not None:
        lane, lane_out = ingest_once(names, True, start, native=True, **cfg)
        assert_same_as_general(names, lane, lane_out, start, **cfg)
        return lane, lane_out
    return fast, fast_out
