"""How fast the HTML timeline opens in Chromium for a big job, beside the page it replaced.

    python benchmarks/bench_timeline.py                          # 1,024 ranks x 1,000 steps
    python benchmarks/bench_timeline.py --ranks 256 --steps 300  # a quicker look
    python benchmarks/bench_timeline.py --baseline-rev bbc9f45   # the page to compare with

The goal (issue 25): the page is drawn, every lane painted, in under 2 s for a 1,024-rank ×
1,000-step job. A synthetic job of that size (``jobtrace.synth``: a slow rank, a leak) is written
once into ``--data-dir`` and reused; each page is written by its own code and opened in a fresh
headless Chromium tab ``--repeat`` times. "Opened" is the time from ``Page.navigate`` until the
page says it has drawn (``body[data-ready=1]``, set once its first full draw is done; both pages
set it), polled every 10 ms over the DevTools protocol; the new page also reports its own
``performance.now()`` at that point. The baseline is the page at ``--baseline-rev`` (the one
before this rewrite), loaded from git and run on the same job in the same run; it draws at most
64 lanes and 300,000 spans, which is part of why it is fast, and is what the new page's level of
detail has to beat without dropping ranks. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASELINE_REV = "bbc9f45"
"""The commit whose ``queries/_timeline.py`` is today's page (before level of detail, curves and heatmap)."""


def baseline_module(rev: str) -> ModuleType:
    """``queries/_timeline.py`` as it was at ``rev``, imported inside the ``queries`` package."""
    import queries

    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:queries/_timeline.py"], check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("queries._timeline_baseline", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = queries.__name__
    exec(compile(source, f"{rev}:queries/_timeline.py", "exec"), module.__dict__)
    return module


def make_job(data_dir: Path, job_id: str, ranks: int, steps: int) -> None:
    from jobtrace.synth import SynthJob, write_job

    if (data_dir / job_id).exists():
        return
    t = time.perf_counter()
    write_job(data_dir, SynthJob(job_id=job_id, ranks=ranks, steps=steps, ranks_per_node=8, slow_ranks={ranks // 3: 1.4},
                                 leaks={ranks // 2: (steps // 2, 8.0)}, logs_per_step=0, compact=False),
              processes=2)  # JSON lines only: segments cost ~0.5 s a rank; the first read caches the job as Parquet
    print(f"wrote the job: {ranks} ranks x {steps} steps in {time.perf_counter() - t:.0f} s")


def open_times(path: Path, repeat: int) -> tuple[list[float], list[float | None], Any]:
    """Seconds from navigation to the page's drawn marker, per run, and the page's own clock where it has one."""
    from tests.queries.chromium import open_browser

    walls, own = [], []
    info = None
    with open_browser() as page:
        for _ in range(repeat):
            page.call("Page.navigate", url="about:blank")
            page.pump(0.3)
            t = time.perf_counter()
            page.call("Page.navigate", url=path.resolve().as_uri())
            while not page.eval("document.body !== null && document.body.dataset.ready === '1'"):
                assert time.perf_counter() - t < 120, "the page did not draw in 120 s"
                time.sleep(0.01)
            walls.append(time.perf_counter() - t)
            own.append(page.eval("window.jobtrace && window.jobtrace.drawnMs ? window.jobtrace.drawnMs / 1000 : null"))
            info = page.eval("""(() => ({lanes: document.querySelectorAll('.lane[data-rank]').length,
                                         errors: 0}))()""")
        info["errors"] = len(page.errors)
    return walls, own, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/jobtrace-bench-timeline"))
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    args = ap.parse_args()

    from queries import AnalysisConfig, analyze, load_local, write_timeline_html

    job_id = f"tl-{args.ranks}x{args.steps}"
    make_job(args.data_dir, job_id, args.ranks, args.steps)
    t = time.perf_counter()
    job = load_local(args.data_dir, job_id)
    report = analyze(job, AnalysisConfig())
    print(f"load + analyze: {time.perf_counter() - t:.1f} s ({report.events:,} events)")

    pages = {}
    t = time.perf_counter()
    pages["new"] = write_timeline_html(job, report, args.data_dir / f"{job_id}.html")
    write_new = time.perf_counter() - t
    t = time.perf_counter()
    old = baseline_module(args.baseline_rev)
    pages["baseline"] = old.write_timeline_html(job, report, args.data_dir / f"{job_id}.baseline.html")
    write_old = time.perf_counter() - t

    print(f"\n{args.ranks} ranks x {args.steps} steps; opened = navigation to first full draw, median of {args.repeat}")
    print(f"{'page':<10} {'write s':>8} {'MB':>7} {'lanes':>6} {'opened s':>9} {'min s':>7} {'page clock s':>13} {'errors':>7}")
    for name, path in (("baseline", pages["baseline"]), ("new", pages["new"])):
        walls, own, info = open_times(path, args.repeat)
        clock = [o for o in own if o is not None]
        print(f"{name:<10} {write_old if name == 'baseline' else write_new:>8.1f} {path.stat().st_size / 1e6:>7.1f} "
              f"{info['lanes']:>6} {statistics.median(walls):>9.2f} {min(walls):>7.2f} "
              f"{(f'{statistics.median(clock):.2f}' if clock else '-'):>13} {info['errors']:>7}")
    print("\ngoal: the new page opened in under 2 s with every lane drawn")


if __name__ == "__main__":
    main()
