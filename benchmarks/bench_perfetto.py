"""How long ``trace-job --perfetto`` takes on a large job, how big the file is, and how much memory it needs.

    python benchmarks/bench_perfetto.py                       # 1,024 ranks x 1,000 steps (6.1M spans)
    python benchmarks/bench_perfetto.py --ranks 128 --steps 1000
    python benchmarks/bench_perfetto.py --keep /tmp/bench-perfetto   # keep the job and the files

A synthetic job (:class:`jobtrace.synth.SynthJob`, with a slow rank, NaN loss and a leak) is
written once. Then each writer runs in a process of its own, which loads and analyses the job
and writes its file; it reports the write's wall time, the file's size, what the file holds and
the process's peak memory above what the load and analysis had already taken:

* **protobuf**: :func:`queries.write_perfetto`, the complete Perfetto trace (every span);
* **json (before)**: the Chrome trace-event JSON writer it replaced, with its 64-rank and
  300,000-span caps, as the baseline, where the tree still has it (``queries._timeline``).

Where ``trace_processor_shell`` is found (``PERFETTO_TP_SHELL`` or on ``PATH``), the protobuf
file is also loaded into Perfetto's trace processor and its slice, flow and counter counts and
import errors are printed. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobtrace.synth import SynthJob, write_job


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(data_dir: str, job_id: str, writer: str, out: str) -> dict[str, Any]:
    """Load, analyse and write with one writer; runs in its own process so peak memory is its own."""
    from queries import AnalysisConfig, analyze, load_local

    t = time.perf_counter()
    job = load_local(data_dir, job_id)
    report = analyze(job, AnalysisConfig())
    prepared = time.perf_counter() - t
    before = _peak_mb()
    spans = job.con.execute("SELECT count(*) FROM events WHERE kind = 'span'").fetchone()[0]
    if writer == "protobuf":
        from queries import write_perfetto

        fn = write_perfetto
    else:
        import queries._timeline as timeline

        fn = getattr(timeline, "write_perfetto", None)
        if fn is None:
            return {"writer": writer, "missing": True}
    t = time.perf_counter()
    path = fn(job, report, out)
    took = time.perf_counter() - t
    result = {"writer": writer, "write_s": round(took, 2), "load_analyse_s": round(prepared, 2),
              "size_mb": round(Path(path).stat().st_size / 1e6, 1), "extra_peak_mb": round(_peak_mb() - before),
              "spans_in_job": spans}
    if writer == "json":
        data = json.loads(Path(path).read_bytes())
        result["spans_in_file"] = sum(1 for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "stuck")
        result["ranks_in_file"] = len({e["tid"] for e in data["traceEvents"] if e.get("name") == "thread_name"})
        result["truncated"] = data.get("otherData", {}).get("truncated")
    return result


def trace_processor(path: Path) -> dict[str, Any] | str:
    shell = os.environ.get("PERFETTO_TP_SHELL") or shutil.which("trace_processor_shell")
    if not shell:
        return ("no trace_processor_shell (the perfetto package downloads it from Google's storage at run time, "
                "and no package registry ships it): not loaded")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    t = time.perf_counter()
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=shell, load_timeout=600))
    loaded = time.perf_counter() - t

    def q(sql: str) -> Any:
        return [r.__dict__ for r in tp.query(sql)]

    out = {"load_s": round(loaded, 1), "slices": q("SELECT count(*) AS n FROM slice")[0]["n"],
           "flows": q("SELECT count(*) AS n FROM flow")[0]["n"],
           "counters": q("SELECT count(*) AS n FROM counter")[0]["n"],
           "threads": q("SELECT count(*) AS n FROM thread WHERE name LIKE 'rank %'")[0]["n"],
           "errors": q("SELECT name, value FROM stats WHERE severity IN ('error', 'data_loss') AND value > 0")}
    tp.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--processes", type=int, default=2, help="processes writing the synthetic job")
    ap.add_argument("--keep", default=None, help="folder to keep the job and the files in")
    ap.add_argument("--only", choices=["protobuf", "json"], default=None)
    ap.add_argument("--one", nargs=4, metavar=("DATA_DIR", "JOB", "WRITER", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-perfetto-"))
    root.mkdir(parents=True, exist_ok=True)
    job_id = f"perfetto-{args.ranks}x{args.steps}"
    if not (root / job_id).exists():
        t = time.perf_counter()
        write_job(root, SynthJob(job_id=job_id, ranks=args.ranks, steps=args.steps, slow_ranks={args.ranks // 3: 1.5},
                                 nan_step=args.steps - 10, leaks={1: (args.steps // 2, 8.0)}),
                  keep_lines=False, processes=args.processes)
        print(f"wrote the job ({args.ranks} ranks x {args.steps} steps) in {time.perf_counter() - t:.1f} s")
    results = []
    for writer in ("protobuf", "json"):
        if args.only and writer != args.only:
            continue
        out = root / ("trace.pftrace" if writer == "protobuf" else "trace.json")
        proc = subprocess.run([sys.executable, __file__, "--one", str(root), job_id, writer, str(out)],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            print(f"{writer}: failed\n{proc.stderr[-2000:]}")
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"\n{args.ranks} ranks x {args.steps} steps")
    print(f"{'writer':<14} {'write s':>8} {'MB':>8} {'peak+ MB':>9}  contents")
    for r in results:
        if r.get("missing"):
            print(f"{r['writer']:<14} (not in this tree)")
            continue
        what = (f"{r['spans_in_job']:,} spans, all ranks" if r["writer"] == "protobuf" else
                f"{r['spans_in_file']:,} of {r['spans_in_job']:,} spans, {r['ranks_in_file']} ranks, "
                f"truncated={r['truncated']}")
        print(f"{r['writer']:<14} {r['write_s']:>8} {r['size_mb']:>8} {r['extra_peak_mb']:>9}  {what}")
    if any(r["writer"] == "protobuf" and not r.get("missing") for r in results):
        print("\ntrace processor:", trace_processor(root / "trace.pftrace"))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
