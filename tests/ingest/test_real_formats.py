"""Formats read from the real logs in tests/corpus: apex loss scaling, mmengine, torchelastic summaries, mpirun tags.

Each test reads an excerpt copied from a public issue (its provenance is in the excerpt's ``.json``), never a
line rebuilt from a format string.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def _lines(rel: str) -> list[str]:
    return (CORPUS / rel).read_text(encoding="utf-8").splitlines()


def test_apex_overflow_skips_become_overflow_metrics_with_the_new_scale(ingest_files):
    summary, cap = ingest_files({"console.log": _lines("health/apex-overflow-cascade-to-half.log")})
    assert summary.lines_by_parser.get("apex") == 17
    skips = [e["metrics"] for e in cap.of("metric") if e["metrics"].get("overflow")]
    assert [m["loss_scale"] for m in skips] == [32768.0 / 2**i for i in range(17)]  # 32768 down to 0.5
    assert len(cap.of("log", level="WARNING")) == 17


def test_apex_nan_input_warning_is_a_marked_record(ingest_files):
    _, cap = ingest_files({"console.log": _lines("health/apex-loss-scale-denormal-nan-input.log")})
    marked = [e for e in cap.of("log") if (e.get("attrs") or {}).get("nonfinite")]
    assert len(marked) == 2
    scales = [e["metrics"]["loss_scale"] for e in cap.of("metric") if e["metrics"].get("overflow")]
    assert scales[-1] == 1.265e-321 and len(scales) == 10  # denormal scales are numbers, not skipped lines


def test_mmengine_epoch_lines_give_steps_metrics_and_nan_grad_norms(ingest_files):
    summary, cap = ingest_files({"console.log": _lines("health/xtuner-mmengine-grad-norm-nan.log")})
    assert summary.lines_by_parser.get("mmengine") == 6
    mets = {e["step"]: e["metrics"] for e in cap.of("metric")}
    assert sorted(mets) == [200, 210, 220, 230, 240, 250]  # epoch 1: the step is the iteration
    assert mets[200]["loss"] == 2.7522 and mets[200]["grad_norm"] == 3.0608 and mets[200]["lr"] == 1.9870e-04
    assert mets[240]["grad_norm"] == "NaN" and mets[240]["loss"] == 2.5128
    spans = {s["step"]: s for s in cap.of("span", cat="step")}
    assert spans[200]["dur"] == 2_890_600_000  # "time: 2.8906" is the step's duration


def test_mmengine_later_epochs_count_on_and_validation_is_no_step(ingest_files):
    # open-mmlab/mmaction2 docs/en/advanced_guides/customize_logging.md shows the epoch form; the second
    # epoch's and the val line's numbers are changed here only in the bracket, to check the arithmetic
    line = ("08/21 02:58:41 - mmengine - INFO - Epoch(train) [2][10/25]  lr: 1.0000e-02  eta: 0:00:00  time: 0.0019  "
            "data_time: 0.0004  loss1: 0.8381  loss2: 0.9007  loss: 1.7388")
    val = "08/21 02:58:42 - mmengine - INFO - Epoch(val) [2][10/25]    eta: 0:00:00  time: 0.0019  data_time: 0.0004"
    _, cap = ingest_files({"console.log": [line, val]})
    assert [e["step"] for e in cap.of("metric")] == [35]  # (2 - 1) * 25 + 10


def test_a_torchelastic_summary_cut_above_its_root_cause_is_still_read(ingest_files):
    # the excerpt starts after the summary's "====" rule and title, at "<NO_OTHER_FAILURES>"
    _, cap = ingest_files({"console.log": _lines("exit/bridge-llm-1-sft-rank1-sigabrt.log")})
    (ev,) = [e for e in cap.of("log") if (e.get("attrs") or {}).get("exit_code") is not None]
    a = ev["attrs"]
    assert (a["rank"], a["local_rank"], a["exit_code"], a["root_cause"]) == (1, 1, -6, True)
    assert a["host"] == "user-Rack-Server" and a["pid"] == 2195196


def test_a_summary_whose_lines_carry_a_harness_stream_label_is_read(ingest_files):
    # accelerate test prints the child's stderr as "stderr: <line>"
    _, cap = ingest_files({"console.log": _lines("exit/accelerate-1473-accelerate-test-rank1-exitcode1.log")})
    exits = [e["attrs"] for e in cap.of("log") if (e.get("attrs") or {}).get("exit_code") is not None]
    assert [(a["rank"], a["exit_code"], a["root_cause"]) for a in exits] == [(1, 1, True)]


def test_mpirun_tags_name_the_rank_after_a_timestamp_or_alone(ingest_files):
    # nccl-957: "--timestamp-output --tag-output" lines of ranks 0 and 3; horovod-1442: "[1,0]<stderr>:" alone
    summary, cap = ingest_files({"console.log": _lines("nccl/nccl-957-megatron-mpi-cuda-invalid-argument.log")})
    warns = [e for e in cap.of("log") if e.get("logger") == "nccl" and "invalid argument" in e["msg"]]
    assert sorted(e["rank"] for e in warns) == [0, 3]
    assert not any("<stdout>" in e["msg"] for e in cap.of("log"))
    _, cap = ingest_files({"other.log": _lines("hang/horovod-1442-stall-inspector-rank4.log")})
    tagged = [e for e in cap.of("log") if "Stalled ranks" in e["msg"] or "horovod_allreduce" in e["msg"]]
    assert tagged and all(e["rank"] == 0 and not e["msg"].startswith("[1,0]") for e in tagged)
