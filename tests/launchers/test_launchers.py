"""Real launchers start a real 2-rank gloo job: srun and sbatch on a one-node SLURM the tests start, and
Open MPI's mpirun. Each rank must resolve its rank and world from the launcher's own variables, and the
job must have one job id, the launcher's, and one TraceID on every rank; its collective lands in one job.
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

pytest.importorskip("torch", reason="the job is a torch.distributed job")

from tests.launchers import slurm
from tests.servers.base import free_port

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).parent / "launcher_job.py"


def job_env(tmp_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith(("JOBTRACE_", "TORCHELASTIC_"))}
    (tmp_path / "out").mkdir(exist_ok=True)
    env.update(JOBTRACE_ROOT=str(ROOT), OUT_DIR=str(tmp_path / "out"), JOBTRACE_DATA_DIR=str(tmp_path / "data"),
               JT_PORT=str(free_port()), OMP_NUM_THREADS="1")
    return env


def ranks_of(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]


def check_one_job(tmp_path: Path, launcher: str, job_id: str | None = None) -> None:
    ranks = ranks_of(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert {r["launcher"] for r in ranks} == {launcher}
    assert len({r["job"] for r in ranks}) == 1 and len({r["trace"] for r in ranks}) == 1
    if job_id is not None:
        assert ranks[0]["job"] == job_id
    jobs = [p for p in (tmp_path / "data").iterdir() if p.is_dir()]
    assert [p.name for p in jobs] == [ranks[0]["job"]]  # every rank wrote into the one job
    colls = [json.loads(line) for f in jobs[0].glob("*.jsonl") for line in f.read_text().splitlines()
             if '"cat":"collective"' in line]
    assert sorted({(c["rank"], c["name"]) for c in colls if c["name"] == "all_reduce"}) == [(0, "all_reduce"),
                                                                                          (1, "all_reduce")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not slurm.available():
        pytest.skip(reason="needs Debian's slurm-wlm and munge, as root (.ci/run installs them)")
    with slurm.cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def test_srun(tmp_path, cluster):
    env = job_env(tmp_path, cluster)
    run = subprocess.run(["srun", "-n", "2", "--overcommit", sys.executable, str(JOB)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    check_one_job(tmp_path, "slurm")
    assert ranks_of(tmp_path)[0]["job"].isdigit() and ranks_of(tmp_path)[0]["node"] == "localhost"


def test_sbatch(tmp_path, cluster):
    env = job_env(tmp_path, cluster)
    script = tmp_path / "batch.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -n 2\n#SBATCH --overcommit\nsrun {sys.executable} {JOB}\n")
    sub = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "slurm-%j.out"), str(script)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True).stdout
        if not queued.strip():
            break
        time.sleep(1)
    output = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert (tmp_path / "out" / "rank1.json").exists(), output[-3000:]
    check_one_job(tmp_path, "slurm", job_id)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (Debian's openmpi-bin)")
def test_mpirun(tmp_path):
    env = job_env(tmp_path)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    run = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, str(JOB)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    check_one_job(tmp_path, "openmpi")


def test_a_rank_that_dies_under_srun_has_slurms_word_in_the_alert(tmp_path, cluster):
    """The demo's training script under srun; rank 1 SIGKILLs itself at step 10. ``jobtrace watch`` names it
    dead with SLURM's view of the step in the evidence, and once the job is over, the step's final state."""
    from tests.procs import stop_tree
    from tests.watching import Watcher

    env = job_env(tmp_path, cluster)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=env["JT_PORT"], PYTHONPATH=str(ROOT), DEMO_PG_TIMEOUT="60")
    # torch's env:// wants RANK and WORLD_SIZE, which srun does not set; the test cluster calls its node
    # "localhost", so the ranks are told this host's name (a real cluster's node names are its hosts').
    rank = ("export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID JOBTRACE_NODE=$(hostname);"
            f" exec {sys.executable} -m jobtrace.demo.train --steps 100000 --kill-rank 1 --hang-step 10")
    srun = subprocess.Popen(["srun", "-n", "2", "--overcommit", "bash", "-c", rank], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (tmp_path / "data").is_dir():
            time.sleep(0.2)
        job = next((tmp_path / "data").iterdir()).name
        assert job.isdigit()  # SLURM's job id
        watcher = Watcher(tmp_path / "data", job, "--timeout", "150", env_extra={"SLURM_CONF": cluster["SLURM_CONF"]})
        _, alert = watcher.wait_for("rank_died", timeout=120)
        assert alert["ranks"] == [1]
        (slurm_seen,) = alert["evidence"]["slurm"]
        assert slurm_seen["id"] == f"{job}.0"
        assert slurm_seen["job"]["JobId"] == job and slurm_seen["job"]["JobState"] in ("RUNNING", "COMPLETING",
                                                                                       "FAILED")
        srun.wait(timeout=120)
        assert watcher.finish(timeout=120) == 1
        (end,) = [a for _, a in watcher.alerts if a["kind"] == "slurm_step"]
        final = end["evidence"]["job"]
        assert final["JobState"] in ("FAILED", "CANCELLED") and final["ExitCode"] != "0:0", end
    finally:
        stop_tree(srun)
