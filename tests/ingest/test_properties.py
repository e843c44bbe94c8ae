"""No input crashes a parser or the ingest, and every line is either parsed or counted as skipped."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import IngestConfig, Ingestor, Line, MemorySink, StreamState
from ingest.parsers import builtin_registry
from tests.ingest import fixtures as fx

REAL = [
    fx.megatron_iteration(3, losses={"lm loss": 2.0}),
    *fx.megatron_timers_all({"forward-backward": {0: 1.0, 1: 2.0}}),
    *fx.megatron_timers_minmax({"optimizer": (1.0, 2.0)}),
    fx.megatron_straggler(fx.T0, ((1.0, 1), (2.0, 0)), ((3.0, 1), (4.0, 0))),
    fx.deepspeed_logger(fx.T0, "INFO", "engine.py", 1, "f", fx.deepspeed_log_dist(0, fx.deepspeed_progress(
        5, 0, [0.1], [(0.9, 0.99)]))),
    fx.deepspeed_timers({"fwd": 1.0, "bwd": 2.0, "bwd_allreduce": 1.0, "step": 0.5}),
    fx.deepspeed_throughput(0, 1, 1, 2.0, 3.0, 1.0, 2.0),
    fx.deepspeed_overflow(0, 1024, 512),
    fx.hf_logs_dict_old({"loss": 1.5, "learning_rate": 1e-4, "epoch": 0.5}),
    fx.hf_logs_dict_new({"loss": 1.5, "grad_norm": 2.0}),
    fx.tqdm_meter(3, 10, 3.0, 1.0),
    fx.nccl_info("h", 1, 2, 0, "Init COMPLETE"),
    fx.nccl_warn("h", 1, 2, 0, "net.cc", 3, "f", "oops", when=fx.T0),
    fx.c10_log_prefix(0, "E", fx.T0, "ProcessGroupNCCL.cpp", 1) + fx.nccl_watchdog(0, 3, "ALLREDUCE", 5, 10, 11),
    fx.cuda_oom("1.00 GiB", 0, "2.00 GiB", "0 bytes", 1, "2.00 GiB", "1.00 GiB", "0.50 GiB"),
    "Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: x",
    "============================================================", "train.py FAILED",
    "2026-01-05 12:00:00,123 - INFO - __main__ - step 4 loss 0.5 time 12ms forward 3ms allreduce 2ms",
    fx.srun_label(3, 2, "INFO:root:step 1 loss 2"), fx.torchrun_tee("default", 1, "step 2 loss 1"),
    "host-1: [Rank 3] step=7, skipped=0, lr=[0.1], mom=[(0.9, 0.999)]",
]

line_text = st.one_of(
    st.sampled_from(REAL),
    st.sampled_from(REAL).flatmap(lambda s: st.integers(0, len(s)).map(lambda i: s[:i])),  # truncated
    st.text(max_size=200),
    st.sampled_from(REAL).flatmap(lambda s: st.text(max_size=30).map(lambda t: s + t)),
)
encoded = st.one_of(
    line_text.map(lambda s: s.encode("utf-8", "surrogatepass")),
    line_text.map(lambda s: s.encode("latin-1", "replace")),
    line_text.map(lambda s: s.encode("utf-16", "surrogatepass")),
    st.binary(max_size=300),
)
separators = st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n"])


def ingest_bytes(tmp_path, data: bytes, **cfg):
    path = tmp_path / "input.log"
    path.write_bytes(data)
    sinks = []

    def factory(node, rank):
        sinks.append(MemorySink())
        return sinks[-1]

    cfg.setdefault("job", "prop")
    summary = Ingestor(IngestConfig(**cfg), factory).run([str(path)])
    return summary, sinks


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class TestNoInputCrashes:
    @SETTINGS
    @given(st.lists(st.tuples(encoded, separators), max_size=40), st.booleans())
    def test_every_line_is_parsed_or_skipped(self, tmp_path, parts, use_hyperscan):
        """Random, truncated, mis-encoded and real lines: the ingest finishes, counts add up, no parser raises."""
        data = b"".join(p + sep for p, sep in parts)
        summary, sinks = ingest_bytes(tmp_path, data, use_hyperscan=None if use_hyperscan else False)
        assert summary.lines == summary.parsed + summary.skipped_total
        assert {} == summary.parser_errors
        expected = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        assert summary.lines == expected.count(b"\n") + (0 if expected.endswith(b"\n") or not expected else 1)

    @SETTINGS
    @given(st.binary(min_size=0, max_size=5000))
    def test_random_bytes(self, tmp_path, data):
        summary, _ = ingest_bytes(tmp_path, data)
        assert summary.lines == summary.parsed + summary.skipped_total
        assert {} == summary.parser_errors

    @settings(max_examples=40, deadline=None)
    @given(line_text)
    def test_each_parser_directly(self, text):
        """Every built-in parser takes any text (and any follow-up lines of a block) without raising."""
        state = StreamState("s", "n", 0, 0)
        for parser in builtin_registry().parsers():
            res = parser.parse(Line(text, text, 1, None, None, state))
            if hasattr(res, "feed"):
                for follow in (text, "", "  " + text, "=" * 60):
                    if res.feed(follow, Line(follow, follow, 2, None, None, state)) != 0:
                        break
                res.finish()


@pytest.mark.parametrize("native", [False, None])
def test_one_megabyte_lines_are_kept_and_longer_ones_cut(tmp_path, native):
    """A 1 MB line is one line (its message capped, counted as such); a line over max_line_bytes is cut, counted
    once with its whole length, and memory stays bounded; in both engines."""
    big = b"x" * (1 << 20)
    data = b"INFO:root:" + big + b"\nstep 1 loss 2 time 3ms\n" + b"y" * (3 << 20) + b"\nlast\n"
    summary, sinks = ingest_bytes(tmp_path, data, max_line_bytes=2 << 20, chunk_bytes=1 << 18, native=native)
    assert 4 == summary.lines == summary.parsed
    assert 1 == summary.truncated_lines and [{"source": str(tmp_path / "input.log"), "bytes": 3 << 20}] == summary.cut_lines
    assert 1 == summary.messages_cut
    assert max(len(line) for s in sinks for line in s.lines) < 200_000
    assert [b"last"] == [orjson.loads(line)["msg"].encode() for s in sinks for line in s.lines
                         if orjson.loads(line).get("msg") == "last"]


@pytest.mark.parametrize("engine", ["python", "auto"])
def test_a_50_megabyte_line_is_read_in_bounded_memory(tmp_path, engine):
    """The command on a log with one 50 MB line (a printed tensor): its head kept, the line counted once with its
    length, the lines around it read, and the process never holds the line (peak RSS far below 50 MB more than
    an ordinary ingest's)."""
    import subprocess
    import sys

    def peak(data: bytes, name: str) -> tuple[int, dict]:
        path = tmp_path / f"{name}.log"
        path.write_bytes(data)
        # VmHWM, not getrusage: that one keeps the high-water mark of the forked test process across exec
        code = ("import runpy, sys; sys.argv = ['jobtrace'] + sys.argv[1:]\n"
                "try:\n    runpy.run_module('jobtrace.cli', run_name='__main__')\n"
                "finally:\n    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
                "    print('maxrss', hwm, file=sys.stderr)")
        res = subprocess.run([sys.executable, "-c", code, "ingest", str(path), "--job", name, "--data-dir",
                              str(tmp_path / "s"), "--json", "--engine", engine], capture_output=True, timeout=600)
        assert res.returncode == 0, res.stderr
        rss = int(res.stderr.decode().rsplit("maxrss", 1)[1].split()[0])
        return rss, orjson.loads(res.stdout)

    head = b"2026-01-01 00:00:00,000 INFO train: step 1 loss 2.0 time 3 ms\n"
    tail = b"\n2026-01-01 00:00:01,000 INFO train: step 2 loss 1.9 time 3 ms\n"
    small_rss, _ = peak(head + b"7" * 1000 + tail, "small")
    tensor = b"tensor([" + b"0.1234, " * (50 * (1 << 20) // 8) + b"])"
    big_rss, summary = peak(head + tensor + tail, "big")
    assert summary["lines"] == 3 and summary["truncated_lines"] == 1
    assert summary["cut_lines"][0]["bytes"] == len(tensor)
    assert summary["events"]["metric"] == 2  # both step lines, around it
    assert big_rss - small_rss < 30 * 1024, (small_rss, big_rss)  # KiB: well under the line's 50 MB


def test_a_parser_that_raises_is_counted_and_the_line_kept(tmp_path):
    from ingest import ParserRegistry

    class Broken:
        name = "broken"
        triggers = ("boom",)

        def parse(self, line):
            raise RuntimeError("bug")

    reg = builtin_registry()
    reg.register(Broken(), first=True)
    path = tmp_path / "x.log"
    path.write_text("boom 1\nok\n")
    sinks = []
    summary = Ingestor(IngestConfig(job="j"), lambda n, r: sinks.append(MemorySink()) or sinks[-1], reg).run([str(path)])
    assert {"broken": 1} == summary.parser_errors and 2 == summary.parsed
    assert 2 == sum(len(s.lines) for s in sinks)
    assert isinstance(reg, ParserRegistry)


def test_mixed_fixture_file_has_no_skips_beyond_blank_lines(tmp_path):
    lines = REAL + [fx.megatron_iteration(i, when=fx.T0 + timedelta(seconds=i)) for i in range(5)]
    summary, _ = ingest_bytes(tmp_path, ("\n".join(lines) + "\n").encode())
    assert 0 == summary.skipped_total - summary.skipped.get("progress bar start", 0)
