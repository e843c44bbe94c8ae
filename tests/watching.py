"""A real job under torchrun and the real ``jobtrace watch`` beside it, for the tests of live watching."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.procs import stop_tree

__all__ = ["Job", "Watcher"]


class Job:
    """The demo's training script under torchrun, in its own process group."""

    def __init__(self, data: Path, job: str, ranks: int, *args: str, env_extra: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBTRACE_")}
        env.update(JOBTRACE_JOB_ID=job, JOBTRACE_DATA_DIR=str(data), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   **(env_extra or {}))
        self.dir = data / job
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
             "-m", "jobtrace.demo.train", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def pid_of(self, rank: int, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in self.dir.glob(f"*.r{rank}.p*.jsonl"):
                return int(re.search(r"\.p(\d+)\.jsonl$", path.name).group(1))  # type: ignore[union-attr]
            time.sleep(0.2)
        raise AssertionError(f"rank {rank} never started")

    def stop(self) -> None:
        stop_tree(self.proc)


class Watcher:
    """``jobtrace watch --json``; each alert line kept with the moment it arrived."""

    def __init__(self, data: Path, job: str, *args: str, env_extra: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBTRACE_")}
        env.update(env_extra or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobtrace.cli", "watch", job, "--data-dir", str(data), "--json", "--interval", "0.5",
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.alerts: list[tuple[float, dict]] = []
        self.said: list[str] = []  # what it wrote to stderr (its progress lines and summary)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.alerts.append((time.monotonic(), json.loads(line)))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.said.append(line)

    @property
    def stderr(self) -> str:
        """Everything it wrote to stderr so far (all of it once :meth:`finish` returned)."""
        return "".join(self.said)

    def wait_for(self, kind: str, state: str = "firing", timeout: float = 90) -> tuple[float, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, a in self.alerts:
                if a["kind"] == kind and a["state"] == state:
                    return t, a
            time.sleep(0.2)
        raise AssertionError(f"no {state} {kind} alert in {timeout}s: {[a for _, a in self.alerts]}; watcher "
                             f"{'running' if self.proc.poll() is None else f'exited {self.proc.returncode}'}, "
                             f"said: {self.stderr[-2000:]!r}")

    def finish(self, timeout: float = 60) -> int:
        """Wait for it to end on its own; past ``timeout``, interrupt it (Ctrl-C: it still prints its summary)."""
        self.interrupted = False
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.interrupted = True
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._reader.join(timeout=10)
        self._err_reader.join(timeout=10)
        return self.proc.returncode
