"""``jobtrace demo``: a real torch.distributed job with an injected fault, then its diagnosis.

The job runs under torchrun (gloo backend, CPU) exactly as a user's would, with
``init_tracing()`` as its only tracing line. For a hang the demo watches the
embedded store and, once no rank has made progress for the stall threshold, stops
the job the way an operator would (SIGTERM, then SIGKILL for ranks blocked in C++),
and then runs the same analysis ``trace-job`` runs.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shippers._local import job_dir

__all__ = ["DemoConfig", "run_job"]


@dataclass
class DemoConfig:
    job_id: str
    data_dir: str = "jobtrace-data"
    ranks: int = 4
    steps: int = 30
    slow_ranks: list[int] = field(default_factory=list)
    slow_ms: float = 40.0
    hang_rank: int | None = None
    hang_step: int = 8
    nan_step: int | None = None
    ranks_per_node: int = 0
    stall_s: float = 6.0
    heartbeat_s: float = 1.0
    timeout_s: float = 300.0
    quiet: bool = True


def _last_progress_ns(directory: Path) -> int:
    """Newest non-heartbeat event time in the store (cheap: reads file tails)."""
    newest = 0
    for path in glob.glob(str(directory / "*.jsonl")):
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            for line in fh.read().splitlines():
                if b'"kind":"heartbeat"' in line or b'"logger":"jobtrace' in line:
                    continue
                try:
                    newest = max(newest, int(line[6:line.index(b",")]))
                except ValueError:
                    continue
    return newest


def run_job(cfg: DemoConfig) -> int:
    """Run the training job; returns torchrun's exit code (negative if the demo stopped it)."""
    env = dict(os.environ)
    env.update(
        JOBTRACE_JOB_ID=cfg.job_id,
        JOBTRACE_DATA_DIR=str(Path(cfg.data_dir).resolve()),
        JOBTRACE_HEARTBEAT_S=str(cfg.heartbeat_s),
        JOBTRACE_STALL_DUMP_S=str(max(1.0, cfg.stall_s / 2)),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.ranks}",
        "--monitor-interval=0.5", "-m", "jobtrace.demo.train", f"--steps={cfg.steps}", f"--slow-ms={cfg.slow_ms}",
        f"--hang-step={cfg.hang_step}", f"--ranks-per-node={cfg.ranks_per_node}",
    ]
    args += [f"--slow-rank={r}" for r in cfg.slow_ranks]
    if cfg.hang_rank is not None:
        args.append(f"--hang-rank={cfg.hang_rank}")
    if cfg.nan_step is not None:
        args.append(f"--nan-step={cfg.nan_step}")
    out = subprocess.DEVNULL if cfg.quiet else None
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)
    directory = job_dir(cfg.data_dir, cfg.job_id)
    deadline = time.monotonic() + cfg.timeout_s
    while proc.poll() is None:
        time.sleep(0.5)
        progress = _last_progress_ns(directory)
        stalled = progress and (time.time_ns() - progress) / 1e9 > cfg.stall_s + 2 * cfg.heartbeat_s
        if stalled or time.monotonic() > deadline:
            _stop(proc)
            return -1
    return proc.returncode


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole job (lets ranks in Python flush), then SIGKILL what is blocked in C++."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
