"""``jobtrace demo``: a real torch.distributed job with an injected fault, then its diagnosis.

The job runs under torchrun (gloo backend, CPU) exactly as a user's would, with
``init_tracing()`` as its only tracing line. For a hang (or a mismatched
collective) the demo watches the embedded store and, once no rank has made progress for
the stall threshold, stops
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

from jobtrace import config
from jobtrace.store import job_dir

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
    nan_rank: int = 0
    ranks_per_node: int = 0
    stall_rank: int | None = None
    stall_step: int = 5
    stall_seconds: float = 1.5
    data_ranks: list[int] = field(default_factory=list)
    data_ms: float = 30.0
    mismatch_rank: int | None = None
    mismatch_step: int = 5
    leak_ranks: list[int] = field(default_factory=list)
    leak_step: int = 4
    leak_mb: float = 16.0
    regress_step: int | None = None
    regress_ms: float = 25.0
    regress_phase: str = "backward"
    device_ms: float = 0.0
    """Every rank's forward pass waits this long each step (a host waiting on its GPU): a steady phase."""
    noise_step: int | None = None
    """From this step the targets carry ``label_noise`` more noise (a corrupted shard): the loss departs."""
    label_noise: float = 0.5
    marks: bool = True
    """``oi.step``/``oi.phase`` in the script; False: steps and phases from the optimizer, module and backward hooks."""
    wrap: str = "none"
    """How gradients are averaged: ``none`` (by hand), ``ddp`` (DistributedDataParallel) or ``fsdp`` (FSDP2)."""
    fr_dump_dir: str | None = None
    """Write PyTorch Flight Recorder dumps (``fr_trace_rank_<r>``) here while the job runs."""
    stall_s: float = 6.0
    heartbeat_s: float = 1.0
    timeout_s: float = 300.0
    quiet: bool = True

    def faults(self) -> str:
        """The injected faults in words, for the demo's banner: every one that is set, "no fault" only when none
        is (issue 25: the banner said "no fault" for a NaN-loss job)."""
        def ranks(rs: list[int]) -> str:
            return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, sorted(rs)))

        out = []
        if self.slow_ranks:
            out.append(f"{ranks(self.slow_ranks)} slow by {self.slow_ms:g} ms a step")
        if self.hang_rank is not None:
            out.append(f"rank {self.hang_rank} hangs at step {self.hang_step}")
        if self.nan_step is not None:
            out.append(f"NaN loss on rank {self.nan_rank} from step {self.nan_step}")
        if self.stall_rank is not None:
            out.append(f"rank {self.stall_rank} stalls {self.stall_seconds:g} s at step {self.stall_step}")
        if self.data_ranks:
            out.append(f"{ranks(self.data_ranks)} {'waits' if len(self.data_ranks) == 1 else 'wait'} "
                       f"{self.data_ms:g} ms a step for data")
        if self.mismatch_rank is not None:
            out.append(f"rank {self.mismatch_rank} calls another collective at step {self.mismatch_step}")
        if self.leak_ranks:
            out.append(f"{ranks(self.leak_ranks)} {'leaks' if len(self.leak_ranks) == 1 else 'leak'} "
                       f"{self.leak_mb:g} MB a step from step {self.leak_step}")
        if self.regress_step is not None:
            out.append(f"every rank's {self.regress_phase} {self.regress_ms:g} ms slower from step {self.regress_step}")
        if self.noise_step is not None:
            out.append(f"noisier labels from step {self.noise_step}")
        return "; ".join(out) or "no fault"


def _last_progress_ns(directory: Path) -> tuple[int, bool]:
    """Newest non-heartbeat event time in the store (cheap: reads file tails), and whether a step is among them."""
    newest = 0
    stepping = False
    for path in glob.glob(str(directory / "*.jsonl")):
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            for line in fh.read().splitlines():
                stepping = stepping or b'"cat":"step"' in line
                if b'"kind":"heartbeat"' in line or b'"logger":"jobtrace' in line:
                    continue
                try:
                    newest = max(newest, int(line[6:line.index(b",")]))
                except ValueError:
                    continue
    return newest, stepping


def run_job(cfg: DemoConfig) -> int:
    """Run the training job; returns torchrun's exit code (negative if the demo stopped it)."""
    env = dict(config.environ())
    env.update({
        config.JOB_ID: cfg.job_id,
        config.DATA_DIR: str(Path(cfg.data_dir).resolve()),
        config.HEARTBEAT_S: str(cfg.heartbeat_s),
        config.STALL_DUMP_S: str(max(1.0, cfg.stall_s / 2)),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.ranks}",
        "--monitor-interval=0.5", "-m", "jobtrace.demo.train", f"--steps={cfg.steps}", f"--slow-ms={cfg.slow_ms}",
        f"--hang-step={cfg.hang_step}", f"--ranks-per-node={cfg.ranks_per_node}", f"--wrap={cfg.wrap}",
    ]
    if not cfg.marks:
        args.append("--no-marks")
    args += [f"--slow-rank={r}" for r in cfg.slow_ranks]
    if cfg.hang_rank is not None:
        args.append(f"--hang-rank={cfg.hang_rank}")
    if cfg.nan_step is not None:
        args += [f"--nan-step={cfg.nan_step}", f"--nan-rank={cfg.nan_rank}"]
    if cfg.stall_rank is not None:
        args += [f"--stall-rank={cfg.stall_rank}", f"--stall-step={cfg.stall_step}", f"--stall-s={cfg.stall_seconds}"]
    args += [f"--data-rank={r}" for r in cfg.data_ranks] + [f"--data-ms={cfg.data_ms}"]
    if cfg.mismatch_rank is not None:
        args += [f"--mismatch-rank={cfg.mismatch_rank}", f"--mismatch-step={cfg.mismatch_step}"]
    args += [f"--leak-rank={r}" for r in cfg.leak_ranks] + [f"--leak-step={cfg.leak_step}", f"--leak-mb={cfg.leak_mb}"]
    if cfg.regress_step is not None:
        args += [f"--regress-step={cfg.regress_step}", f"--regress-ms={cfg.regress_ms}",
                 f"--regress-phase={cfg.regress_phase}"]
    if cfg.device_ms:
        args.append(f"--device-ms={cfg.device_ms}")
    if cfg.noise_step is not None:
        args += [f"--noise-step={cfg.noise_step}", f"--label-noise={cfg.label_noise}"]
    if cfg.fr_dump_dir:
        args.append(f"--fr-dump-dir={Path(cfg.fr_dump_dir).resolve()}")
        env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    # The demo's steps last milliseconds: sample host memory at every one of them, so that an
    # injected leak is dated to its step (real steps outlast the library's 0.1 s default).
    env.setdefault(config.MEMORY_INTERVAL_S, "0")
    out = subprocess.DEVNULL if cfg.quiet else None
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)
    directory = job_dir(cfg.data_dir, cfg.job_id)
    deadline = time.monotonic() + cfg.timeout_s
    # Only a job with an injected hang is stopped on a stall: a loaded machine can pause a
    # healthy job for seconds, and stopping it would fake the very fault under test.
    # Start-up (importing torch, forming the group) can outlast the threshold on a loaded machine
    # too, so the watch begins once some rank has finished a step.
    watch = cfg.hang_rank is not None or cfg.mismatch_rank is not None
    stepping = False
    while proc.poll() is None:
        time.sleep(0.5)
        progress = 0
        if watch:
            progress, seen = _last_progress_ns(directory)
            stepping = stepping or seen
        stalled = stepping and progress and (time.time_ns() - progress) / 1e9 > cfg.stall_s + 2 * cfg.heartbeat_s
        if stalled or time.monotonic() > deadline:
            _stop(proc)
            return -1
    return proc.returncode


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job (torchrun forwards it, so ranks in Python flush), then SIGKILL what is blocked in C++.

    torchrun starts each rank in a session of its own, so killing torchrun's process
    group does not reach them: a rank blocked in a collective ignores the forwarded
    SIGTERM and would outlive torchrun, orphaned. The ranks are found first and
    killed one by one at the end.
    """
    ranks = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        pass
    for pid in ranks + _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    _wait_gone(ranks, timeout=10.0)


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Return once every killed rank has died: SIGKILL is delivered asynchronously, and an
    orphaned rank is not our child to wait for, so a caller looking right after the kill
    (a test, a rerun on the same port) could still see it running."""
    try:
        import psutil
    except ImportError:
        return
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the ranks and their helpers); empty when psutil is missing."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil absent or the job already gone
        return []
