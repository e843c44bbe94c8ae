"""What the metrics path costs: the training step with the sidecar scraping and without, the scrape itself,
and the series per rank, in one run.

    python benchmarks/bench_metrics.py [--runs 3] [--steps 400] [--scrape-interval 1]

* Step cost: the demo job (4 ranks under torchrun, gloo, on this machine's cores) run alternately with
  ``jobtrace metrics`` scraped every ``--scrape-interval`` seconds (15 s is usual; 1 s is harsh) and without
  it; the median step time of each run is read from the job's own step spans. Whole runs of a 4-rank job
  on 2 cores differ by about ±10 % from one to the next, so the runs alternate and the medians of medians
  are compared, with the spread printed beside them.
* Scrape cost: wall and CPU time of one scrape of a running job and of a job's whole store read at once
  (a sidecar started late), and the bytes of the exposition.
* Series: how many a rank adds (the goal is few labels and no per-step series).

The ranks themselves run nothing of the metrics path (the sidecar reads what they already write), so the
step cost with and without it measures only the competition for the node's cores. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_job(data: Path, job: str, steps: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBTRACE_")}
    env.update(JOBTRACE_JOB_ID=job, JOBTRACE_DATA_DIR=str(data), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                             "-m", "jobtrace.demo.train", "--steps", str(steps)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def median_step_ms(data: Path, job: str) -> float:
    durs = [orjson.loads(line)["dur"] for f in (data / job).glob("*.jsonl") for line in f.read_bytes().splitlines()
            if b'"cat":"step"' in line]
    return statistics.median(durs) / 1e6


def scraper(port: int, interval: float, stop: threading.Event, costs: list[float]) -> None:
    import urllib.request

    while not stop.wait(interval):
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
        except OSError:
            continue
        costs.append(time.perf_counter() - t0)


def one_run(root: Path, i: int, with_sidecar: bool, steps: int, interval: float) -> dict[str, float]:
    from tests.servers.base import free_port

    data = root / f"r{i}"
    data.mkdir()
    sidecar = None
    costs: list[float] = []
    stop = threading.Event()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    if with_sidecar:
        port = free_port()
        sidecar = subprocess.Popen([sys.executable, "-m", "jobtrace.cli", "metrics", "--data-dir", str(data),
                                    "--listen", f"127.0.0.1:{port}", "--no-gpus", "--no-kernel-log"],
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        threading.Thread(target=scraper, args=(port, interval, stop, costs), daemon=True).start()
    job = run_job(data, "job", steps)
    t0 = time.monotonic()
    job.wait(timeout=900)
    wall = time.monotonic() - t0
    stop.set()
    if sidecar is not None:
        sidecar.terminate()
        sidecar.wait(timeout=30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"step_ms": median_step_ms(data, "job"), "wall_s": wall, "scrapes": len(costs),
            "scrape_ms": statistics.median(costs) * 1e3 if costs else 0.0,
            "children_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def store_scrape(data: Path) -> tuple[float, float, int, int, int]:
    """(wall ms, CPU ms, exposition bytes, series, ranks) of one scrape of ``data`` read from the start."""
    from prometheus_client import CollectorRegistry, generate_latest

    from metrics import StoreMetrics

    collector = StoreMetrics(data, forget_after_s=1e9)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    c0, t0 = time.process_time(), time.perf_counter()
    text = generate_latest(registry)
    wall, cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    series = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
    ranks = len({m.group(1) for line in series if (m := re.search(r'rank="(\d+)"', line))})
    return wall, cpu, len(text), len(series), ranks


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3, help="runs of each kind, alternated")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--scrape-interval", type=float, default=1.0)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for i in range(2 * args.runs):
        with_sidecar = (i % 2 == 1) if (i // 2) % 2 == 0 else (i % 2 == 0)  # ABBA: neither kind always first
        r = one_run(root, i, with_sidecar, args.steps, args.scrape_interval)
        results[with_sidecar].append(r)
        print(f"run {i}: {'sidecar' if with_sidecar else 'plain  '} step {r['step_ms']:.2f} ms, wall {r['wall_s']:.1f}s"
              + (f", {r['scrapes']} scrapes of {r['scrape_ms']:.1f} ms" if with_sidecar else ""), flush=True)
    plain = statistics.median(r["step_ms"] for r in results[False])
    side = statistics.median(r["step_ms"] for r in results[True])
    spread = max(r["step_ms"] for r in results[False]) - min(r["step_ms"] for r in results[False])
    print(f"\nstep time, medians of {args.runs} runs: plain {plain:.2f} ms, with the sidecar scraped every "
          f"{args.scrape_interval:g}s {side:.2f} ms ({(side - plain) / plain * 100:+.1f} %; the plain runs' own spread "
          f"{spread / plain * 100:.1f} %)")
    scrapes = [r["scrape_ms"] for r in results[True] if r["scrapes"]]
    print(f"scrape of a running 4-rank job: median {statistics.median(scrapes):.1f} ms wall (HTTP included)")
    wall, cpu, size, series, ranks = store_scrape(root / "r0")
    print(f"first scrape of a finished {args.steps}-step job (its whole store read): {wall:.0f} ms wall, "
          f"{cpu:.0f} ms CPU, {size / 1e3:.1f} kB of exposition; {series} samples for {ranks} ranks = "
          f"{series / max(ranks, 1):.0f} a rank (the step histogram's 17 included), none per step")


if __name__ == "__main__":
    main()
