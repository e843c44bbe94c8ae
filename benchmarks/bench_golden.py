"""The golden library at scale: adding an entry, choosing and comparing against a library of 100, entry size.

    python benchmarks/bench_golden.py                  # 64 ranks x 1,000 steps, a library of 100 entries
    python benchmarks/bench_golden.py --ranks 16 --steps 200 --entries 20

A synthetic job (``jobtrace.synth``, the embedded-store format: phases, a step span, an all_reduce, metrics,
memory and one log line per rank and step) is generated once, analysed (the baseline: what ``trace-job``
costs without golden runs), then:

* **add**: the entry of the job (``profile_job``: its per-step series, log templates and shape) and the
  size of its JSON file;
* **library**: ``--entries`` entries made from it, each with its series scaled by a factor (0.9-1.1)
  and a shape of its own for a quarter of them (another world size), saved to a folder, as ``golden add``
  leaves them;
* **choose and compare**: what ``trace-job --golden --gate`` adds to the analysis: loading the library,
  choosing the nearest same-shape entries, the band comparison, the log templates, the deviation score and
  its leave-one-out; measured beside the analysis alone, in the same run (goal: under 1 s beyond it).

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--entries", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "jobtrace-bench-golden")
    args = p.parse_args()

    from jobtrace.synth import SynthJob, write_job
    from queries import (
        AnalysisConfig,
        GoldenProfile,
        analyze,
        choose_golden,
        compare_to_golden,
        list_golden,
        load_golden,
        load_local,
        profile_job,
        save_golden,
    )

    job_id = f"golden-{args.ranks}x{args.steps}"
    if not (args.dir / job_id / ".complete").exists():
        t0 = time.perf_counter()
        write_job(args.dir, SynthJob(job_id=job_id, ranks=args.ranks, steps=args.steps, logs_per_step=1),
                  processes=os.cpu_count() or 1)
        (args.dir / job_id / ".complete").touch()
        print(f"job generated in {time.perf_counter() - t0:.1f} s")
    cfg = AnalysisConfig(golden_gate=6.0)

    def analysis_alone() -> float:
        job = load_local(args.dir, job_id)
        t0 = time.perf_counter()
        analyze(job, cfg)
        return time.perf_counter() - t0

    def add_entry() -> tuple[float, GoldenProfile]:
        job = load_local(args.dir, job_id)
        analyze(job, cfg)  # builds the step tables, as `golden add` does before it profiles
        t0 = time.perf_counter()
        entry = profile_job(job)
        return time.perf_counter() - t0, entry

    adds = [add_entry() for _ in range(args.repeat)]
    entry = adds[0][1]
    lib = args.dir / "library"
    lib.mkdir(exist_ok=True)
    for old in lib.glob("*.json"):
        old.unlink()
    rnd = random.Random(3)
    for i in range(args.entries):
        factor = rnd.uniform(0.9, 1.1)
        series = {k: [None if v is None else v * factor for v in vs] for k, vs in entry.series.items()}
        shape = dict(entry.shape)
        if i % 4 == 3:
            shape["world"] = shape.get("world", 0) * 2
        save_golden(dataclasses.replace(entry, name=f"e{i:03d}", job_id=f"e{i:03d}", series=series, shape=shape), lib)
    size = statistics.median(p.stat().st_size for p in lib.glob("*.json"))

    def choose_and_compare() -> tuple[float, float]:
        job = load_local(args.dir, job_id)
        t0 = time.perf_counter()
        report = analyze(job, cfg)  # the analysis alone, then what --golden adds on the same loaded job
        t1 = time.perf_counter()
        entries = [load_golden(lib, n) for n in list_golden(lib)]
        mine = profile_job(job)
        chosen, _ = choose_golden(mine, entries)
        findings = compare_to_golden(job, chosen, cfg, mine)
        t2 = time.perf_counter()
        assert report is not None and findings is not None
        return t1 - t0, t2 - t1

    runs = [choose_and_compare() for _ in range(args.repeat)]
    alone = statistics.median([analysis_alone() for _ in range(args.repeat)])
    print(f"job {args.ranks} ranks x {args.steps} steps; library of {args.entries} entries; medians of {args.repeat}")
    print(f"  analysis alone (baseline)        {alone:8.3f} s")
    print(f"  add an entry (profile the job)   {statistics.median(a for a, _ in adds):8.3f} s")
    print(f"  choose + compare (--golden)      {statistics.median(b for _, b in runs):8.3f} s beyond the analysis "
          f"({statistics.median(a for a, _ in runs):.3f} s in the same run); goal < 1 s")
    print(f"  entry size                       {size / 1024:8.1f} KiB (job's events: "
          f"{sum(p.stat().st_size for p in (args.dir / job_id).glob('*.jsonl')) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
