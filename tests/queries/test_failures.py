"""Failure findings from log text (issue 19): the signatures on real lines, cause versus consequence, bad input.

Every line classified here is read from an excerpt of ``tests/corpus`` (copied from a public
source, provenance beside it), never written for the test; the verdicts of whole excerpts are
checked by ``tests/test_corpus.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import IngestConfig, Ingestor, open_sink
from jobtrace.errors import JobNotFound
from queries import analyze, load_local
from queries._signatures import classify, message_rank

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def corpus_line(excerpt: str, contains: str) -> str:
    """The first line of a corpus excerpt holding ``contains``, with a launcher prefix taken off as ingest does."""
    for line in (CORPUS / excerpt).read_text(errors="replace").splitlines():
        if contains in line:
            return line
    raise AssertionError(f"{contains!r} not in {excerpt}")


@pytest.mark.parametrize(("excerpt", "contains", "kind", "rank"), [
    ("oom/qwen3-coder-174-rank3-oom-gpu3.log", "Tried to allocate", "cuda_oom", 3),
    ("collective_timeout/ace-348-perlmutter-ranks123-allreduce.log", "[Rank 3] Watchdog caught", "collective_timeout", 3),
    ("hardware/pytorch-113128-rank12-uncorrectable-ecc.log", "uncorrectable ECC", "hardware_fault", 12),
    ("exit/colossalai-3514-sigkill-local-rank3.log", "failed (exitcode: -9)", "host_oom", None),
    ("collective_timeout/pipedream-39-gloo-recv-timeout-broadcast.log", "Timed out waiting", "collective_timeout", None),
    ("nccl/megatron-792-distopt-odd-dp-ncclsystemerror.log", "ncclSystemError:", "nccl_error", None),
    ("hardware/open-gpu-kernel-modules-1150-xid45-after-nvlink-xid149-145.log", "NVRM: Xid", "hardware_fault", None),
    ("hang/pytorch-148976-barrier-mismatch-debug-detail.log", "Detected mismatch", "collective_mismatch", None),
    ("hang/llamafactory-6953-rank144-heartbeat-monitor.log", "Heartbeat monitor timed out", "hang", 144),
])
def test_a_real_failure_line_is_read_as_its_kind(excerpt, contains, kind, rank):
    line = corpus_line(excerpt, contains)
    failure = classify(line)
    assert failure is not None and failure.kind == kind, (line, failure)
    assert failure.rank == rank


def test_a_mismatch_report_names_the_rank_behind():
    """ProcessGroupWrapper: rank 1 at SequenceNumber=1, rank 2 at 0: rank 2 never made the barrier rank 1 is in."""
    failure = classify(corpus_line("hang/pytorch-148976-barrier-mismatch-debug-detail.log", "Detected mismatch"))
    assert failure is not None and failure.facts["culprits"] == [2]


def test_healthy_lines_are_not_failures():
    """Every line of every healthy excerpt of the corpus: not one is read as a failure."""
    import json

    for meta in sorted(CORPUS.glob("*/*.json")):
        if not json.loads(meta.read_text())["healthy"]:
            continue
        for line in meta.with_suffix(".log").read_text(errors="replace").splitlines():
            assert classify(line) is None, (meta.stem, line)


def _report(tmp_path: Path, *paths: Path):
    Ingestor(IngestConfig(job="j"), open_sink("local", "j", data_dir=tmp_path / "store")).run([str(p) for p in paths])
    return analyze(load_local(tmp_path / "store", "j"))


def test_the_first_cause_leads_and_its_consequences_follow(tmp_path):
    """ms-swift#5943: rank 15 runs out of GPU memory; rank 12's exception comes after: the OOM is the root cause."""
    report = _report(tmp_path, CORPUS / "oom/ms-swift-5943-rlhf-rank15-oom-gpu7.log")
    first = report.findings[0]
    assert (first.kind, first.ranks, first.severity) == ("cuda_oom", [15], "error"), report.findings
    assert first.details["facts"]["gpu"] == 7 and first.details["root_cause"]
    rest = [f for f in report.findings[1:] if f.details.get("consequence_of")]
    assert rest and all(f.severity == "warning" and f.details["consequence_of"] == "cuda_oom" for f in rest)
    assert not report.healthy


def test_ranks_that_timed_out_in_different_collectives_are_a_mismatch(tmp_path):
    """axolotl#1495: ranks 1, 5, 6 time out in ALLREDUCE SeqNum 13807 with NumelIn 11274112, rank 7 with 10942336."""
    report = _report(tmp_path, CORPUS / "collective_timeout/axolotl-1495-qwen-moe-rank7-numel-differs.log")
    mismatch = [f for f in report.findings if f.kind == "collective_mismatch"]
    assert [f.ranks for f in mismatch] == [[7]], report.findings
    timeouts = [f for f in report.findings if f.kind == "collective_timeout"]
    assert timeouts and timeouts[0].ranks == [1, 5, 6, 7]  # one grouped finding, not one line per rank


def test_a_rank_the_log_never_names_stays_unknown(tmp_path):
    """An OOM in a console with no rank anywhere (lightning#18134) is reported for rank ?, never rank 0."""
    report = _report(tmp_path, CORPUS / "oom/lightning-18134-zero3-offload-falcon40b.log")
    oom = [f for f in report.findings if f.kind == "cuda_oom"]
    assert oom and oom[0].ranks == [] and "rank ?" in oom[0].summary


@pytest.mark.parametrize("content", [os.urandom(64 * 1024), b"hello\nworld\n", b"\x00\xff" * 5000 + b"\n"])
def test_bad_input_gives_no_finding_above_info(tmp_path, content):
    """Junk is skipped and counted, or read as plain log lines: never a failure, a straggler or a hang."""
    path = tmp_path / "junk.log"
    path.write_bytes(content)
    summary = Ingestor(IngestConfig(job="j"), open_sink("local", "j", data_dir=tmp_path / "store")).run([str(path)])
    assert summary.lines == summary.parsed + summary.skipped_total
    if summary.parsed == 0:  # nothing readable: the store has no job, and loading says so
        with pytest.raises(JobNotFound):
            load_local(tmp_path / "store", "j")
        assert summary.skipped_total == summary.lines > 0
        return
    report = analyze(load_local(tmp_path / "store", "j"))
    assert [f for f in report.findings if f.severity != "info"] == [], report.findings


# launcher and paste prefixes; a launcher's ``[rankN]:`` names the same rank as the message
_PREFIX = st.sampled_from(["", "[rank{r}]:", "[default3]:", "12: ", "worker-1: ", "2024-01-01 00:00:00 ", "> "])


@settings(max_examples=200, deadline=None)
@given(prefix=_PREFIX, rank=st.integers(0, 4095), noise=st.text(max_size=40))
def test_a_rank_in_the_message_is_read_whatever_surrounds_it(prefix, rank, noise):
    text = (f"{prefix.format(r=rank)}[E ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: {noise}")
    assert message_rank(text) == rank


@settings(max_examples=200, deadline=None)
@given(pg=st.integers(1, 64), rank=st.integers(0, 4095))
def test_a_rank_in_another_process_group_is_not_taken_for_the_global_rank(pg, rank):
    assert message_rank(f"[PG {pg} Rank {rank}] Exception (either an error or timeout) detected by watchdog") is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_classify_takes_any_text(text):
    failure = classify(text)
    assert failure is None or failure.kind in {"cuda_oom", "hardware_fault", "collective_mismatch", "hang",
                                               "collective_timeout", "nccl_error", "process_exit", "host_oom",
                                               "python_exception", "peer_lost"}
