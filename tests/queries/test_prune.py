"""``jobtrace prune``: a real job's raw lines go, ``trace-job`` says the same from what is left.

The job is the demo's under torchrun with a hung rank. One rank's segment is removed, as if it had been
SIGKILLed before writing it, so prune must write it first. The cut-off is seconds, not days (file
times are left as the ranks wrote them: a segment is named after its file's length and mtime); a second, recent job and a
file with a torn last line show what prune leaves alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="a real torch.distributed job")

from jobtrace.demo import DemoConfig, run_job
from jobtrace.store import job_dir

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


def jobtrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobtrace.cli", *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def verdict(data: Path, job: str) -> list[tuple]:
    run = jobtrace("trace", job, "--data-dir", str(data), "--json", "--stall-threshold", "5")
    assert run.returncode in (0, 1), run.stderr
    report = json.loads(run.stdout)
    return sorted((f["kind"], tuple(f.get("ranks") or ())) for f in report["findings"])


def test_prune_keeps_the_verdict_and_frees_the_lines(tmp_path):
    data = tmp_path / "d"
    assert run_job(DemoConfig(job_id="old", data_dir=str(data), ranks=3, steps=12, hang_rank=1, hang_step=6,
                              stall_s=4.0)) != 0
    old = job_dir(data, "old")
    victim = sorted(old.glob("*.jsonl"))[1]
    for f in old.glob(victim.name + ".*.parquet"):
        f.unlink()  # as if SIGKILLed before its exit wrote the segment
    torn = job_dir(data, "torn")
    shutil.copytree(old, torn)
    for f in torn.glob("*.parquet"):
        f.unlink()
    with open(sorted(torn.glob("*.jsonl"))[0], "ab") as fh:
        fh.write(b'{"ts":1,"kind":"log"')  # a torn last line: no segment can stand for that file
    before = verdict(data, "old")
    assert ("stalled_rank", (1,)) in before or any(k == "stalled_rank" for k, _ in before), before
    lines_bytes = sum(f.stat().st_size for f in old.glob("*.jsonl"))
    without_segment = [f for f in old.glob("*.jsonl") if not list(old.glob(f.name + ".*.parquet"))]
    assert without_segment == [victim]
    time.sleep(3)
    recent = job_dir(data, "recent")
    shutil.copytree(old, recent)
    for f in recent.iterdir():
        os.utime(f)  # written just now

    dry = jobtrace("prune", "--older-than", "2s", "--data-dir", str(data), "--dry-run")
    assert dry.returncode == 0 and "would free" in dry.stdout and list(old.glob("*.jsonl"))

    run = jobtrace("prune", "--older-than", "2s", "--data-dir", str(data))
    assert run.returncode == 0, run.stderr
    assert "2 job(s) pruned, 1 more recent left alone" in run.stdout, run.stdout
    assert "3 segment(s) written" in run.stdout  # old's victim, and torn's two whole files
    assert not list(old.glob("*.jsonl")) and list(old.glob("*.jsonl.*.parquet"))
    freed = float(run.stdout.split("freed ")[1].split(" MB")[0])
    assert freed >= lines_bytes / 1e6 - 0.1
    assert verdict(data, "old") == before  # the same report from the segments alone
    assert len(list(recent.glob("*.jsonl"))) == 3  # recent: untouched
    kept = list(torn.glob("*.jsonl"))
    assert len(kept) == 1 and "torn or invalid line" in run.stderr and kept[0].name in run.stderr
    assert verdict(data, "torn") == before  # nothing of it lost either


def test_bad_durations_are_usage_errors(tmp_path):
    for bad in ("-3d", "0", "7y", "soon"):
        run = jobtrace("prune", "--older-than", bad, "--data-dir", str(tmp_path))
        assert run.returncode == 2 and "duration" in run.stderr.lower() or "above zero" in run.stderr, (bad, run.stderr)
