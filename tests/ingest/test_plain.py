"""The plain-line fast path writes exactly what the general per-line path writes.

Each test ingests the same input twice (``plain_fast_path`` off, then on) and compares
every sink's lines byte for byte and the summaries (see :mod:`tests.ingest.paths`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingest import fixtures as fx
from tests.ingest.paths import assert_paths_agree
from tests.ingest.test_properties import REAL

ROOT = Path(__file__).resolve().parents[2]
STAMP = "2026-01-05 12:00:00,250"


def plain(msg: str, *, level: str = "INFO", logger: str = "trainer.data", stamp: str = STAMP) -> str:
    return f"{stamp} - {level} - {logger} - {msg}"


def write(tmp_path: Path, lines: list[str] | bytes, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_bytes(lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
    return path


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "benchmarks" / "bench_ingest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Lines at the edge of the strict form: each must be read as the general path reads it.
EDGES = [
    plain("prefetched shard 1 (2 samples, 0.1 ms)"),
    plain('quoted "text" and back\\slash'),
    plain("tab\there and ctrl \x01\x1f and del \x7f"),
    plain("non-ASCII: é 中文 🙂 \u2028 \ufffd"),
    plain("  leading spaces are eaten by the layout"),
    plain("\u00a0unicode space first"),
    plain(""),
    plain("x", level="WARN"), plain("x", level="FATAL"), plain("x", level="TRACE"), plain("x", level="NOTICE"),
    plain("x", level="WARNING"), plain("x", level="ERROR"), plain("x", level="DEBUG"), plain("x", level="CRITICAL"),
    plain("x", logger="a" * 201), plain("x", logger="a" * 202), plain("x", logger="pkg:sub"), plain("x", logger="<mod>"),
    plain("x", logger="naïve"), plain("x", logger="[bracketed]"),
    plain("bad date", stamp="2026-02-30 12:00:00,250"), plain("bad hour", stamp="2026-01-05 25:00:00,250"),
    plain("leap second", stamp="2026-01-05 23:59:60,250"), plain("dot fraction", stamp="2026-01-05 12:00:00.123456789"),
    plain("one digit", stamp="2026-01-05 12:00:00,1"), plain("ten digits", stamp="2026-01-05 12:00:00,1234567890"),
    plain("no fraction", stamp="2026-01-05 12:00:00"),
    "2026-01-05 12:00:00,250 - INFO - name -  two spaces",
    "2026-01-05 12:00:00,250 - INFO - name -",
    "2026-01-05 12:00:00,250 - INFO - name - ",
    "2026-01-05 12:00:00,250 - INFO - just a message",
    "2026-01-05T12:00:00,250 - INFO - name - T separator",
    "2026-01-05 12:00:00,250Z - INFO - name - zoned",
    "12:00:01,500 - INFO - name - time only: takes the date of the line before",
    "rank 0: no timestamp, waits for one",
    plain("after a line without timestamp"),
    plain("x" * 300),
    plain("step 12 loss 1.5 time 3ms"),
    "Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
    plain("inside the traceback? no: ends it"),
    "ValueError: boom",
    plain("after the traceback"),
]


def test_edge_lines_without_prefix(tmp_path):
    assert_paths_agree([write(tmp_path, EDGES)], max_msg_chars=256)


def test_edge_lines_behind_srun_labels(tmp_path):
    lines = [fx.srun_label(i % 3, 2, line) for i, line in enumerate(EDGES)] + [fx.srun_label(1, 1, EDGES[0])]
    summary, _ = assert_paths_agree([write(tmp_path, lines)], max_msg_chars=256)
    assert {0, 1, 2} == {s["rank"] for s in summary.streams}


def test_bad_bytes_nul_and_crlf(tmp_path):
    data = (plain("ok").encode() + b"\r\n" + plain("nul \x00 inside").encode() + b"\n" + plain("").encode()
            + b"\xff\xfe latin-1 \xe9\n" + plain("half ").encode() + "é".encode()[:1] + b"\n\n   \n"
            + plain("last, no newline").encode())
    assert_paths_agree([write(tmp_path, data)])


def test_long_lines_are_cut_the_same_way(tmp_path):
    lines = [plain("a" * 5000), plain("short"), plain("é" * 3000), plain("b" * 100)]
    assert_paths_agree([write(tmp_path, lines)], max_line_bytes=4096, chunk_bytes=1024, max_msg_chars=2000)


@pytest.mark.parametrize("tz", ["UTC", "+05:30", "Europe/Paris", "America/New_York"])
def test_time_zones(tmp_path, tz):
    stamps = ["2026-03-08 01:59:59,999", "2026-03-08 02:30:00,000", "2026-03-08 03:00:00,001",
              "2026-03-29 02:30:00,000", "2026-10-25 02:30:00,000", "2026-11-01 01:30:00,000"]
    assert_paths_agree([write(tmp_path, [plain("t", stamp=s) for s in stamps])], tz=tz)


def test_benchmark_mixed_log_with_clock_alignment(tmp_path):
    """The benchmark's mixed file, split per node with node 1's clock 40 ms ahead: offsets applied the same."""
    bench = bench_module()
    mixed = tmp_path / "mixed.log"
    bench.make_log(mixed, 6000)
    summary, out = assert_paths_agree([mixed])
    assert summary.lines >= 6000 and sum(len(v) for v in out.values()) > summary.lines
    node = {0: [], 1: []}
    for line in mixed.read_text().splitlines():
        rank = int(line.split(":", 1)[0])
        node[rank // 4].append(line)
    logs = tmp_path / "nodes"
    logs.mkdir()
    for n, lines in node.items():
        if n == 1:
            lines = [line.replace(",250 - ", ",290 - ").replace(",500 - ", ",540 - ") for line in lines]
        write(logs, lines, f"node{n}.log")
    summary, _ = assert_paths_agree([logs])
    assert summary.lines == 6000 or summary.lines > 6000


def test_pdsh_and_torchrun_prefixes_take_the_general_path(tmp_path):
    pdsh = [f"worker-{i % 2}: " + plain(f"m{i}") for i in range(6)]
    tee = [fx.torchrun_tee("default", i % 2, plain(f"m{i}")) for i in range(6)]
    assert_paths_agree([write(tmp_path, pdsh, "pdsh.log"), write(tmp_path, tee, "tee.log")])


def test_without_hyperscan(tmp_path):
    assert_paths_agree([write(tmp_path, EDGES)], use_hyperscan=False)


message = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
strict_like = st.builds(plain, message, level=st.sampled_from(["INFO", "WARN", "ERROR", "DEBUG"]),
                        logger=st.sampled_from(["a", "trainer.data", "<m>", "x:y", "é"]))
any_line = st.one_of(strict_like, st.sampled_from(REAL + EDGES), message)
labelled = st.tuples(st.one_of(st.none(), st.integers(0, 3)), any_line).map(
    lambda t: t[1] if t[0] is None else fx.srun_label(t[0], 1, t[1]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(labelled, min_size=1, max_size=40))
def test_random_mixes_of_plain_and_other_lines(tmp_path, lines):
    assert_paths_agree([write(tmp_path, lines)])


def test_the_fast_path_takes_the_plain_lines(tmp_path, monkeypatch):
    """Guards the tests above against comparing the general path with itself."""
    from ingest._router import StreamRouter

    taken = []
    real = StreamRouter._plain_line

    def spy(self, src, m, raw):
        ok = real(self, src, m, raw)
        taken.append(ok)
        return ok

    monkeypatch.setattr(StreamRouter, "_plain_line", spy)
    lines = [fx.srun_label(0, 1, plain(f"m{i}")) for i in range(10)]
    assert_paths_agree([write(tmp_path, lines)])
    assert 9 == sum(taken)  # the first line of a stream creates it on the general path
