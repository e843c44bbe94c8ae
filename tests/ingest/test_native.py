"""The compiled fast lane (``native/``) writes exactly what the Python engine writes.

Every ingest test already compares the lane's output with the general per-line path
(:mod:`tests.ingest.paths`); these tests aim at what the lane itself reads: step lines
at the edges of the generic parser's pattern, lines that wait for a time, the hand-over
of a stream's state when a line goes back to Python, and that the lane really reads the
common lines (so that the comparisons do not compare Python with itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingest import fixtures as fx
from tests.ingest.paths import NOT_BUILT, assert_paths_agree
from tests.ingest.test_plain import bench_module, plain, write

if os.environ.get("CI"):
    import jobtrace_native  # noqa: F401 - CI builds the lane: its absence must fail, not skip
else:
    pytest.importorskip("jobtrace_native", reason=NOT_BUILT)


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
    from ingest._align_pass import AlignPass
    from ingest._lane import LaneDriver

    given_back = []
    real = LaneDriver.give_back
    sync_read_in_python = []
    real_sync = AlignPass._sync_lines

    def spy(self, src, raw, ids, truncated, label=None):
        given_back.append(raw)
        return real(self, src, raw, ids, truncated, label)

    def sync_spy(self, src, lines, streams, points):
        lines = list(lines)
        if src.lane is not None:
            sync_read_in_python.extend(lines)
        return real_sync(self, src, lines, streams, points)

    monkeypatch.setattr(LaneDriver, "give_back", spy)
    monkeypatch.setattr(AlignPass, "_sync_lines", sync_spy)
    mixed = tmp_path / "mixed.log"
    bench_module().make_log(mixed, 8000)
    summary, _ = assert_paths_agree([mixed])
    lane_lines = summary.lines - len(given_back) // 2  # two of the four runs use the lane
    assert summary.fast_lane and lane_lines > 0.9 * summary.lines
    assert not [x for x in given_back if b"{'" in x]  # the Trainer's metric dicts (see the tests below)
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
    from ingest._lane import LaneDriver

    given_back = []
    real = LaneDriver.give_back

    def spy(self, src, raw, ids, truncated, label=None):
        given_back.append(raw)
        return real(self, src, raw, ids, truncated, label)

    monkeypatch.setattr(LaneDriver, "give_back", spy)
    lines = [fx.srun_label(i % 4, 1, WAITING[i % 3]) for i in range(400)]
    summary, _ = assert_paths_agree([write(tmp_path, lines)])
    assert summary.estimated_ts == 400 and len(given_back) // 2 <= 8  # the first line of each of 4 streams


# ---- the literals the lane finds trigger lines by -------------------------------------------------------

_OWN_TRIGGERS = [r"(?i)\berr(?:or)?\b\s*\d", r"[Ee]xception: ", r"(?:ab){3}c", r"x{2}\d{2}[yz]", r"\bkv=\d+",
                 r"(?i)global_step|iter", r"error_count=\d"]  # the last one's literal holds the first one's


def _own_lane(triggers: list[list[str]], sync: tuple[int, ...] = ()):
    native = pytest.importorskip("jobtrace_native", reason=NOT_BUILT)
    return native.FastLane("srun", 0, 1 << 20, 64, triggers, [f"p{i}" for i in range(len(triggers))],
                           lambda key, unit: None, list(sync))


def _literals(triggers: list[str]) -> list[bytes] | None:
    return _own_lane([triggers]).filter_literals(False)


def test_the_lane_finds_trigger_lines_by_literals():
    """The built-in triggers all need a literal, so the lane scans blocks for those (not with the regular
    expression, several times slower); a trigger that can match nearly anything keeps the regular expression."""
    from ingest import IngestConfig, Ingestor

    lane = Ingestor(IngestConfig(job="lits"), lambda node, rank: None)._lanes.new_lane("srun")
    if lane is None:
        pytest.skip(reason=NOT_BUILT)
    main, sync = lane.filter_literals(False), lane.filter_literals(True)
    assert main is not None and sync is not None and set(sync) <= set(main)
    assert b"] NCCL " in main and b"ste" in main and b"Ste" in main  # the case-insensitive step trigger
    assert _literals([r"\d+ ms"]) == [b" ms"] and _literals([r"(?i)ok"]) == [b"OK", b"Ok", b"oK", b"ok"]
    assert _literals([r"\d+"]) is None and _literals([r"x*"]) is None and _literals([r"(?i)step|\w"]) is None


def test_a_torchrun_prefix_names_the_stream_of_a_given_back_line(tmp_path):
    """Found by hypothesis: in an srun file, ``[rank0]:`` (no srun label) is rank 0's line, so its stream is srun
    label 0's, which the lane holds with a line waiting for a time; the lane gives the bracketed line back and must
    hand over that stream (not the unlabelled one) first, or the waiting line is written after it. The same for a
    torchrun rank that differs from the srun label, and a ``[default2]:`` local-rank stream the lane never holds."""
    megatron = ("0:  [2026-01-05 12:00:00.000000] iteration        3/    1000 | consumed samples:            0 | "
                "elapsed time per iteration (ms): 1000.0 | learning rate: 1.500000E-04 | global batch size:   256 | "
                "lm loss: 2.000000E+00 | loss scale: 1.0 | grad norm: 1.250 | number of skipped iterations:   0 | "
                "number of nan iterations:   0 |")
    watchdog = ("[E105 12:00:00.123456789 ProcessGroupNCCL.cpp:1] [Rank 0] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=5, NumelOut=5, Timeout(ms)=10) ran for 11 "
                "milliseconds before timing out.")
    for prefix in ("[rank0]:", "0: [rank0]:", "1: [rank0]:", "[default2]:", "0: [default0]:"):
        lines = [megatron, "0:   forward-backward:", prefix + watchdog, "1:   waiting", "0: " + plain("after")]
        summary, _ = assert_paths_agree([write(tmp_path, lines)])
        assert summary.fast_lane


def test_per_rank_files_share_one_compiled_lane(tmp_path, monkeypatch):
    """A job's logs as one file per rank (some with srun labels, some without): the triggers are compiled once per
    prefix mode, every other file's lane is a fresh one sharing them, and the output is still the Python engine's,
    byte for byte, each file's state its own."""
    import ingest._lane

    if ingest._lane.lane_module() is None:
        pytest.skip(reason=NOT_BUILT)
    compiled: list[str] = []
    real = ingest._lane.new_lane

    def counted(mode, *args):
        compiled.append(mode)
        return real(mode, *args)

    monkeypatch.setattr(ingest._lane, "new_lane", counted)
    mixed = tmp_path / "mixed.log"
    bench_module().make_log(mixed, 6000)
    lines = mixed.read_bytes().split(b"\n")
    paths = []
    for k in range(6):
        part = lines[k * 1000:(k + 1) * 1000]
        if k % 2:  # without the srun labels: another prefix mode, its own compiled lane
            part = [x.split(b": ", 1)[-1] for x in part]
        paths.append(tmp_path / f"rank{k}.log")
        paths[-1].write_bytes(b"\n".join(part) + b"\n")
    summary, _ = assert_paths_agree(paths)
    assert summary.fast_lane
    assert sorted(compiled) == ["none", "srun"], compiled  # the lane runs: once per mode, for 6 files and 2 passes


def test_a_user_trigger_without_a_literal_keeps_the_regex_scan(tmp_path):
    """A user's parser whose trigger needs no literal of two bytes (it matches nearly anywhere): the lane finds
    trigger lines with the triggers themselves, gives that parser's lines back, and writes what Python writes."""
    from ingest import IngestConfig, Ingestor, MemorySink
    from ingest.parsers import _util, builtin_registry

    class Speedup:
        name = "speedup"
        triggers = (r"\d+\.\d+x",)

        def parse(self, line):
            return [{"kind": "metric", "metrics": {"speedup": float(line.text.rsplit(" ", 1)[-1].rstrip("x"))}}]

    path = tmp_path / "mix.log"
    bench_module().make_log(path, 3000)
    with path.open("a") as f:
        f.write("".join(f"{r}: 2026-01-05 12:10:00,000 - INFO - perf - speedup {r}.5x\n" for r in range(8)))
    runs = {}
    for native in (True, False):
        reg = builtin_registry()
        reg.register(Speedup())
        sinks: dict = {}
        _util.set_span_id_counter(1)
        ing = Ingestor(IngestConfig(job="own", native=native),
                       lambda n, r, sinks=sinks: sinks.setdefault((n, r), MemorySink()), reg)
        if native:
            lane = ing._lanes.new_lane("srun")
            if lane is None:
                pytest.skip(reason=NOT_BUILT)
            assert lane.filter_literals(False) is None and lane.filter_literals(True) is not None
        summary = ing.run([str(path)])
        runs[native] = (summary, {k: list(v.lines) for k, v in sinks.items()})
    assert runs[True][0].fast_lane and runs[True][0].lines_by_parser["speedup"] == 8
    assert runs[True][1] == runs[False][1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["err", "ERR", "Error", "or", " ", "7", "exception: ", "Exception: ", "ab", "c",
                                 "xx", "12", "y", "kv=", "3", "GLOBAL_STEP", "Iter", "iter", "_", "\t", "error_count="]),
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
    # and each parser's own triggers are checked where their literals are: the lane names the parsers Python does
    lane = _own_lane([[t] for t in _OWN_TRIGGERS], sync=(1, 3, 5))
    python = [i for i, t in enumerate(_OWN_TRIGGERS) if re.search(t.encode(), data)]
    assert lane.line_triggers(data) == python
    assert lane.line_triggers(data, True) == [i for i in python if i in (1, 3, 5)]


# ---- Hugging Face Trainer metric dicts -------------------------------------------------

HF_LOGS = [
    {"loss": 2.3456, "grad_norm": 1.2345678, "learning_rate": 4.5e-05, "epoch": 0.01},
    {"loss": 0.0, "grad_norm": 12.5, "learning_rate": 0.0003, "epoch": 1.0},
    {"eval_loss": 1.75, "eval_runtime": 12.3456, "eval_samples_per_second": 81.0, "eval_steps_per_second": 10.125,
     "epoch": 2.0},
    {"train_runtime": 1234.5678, "train_samples_per_second": 12.345, "train_steps_per_second": 0.772,
     "total_flos": 123456789012345.0, "train_loss": 1.8765, "epoch": 3.0},
    {"loss": -1.5, "learning_rate": 1e-05, "epoch": 0.5},  # 1e-05 and '1e-05': the smallest orjson writes plainly
    {"loss": 1, "epoch": 2},  # ints: their floats
]

# Dict lines the lane reads besides the Trainer's own: the edges of the shape it takes.
HF_EDGES = [
    "{'loss': -0, 'a': '-0', 'b': -0.0, 'c': 0}",  # the int -0 is 0.0; the string '-0' is -0.0
    "{'learning_rate': 0.5, 'lr': 0.25}",  # renamed onto a name met again: first place, last value
    "{'train/loss': 1.5E+3, 'x.y-z': '2.5e-3', '_k9': 9999999999999998.0}",
    "{'loss': 1.2345678901234567890123}",
]

# Dict lines the lane gives back (each as its trigger shows it): Python reads them its own ways.
HF_UNUSUAL = [
    "{'loss': None, 'lr': 1.0}", "{'loss': True, 'lr': 1.0}", "{'loss': nan}", "{'loss': 'nan'}",
    "{'loss': 'inf', 'grad_norm': inf}", "{'loss': 1_000}", "{'loss': 0x10}", "{'loss': 007}", "{'loss': 1e-07}",
    "{'loss': 1e16}", "{'loss': 1e999}", "{'loss': 123456789012345678901234}", "{'loss': 1.5, 'loss': 2.5}",
    "{'loss': [1, 2]}", "{'loss': {'a': 1}}", "{'loss': 'x'}", "{'a': 1, 'lo\\'ss': 1.0}", "{'loss': 1.0} tail",
    "head {'loss': 1.0}", "{'a': 1, 'lossé': 1.0}", "{'loss': +1.0}", "{'loss': 1.0, }", "{'loss': 1.0,  'lr': 2}",
    "{'loss': 1.}", "{'loss': .5}", "{'loss': 1.0} {'lr': 2.0}", "{'loss': ' 1.5'}", "{'loss': 1.0, 'step': 'a'}",
    "{'loss': 1.0}\t",
]

# Lines like dicts that no trigger names (no "{'key': " in them): prints, for the lane as for Python.
HF_PRINTS = ["{'lo\\'ss': 1.0}", "{'lossé': 1.0}", "{'loss':1.0}", '{"loss": 1.0}']


def stamp(i: int) -> str:
    return f"2026-01-05 12:{i // 60 % 60:02d}:{i % 60:02d},250"


def hf_run(dict_of, bar: bool, steps: int = 12, ranks: int = 2) -> list[str]:
    """A Trainer's output on ``ranks`` srun-labelled ranks: logging lines, a tqdm bar (if ``bar``) and a dict
    every other step; the first line of each rank is a dated one (a stream's first line is Python's)."""
    lines = []
    for i in range(steps):
        for r in range(ranks):
            mine = [plain(f"batch {i} of rank {r} begins", stamp=stamp(i))]
            if bar:
                mine.append(fx.tqdm_meter(i, steps, i * 0.25, 4.0 if i else None))
            if i % 2:
                mine.append(dict_of(HF_LOGS[i // 2 % len(HF_LOGS)]))
            lines += [fx.srun_label(r, 1, x) for x in mine]
    return lines


@pytest.fixture
def given_back(monkeypatch):
    """The lines the lane gives back to Python (only the runs that use the lane give any)."""
    from ingest._lane import LaneDriver

    got: list[str] = []
    real = LaneDriver.give_back

    def spy(self, src, raw, ids, truncated, label=None):
        got.append(raw.decode("utf-8", "replace"))
        return real(self, src, raw, ids, truncated, label)

    monkeypatch.setattr(LaneDriver, "give_back", spy)
    return got


def dicts_in(lines: list[str]) -> list[str]:
    return [x for x in lines if "{'" in x]


@pytest.mark.parametrize("dict_of", [fx.hf_logs_dict_old, fx.hf_logs_dict_new], ids=["str-floats", "4g-strings"])
@pytest.mark.parametrize("bar", [True, False], ids=["bar", "no-bar"])
def test_trainer_metric_dicts_are_read_by_the_lane(tmp_path, given_back, dict_of, bar):
    """The dicts wait for the next dated line; their step is the bar's count, else the count of loss dicts."""
    lines = hf_run(dict_of, bar)
    summary, out = assert_paths_agree([write(tmp_path, lines)])
    assert summary.fast_lane and summary.lines_by_parser["huggingface"] >= 12
    assert dicts_in(given_back) == [] and len(given_back) == 2  # the first line of each rank
    events = [orjson.loads(x) for written in out.values() for x in written]
    metrics = [e for e in events if e["kind"] == "metric" and "loss" in e["metrics"]]
    assert metrics and all(e["est"] for e in metrics)
    assert all(("attrs" in e) is (not bar) for e in metrics)


def test_trainer_metric_dicts_in_a_file_without_prefix(tmp_path, given_back):
    lines = [x.split(": ", 1)[1] for x in hf_run(fx.hf_logs_dict_old, False, ranks=1)]
    summary, _ = assert_paths_agree([write(tmp_path, lines)])
    assert summary.fast_lane and dicts_in(given_back) == [] and len(given_back) == 1


@pytest.mark.parametrize("bar", [True, False], ids=["bar", "no-bar"])
@pytest.mark.parametrize("pending_cap", [3, 10_000])
def test_trainer_metric_dicts_at_the_end_of_a_file(tmp_path, given_back, pending_cap, bar):
    """Dicts that no dated line follows: written at the stream's last time by the lane (or past the cap);
    then a rank whose last dict the lane gives back: Python writes that rank's pending lines, the lane the others'."""
    edge = [fx.hf_logs_dict_new(d) for d in HF_LOGS] + HF_EDGES
    tail = [fx.srun_label(r, 1, x) for r in (0, 1) for x in edge]
    lines = hf_run(fx.hf_logs_dict_old, bar, steps=4) + tail
    summary, _ = assert_paths_agree([write(tmp_path, lines)], pending_cap=pending_cap)
    assert dicts_in(given_back) == [] and summary.estimated_ts >= 2 * len(edge)
    given_back.clear()
    # "NaN" as a metric: a pending event the lane does not take over
    ends_in_python = lines + [fx.srun_label(2, 1, plain("rank 2")), fx.srun_label(2, 1, HF_UNUSUAL[3])]
    assert_paths_agree([write(tmp_path, ends_in_python)], pending_cap=pending_cap)
    assert dicts_in(given_back) == [fx.srun_label(2, 1, HF_UNUSUAL[3])]


def test_trainer_metric_dicts_around_lines_python_reads(tmp_path, given_back):
    """Pending dicts go to Python with their stream (a traceback, an unusual dict), and Python's pending dicts
    come back to the lane (the dict after a given-back one, and a stream's first dict, leave the lane reading)."""
    body: list[str] = []
    for i in range(8):
        body.append(plain(f"batch {i}", stamp=stamp(i)))
        if i == 5:  # given back while the lane holds nothing pending: the lane takes Python's pending dict over
            body += [HF_UNUSUAL[5], fx.hf_logs_dict_new(HF_LOGS[0]), WAITING[1]]
        body += [fx.tqdm_meter(i, 8, i * 0.5, 2.0 if i else None), fx.hf_logs_dict_old(HF_LOGS[i % len(HF_LOGS)]),
                 "rank print line"]
        if i == 3:  # while the lane holds tqdm and dict events pending: they go to Python
            body += ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', "ValueError: x"]
        body += [step(i, "loss 0.5 time 3ms", stamp=stamp(i)), plain(f"done {i}", stamp=stamp(i))]
    # rank 1's first line is a dict (Python reads it and the lane adopts what it leaves pending, before the
    # stream has an output); rank 2 reads dicts but never prints a dated line
    lines = [fx.srun_label(r, 1, x) for x in body for r in (0, 1)]
    lines.insert(0, fx.srun_label(1, 1, fx.hf_logs_dict_old(HF_LOGS[0])))
    lines += [fx.srun_label(2, 1, fx.hf_logs_dict_new(d)) for d in HF_LOGS]
    summary, _ = assert_paths_agree([write(tmp_path, lines)])
    assert summary.lines_by_parser["huggingface"] >= 30
    unusual = fx.srun_label(0, 1, HF_UNUSUAL[5])
    first_of_1, first_of_2 = fx.srun_label(1, 1, fx.hf_logs_dict_old(HF_LOGS[0])), lines[-len(HF_LOGS)]
    assert dicts_in(given_back) == [first_of_1, unusual, fx.srun_label(1, 1, HF_UNUSUAL[5]), first_of_2]


def test_unusual_dicts_are_given_back(tmp_path, given_back):
    """Each dict outside the lane's shape goes back to Python; the edges of the shape stay in the lane."""
    body = [x for u in HF_UNUSUAL + HF_EDGES + HF_PRINTS for x in (u, plain("next", stamp=stamp(1)))]
    lines = [fx.srun_label(0, 1, plain("first"))] + [fx.srun_label(0, 1, x) for x in body]
    assert_paths_agree([write(tmp_path, lines)])
    back = set(given_back)
    for u in HF_UNUSUAL:
        assert fx.srun_label(0, 1, u) in back, u
    for e in HF_EDGES + HF_PRINTS:
        assert fx.srun_label(0, 1, e) not in back, e


def test_a_long_dict_and_a_short_message_cap(tmp_path, given_back):
    """A dict longer than the message cap (the log event cuts it) or of 64 KiB or more (``_metrics`` reads it
    with ``_PAIR``) is Python's."""
    short = fx.hf_logs_dict_old(HF_LOGS[0])
    long = fx.hf_logs_dict_old({f"k{i}": i + 0.5 for i in range(5000)})
    lines = [fx.srun_label(0, 1, x) for x in [plain("first"), short, long, plain("next", stamp=stamp(2))]]
    assert_paths_agree([write(tmp_path, lines)], max_msg_chars=40)
    assert dicts_in(given_back) == [fx.srun_label(0, 1, short), fx.srun_label(0, 1, long)]
    given_back.clear()
    assert_paths_agree([write(tmp_path, lines)], max_msg_chars=1 << 17)
    assert dicts_in(given_back) == [fx.srun_label(0, 1, long)]


hf_key = st.sampled_from(["loss", "grad_norm", "learning_rate", "lr", "epoch", "eval_loss", "train_samples_per_second",
                          "train_samples_per_s", "a/b", "x.y-z", "_k", "k9"])
hf_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e4, 1e4),
                     st.sampled_from([0.0, -0.0, 1e-05, 9.99e-06, 1e16, 9999999999999998.0]))
hf_value = st.one_of(hf_float.map(repr), hf_float.map(lambda v: repr(f"{v:.4g}")), st.integers(-10**25, 10**25).map(str),
                     st.sampled_from(["None", "True", "'x'", "007", "1_0", "-0", "'-0'", "[1]", "+1.5", "1.", ".5"]))
hf_line = st.lists(st.tuples(hf_key, hf_value), min_size=1, max_size=6).map(
    lambda kv: "{" + ", ".join(f"'{k}': {v}" for k, v in kv) + "}")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), st.one_of(
    hf_line, hf_line, st.sampled_from(HF_UNUSUAL + HF_EDGES + HF_PRINTS + WAITING[:3]),
    st.integers(0, 30).map(lambda n: fx.tqdm_meter(n, 30, n * 0.5, 2.0)),
    st.integers(0, 59).map(lambda s: plain("dated", stamp=stamp(s))))), min_size=1, max_size=25))
def test_random_trainer_dicts(tmp_path: Path, lines):
    assert_paths_agree([write(tmp_path, [fx.srun_label(r, 1, x) for r, x in lines])])
