"""Run the plain torchrun jobs of ``tests/jobs/train.py``: the two forms a user has of each.

    python tests/jobs/run_jobs.py OUT_DIR [CASE ...]   # every case by default

Each case runs ``torchrun --nproc-per-node 4 --tee 3 --log-dir …`` (gloo, CPU, no jobtrace),
and leaves in ``OUT_DIR/<case>/``:

* ``console.log``: torchrun's console, every rank's lines prefixed ``[defaultN]:``, the agent's
  own lines among them (what ``torchrun … 2>&1 | tee console.log`` keeps);
* ``logdir/``: torchrun's log directory (``<run>/attempt_0/<local rank>/stdout.log``, ``stderr.log``);
* ``case.json``: the case, the rank its fault is on, and torchrun's exit code.

``healthy_busy`` keeps two processes spinning on the CPU while the job runs: a noisy but healthy
machine. Nothing here reads the logs; the verdicts are checked by ``test_plain_jobs.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
NPROC = 4
FAULT_RANK = 2


@dataclass(frozen=True)
class Case:
    name: str
    fault: str
    busy: bool = False


CASES = {c.name: c for c in (
    Case("slow_rank", "slow_rank"),
    Case("slow_episode", "slow_episode"),
    Case("hang", "hang"),
    Case("crash", "crash"),
    Case("mismatch", "mismatch"),
    Case("nan", "nan"),
    Case("spike", "spike"),
    Case("slow_data", "slow_data"),
    Case("healthy_busy", "healthy", busy=True),
)}


def _spin(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def run_case(case: Case, out: Path, timeout_s: float = 240.0) -> dict[str, object]:
    """Run one case into ``out/<case>/``; returns what ``case.json`` holds."""
    where = out / case.name
    where.mkdir(parents=True, exist_ok=True)
    logdir = where / "logdir"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBTRACE_", "TORCH_DISTRIBUTED_DEBUG"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC), "--tee", "3",
           "--log-dir", str(logdir), "--standalone", "--monitor-interval", "0.5",
           str(HERE / "train.py"), "--fault", case.fault, "--rank", str(FAULT_RANK)]
    spinners = []
    if case.busy:
        stop_at = time.time() + timeout_s
        spinners = [multiprocessing.Process(target=_spin, args=(stop_at,), daemon=True) for _ in range(2)]
        for s in spinners:
            s.start()
    try:
        with open(where / "console.log", "wb") as console:
            try:
                rc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, env=env, timeout=timeout_s,
                                    cwd=where).returncode
            except subprocess.TimeoutExpired:
                rc = None
    finally:
        for s in spinners:
            s.terminate()
    meta = {**asdict(case), "fault_rank": FAULT_RANK, "nproc": NPROC, "returncode": rc}
    (where / "case.json").write_text(json.dumps(meta, indent=2))
    return meta


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    for name in argv[1:] or list(CASES):
        meta = run_case(CASES[name], out)
        print(f"{name}: torchrun exit {meta['returncode']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
