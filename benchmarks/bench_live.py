"""How fast ``jobtrace watch`` names a hung job's culprit, whether it names the right rank, and what it costs.

    python benchmarks/bench_live.py [--hangs 21] [--healthy-minutes 10]

Real 4-rank gloo jobs (the demo's training script under torchrun) with one fault each, in turn:
a rank that stops joining (sleeps in its forward pass), a rank frozen with the GIL held (a C sleep
that never lets go of it, so its heartbeat thread stops too) and a rank killed (SIGKILL); which rank
and at which step vary. The script writes the fault's moment before it strikes; the watcher is the
real command in its own process. Per fault: the time from the fault to the first alert that names a
rank (a hang, a silent or a dead rank), and whether that is the faulty rank. Then healthy jobs back
to back for ``--healthy-minutes`` with a CPU hog on each core: every alert there is a false one. The
watcher's CPU is read from its own rusage; its reads from the store's bytes.

Goal (issue: live watching): p90 ≤ 15 s, the right rank every time, no false alert. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("hang", "freeze", "kill")
NAMING = ("hang", "silent", "rank_died")


def start_job(data: Path, job: str, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBTRACE_")}
    env.update(JOBTRACE_JOB_ID=job, JOBTRACE_DATA_DIR=str(data), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                             "-m", "jobtrace.demo.train", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """torchrun and every worker: each worker has a session of its own, and a frozen one outlives its launcher."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.send_signal(signal.SIGCONT)
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)
    proc.wait(timeout=30)


class Watcher:
    def __init__(self, data: Path, job: str, timeout: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "jobtrace.cli", "watch", job, "--data-dir", str(data),
                                      "--json", "--interval", "0.5", "--timeout", str(timeout)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT)))
        self.reads = (0, 0.0)  # polls of the store, MB read: from the watcher's closing line
        self.alerts: list[tuple[int, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.alerts.append((time.time_ns(), json.loads(line)))

    def first_naming(self, timeout: float) -> tuple[int, dict] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, a in self.alerts:
                if a["state"] == "firing" and a["kind"] in NAMING:
                    return t, a
            time.sleep(0.1)
        return None

    def close(self) -> float:
        """Stops the watcher; its CPU seconds."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.proc.send_signal(signal.SIGINT)  # it prints its closing line on an interrupt
        _, err = self.proc.communicate(timeout=30)
        m = re.search(r"\(([\d.]+) MB in ([\d,]+) polls", err or "")
        if m:
            self.reads = (int(m.group(2).replace(",", "")), float(m.group(1)))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def one_fault(root: Path, i: int, kind: str, rank: int, step: int) -> dict:
    data = root / f"f{i}"
    inject = data / "inject.jsonl"
    data.mkdir(parents=True)
    job = start_job(data, "job", "--steps", "100000", f"--{kind}-rank", str(rank), "--hang-step", str(step),
                    "--inject-log", str(inject))
    watcher = Watcher(data, "job", timeout=120)
    t0 = time.monotonic()
    found = watcher.first_naming(timeout=90)
    stop(job)
    cpu = watcher.close()
    wall = time.monotonic() - t0
    injected = [json.loads(line) for line in inject.read_text().splitlines()] if inject.exists() else []
    out = {"kind": kind, "rank": rank, "step": step, "injected": bool(injected), "watch_cpu_s": cpu, "wall_s": wall,
           "polls": watcher.reads[0], "read_mb": watcher.reads[1]}
    if found and injected:
        t_alert, alert = found
        out.update(alert_kind=alert["kind"], named=alert["ranks"], latency_s=(t_alert - injected[0]["ts"]) / 1e9,
                   right=alert["ranks"] == [rank])
    return out


def healthy(root: Path, minutes: float) -> dict:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    alerts, jobs, watched = [], 0, 0.0
    deadline = time.monotonic() + minutes * 60
    try:
        while time.monotonic() < deadline:
            data = root / f"h{jobs}"
            data.mkdir(parents=True)
            job = start_job(data, "job", "--steps", "600")
            watcher = Watcher(data, "job", timeout=max(30.0, deadline - time.monotonic()) + 60)
            t0 = time.monotonic()
            while job.poll() is None and time.monotonic() < deadline + 60:
                time.sleep(0.5)
            time.sleep(3)
            stop(job)
            watcher.close()
            watched += time.monotonic() - t0
            alerts += [a for _, a in watcher.alerts if a["state"] == "firing"]
            jobs += 1
    finally:
        for h in hogs:
            h.kill()
    return {"jobs": jobs, "watched_s": watched, "false_alerts": alerts}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hangs", type=int, default=21, help="faults in all, the three kinds in turn")
    p.add_argument("--healthy-minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="bench-live-"))
    results = []
    for i in range(args.hangs):
        kind = KINDS[i % 3]
        r = one_fault(root, i, kind, rng.randrange(4), rng.randrange(5, 30))
        results.append(r)
        print(f"{i:3d} {kind:<6} rank {r['rank']} step {r['step']:>2}: "
              + (f"{r['alert_kind']} naming {r['named']} after {r['latency_s']:.1f}s "
                 f"({'right' if r['right'] else 'WRONG'})" if "latency_s" in r else "NO ALERT"), flush=True)
    print()
    for kind in (*KINDS, "all"):
        rs = [r for r in results if (kind == "all" or r["kind"] == kind)]
        lat = sorted(r["latency_s"] for r in rs if "latency_s" in r)
        if not lat:
            continue
        p90 = lat[min(len(lat) - 1, int(round(0.9 * (len(lat) - 1))))]
        print(f"{kind:<7} {len(rs)} faults: alerted {len(lat)}, right rank {sum(r.get('right', False) for r in rs)}; "
              f"time to alert p50 {statistics.median(lat):.1f}s, p90 {p90:.1f}s, max {lat[-1]:.1f}s")
    cpu = sum(r["watch_cpu_s"] for r in results) / max(sum(r["wall_s"] for r in results), 1e-9) * 100
    print(f"watcher CPU while watching a 4-rank job: {cpu:.1f} % of a core (polling every 0.5 s)")
    wall = max(sum(r["wall_s"] for r in results), 1e-9)
    print(f"watcher reads: {sum(r['polls'] for r in results) / wall:.1f} polls/s of the store, "
          f"{sum(r['read_mb'] for r in results) * 1e3 / wall:.1f} kB/s read (what the ranks wrote, read once)")
    if args.healthy_minutes > 0:
        h = healthy(root, args.healthy_minutes)
        print(f"healthy: {h['jobs']} jobs, {h['watched_s'] / 60:.1f} min watched with a CPU hog on each core: "
              f"{len(h['false_alerts'])} false alerts {[a['summary'][:100] for a in h['false_alerts']]}")
    print("goal: p90 ≤ 15 s, the right rank every time, 0 false alerts")


if __name__ == "__main__":
    main()
