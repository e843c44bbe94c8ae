"""Launchers that name no run: bare torchrun (``TORCHELASTIC_RUN_ID=none``), the DeepSpeed launcher and ranks
started by hand with ``MASTER_ADDR``/``MASTER_PORT``. Two real runs on the same port must still get two job
ids, and every rank of one run the same id and TraceID: a nonce through torchrun's agent store, or through
the store rank 0 serves early and torch's ``env://`` rendezvous then reuses (the job's all-reduce proves it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the launchers are torch's and DeepSpeed's")

from tests.servers.base import free_port

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]
JOB = str(Path(__file__).parent / "runid_job.py")
RANKS = 3


def _env(out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBTRACE_", "TORCHELASTIC_"))}
    env.update(JOBTRACE_ROOT=str(ROOT), OUT_DIR=str(out), JOBTRACE_DATA_DIR=str(out / "data"), OMP_NUM_THREADS="1")
    return env


def _launch(launcher: str, out: Path, port: int) -> None:
    env = _env(out)
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={RANKS}",
               f"--master-port={port}", JOB]
    elif launcher == "deepspeed":
        pytest.importorskip("deepspeed", reason="the DeepSpeed launcher is DeepSpeed's")
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", f"--num_gpus={RANKS}", f"--master_port={port}", JOB]
    else:  # by hand: each rank its own process, the environment torch's env:// reads and nothing else
        procs = []
        for rank in range(RANKS):
            env_r = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                     "LOCAL_RANK": str(rank), "WORLD_SIZE": str(RANKS)}
            procs.append(subprocess.Popen([sys.executable, JOB], env=env_r, stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
        return
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]


def one_run(launcher: str, out: Path, port: int) -> list[dict]:
    out.mkdir()
    _launch(launcher, out, port)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "by-hand"])
def test_two_runs_on_one_port_are_two_jobs(tmp_path, launcher):
    port = free_port()
    first, second = one_run(launcher, tmp_path / "a", port), one_run(launcher, tmp_path / "b", port)
    for run in (first, second):
        assert len({r["job"] for r in run}) == 1 and len({r["trace"] for r in run}) == 1
        assert run[0]["job"].startswith("job-") and "nonce" in run[0]["warnings"][0]
        assert [r["sum"] for r in run] == [float(RANKS)] * RANKS  # the group formed on the same store
    assert first[0]["job"] != second[0]["job"] and first[0]["trace"] != second[0]["trace"]
    # the part derived from the address is the same: only the run's nonce differs
    assert first[0]["job"].rsplit("-", 1)[0] == second[0]["job"].rsplit("-", 1)[0]
    expected = {"torchrun": "torchrun", "deepspeed": "deepspeed", "by-hand": "torch-env"}[launcher]
    assert {r["launcher"] for r in first} == {expected}
