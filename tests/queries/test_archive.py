"""``jobtrace archive`` into a real S3-compatible store (SeaweedFS, built from its Go module) and ``trace-job
--backend archive`` out of it: the same findings as from the embedded store and after ``jobtrace prune``; a
tampered object, a missing job and wrong credentials are clear errors (exit 3), never a partial job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="a real torch.distributed job")
pytest.importorskip("boto3", reason="jobtrace[archive]")

from jobtrace.demo import DemoConfig, run_job
from jobtrace.store import job_dir

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


def jobtrace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobtrace.cli", *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


def findings(run: subprocess.CompletedProcess[str]) -> list[tuple]:
    assert run.returncode in (0, 1), run.stderr
    return sorted((f["kind"], tuple(f.get("ranks") or ())) for f in json.loads(run.stdout)["findings"])


def test_archive_round_trip_through_a_real_s3_store(tmp_path, seaweedfs):
    data = tmp_path / "d"
    assert run_job(DemoConfig(job_id="arch", data_dir=str(data), ranks=3, steps=30, slow_ranks=[2], slow_ms=30)) == 0
    local = findings(jobtrace("trace", "arch", "--data-dir", str(data), "--json"))
    assert any(kind in ("slow_rank", "straggler") and 2 in ranks for kind, ranks in local), local
    s3 = seaweedfs.client()
    s3.create_bucket(Bucket="training-logs")

    run = jobtrace("archive", "arch", "--to", "s3://training-logs/jobtrace", "--data-dir", str(data), env=seaweedfs.env())
    assert run.returncode == 0 and "manifest last" in run.stdout, run.stderr
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="training-logs", Prefix="jobtrace/arch/")["Contents"]}
    assert "jobtrace/arch/MANIFEST.json" in keys
    assert sum(k.endswith(".jsonl.zst") for k in keys) == 3 and any(k.endswith(".parquet") for k in keys)

    # prune the local store (raw lines go), then read the archive: the same findings every way
    time.sleep(2)
    assert jobtrace("prune", "--older-than", "1s", "--data-dir", str(data)).returncode == 0
    assert not list(job_dir(data, "arch").glob("*.jsonl"))
    assert findings(jobtrace("trace", "arch", "--data-dir", str(data), "--json")) == local
    from_archive = jobtrace("trace", "arch", "--backend", "archive", "--url", "s3://training-logs/jobtrace", "--json",
                            env=seaweedfs.env())
    assert findings(from_archive) == local

    # an object changed after the archive: refused, named
    victim = sorted(k for k in keys if k.endswith(".jsonl.zst"))[0]
    s3.put_object(Bucket="training-logs", Key=victim, Body=b"not what was archived")
    bad = jobtrace("trace", "arch", "--backend", "archive", "--url", "s3://training-logs/jobtrace", env=seaweedfs.env())
    assert bad.returncode == 3 and "does not match the archive's manifest" in bad.stderr and victim in bad.stderr
    # a job that was never archived, and the wrong secret (which never appears in the message)
    none = jobtrace("trace", "nope", "--backend", "archive", "--url", "s3://training-logs/jobtrace", env=seaweedfs.env())
    assert none.returncode == 3 and "no archived job 'nope'" in none.stderr
    wrong = jobtrace("archive", "arch", "--to", "s3://training-logs/other", "--data-dir", str(data),
                     env={**seaweedfs.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-abcdef"})
    assert wrong.returncode == 3 and "SignatureDoesNotMatch" in wrong.stderr and "wrong-secret" not in wrong.stderr
    assert jobtrace("archive", "arch", "--to", "http://x/y", "--data-dir", str(data)).returncode == 3
