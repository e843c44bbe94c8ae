"""``trace-job`` analysis cost on synthetic jobs: time and peak memory as ranks and steps grow.

    python benchmarks/bench_analysis.py                      # 64 and 1,024 ranks x 1,000 steps
    python benchmarks/bench_analysis.py --ranks 64 1024 8192 --steps 1000
    python benchmarks/bench_analysis.py --ranks 1024 --steps 100 1000 --threads 2

Each job is generated once in the embedded-store format (``jobtrace.synth``: per rank and
step a data/forward/backward/optimizer phase, a step span, an all_reduce, a metrics
point, a memory point and a log line; one slow rank, one leaking rank) under ``--dir``
(default: a folder in the temp directory, kept for reruns). Each measurement runs in a
fresh process with ``JOBTRACE_THREADS`` cores for DuckDB, so peak RSS is the
analysis's own: it reports the load (JSON scan into the ``events`` table) and the
analysis (every check, as ``trace-job`` runs them) apart, and the raw size on disk.
Three passes per job: "segments" is the first read of a job whose ranks all exited
cleanly (each left the Parquet segment of its lines); "lines" the first read of a job
whose ranks were killed (every JSON line parsed; it writes the job's Parquet cache, as
the first ``trace-job`` of such a job does); "cached" the read after that. The cost
of writing the segments (what each rank pays at exit) is printed too. Jobs above
``--prune-above`` rank-steps (8,192 x 1,000: ~22 GB of JSON) are written rank by rank and
keep only their segments, as a job whose raw logs retention has pruned; the raw size
column still shows what the lines weighed. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from queries import AnalysisConfig, analyze, load_local
t0 = time.perf_counter()
job = load_local({data!r}, {job!r}, verify=False)
t1 = time.perf_counter()
report = analyze(job, AnalysisConfig())
t2 = time.perf_counter()
print(json.dumps({{"load_s": t1 - t0, "analyze_s": t2 - t1, "events": job.stats.events,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "findings": sorted({{f.kind for f in report.findings}})}}))
"""


def generate(data: Path, ranks: int, steps: int, prune: bool, processes: int) -> tuple[str, float]:
    from jobtrace.synth import SynthJob, write_job
    from queries._segments import compact

    job_id = f"bench-{ranks}x{steps}"
    directory = data / job_id
    done = directory / ".complete"
    t = 0.0
    if not done.exists():
        t0 = time.perf_counter()
        write_job(data, SynthJob(job_id=job_id, ranks=ranks, steps=steps, logs_per_step=1, compact=prune,
                                 slow_ranks={ranks // 3: 1.5}, leaks={ranks - 1: (steps // 2, 1.0)}),
                  keep_lines=not prune, processes=processes)
        done.touch()
        t = time.perf_counter() - t0
    files = sorted(directory.glob("*.jsonl"))
    if files and not any(directory.glob("*.jsonl.*.parquet")):
        t0 = time.process_time()
        for path in files:
            compact(path)
        cpu = time.process_time() - t0
        print(f"segments written: {cpu / len(files) * 1e3:.1f} ms CPU per rank ({cpu:.1f} s for {len(files)} ranks)")
    return job_id, t


def measure(data: Path, job_id: str, threads: int, memory_limit: str | None) -> dict[str, float]:
    import json

    env = dict(os.environ, JOBTRACE_THREADS=str(threads), JOBTRACE_CACHE_SETTLED_S="0")
    if memory_limit:
        env["JOBTRACE_MEMORY_LIMIT"] = memory_limit
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), data=str(data), job=job_id)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 1024])
    p.add_argument("--steps", type=int, nargs="+", default=[1000])
    p.add_argument("--threads", type=int, default=1, help="DuckDB threads (default 1: one core)")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "jobtrace-bench-analysis")
    p.add_argument("--prune-above", type=int, default=2_000_000,
                   help="above this many rank-steps, keep only each rank's segment (raw lines pruned, as retention "
                        "does), so 8,192 x 1,000 fits on disk: the 'lines' and 'cached' passes are skipped")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="processes generating the job")
    p.add_argument("--memory-limit", default=None, help="DuckDB memory_limit, if the store honours JOBTRACE_MEMORY_LIMIT")
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"{'ranks':>6} {'steps':>6} {'events':>12} {'raw MB':>9} {'load s':>8} {'analyze s':>10} {'total s':>8} "
          f"{'peak MB':>8}  findings")
    for ranks in args.ranks:
        for steps in args.steps:
            prune = ranks * steps > args.prune_above
            job_id, gen_s = generate(args.dir, ranks, steps, prune, args.processes)
            directory = args.dir / job_id
            pruned = directory / ".synth-raw-bytes"
            raw = (int(pruned.read_text()) if pruned.exists() else
                   sum(f.stat().st_size for f in directory.glob("*.jsonl"))) / 2**20
            hidden = directory / ".segments-hidden"
            for label in ("segments",) if pruned.exists() else ("segments", "lines", "cached"):
                if label == "segments":
                    for cache in (directory / ".cache").glob("*"):
                        cache.unlink()
                if label == "lines":  # as if every rank had been killed: no segment
                    hidden.mkdir(exist_ok=True)
                    for seg in directory.glob("*.jsonl.*.parquet"):
                        seg.rename(hidden / seg.name)
                m = measure(args.dir, job_id, args.threads, args.memory_limit)
                print(f"{ranks:>6} {steps:>6} {m['events']:>12,} {raw:>9,.0f} {m['load_s']:>8.2f} "
                      f"{m['analyze_s']:>10.2f} {m['load_s'] + m['analyze_s']:>8.2f} {m['peak_mb']:>8,.0f}  "
                      f"{label:<9}{','.join(m['findings'])}" + (f"   (generated in {gen_s:.0f}s)" if gen_s else ""),
                      flush=True)
                gen_s = 0.0
            for seg in hidden.glob("*"):
                seg.rename(directory / seg.name)
            for cache in (directory / ".cache").glob("*"):
                cache.unlink()


if __name__ == "__main__":
    main()
