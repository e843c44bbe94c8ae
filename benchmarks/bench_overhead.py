"""What jobtrace costs a training process, beside the baselines, in one run.

    python benchmarks/bench_overhead.py [--records 200000] [--repeat 5]
    python benchmarks/bench_overhead.py --redaction     # what redaction costs, on against off
    python benchmarks/bench_overhead.py --ddp           # the DDP demo job: process-group hooks, all tracing

Each case runs in a fresh subprocess (logging and OpenTelemetry are process-global)
and reports the median over ``--repeat`` runs:

* calling-thread cost of ``logger.info("step %d loss %.4f", i, x)`` with: a
  ``NullHandler`` (the floor: record creation alone), a ``FileHandler``,
  OpenTelemetry's logging bridge with a ``BatchLogRecordProcessor``, and jobtrace. It
  is the CPU time of the thread that logs (``time.thread_time``); the wall time per call
  of the tight loop is printed beside it, since in a pure-Python loop that time also
  covers the export thread's turns with the GIL (a training step mostly runs in C++
  kernels that release it);
* total CPU per record, background threads included (process CPU time / records);
* a step span (``with oi.step(i):``) and an OpenTelemetry SDK span for comparison;
* one collective record: the instrumentation wrapper around a no-op (what the calling
  thread pays), and ``all_reduce`` of a 4-byte tensor on a 1-rank gloo group end to end,
  instrumented and plain (which also includes the export thread's share of the GIL);
* a training step of the demo's MLP in one process (forward/backward/optimizer with
  phases: a sub-millisecond step, the harshest case) with and without jobtrace, and with
  the one-line setup alone (its log line captured; no step, phase or metrics calls);
* the real demo job (4 ranks under torchrun, gloo): its step traced and plain in
  alternating blocks of one job (``demo_blocks.py``: separate runs of a 4-rank job on 2
  cores differ by ±10 %, which hides a 1 % effect), and the same on one rank with one
  part of the tracing on at a time (spans, metrics, the log record, the console's trace
  context, the collective record), and with none (an A/A check of the method);
* each tracing call of the demo's step on its own, where the step's kernels have just
  evicted the caches (``demo_calls.py``, 2 ranks): where the step's cost goes, and the
  export thread's share with and without its encoding.

Prints figures and the ratios the project's goals are stated in; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = """
import json, logging, os, sys, tempfile, time
sys.path.insert(0, {root!r})
N = {n}
log = logging.getLogger("bench")
log.setLevel(logging.INFO)
log.propagate = False
THREAD = {{}}
def measure(fn):
    cpu0 = time.process_time(); th0 = time.thread_time(); t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    THREAD["us"] = (time.thread_time() - th0) / N * 1e6
    return wall, cpu0
def records():
    x = 0.5
    for i in range(N):
        log.info("step %d loss %.4f", i, x)
"""

CASES: dict[str, str] = {
    "null": """
log.addHandler(logging.NullHandler())
wall, cpu0 = measure(records)
print(json.dumps({"call_us": wall / N * 1e6, "thread_us": THREAD["us"], "cpu_us": (time.process_time() - cpu0) / N * 1e6}))
""",
    "file": """
d = tempfile.mkdtemp()
h = logging.FileHandler(os.path.join(d, "f.log"))
h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
log.addHandler(h)
wall, cpu0 = measure(records)
h.close()
print(json.dumps({"call_us": wall / N * 1e6, "thread_us": THREAD["us"], "cpu_us": (time.process_time() - cpu0) / N * 1e6}))
""",
    "otel_bridge": """
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
try:
    from opentelemetry.sdk._logs.export import LogRecordExporter as _Exp, LogRecordExportResult as _Res
except ImportError:
    from opentelemetry.sdk._logs.export import LogExporter as _Exp, LogExportResult as _Res
class Discard(_Exp):
    def export(self, batch):
        return _Res.SUCCESS
    def shutdown(self):
        pass
    def force_flush(self, timeout_millis=30000):
        return True
provider = LoggerProvider()
provider.add_log_record_processor(BatchLogRecordProcessor(Discard(), max_queue_size=N + 10))
import warnings; warnings.simplefilter("ignore")
log.addHandler(LoggingHandler(logger_provider=provider))
wall, cpu0 = measure(records)
provider.force_flush(); provider.shutdown()
print(json.dumps({"call_us": wall / N * 1e6, "thread_us": THREAD["us"], "cpu_us": (time.process_time() - cpu0) / N * 1e6}))
""",
    "jobtrace": """
import otel_instrumentation as oi
log.propagate = True  # before init: a non-propagating logger gets the handler of its own
t = oi.init_tracing("bench", data_dir=tempfile.mkdtemp(), torch=False, console=False)
exported0 = t.worker.stats.exported + t.worker.queued
wall, cpu0 = measure(records)
t.force_flush(60)
cpu = time.process_time() - cpu0
t.shutdown()
assert N <= t.worker.stats.exported - exported0 < N + 50, (t.worker.stats, "each record must be exported once")
print(json.dumps({"call_us": wall / N * 1e6, "thread_us": THREAD["us"], "cpu_us": cpu / N * 1e6, "spilled": t.worker.stats.spilled}))
""",
    "redact_lines": """
# The lines a traced run really writes (the log case's records, step spans, metrics), then Redactor.redact over
# them in the export thread's batch size: what redaction adds per line on the export thread, each prefilter.
import glob, statistics
import otel_instrumentation as oi
from jobtrace.redact import Redactor
d = tempfile.mkdtemp()
t = oi.init_tracing("bench", data_dir=d, torch=False, console=False, redact=False)
log.propagate = True
for i in range(N // 4):
    with oi.step(i):
        log.info("step %d loss %.4f", i, 0.5)
    oi.log_metrics(i, loss=0.5, lr=3e-4, grad_norm=0.9)
t.force_flush(60); t.shutdown()
lines = b"".join(open(f, "rb").read() for f in glob.glob(os.path.join(d, "**", "*.jsonl"), recursive=True)).splitlines(True)
secret = ("hf" + "_" + "Ab" * 17).encode()
with_secrets = [l if i % 1000 else l.replace(b'"msg":"', b'"msg":"token ' + secret + b' ', 1) for i, l in enumerate(lines)]
B = 512
def per_line(r, src):
    batches = [b"".join(src[i:i + B]) for i in range(0, len(src), B)]
    r.redact(batches[0])  # built on first use (Hyperscan compiles)
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for b in batches:
            r.redact(b)
        best.append((time.perf_counter() - t0) / len(src) * 1e6)
    return min(best)
out = {"lines": len(lines), "bytes_per_line": sum(map(len, lines)) / len(lines)}
for name, hs in (("hyperscan", True), ("re", False)):
    r = Redactor(hyperscan=hs)
    if hs and r.engine != "hyperscan":
        continue
    out[name + "_us"] = per_line(r, lines)
    out[name + "_secrets_us"] = per_line(r, with_secrets)
import orjson
objs = [orjson.loads(l) for l in lines[:20000]]
t0 = time.perf_counter()
for o in objs:
    orjson.dumps(o)
out["encode_us"] = (time.perf_counter() - t0) / len(objs) * 1e6  # the baseline: encoding the same lines once
print(json.dumps(out))
""",
    "spans": """
import otel_instrumentation as oi
t = oi.init_tracing("bench", data_dir=tempfile.mkdtemp(), torch=False, console=False)
M = N // 4
t0 = time.perf_counter()
for i in range(M):
    with oi.step(i):
        pass
ours = (time.perf_counter() - t0) / M * 1e6
t0 = time.perf_counter()
for i in range(M):
    with oi.phase("forward"):
        pass
phase = (time.perf_counter() - t0) / M * 1e6
t.shutdown()
from opentelemetry import trace
tracer = trace.get_tracer("bench")
t0 = time.perf_counter()
for i in range(M):
    with tracer.start_as_current_span("step"):
        pass
otel = (time.perf_counter() - t0) / M * 1e6
print(json.dumps({"step_span_us": ours, "phase_span_us": phase, "otel_span_us": otel}))
""",
    "collective": """
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300))
dist.init_process_group("gloo", rank=0, world_size=1)
x = torch.zeros(1)
M = min(N // 10, 20000)
def loop():
    t0 = time.perf_counter()
    for _ in range(M):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / M * 1e6
for _ in range(2000): dist.all_reduce(x)
plain = min(loop() for _ in range(3))
import otel_instrumentation as oi
t = oi.init_tracing("bench", data_dir=tempfile.mkdtemp(), console=False)
# The record alone, on the calling thread: the same wrapper around a function that does nothing.
from otel_instrumentation._torch import wrap_collective
def noop(tensor, op=None, group=None, async_op=False):
    return None
wrapped = wrap_collective(noop, "all_reduce", t.recorder, dist)
t0 = time.perf_counter()
for _ in range(M):
    noop(x)
bare = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(M):
    wrapped(x)
record = (time.perf_counter() - t0 - bare) / M * 1e6
for _ in range(2000): dist.all_reduce(x)
traced = min(loop() for _ in range(3))
t.shutdown()
print(json.dumps({"plain_us": plain, "traced_us": traced, "record_us": record}))
""",
    "demo_step": """
import logging, statistics, torch
torch.manual_seed(0); torch.set_num_threads(1)
import otel_instrumentation as oi
import contextlib
t = oi.init_tracing("bench", data_dir=tempfile.mkdtemp(), console=False)
ours = [h for h in log.handlers if type(h).__name__ == "JobtraceHandler"]
H = {hidden}
model = torch.nn.Sequential(torch.nn.Linear(64, H), torch.nn.ReLU(), torch.nn.Linear(H, H), torch.nn.ReLU(), torch.nn.Linear(H, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64); y = torch.randn(32, 1)
null = lambda *a, **k: contextlib.nullcontext()
def block(traced, steps, start):
    # One block of steps, instrumented or not, in the same process (same threads, caches, allocator).
    # HELPERS False: the one-line setup only (records captured, no step/phase/metrics calls).
    helpers = traced and {helpers}
    step, phase, metrics = (oi.step, oi.phase, oi.log_metrics) if helpers else (null, null, lambda *a, **k: None)
    log.handlers[:] = ours if traced else []
    c0 = time.process_time(); th0 = time.thread_time()
    for i in range(start, start + steps):
        with step(i):
            with phase("data"):
                xb = x + 0
            with phase("forward"):
                loss = torch.nn.functional.mse_loss(model(xb), y)
            with phase("backward"):
                opt.zero_grad(); loss.backward()
            with phase("optimizer"):
                opt.step()
        metrics(i, loss=loss)
        log.info("step %d loss %.4f", i, loss.item())
    thread = (time.thread_time() - th0) / steps * 1e6
    if traced:
        t.force_flush(60)  # the export of this block is charged to it, as if training did it
    return (time.process_time() - c0) / steps * 1e6, thread
S = {block_steps}
block(True, S, 0); block(False, S, 0)  # warm-up
pairs = []
for b in range(1, {blocks} + 1):
    order = (True, False) if b % 2 else (False, True)
    r = dict(zip(order, (block(order[0], S, b * S), block(order[1], S, b * S))))
    pairs.append((r[False], r[True]))
plain = statistics.median(p[0] for p, _ in pairs)
diffs = sorted((tr[0] - p[0]) / p[0] * 100 for p, tr in pairs)
q = len(diffs) // 4
print(json.dumps({"step_cpu_us": plain, "traced_cpu_us": statistics.median(tr[0] for _, tr in pairs),
                  "slowdown_pct": statistics.median(diffs), "q1": diffs[q], "q3": diffs[-1 - q],
                  "thread_extra_us": statistics.median(tr[1] - p[1] for p, tr in pairs),
                  "cpu_extra_us": statistics.median(tr[0] - p[0] for p, tr in pairs)}))
""",}


def _env(recorder: str | None, redact: str | None = None, native_hooks: str | None = None) -> dict[str, str]:
    """This process's environment, with ``JOBTRACE_NATIVE`` set for ``recorder`` ("native", "python" or None: the default),
    ``JOBTRACE_REDACT`` for ``redact`` ("0", "1" or None: the default, on) and ``JOBTRACE_NATIVE_HOOKS`` for
    ``native_hooks``."""
    import os

    env = dict(os.environ)
    if native_hooks is not None:
        env["JOBTRACE_NATIVE_HOOKS"] = native_hooks
    if redact is not None:
        env["JOBTRACE_REDACT"] = redact
    if recorder is not None:
        env["JOBTRACE_NATIVE"] = "1" if recorder == "native" else "0"
    return env


def run_case(name: str, n: int, recorder: str | None = None, redact: str | None = None,
             **fmt: object) -> dict[str, float]:
    body = CASES[name]
    for key, value in fmt.items():
        body = body.replace("{" + key + "}", repr(value))
    code = textwrap.dedent(PRELUDE.format(root=str(ROOT), n=n)) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         env=_env(recorder, redact))
    if out.returncode != 0:
        raise SystemExit(f"case {name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(name: str, n: int, repeat: int, recorder: str | None = None, redact: str | None = None,
              **fmt: object) -> dict[str, float]:
    runs = [run_case(name, n, recorder, redact, **fmt) for _ in range(repeat)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


PARTS = ("spans", "metrics", "log", "console", "collective")


def _torchrun(script: str, ranks: int, *args: str, out_arg: bool = False, recorder: str | None = None,
              redact: str | None = None, native_hooks: str | None = None) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run ``benchmarks/<script>.py`` as a ``ranks``-rank job on its own store; returns its folder and the run."""
    import os
    import tempfile

    out = tempfile.mkdtemp(prefix=f"bench-{script}-")
    env = dict(_env(recorder, redact, native_hooks), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), JOBTRACE_DATA_DIR=os.path.join(out, "data"),
               JOBTRACE_JOB_ID=f"bench-{script.replace('_', '-')}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           str(ROOT / "benchmarks" / f"{script}.py"), *(["--out", out] if out_arg else []), *args]
    return out, subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def demo_blocks(ranks: int, blocks: int, block_steps: int = 10, parts: tuple[str, ...] = PARTS,
                recorder: str | None = None, redact: str | None = None, wrap: str = "none",
                native_hooks: str | None = None) -> dict[str, float]:
    """The demo job's step with and without tracing in alternating blocks of one job (``demo_blocks.py``).

    Medians over ranks of: the plain step (process CPU of all threads, training thread CPU,
    wall), and what tracing adds per step (training thread CPU and wall: median over block
    pairs of traced minus plain; the export thread: its CPU over the run per traced step,
    idle wake-ups included; the heartbeat thread likewise, since it drains the compiled hooks' records).
    """
    out, run = _torchrun("demo_blocks", ranks, "--blocks", str(blocks), "--block-steps", str(block_steps),
                         "--parts", ",".join(parts) or "none", "--wrap", wrap, out_arg=True,
                         recorder=recorder, redact=redact, native_hooks=native_hooks)
    found = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(ranks)
             if Path(out, f"rank{r}.json").exists()]
    if run.returncode != 0 or len(found) != ranks:
        raise SystemExit(f"demo_blocks failed:\n{run.stderr[-3000:]}")

    def per_rank(fn: Any) -> float:
        return statistics.median(fn(r) for r in found)

    def diffs(r: dict[str, Any], k: int) -> list[float]:
        return [t[k] - p[k] for p, t in r["pairs"]]

    return {
        "pairs": blocks,
        "process_cpu_us": per_rank(lambda r: r["process_cpu_us_per_step"]),
        "thread_plain_us": per_rank(lambda r: statistics.median(p[0] for p, _ in r["pairs"])),
        "wall_plain_us": per_rank(lambda r: statistics.median(p[1] for p, _ in r["pairs"])),
        "thread_extra_us": per_rank(lambda r: statistics.median(diffs(r, 0))),
        "wall_extra_us": per_rank(lambda r: statistics.median(diffs(r, 1))),
        "export_us": per_rank(lambda r: r["export_us_per_traced_step"]),
        "beat_us": per_rank(lambda r: r.get("beat_us_per_traced_step", 0.0)),
        "compiled_hooks": float(all(r.get("compiled_hooks") for r in found)),
        "faults_plain": per_rank(lambda r: statistics.median(p[2] for p, _ in r["pairs"])),
        "faults_extra": per_rank(lambda r: statistics.median(diffs(r, 2))),
    }


def demo_calls(ranks: int, *extra: str, recorder: str | None = None) -> str:
    """Each tracing call of the demo's step timed on its own, cold, traced against plain (``demo_calls.py``)."""
    _, run = _torchrun("demo_calls", ranks, *extra, recorder=recorder)
    if run.returncode != 0:
        raise SystemExit(f"demo_calls failed:\n{run.stderr[-3000:]}")
    return run.stdout


def _native_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("jobtrace_native") is not None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--blocks", type=int, default=150, help="block pairs of the demo-job runs")
    p.add_argument("--recorders", default=None,
                   help="which recorders, comma-separated: native,python (default: both where jobtrace_native is installed)")
    p.add_argument("--no-parts", action="store_true", help="skip the one-rank runs of each part of the tracing")
    p.add_argument("--redaction", action="store_true",
                   help="only what redaction costs: per line, per log record and on the demo job, on against off")
    p.add_argument("--ddp", action="store_true",
                   help="only the DDP demo job: the collectives' process-group hooks alone, and all of tracing")
    args = p.parse_args()
    n, rep = args.records, args.repeat
    recorders = args.recorders.split(",") if args.recorders else (["native", "python"] if _native_installed() else ["python"])
    if args.redaction:
        redaction(n, rep, args.blocks, recorders)
        return
    if args.ddp:
        ddp(args.blocks, recorders)
        return

    base = {name: median_of(name, n, rep) for name in ("null", "file", "otel_bridge")}
    figures: dict[str, dict[str, Any]] = {}
    for r in recorders:
        figures[r] = {
            "log": median_of("jobtrace", n, rep, r),
            "spans": median_of("spans", n, rep, r),
            "coll": median_of("collective", n, rep, r),
            "harsh": run_case("demo_step", n, r, hidden=256, blocks=30, block_steps=100, helpers=True),
            "one_line": run_case("demo_step", n, r, hidden=256, blocks=30, block_steps=100, helpers=False),
            "demo_sized": run_case("demo_step", n, r, hidden=1024, blocks=16, block_steps=30, helpers=True),
            # The real demo job (4 ranks on this machine's cores), and each call of its step.
            "job": demo_blocks(4, args.blocks, recorder=r),
            "calls": demo_calls(2, recorder=r),
        }
    one_rank: dict[str, dict[str, float]] = {}
    if not args.no_parts:  # what each part costs on one rank, with the first recorder
        one_rank = {part: demo_blocks(1, args.blocks, parts=(part,), recorder=recorders[0]) for part in PARTS}
        one_rank["all"] = demo_blocks(1, args.blocks, recorder=recorders[0])
        one_rank["none (A/A)"] = demo_blocks(1, args.blocks, parts=(), recorder=recorders[0])

    floor = base["null"]["thread_us"]
    print(f"records per run: {n}, runs per case: {rep} (medians); recorders: {', '.join(recorders)}\n")
    print("calling thread = CPU time of the thread that logs (what training pays); loop wall = wall time per call")
    print("of the logging loop, which also holds while the export thread has the GIL; total CPU = all threads.\n")
    print(f"{'logger.info() with':<24}{'calling thread':>16}{'x floor':>9}{'loop wall':>12}{'total CPU':>12}")
    rows = [(base["null"], "NullHandler (floor)"), (base["file"], "FileHandler"), (base["otel_bridge"], "OTel bridge + batch")]
    rows += [(figures[r]["log"], f"jobtrace ({r})") for r in recorders]
    for row, label in rows:
        print(f"{label:<24}{row['thread_us']:>13.2f} µs{row['thread_us'] / floor:>8.2f}x{row['call_us']:>9.2f} µs"
              f"{row['cpu_us']:>9.2f} µs")
    print(f"\nOTel SDK span create+end    {figures[recorders[0]]['spans']['otel_span_us']:8.2f} µs")
    for r in recorders:
        f = figures[r]
        spans, coll, job = f["spans"], f["coll"], f["job"]
        print(f"\n==== the {r} recorder ====")
        print(f"step span                   {spans['step_span_us']:8.2f} µs   phase span {spans['phase_span_us']:.2f} µs")
        print(f"collective record           {coll['record_us']:8.2f} µs on the calling thread   (all_reduce, 1-rank gloo,"
              f" end to end: {coll['plain_us']:.1f} µs plain, {coll['traced_us']:.1f} µs traced, export included)")
        for label, c in (("1-process MLP step, small", f["harsh"]), ("  the same, one line only", f["one_line"]),
                         ("1-process MLP step, larger", f["demo_sized"])):
            print(f"{label:<28}{c['step_cpu_us']:8.1f} µs CPU plain, {c['traced_cpu_us']:.1f} µs traced: "
                  f"{c['slowdown_pct']:+.2f} % (interquartile {c['q1']:+.2f} .. {c['q3']:+.2f} % over interleaved block pairs;"
                  f" process CPU, all threads, export included); per step +{c['thread_extra_us']:.0f} µs on the training"
                  f" thread, +{c['cpu_extra_us']:.0f} µs in all")
        added = job["thread_extra_us"] + job["export_us"]
        f["job_cpu"] = job_cpu = added / job["process_cpu_us"] * 100
        f["job_wall"] = job_wall = job["wall_extra_us"] / job["wall_plain_us"] * 100
        print(f"demo job, 4 ranks, blocks of 10 steps alternated traced/plain in one job ({job['pairs']} pairs, medians):")
        print(f"  step wall {job['wall_plain_us']:8.1f} µs plain, {job['wall_extra_us']:+.1f} µs traced ({job_wall:+.2f} %)")
        print(f"  step CPU  {job['process_cpu_us']:8.1f} µs (process, all threads; training thread "
              f"{job['thread_plain_us']:.1f} µs): tracing adds {job['thread_extra_us']:+.1f} µs on the training thread "
              f"+ {job['export_us']:.1f} µs export thread = {job_cpu:+.2f} %")
        print(f"  minor page faults of the training thread per step: {job['faults_plain']:.1f} plain, "
              f"{job['faults_extra']:+.1f} traced")
        print("each call of the demo's step on its own, cold (demo_calls.py, even steps traced, odd plain, one job):")
        print(textwrap.indent(f["calls"].rstrip(), "  "))
    if one_rank:
        print(f"\nthe demo's step on one rank, one part of the tracing at a time ({recorders[0]} recorder; "
              "training thread / export thread per traced step):")
        for part, c in one_rank.items():
            print(f"  {part:<12} {c['thread_extra_us']:+7.1f} µs / {c['export_us']:5.1f} µs   "
                  f"(plain step: {c['thread_plain_us']:.0f} µs thread CPU, wall {c['wall_plain_us']:.0f} µs "
                  f"{c['wall_extra_us']:+.0f} µs)")
    for r in recorders:
        f = figures[r]
        log_ = f["log"]
        print(f"\ngoals, {r} recorder:")
        goals = [
            ("calling thread ≤ 1.5x NullHandler floor", log_["thread_us"] <= 1.5 * floor),
            ("calling thread < FileHandler", log_["thread_us"] < base["file"]["thread_us"]),
            ("loop wall < FileHandler", log_["call_us"] < base["file"]["call_us"]),
            ("total CPU ≤ FileHandler", log_["cpu_us"] <= base["file"]["cpu_us"]),
            ("step span < 20 µs", f["spans"]["step_span_us"] < 20),
            ("collective record < 5 µs", f["coll"]["record_us"] < 5),
            ("1-process step (larger) slowed < 1 %", f["demo_sized"]["slowdown_pct"] < 1),
            ("demo job step slowed < 1 % (wall, interleaved blocks)", f["job_wall"] < 1),
            ("demo job step costs < 1 % more CPU (interleaved blocks)", f["job_cpu"] < 1),
        ]
        for goal, ok in goals:
            print(f"  [{'met' if ok else 'NOT met'}] {goal}")


def _share(job: dict[str, float]) -> float:
    """What tracing adds to a step's CPU (training thread + export thread), in % of the step's process CPU."""
    return (job["thread_extra_us"] + job["export_us"] + job.get("beat_us", 0.0)) / job["process_cpu_us"] * 100


def ddp(blocks: int, recorders: list[str]) -> None:
    """The demo job under DistributedDataParallel (4 ranks): the reducer's all-reduces recorded through the
    process-group hooks alone (the compiled ones where built, and the Python ones), against the same job's
    plain blocks, then all of tracing; the A/A check beside. Background threads (export, heartbeat) count."""
    from otel_instrumentation import native_hooks

    compiled = native_hooks.built_path() is not None
    print(f"DDP demo job, 4 ranks, {blocks} block pairs of 10 steps (traced/plain alternated in one job; medians); "
          f"compiled hooks {'built' if compiled else 'NOT built (python -m otel_instrumentation.native_hooks)'}:")
    cases = ([("hooks, compiled", ("collective",), "1")] if compiled else []) + [
        ("hooks, Python", ("collective",), "0"), ("all tracing", PARTS, None), ("nothing (A/A)", (), None)]
    for r in recorders:
        for label, parts, hooks in cases:
            job = demo_blocks(4, blocks, parts=parts, recorder=r, wrap="ddp", native_hooks=hooks)
            print(f"  {r:<7} {label:<16} step CPU {job['process_cpu_us']:8.1f} µs, wall {job['wall_plain_us']:8.1f} µs: "
                  f"+{job['thread_extra_us']:.1f} µs training thread, {job['export_us']:.1f} µs export, "
                  f"{job['beat_us']:.1f} µs heartbeat = {_share(job):+.2f} % CPU; "
                  f"wall {job['wall_extra_us'] / job['wall_plain_us'] * 100:+.2f} %")
    print("goal: the process-group mechanism (hooks only) costs ≤ 0.5 % of the step's CPU")


def redaction(n: int, rep: int, blocks: int, recorders: list[str]) -> None:
    """What redaction (``JOBTRACE_REDACT``, on by default) costs, against the same runs with it off."""
    lines = run_case("redact_lines", n)
    print(f"redaction of the lines a traced run writes ({lines['lines']} lines, {lines['bytes_per_line']:.0f} bytes "
          f"each on average; batches of 512, best of 5), export thread, per line:")
    for name in ("hyperscan", "re"):
        if f"{name}_us" in lines:
            print(f"  {name + ' prefilter':<20}{lines[name + '_us']:7.3f} µs   with a secret in 1 line of 1000: "
                  f"{lines[name + '_secrets_us']:.3f} µs")
    print(f"  {'baseline: orjson':<20}{lines['encode_us']:7.3f} µs   (encoding the same line once)")
    for r in recorders:
        on, off = median_of("jobtrace", n, rep, r, "1"), median_of("jobtrace", n, rep, r, "0")
        print(f"\nlogger.info() traced, {r} recorder (median of {rep} runs of {n} records; all threads' CPU per record):")
        print(f"  redaction off {off['cpu_us']:6.2f} µs, on {on['cpu_us']:6.2f} µs: {on['cpu_us'] - off['cpu_us']:+.2f} µs; "
              f"calling thread {off['thread_us']:.2f} -> {on['thread_us']:.2f} µs")
        job_on, job_off = demo_blocks(4, blocks, recorder=r, redact="1"), demo_blocks(4, blocks, recorder=r, redact="0")
        for label, job in (("off", job_off), ("on", job_on)):
            cpu = (job["thread_extra_us"] + job["export_us"]) / job["process_cpu_us"] * 100
            print(f"  demo job ({blocks} block pairs), redaction {label:<3}: export thread {job['export_us']:6.1f} µs per "
                  f"traced step, tracing {cpu:+.2f} % of the step's CPU")


if __name__ == "__main__":
    main()
