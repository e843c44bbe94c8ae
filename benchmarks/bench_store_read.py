"""Why DuckDB: reading an embedded store and computing per-rank step medians, DuckDB vs Polars.

    python benchmarks/bench_store_read.py [--ranks 256] [--steps 500] [--threads 1]

Both engines read the same synthetic job (``jobtrace.synth``) with an explicit
schema and compute the query at the heart of the straggler analysis: per rank, the
median step time and the median collective wait per step. Polars is optional
(``pip install polars``); without it only DuckDB is measured. Prints figures.
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DUCKDB = """
import duckdb, glob, sys, time
sys.path.insert(0, {root!r})
from queries._store import COLUMNS
if {narrow}:
    COLUMNS = {{k: COLUMNS[k] for k in ("ts", "kind", "rank", "step", "cat", "name", "dur")}}
paths = sorted(glob.glob({pattern!r}))
con = duckdb.connect(); con.execute("SET threads = {threads}")
cols = "{{" + ", ".join(f"'{{k}}': '{{v}}'" for k, v in COLUMNS.items()) + "}}"
t0 = time.perf_counter()
con.execute(f"CREATE TABLE events AS SELECT * FROM read_json(?, format='newline_delimited', columns={{cols}}, ignore_errors=true)", [paths])
rows = con.execute('''
  WITH s AS (SELECT rank, step, sum(dur) AS step_ns FROM events WHERE kind='span' AND cat='step' GROUP BY rank, step),
       c AS (SELECT rank, step, sum(dur) AS coll_ns FROM events WHERE kind='span' AND cat='collective' GROUP BY rank, step)
  SELECT rank, median(step_ns), median(coalesce(coll_ns, 0)) FROM s LEFT JOIN c USING (rank, step) GROUP BY rank''').fetchall()
print(time.perf_counter() - t0, len(rows))
"""

POLARS = """
import os
os.environ["POLARS_MAX_THREADS"] = "{threads}"
import polars as pl, glob, time
paths = sorted(glob.glob({pattern!r}))
schema = {{"ts": pl.Int64, "kind": pl.Utf8, "rank": pl.Int32, "step": pl.Int64, "cat": pl.Utf8, "name": pl.Utf8,
          "dur": pl.Int64}}
t0 = time.perf_counter()
df = pl.concat([pl.scan_ndjson(p, schema=schema, ignore_errors=True) for p in paths]).collect()
spans = df.filter(pl.col("kind") == "span")
s = spans.filter(pl.col("cat") == "step").group_by(["rank", "step"]).agg(pl.col("dur").sum().alias("step_ns"))
c = spans.filter(pl.col("cat") == "collective").group_by(["rank", "step"]).agg(pl.col("dur").sum().alias("coll_ns"))
out = (s.join(c, on=["rank", "step"], how="left").with_columns(pl.col("coll_ns").fill_null(0))
       .group_by("rank").agg(pl.col("step_ns").median(), pl.col("coll_ns").median()))
print(time.perf_counter() - t0, out.height)
"""


def run(code: str) -> tuple[float, int, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(out.stderr)
    secs, rows = out.stdout.split()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return float(secs), int(rows), max(peak, before) / 1024


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    from jobtrace.synth import SynthJob, write_job

    with tempfile.TemporaryDirectory() as d:
        directory = write_job(d, SynthJob(job_id="bench", ranks=args.ranks, steps=args.steps, slow_ranks={3: 1.5}))
        size = sum(os.path.getsize(f) for f in glob.glob(str(directory / "*.jsonl")))
        pattern = str(directory / "*.jsonl")
        print(f"store: {args.ranks} ranks x {args.steps} steps, {size / 1e6:.0f} MB, threads={args.threads}")
        wide, rows, _ = run(DUCKDB.format(root=str(ROOT), pattern=pattern, threads=args.threads, narrow=False))
        print(f"duckdb, all 24 columns (what trace-job loads): {wide:6.2f} s  ({size / 1e6 / wide:.0f} MB/s, {rows} ranks)")
        secs, rows, _ = run(DUCKDB.format(root=str(ROOT), pattern=pattern, threads=args.threads, narrow=True))
        print(f"duckdb, the 7 columns of this query         : {secs:6.2f} s  ({size / 1e6 / secs:.0f} MB/s)")
        try:
            import polars  # noqa: F401
        except ImportError:
            print("polars : not installed (pip install polars)")
            return
        psecs, prows, _ = run(POLARS.format(pattern=pattern, threads=args.threads))
        print(f"polars, the 7 columns of this query         : {psecs:6.2f} s  ({size / 1e6 / psecs:.0f} MB/s, {prows} ranks)")
        print(f"duckdb/polars time ratio (same columns): {secs / psecs:.2f}")


if __name__ == "__main__":
    main()
