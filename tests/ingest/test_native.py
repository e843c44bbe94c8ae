"""The compiled fast lane (``ingest/native``) writes exactly what the Python engine writes.

Every ingest test already compares the lane's output with the general per-line path
(:mod:`tests.ingest.paths`); these tests aim at what the lane itself reads: step lines
at the edges of the generic parser's pattern, lines that wait for a time, the hand-over
of a stream's state when a line goes back to Python, and that the lane really reads the
common lines (so that the comparisons do not compare Python with itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingest import fixtures as fx
from tests.ingest.paths import assert_paths_agree
from tests.ingest.test_plain import bench_module, plain, write

if os.environ.get("CI"):
    import jobtrace_native  # noqa: F401 - CI builds the lane: its absence must fail, not skip
else:
    pytest.importorskip("jobtrace_native")


def step(n: int, rest: str, stamp: str = "2026-01-05 12:00:00,250") -> str:
    return plain(f"step {n} {rest}", logger="__main__", stamp=stamp)


STEP_EDGES = [
    step(1, "loss 1.9802 lr 0.0003 grad_norm 1.196 time 250.0ms (data 2.0ms forward 90.0ms backward 120.0ms "
            "allreduce 30.0ms optimizer 8.0ms)"),
    step(2, "loss nan lr inf grad_norm -inf time 1.5 s"),
    step(3, "loss NaN scale Infinity time 3 ms"),
    step(4, "loss=0.5, lr=1e-5, grad_norm=2.5e+3 step_time=0.25s"),
    step(5, "loss: 0.25 tokens/s: 12000.0 data_ms 3 forward_ms 4"),
    step(6, "loss 1e-7 lr 1e16 time 10ms"),  # floats orjson writes in exponent form: given back
    step(7, "loss 0.5 forward -3ms backward 0ms time 9ms"),
    step(8, "loss 0.5 forward 1e12 s time 2ms"),
    step(9, "loss 0.5 wait_time 12.5 time 3ms"),  # a duration metric: given back
    step(10, "loss 0.5 x 1.5msx time 4ms"),
    step(11, "loss 0.5 fwd 5 secs bwd 6 sec opt 7 seconds"),
    step(12, "loss .5 lr +2 grad_norm [3] time 2.ms"),
    step(13, "loss 1.5lr 2"),
    step(14, "loss 1.5 lr"),
    step(15, "nothing to read here"),
    step(16, "loss 0.5 é time 4ms"),  # non-ASCII: given back
    step(17, "loss\t0.5\ttime\t4ms"),
    plain("iteration 18/ 100 | loss 0.5 | time 3ms", logger="__main__"),
    plain("global_step=19 loss=0.5 elapsed=0.5s", logger="__main__"),
    step(20, "loss 0.5 time 3ms", stamp="2026-01-05 12:00:01,5"),
    step(21, "loss 0.5 time 3ms", stamp="2026-01-05 12:00:02.123456789"),
]

WAITING = [
    "rank 0: tokens seen so far 32768",
    "node0:4000:4100 [0] NCCL INFO Channel 00/32 : 0 1 via P2P/IPC",
    "node0:4000:4100 [0] init.cc:1234 NCCL WARN Call to connect returned Connection refused",
    "node0:4000:4100 [0] transport.cc:55 (ncclTransportP2pSetup) NCCL WARN setup failed",
    "nodé0:4000:4100 [0] NCCL INFO non-ASCII host",
    'print with "quotes", back\\slash and é',
    "Epoch 3 starting",  # a capital that may start a head: given back
]


def test_step_lines_at_the_edges_of_the_pattern(tmp_path):
    lines = [fx.srun_label(i % 2, 1, x) for i, x in enumerate(STEP_EDGES * 2)]
    summary, out = assert_paths_agree([write(tmp_path, lines)])
    assert summary.fast_lane
    assert summary.lines_by_parser.get("generic-step", 0) >= 30


def test_lines_waiting_for_a_time_between_lane_and_python_lines(tmp_path):
    """Print and NCCL lines pend in the lane, then a traceback (a Python block) and step lines release them."""
    body: list[str] = []
    for i in range(6):
        body += WAITING[: 2 + i % 5] + [step(i, "loss 0.5 time 3ms", stamp=f"2026-01-05 12:00:0{i},250")]
        if i == 3:
            body += ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', "ValueError: x"]
        body += [plain(f"plain {i}", stamp=f"2026-01-05 12:00:0{i},500")]
    lines = [fx.srun_label(r, 1, x) for x in body for r in (0, 1)] + [fx.srun_label(2, 1, x) for x in WAITING]
    summary, _ = assert_paths_agree([write(tmp_path, lines)])
    assert summary.estimated_ts > 0 and summary.lines_by_parser.get("nccl", 0) > 0


@pytest.mark.parametrize("pending_cap", [3, 10_000])
def test_a_stream_that_never_gets_a_time(tmp_path, pending_cap):
    lines = [fx.srun_label(i % 3, 1, WAITING[i % 4]) for i in range(40)]
    assert_paths_agree([write(tmp_path, lines)], pending_cap=pending_cap)


def test_no_prefix_late_ranks_unlabelled_lines_and_a_zone(tmp_path):
    plain_file = write(tmp_path, STEP_EDGES + WAITING + STEP_EDGES, "single.log")
    late = [fx.srun_label(0, 1, x) for x in STEP_EDGES[:5]] + [x for x in WAITING[:2]] + \
           [fx.srun_label(5, 1, x) for x in STEP_EDGES] + [fx.srun_label(0, 1, plain("last"))]
    late_file = write(tmp_path, late, "late.log")
    assert_paths_agree([plain_file, late_file], tz="+05:30")


def test_the_lane_reads_the_common_lines(tmp_path, monkeypatch):
    """Guards the comparisons: on the benchmark's mixed log the lane reads nearly every line itself."""
    from ingest._engine import Ingestor

    given_back = []
    real = Ingestor._lane_give_back
    sync_read_in_python = []
    real_sync = Ingestor._sync_lines

    def spy(self, src, raw, ids, truncated, label=None):
        given_back.append(raw)
        return real(self, src, raw, ids, truncated, label)

    def sync_spy(self, src, lines, streams, points):
        lines = list(lines)
        if src.lane is not None:
            sync_read_in_python.extend(lines)
        return real_sync(self, src, lines, streams, points)

    monkeypatch.setattr(Ingestor, "_lane_give_back", spy)
    monkeypatch.setattr(Ingestor, "_sync_lines", sync_spy)
    mixed = tmp_path / "mixed.log"
    bench_module().make_log(mixed, 8000)
    summary, _ = assert_paths_agree([mixed])
    lane_lines = summary.lines - len(given_back) // 2  # two of the four runs use the lane
    assert summary.fast_lane and lane_lines > 0.9 * summary.lines
    # the alignment pass: the lane reads the generic step lines' moments, Python the others (DeepSpeed, Megatron)
    steps = summary.lines_by_parser["generic-step"]
    assert len(sync_read_in_python) // 2 < 0.3 * steps


token = st.sampled_from(["loss", "lr", "grad_norm", "time", "forward", "backward", "data", "allreduce", "x",
                         "step_time", "tokens/s", "wait_time", "fwd", "opt", "1.5", "-2", "nan", "inf", "1e3",
                         ".5", "3.", "[4]", "ms", "s", "secs", "msx", "=", ":", ",", "|", "(", ")", "é", "\t"])
step_text = st.lists(token, min_size=1, max_size=14).map(" ".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), st.one_of(step_text.map(lambda t: step(7, t)),
                                                        st.sampled_from(WAITING + STEP_EDGES))), min_size=1, max_size=25))
def test_random_step_lines(tmp_path: Path, lines):
    assert_paths_agree([write(tmp_path, [fx.srun_label(r, 1, x) for r, x in lines])])


def test_two_streams_of_one_rank_release_their_waiting_lines_in_python_order(tmp_path):
    """An srun label's stream and a torchrun-prefixed stream of the same rank share an output: the lines both
    still hold at the end of the file go out in the order the Python engine releases them (found by hypothesis)."""
    lines = ["0: [default1]:step 2 loss 1", "0: 2026-01-05 12:00:00,250 - INFO - a - ", "0: :"]
    assert_paths_agree([write(tmp_path, lines)])


def test_a_stream_that_gets_its_output_only_at_the_end_releases_in_python_order(tmp_path):
    """A stream whose only line waits for a time has no output until the end of the file, where it gets the one
    another stream (rank 3) writes to: their last lines go out in the order the Python engine releases them
    (found by hypothesis)."""
    megatron = fx.megatron_iteration(3, elapsed_ms=1000.0, when=fx.T0)
    plain_line = "2026-01-05 12:00:00,250 - INFO - a - "
    lines = ["0: " + megatron, "1: " + plain_line, "2: " + plain_line, "0", "3: " + megatron, "3: 0"]
    assert_paths_agree([write(tmp_path, lines)])


def test_a_log_without_any_time_is_read_by_the_lane(tmp_path, monkeypatch):
    """The first line of each stream (read by Python) leaves a line waiting for a time; the lane takes it over
    with the stream, so a print-only log does not go back to Python line by line."""
    from ingest._engine import Ingestor

    given_back = []
    real = Ingestor._lane_give_back

    def spy(self, src, raw, ids, truncated, label=None):
        given_back.append(raw)
        return real(self, src, raw, ids, truncated, label)

    monkeypatch.setattr(Ingestor, "_lane_give_back", spy)
    lines = [fx.srun_label(i % 4, 1, WAITING[i % 3]) for i in range(400)]
    summary, _ = assert_paths_agree([write(tmp_path, lines)])
    assert summary.estimated_ts == 400 and len(given_back) // 2 <= 8  # the first line of each of 4 streams


# ---- the literals the lane finds trigger lines by -------------------------------------------------------

_OWN_TRIGGERS = [r"(?i)\berr(?:or)?\b\s*\d", r"[Ee]xception: ", r"(?:ab){3}c", r"x{2}\d{2}[yz]", r"\bkv=\d+",
                 r"(?i)global_step|iter"]


def _literals(triggers: list[str]) -> list[bytes] | None:
    native = pytest.importorskip("jobtrace_native")
    lane = native.FastLane("srun", 0, 1 << 20, 64, [triggers], ["own"], lambda key, unit: None, [])
    return lane.filter_literals(False)


def test_the_lane_finds_trigger_lines_by_literals():
    """The built-in triggers all need a literal, so the lane scans blocks for those (not with the regular
    expression, several times slower); a trigger that can match nearly anything keeps the regular expression."""
    from ingest import IngestConfig, Ingestor

    lane = Ingestor(IngestConfig(job="lits"), lambda node, rank: None)._new_lane("srun")
    if lane is None:
        pytest.skip("the compiled lane is not built")
    main, sync = lane.filter_literals(False), lane.filter_literals(True)
    assert main is not None and sync is not None and set(sync) <= set(main)
    assert b"] NCCL " in main and b"ste" in main and b"Ste" in main  # the case-insensitive step trigger
    assert _literals([r"\d+ ms"]) == [b" ms"] and _literals([r"(?i)ok"]) == [b"OK", b"Ok", b"oK", b"ok"]
    assert _literals([r"\d+"]) is None and _literals([r"x*"]) is None and _literals([r"(?i)step|\w"]) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["err", "ERR", "Error", "or", " ", "7", "exception: ", "Exception: ", "ab", "c",
                                 "xx", "12", "y", "kv=", "3", "GLOBAL_STEP", "Iter", "iter", "_", "\t"]),
                max_size=12).map("".join))
def test_every_line_a_trigger_matches_holds_a_literal(line):
    """Sound whatever the line: where a trigger matches (Python's re, as the engine's per-line matcher), one of
    the literals the lane looks for is in the line; else the lane would read a trigger line as a plain one."""
    import re

    lits = _literals(_OWN_TRIGGERS)
    assert lits is not None
    data = line.encode()
    for t in _OWN_TRIGGERS:
        if re.search(t.encode(), data):
            assert any(lit in data for lit in lits), (t, line, lits)
