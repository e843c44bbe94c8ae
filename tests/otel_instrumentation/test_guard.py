"""``oi.guard`` on real 3-rank gloo jobs: only rank 1's gradients go bad (each rank trains its own model, so
nothing averages them), and every rank must take the same action at the same step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the guard hooks torch's optimizers")

from otel_instrumentation import GUARD_EXIT

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, action: str, fault: str) -> tuple[int, list[dict], list[dict]]:
    (tmp_path / "out").mkdir()
    env = dict(os.environ, JOBTRACE_ROOT=str(ROOT), OUT_DIR=str(tmp_path / "out"), JOBTRACE_DATA_DIR=str(tmp_path / "d"),
               JOBTRACE_JOB_ID="guard", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                           str(Path(__file__).parent / "guard_job.py"), "--action", action, "--fault", fault],
                          env=env, capture_output=True, text=True, timeout=300)
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(3)]
    events = [json.loads(line) for f in (tmp_path / "d" / "guard").glob("*.jsonl") for line in f.read_text().splitlines()]
    return proc.returncode, ranks, events


def test_skip_leaves_every_ranks_weights_alone_at_the_bad_step(tmp_path):
    rc, ranks, events = run(tmp_path, "skip", "nan")
    assert rc == 0
    for r in ranks:
        sums = r["sums"]
        assert len(sums) == 6 and sums[3] == sums[2] and sums[4] != sums[3]  # step 3 skipped, the others applied
        assert [(a["step"], a["action"], a["rank"]) for a in r["actions"]] == [(3, "skip", 1)]
        assert r["actions"][0]["batch_ids"]  # the bad batch, to find again
    warnings = [e for e in events if e.get("logger") == "jobtrace.guard"]
    assert sorted(e["rank"] for e in warnings) == [0, 1, 2] and all("non-finite" in e["msg"] for e in warnings)


def test_clip_bounds_the_update_on_every_rank(tmp_path):
    rc, ranks, _ = run(tmp_path, "clip", "explode")
    assert rc == 0
    for r in ranks:
        assert [(a["step"], a["action"], a["rank"]) for a in r["actions"]] == [(3, "clip", 1)]
        assert r["actions"][0]["norm"] > 1e3  # rank 1's norm, seen by every rank
    jump = abs(ranks[1]["sums"][3] - ranks[1]["sums"][2])
    assert jump < 50  # clipped to a norm of 50 with lr 0.1 (unclipped: a norm of ~1e6): no explosion reached them
    assert all(x == x for r in ranks for x in r["sums"])  # and no NaN


def test_stop_checkpoints_on_every_rank_then_exits_with_the_guards_status(tmp_path):
    rc, ranks, events = run(tmp_path, "stop", "nan")
    assert rc != 0
    assert [r["checkpoint"] for r in ranks] == [3, 3, 3] and [len(r["sums"]) for r in ranks] == [3, 3, 3]
    stops = [e for e in events if e.get("logger") == "jobtrace.guard" and e.get("level") == "CRITICAL"]
    assert sorted(e["rank"] for e in stops) == [0, 1, 2] and "stopped the job at step 3" in stops[0]["msg"]
    assert GUARD_EXIT == 65


@pytest.mark.parametrize("resume", ["file", "signal"])
def test_pause_holds_every_rank_until_the_file_goes_or_a_signal_comes(tmp_path, resume):
    """Every rank stops at the bad step and stays there (no rank trains on); removing the pause file, or
    SIGUSR1 to the ranks, lets them all go on, with the bad step's update skipped."""
    import signal
    import time

    pause = tmp_path / "paused"
    (tmp_path / "out").mkdir()
    env = dict(os.environ, JOBTRACE_ROOT=str(ROOT), OUT_DIR=str(tmp_path / "out"), JOBTRACE_DATA_DIR=str(tmp_path / "d"),
               JOBTRACE_JOB_ID="guard", OMP_NUM_THREADS="1", PAUSE_FILE=str(pause))
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                             str(Path(__file__).parent / "guard_job.py"), "--action", "pause", "--fault", "nan"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not pause.exists():
            time.sleep(0.2)
        assert "paused the job at step 3: non-finite gradients (rank 1)" in pause.read_text()
        time.sleep(3)  # a rank that did not pause would finish its last steps meanwhile
        assert proc.poll() is None
        held = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(3)]
        assert [len(r["sums"]) for r in held] == [3, 3, 3]  # steps 0-2 done, every rank held at step 3
        if resume == "file":
            pause.unlink()
        else:
            import psutil

            ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "guard_job.py" in " ".join(c.cmdline())]
            assert len(ranks) == 3
            for r in ranks:
                r.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=120) == 0
    finally:
        from tests.procs import stop_tree

        stop_tree(proc)
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(3)]
    for r in ranks:
        assert [(a["step"], a["action"], a["rank"]) for a in r["actions"]] == [(3, "pause", 1)]
        sums = r["sums"]
        assert len(sums) == 6 and sums[3] == sums[2] and all(x == x for x in sums)  # step 3 skipped: no NaN
    assert not pause.exists()
    events = [json.loads(line) for f in (tmp_path / "d" / "guard").glob("*.jsonl") for line in f.read_text().splitlines()]
    how = "SIGUSR1" if resume == "signal" else "the pause file removed"
    resumed = [e for e in events if e.get("logger") == "jobtrace.guard" and "resumed at step 3" in e.get("msg", "")]
    assert len(resumed) == 3 and (resume == "file" or any(how in e["msg"] for e in resumed))
