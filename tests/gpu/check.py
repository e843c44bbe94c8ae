"""The GPU check of the real-stacks issue: a DDP job on NCCL, traced with one line, and what jobtrace made of it.

    bash tests/gpu/check.sh            # on a machine with CUDA; prints figures and verdicts
    python tests/gpu/check.py --cpu    # a dry run of the same script on gloo (no GPU needed)

Prints, for the job with as many ranks as there are GPUs (up to 8):

* how collectives were recorded (process-group hooks or wrapped functions), how many per step, and
  their timing: ``device`` (NCCL's CUDA-event duration) against the host's issue-to-completion span;
* the CUDA memory counters (allocated, reserved, fragmentation = reserved - allocated);
* the verdict on a healthy run, a slow rank and a hung rank (the last two need 2 GPUs or more);
* tracing overhead: steps per second traced against ``JOBTRACE_DISABLE=1``, in one alternating series.

Asserts nothing: the figures go into the session's closing note.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def torchrun(n: int, out: Path, job: str, *extra: str, env_extra: dict[str, str] | None = None,
             timeout: float = 300) -> tuple[int, float, str]:
    env = dict(os.environ, JOBTRACE_ROOT=str(ROOT), JOBTRACE_DATA_DIR=str(out), JOBTRACE_JOB_ID=job,
               JOBTRACE_HEARTBEAT_S="1", JOBTRACE_STALL_DUMP_S="5", OMP_NUM_THREADS="1", **(env_extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           str(Path(__file__).parent / "train_gpu.py"), *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # the hung job: every process of it (torchrun gives each rank its own session)
        import psutil

        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in tree:
            p.terminate()
        _, alive = psutil.wait_procs(tree, timeout=5)
        for p in alive:
            p.kill()
        text, _ = proc.communicate()
    return proc.returncode, time.monotonic() - t0, text


def events(out: Path, job: str) -> list[dict]:
    return [json.loads(line) for f in (out / job).glob("*.jsonl") for line in f.read_text().splitlines()
            if line.startswith("{")]


def verdict(out: Path, job: str, stall_s: float = 300) -> list[str]:
    from queries import AnalysisConfig, analyze, load_local

    report = analyze(load_local(out, job), AnalysisConfig(stall_s=stall_s))
    return [f"{f.kind} {f.ranks}: {f.summary[:160]}" for f in report.findings if f.severity in ("error", "warning")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="a dry run on gloo (2 ranks, small model)")
    args = p.parse_args()
    import torch

    cpu = args.cpu or not torch.cuda.is_available()
    n = 2 if cpu else min(torch.cuda.device_count(), 8)
    extra = ["--cpu", "--hidden", "256"] if cpu else []
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, devices {0 if cpu else n}, ranks {n}"
          + (" (dry run on CPU)" if cpu else f", {torch.cuda.get_device_name(0)}"))
    out = Path(tempfile.mkdtemp(prefix="jt-gpu-"))

    rc, wall, text = torchrun(n, out, "healthy", *extra)
    print(f"\n== healthy DDP job: exit {rc} in {wall:.1f}s; {text.strip().splitlines()[-1] if text.strip() else ''}")
    ev = events(out, "healthy")
    colls = [e for e in ev if e.get("cat") == "collective"]
    steps = {e["step"] for e in ev if e.get("cat") == "step"}
    by_op: dict[str, int] = {}
    for c in colls:
        by_op[c["name"]] = by_op.get(c["name"], 0) + 1
    timing: dict[str, int] = {}
    for c in colls:
        key = (c.get("attrs") or {}).get("timing", "host")
        timing[key] = timing.get(key, 0) + 1
    print(f"collectives: {len(colls)} ({by_op}), steps {len(steps)}, timing {timing}")
    ar = [c for c in colls if c["name"] == "all_reduce" and c.get("step") is not None and c["step"] >= 5]
    if ar:
        print(f"all_reduce span median {statistics.median(c['dur'] for c in ar) / 1e3:.1f} µs "
              f"(bytes {sorted({c['attrs'].get('bytes') for c in ar})[:4]})")
    mem = [e["metrics"] for e in ev if e["kind"] == "metric" and "cuda_allocated_bytes" in e.get("metrics", {})]
    if mem:
        last = mem[-1]
        frag = last["cuda_reserved_bytes"] - last["cuda_allocated_bytes"]
        print(f"CUDA memory: allocated {last['cuda_allocated_bytes'] / 2**20:.0f} MiB, reserved "
              f"{last['cuda_reserved_bytes'] / 2**20:.0f} MiB, fragmentation {frag / 2**20:.0f} MiB, "
              f"peak {last.get('cuda_max_allocated_bytes', 0) / 2**20:.0f} MiB ({len(mem)} samples)")
    else:
        print("CUDA memory: no samples")
    print("verdict:", verdict(out, "healthy") or "healthy")
    try:  # the sidecar's series of that job, and the GPUs through NVML (the real path of metrics._gpu)
        scrape = subprocess.run([sys.executable, "-m", "jobtrace.cli", "metrics", "--data-dir", str(out), "--once",
                                 "--job", "healthy", "--forget-after", "86400"], capture_output=True, text=True,
                                timeout=120)
        lines = [x for x in scrape.stdout.splitlines() if not x.startswith("#")]
        gpu = [x for x in lines if x.startswith(("jobtrace_gpu_", "jobtrace_exporter_gpus"))]
        rank0 = [x for x in lines if 'rank="0"' in x]
        print(f"metrics: {len(lines)} samples, {len(rank0)} for rank 0; GPU samples {len(gpu)}:", *gpu[:12],
              sep="\n  ")
        if scrape.returncode:
            print("metrics failed:", scrape.stderr[-2000:])
    except Exception as exc:  # a report, not a gate
        print(f"metrics: {type(exc).__name__}: {exc}")

    if n >= 2:
        rc, wall, _ = torchrun(n, out, "slow", *extra, "--slow-rank", str(n - 1))
        print(f"\n== slow rank {n - 1}: exit {rc} in {wall:.1f}s; verdict:", verdict(out, "slow"))
        rc, wall, _ = torchrun(n, out, "hang", *extra, "--hang-rank", "0", timeout=60)
        print(f"\n== hung rank 0: exit {rc} in {wall:.1f}s; verdict:", verdict(out, "hang", stall_s=10))
    else:
        print("\n== slow and hung rank: need 2 GPUs or more; skipped")

    walls: dict[str, list[float]] = {"traced": [], "off": []}
    for k in range(3):
        for mode in (("traced", "off") if k % 2 == 0 else ("off", "traced")):
            env = {"JOBTRACE_DISABLE": "1"} if mode == "off" else {}
            _, wall, _ = torchrun(n, out, f"ovh-{mode}-{k}", *extra, "--steps", "200", env_extra=env)
            walls[mode].append(wall)
    t, o = statistics.median(walls["traced"]), statistics.median(walls["off"])
    print(f"\n== overhead: 200-step job {o:.2f}s untraced, {t:.2f}s traced ({(t - o) / o * 100:+.1f} %; whole runs, "
          "start-up included: medians of 3 alternated)")


if __name__ == "__main__":
    main()
