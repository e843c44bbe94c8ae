"""RankMetrics' arithmetic: the derived TFLOP/s and MFU, and a job's own figures winning over them."""

from __future__ import annotations

import pytest

from metrics import RankMetrics


def step(r: RankMetrics, i: int, seconds: float, comm: float = 0.0) -> None:
    if comm:
        r.feed({"ts": i * 10**9, "kind": "span", "cat": "collective", "step": i, "dur": int(comm * 1e9)})
    r.feed({"ts": i * 10**9 + 1, "kind": "span", "cat": "step", "step": i, "dur": int(seconds * 1e9),
            "trace_id": "ab" * 16, "span_id": "cd" * 8})


def test_tflops_and_mfu_come_from_flops_per_step_over_the_step_time():
    r = RankMetrics("j", 0)
    r.feed({"ts": 1, "kind": "metric", "step": 0, "metrics": {"flops_per_step": 3e12, "peak_flops": 1e13}})
    step(r, 0, 0.5, comm=0.2)
    assert r.derived() == pytest.approx({"tflops": 6.0, "mfu": 0.6})
    assert r.collective_seconds == pytest.approx(0.2) and r.steps_total == 1
    r.feed({"ts": 2, "kind": "metric", "step": 1, "metrics": {"mfu": 0.42}})  # the job's own figure wins
    assert "mfu" not in r.derived() and r.values["mfu"] == 0.42


def test_no_flops_no_derived_gauges_and_buckets_are_cumulative_per_bucket():
    r = RankMetrics("j", 1)
    for i, s in enumerate((0.004, 0.02, 0.02, 3.0)):
        step(r, i, s)
    assert r.derived() == {}
    assert sum(r.buckets) == 4 and r.buckets[0] == 1 and r.buckets[2] == 2
    assert r.exemplars[2]["value"] == 0.02 and r.exemplars[2]["span_id"] == "cd" * 8


def test_a_rank_that_ended_cleanly_has_no_heartbeat_age(tmp_path):
    """Else every rank of every finished job would look silent until the sidecar forgets the job."""
    from metrics import StoreMetrics

    live, done = RankMetrics("j", 0), RankMetrics("j", 1)
    for r in (live, done):
        step(r, 0, 0.1)
    done.feed({"ts": 5, "kind": "log", "logger": "jobtrace.lifecycle", "msg": "stop"})
    collector = StoreMetrics(tmp_path)
    collector.ranks = {("j", 0): live, ("j", 1): done}
    ages = [s.labels["rank"] for f in collector.collect() if f.name == "jobtrace_heartbeat_age_seconds"
            for s in f.samples]
    assert done.stopped and not live.stopped and ages == ["0"]


def test_collectives_written_after_their_steps_span_still_count_for_it():
    """The compiled process-group hooks' records are drained into the batch after the step span they belong to;
    a record of an older step than the last one seen is dropped, never added to the wrong step."""
    r = RankMetrics("j", 0)
    step(r, 0, 0.5)
    for dur in (0.1, 0.05):
        r.feed({"ts": 10, "kind": "span", "cat": "collective", "step": 0, "dur": int(dur * 1e9)})
    assert r.collective_seconds == pytest.approx(0.15)
    step(r, 1, 0.5, comm=0.2)  # in order again
    r.feed({"ts": 11, "kind": "span", "cat": "collective", "step": 0, "dur": 10**9})  # late, for step 0
    assert r.collective_seconds == pytest.approx(0.2)
