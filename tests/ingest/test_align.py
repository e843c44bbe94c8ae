"""Clock alignment: synthetic multi-node logs with known clock offsets are recovered."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import estimate_offsets
from tests.ingest.paths import NOT_BUILT

T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)
OFFSETS_MS = {"node-a": 0.0, "node-b": 250.0, "node-c": -1300.0, "node-d": 37.4}


def node_logs(offsets_ms, *, ranks_per_node=2, steps=60, jitter_ms=0.2, resolution="us", seed=3, missing=None):
    """Per rank files: every rank logs the end of each step (all ranks leave the all-reduce together) with its
    node's clock; asctime-style timestamps at microsecond or millisecond resolution."""
    rnd = random.Random(seed)
    files = {}
    rank = 0
    ends = [T0 + timedelta(milliseconds=100 * s + rnd.uniform(0, 30)) for s in range(steps)]
    for node, off in offsets_ms.items():
        for _ in range(ranks_per_node):
            lines = []
            for s, end in enumerate(ends):
                if missing and (node, s) in missing:
                    continue
                t = end + timedelta(milliseconds=off + rnd.uniform(0, jitter_ms))
                stamp = t.strftime("%Y-%m-%d %H:%M:%S")
                frac = f".{t.microsecond:06d}" if resolution == "us" else f",{t.microsecond // 1000:03d}"
                lines.append(f"{stamp}{frac} INFO train: step {s} loss 1.0 time 95.0ms")
            files[f"{node}.rank{rank}.log"] = lines
            rank += 1
    return files


class TestClockAlignment:
    @pytest.mark.parametrize("resolution", ["us", "ms"])
    def test_known_offsets_are_recovered_within_a_millisecond(self, ingest_files, resolution):
        """+250 ms, -1.3 s and +37.4 ms against node-a are estimated within 1 ms, with µs or ms timestamps."""
        summary, cap = ingest_files(node_logs(OFFSETS_MS, resolution=resolution))
        got = {o.domain: o for o in summary.clock_offsets}
        assert set(OFFSETS_MS) == set(got)
        ref = got["node-a"].reference
        for node, true in OFFSETS_MS.items():
            expected = true - OFFSETS_MS[ref]
            assert abs(got[node].offset_ms - expected) < 1.0, (node, got[node])
        assert summary.alignment_residual_ms is not None and summary.alignment_residual_ms < 1.0

    def test_corrected_step_ends_agree_across_nodes(self, ingest_files):
        _, cap = ingest_files(node_logs(OFFSETS_MS))
        by_step = {}
        for e in cap.of("span", cat="step"):
            by_step.setdefault(e["step"], []).append(e["ts"])
        spreads = [(max(v) - min(v)) / 1e6 for v in by_step.values()]
        assert len(by_step) == 60 and max(spreads) < 1.5

    def test_no_alignment_when_disabled_or_too_few_shared_moments(self, ingest_files):
        summary, cap = ingest_files(node_logs({"node-a": 0.0, "node-b": 250.0}), align=False)
        assert [] == summary.clock_offsets
        missing = {("node-b", s) for s in range(2, 60)}
        summary, _ = ingest_files(node_logs({"node-a": 0.0, "node-b": 250.0}, missing=missing))
        b = {o.domain: o for o in summary.clock_offsets}["node-b"]
        assert not b.applied and "shared moments" in b.note

    def test_a_few_late_lines_do_not_move_the_estimate(self):
        """The trimmed mean ignores outliers (a rank that logged late after a slow optimizer step)."""
        pts = {"a": {("step", s): [s * 10**8] for s in range(40)},
               "b": {("step", s): [s * 10**8 + 250_000_000 + (80_000_000 if s % 10 == 0 else 0)] for s in range(40)}}
        off = estimate_offsets(pts)["b"]
        assert abs(off.offset_ms - 250.0) < 0.5 and off.points == 40


class TestBoundedMoments:
    """Memory for alignment must not grow with the log: each node keeps at most ``cap`` moments."""

    def test_the_cap_holds_and_the_offset_is_still_exact(self):
        from ingest._align import SyncMoments

        moments = SyncMoments(cap=64)
        for s in range(100_000):
            moments.add("a", s, s * 10**8)
            moments.add("b", s, s * 10**8 + 250_000_000)
        assert all(len(keys) <= 64 for keys in moments.points.values())
        off = estimate_offsets(moments.points)["b"]
        assert abs(off.offset_ms - 250.0) < 1e-6 and off.points >= 32

    def test_nodes_covering_different_parts_of_the_job_still_share_moments(self):
        """Node a logged steps 0-99,999; node b only from step 70,000 (a late file): their kept steps overlap."""
        from ingest._align import SyncMoments

        moments = SyncMoments(cap=64)
        for s in range(100_000):
            moments.add("a", s, s * 10**8)
            if s >= 70_000:
                moments.add("b", s, s * 10**8 - 1_300_000_000)
            moments.add("c", "not a step", 0)  # type: ignore[arg-type]
        assert "c" not in moments.points
        offsets = estimate_offsets(moments.points)
        assert all(o.applied or o.note == "reference" for o in offsets.values())
        assert abs(offsets["b"].offset_ms - offsets["a"].offset_ms + 1300.0) < 1e-6

    def test_ingest_keeps_alignment_exact_with_a_small_cap(self, ingest_files, monkeypatch):
        import ingest._align

        monkeypatch.setattr(ingest._align, "MAX_MOMENTS", 8)
        summary, _ = ingest_files(node_logs(OFFSETS_MS, steps=200))
        offsets = {o.domain: o for o in summary.clock_offsets}
        ref = next(o.reference for o in offsets.values())
        for node, truth in OFFSETS_MS.items():
            assert abs(offsets[node].offset_ms - (truth - OFFSETS_MS[ref])) < 1.0
            assert offsets[node].points <= 8


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.sampled_from("abc"), st.one_of(
    st.integers(-5, 300), st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.none(), st.booleans()),
    st.integers(-2**64, 2**64)), max_size=400))
def test_the_lanes_store_keeps_what_sync_moments_keep(cap, moments):
    """The compiled store the lane adds its moments to holds exactly what ``SyncMoments`` holds, whatever comes:
    the same steps per domain past the cap (strides), and no non-step, too large step or time."""
    native = pytest.importorskip("jobtrace_native", reason=NOT_BUILT)
    from ingest._align import SyncMoments

    py, rs = SyncMoments(cap=cap), native.MomentStore(cap)
    for domain, step, ts in moments:
        py.add(domain, step, ts)  # type: ignore[arg-type]
        rs.add(domain, step, ts)
    assert rs.points == py.points and bool(rs) == bool(py)
    assert rs.medians() == py.medians()
