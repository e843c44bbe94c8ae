"""Bare torchrun names no run (``TORCHELASTIC_RUN_ID=none``): two real runs on the same port must still get
two job ids, and every rank of one run the same id and TraceID (a nonce through torchrun's agent store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torchrun is torch's")

from tests.servers.base import free_port

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


def bare_run(out: Path, port: int) -> list[dict]:
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBTRACE_")}
    env.update(JOBTRACE_ROOT=str(ROOT), OUT_DIR=str(out), JOBTRACE_DATA_DIR=str(out / "data"), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=3",
                          f"--master-port={port}", str(Path(__file__).parent / "runid_job.py")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


def test_two_bare_torchrun_runs_on_one_port_are_two_jobs(tmp_path):
    port = free_port()
    first, second = bare_run(tmp_path / "a", port), bare_run(tmp_path / "b", port)
    for run in (first, second):
        assert len({r["job"] for r in run}) == 1 and len({r["trace"] for r in run}) == 1
        assert run[0]["job"].startswith("job-") and "nonce" in run[0]["warnings"][0]
    assert first[0]["job"] != second[0]["job"] and first[0]["trace"] != second[0]["trace"]
    # the part derived from the address is the same: only the run's nonce differs
    assert first[0]["job"].rsplit("-", 1)[0] == second[0]["job"].rsplit("-", 1)[0]
