"""A real torch.distributed job without jobtrace, its text logs ingested, and trace-job's verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

from ingest import IngestConfig, Ingestor, open_sink
from queries import analyze, load_local
from tests.conftest import python_env

pytestmark = pytest.mark.torchjob
SCRIPT = Path(__file__).with_name("plain_train.py")


def test_slow_rank_of_an_uninstrumented_job_is_named_from_its_logs(tmp_path):
    """torchrun --tee output of 3 gloo ranks (rank 1 sleeps 40 ms a step) is ingested; the analysis names rank 1."""
    log = tmp_path / "job.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3", "--tee=3",
           f"--log-dir={tmp_path / 'torchrun'}", "--monitor-interval=0.5", str(SCRIPT), "--steps=12",
           "--slow-rank=1", "--slow-ms=40"]
    with open(log, "wb") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=python_env(), timeout=180).returncode
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert "[default1]:" in text and "jobtrace" not in text

    summary = Ingestor(IngestConfig(job="plain"), open_sink("local", "plain", data_dir=tmp_path / "store")).run([str(log)])
    assert summary.lines == summary.parsed + summary.skipped_total
    assert not summary.parser_errors
    assert {0, 1, 2} == {s["rank"] for s in summary.streams}

    report = analyze(load_local(tmp_path / "store", "plain"))
    assert (3, 12) == (report.ranks, report.steps)
    slow = [f for f in report.findings if f.kind == "slow_rank"]
    assert [[1]] == [f.ranks for f in slow], report.findings
    assert "all_reduce" == slow[0].details["others_wait_op"]
