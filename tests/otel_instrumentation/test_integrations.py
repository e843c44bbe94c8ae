"""Hugging Face ``Trainer``, Lightning and DeepSpeed jobs, the real libraries on 2 gloo ranks, traced end to end with
``init_tracing()`` as the script's only line: steps, phases, the framework's loss and learning rate,
DDP's collectives, one TraceID, and a healthy verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="both frameworks train with torch")

from queries import AnalysisConfig, analyze, load_local

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


def run_job(tmp_path: Path, script: str, job: str) -> tuple[dict[int, list[dict]], str]:
    env = dict(os.environ, JOBTRACE_ROOT=str(ROOT), JOBTRACE_DATA_DIR=str(tmp_path / "data"), JOBTRACE_JOB_ID=job,
               OUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(Path(__file__).parent / script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    events: dict[int, list[dict]] = {0: [], 1: []}
    for path in (tmp_path / "data" / job).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            events[e["rank"]].append(e)
    return events, run.stdout


def check(tmp_path: Path, events: dict[int, list[dict]], stdout: str, job: str) -> None:
    assert stdout.count("auto_steps=6 on=True collectives=hooks") == 2, stdout
    for rank, own in events.items():
        steps = sorted(e["step"] for e in own if e.get("cat") == "step")
        assert steps == list(range(6)), (rank, steps)
        phases = {e["name"] for e in own if e.get("cat") == "phase"}
        assert {"data", "forward", "backward", "optimizer"} <= phases, (rank, phases)
        metrics = {e["step"]: e["metrics"] for e in own if e["kind"] == "metric" and "loss" in e.get("metrics", {})}
        assert sorted(metrics) == list(range(6)) and all(m["lr"] > 0 and m["loss"] > 0 for m in metrics.values())
        assert any(e.get("cat") == "collective" and e["name"] == "all_reduce" and e.get("step") == 3 for e in own)
    assert len({e["trace_id"] for own in events.values() for e in own}) == 1
    report = analyze(load_local(tmp_path / "data", job), AnalysisConfig())
    assert report.ranks == 2 and report.steps == 6
    assert not [f.summary for f in report.findings if f.severity in ("error", "warning")]


def test_a_hugging_face_trainer_job(tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face Trainer (jobtrace[dev])")
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate (jobtrace[dev])")
    events, stdout = run_job(tmp_path, "hf_job.py", "hf")
    check(tmp_path, events, stdout, "hf")
    assert all("grad_norm" in e["metrics"] for e in events[0] if e["kind"] == "metric" and "loss" in e["metrics"])
    assert any("transformers Trainer: world 2" in (e.get("msg") or "") for e in events[0])


def test_a_lightning_job(tmp_path):
    pytest.importorskip("lightning", reason="Lightning (jobtrace[dev])")
    events, stdout = run_job(tmp_path, "lightning_job.py", "pl")
    check(tmp_path, events, stdout, "pl")
    assert all("train_loss" in e["metrics"] for e in events[1] if e["kind"] == "metric" and "loss" in e["metrics"])


def test_a_deepspeed_job(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed (jobtrace[dev]); its CPU accelerator runs on gloo")
    events, stdout = run_job(tmp_path, "deepspeed_job.py", "ds")
    assert stdout.count("auto_steps=4 on=True collectives=hooks global_steps=4") == 2, stdout
    for rank, own in events.items():
        assert sorted(e["step"] for e in own if e.get("cat") == "step") == [0, 1, 2, 3]
        metrics = {e["step"]: e["metrics"] for e in own if e["kind"] == "metric" and "skipped_steps" in e["metrics"]}
        assert sorted(metrics) == [0, 1, 2, 3], (rank, metrics)
        for m in metrics.values():
            assert m["loss"] > 0 and m["skipped_steps"] == 0 and "overflow" not in m
        lrs = [metrics[s]["lr"] for s in range(4)]
        assert lrs == sorted(lrs) and lrs[0] < lrs[-1]  # the warm-up schedule, as DeepSpeed applied it
        assert any(e.get("cat") == "collective" and e["name"] == "all_reduce" for e in own)
    report = analyze(load_local(tmp_path / "data", "ds"), AnalysisConfig())
    assert report.ranks == 2 and report.steps == 4
    assert not [f.summary for f in report.findings if f.severity in ("error", "warning")]
