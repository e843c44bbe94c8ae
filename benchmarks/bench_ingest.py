"""Ingest throughput (lines/s, one core) on a mixed real-format log, against baselines in the same run.

    python benchmarks/bench_ingest.py [--lines 1000000] [--json]

The input mixes, as an 8-rank job's ``srun -l`` output would: Python ``logging`` lines,
NCCL INFO lines, DeepSpeed progress/timer lines, plain ``step N loss x time T ms``
lines, Megatron iteration lines, Hugging Face dicts and tqdm refreshes, headless
``print`` lines and tracebacks, all built with the frameworks' format strings
(``tests/ingest/fixtures.py``). Figures printed (nothing is asserted):

* ``grep -c`` over the file: the I/O floor;
* a bare Python loop over the lines doing what the engine's regexes do (head
  layout match plus the combined trigger search with ``re``): the "plain regex loop";
* the ingest, Hyperscan matching, to a null sink and to the embedded store, as a user
  runs it (with the compiled fast lane, ``native/``, where it is built, and the
  allocator thresholds the ``ingest`` command sets, ``ingest/_allocator.py``); the null
  sink takes several lines per item as the store does, once one line per item as the
  network shippers take them, and once with glibc's default thresholds (page faults
  printed beside);
* the same to a null sink with the Python engine alone (``native=False``);
* the Python engine with the plain-line fast path off (``plain_fast_path=False``: every
  line through the general per-line path, as before the fast path);
* the Python engine with Python ``re`` matching (no Hyperscan);
* the ingest of a file of each kind of line alone (what each kind costs);
* peak memory of the ingest for two input sizes, to a null sink and to the embedded store
  (whose segments are written at the end; flat memory means the same peak).

The ingest runs in one process and one thread; rates are lines per CPU second of
that process (``time.process_time``), so a busy machine does not distort them (the
wall-clock rate is printed beside). The goal is 500,000 lines/s.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ingest import fixtures as fx


def make_log(path: Path, n_lines: int, seed: int = 1) -> int:
    rnd = random.Random(seed)
    written = 0
    t = fx.T0
    step = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < n_lines:
            step += 1
            t += timedelta(milliseconds=250)
            stamp = t.strftime("%Y-%m-%d %H:%M:%S") + f",{t.microsecond // 1000:03d}"
            batch: list[str] = []
            for rank in range(8):
                lab = lambda s, r=rank: fx.srun_label(r, 1, s)  # noqa: E731
                for _ in range(4):
                    batch.append(lab(f"{stamp} - INFO - trainer.data - prefetched shard {rnd.randint(0, 9999)} "
                                     f"({rnd.randint(1, 512)} samples, {rnd.random() * 9:.2f} ms)"))
                batch.append(lab(fx.nccl_info(f"node{rank // 4}", 4000 + rank, 4100 + rank, rank % 4,
                                              f"Channel {rnd.randint(0, 31):02d}/32 : {rank} {(rank + 1) % 8} via P2P/IPC")))
                batch.append(lab(fx.nccl_info(f"node{rank // 4}", 4000 + rank, 4100 + rank, rank % 4,
                                              "comm 0x55d5 rank 3 nRanks 8 nNodes 2 localRanks 4 localRank 3 MNNVL 0")))
                batch.append(lab(f"{stamp} - INFO - __main__ - step {step} loss {2.0 / (1 + step * 0.01):.4f} lr 0.0003 "
                                 f"grad_norm {rnd.random() + 0.5:.3f} time 250.0ms (data 2.0ms forward 90.0ms backward "
                                 f"120.0ms allreduce 30.0ms optimizer 8.0ms)"))
                batch.append(lab(f"rank {rank}: tokens seen so far {step * 4096 * 8}"))
                if rank == 0:
                    batch.append(lab(fx.deepspeed_logger(t, "INFO", "logging.py", 128, "log_dist", fx.deepspeed_log_dist(
                        0, fx.deepspeed_progress(step, 0, [3e-4], [(0.9, 0.95)])))))
                    batch.append(lab(fx.deepspeed_logger(t, "INFO", "logging.py", 128, "log_dist", fx.deepspeed_log_dist(
                        0, fx.deepspeed_timers({"fwd": 90.0, "bwd": 150.0, "bwd_inner": 120.0, "bwd_allreduce": 30.0,
                                                "step": 8.0})))))
                if rank == 7:
                    batch.append(lab(fx.megatron_iteration(step, elapsed_ms=250.0, when=t)))
                    batch.append(lab(fx.tqdm_meter(step % 1000, 1000, step * 0.25, 4.0)))
                    if step % 10 == 0:
                        batch.append(lab(fx.hf_logs_dict_old({"loss": 1.2345, "grad_norm": 0.9, "learning_rate": 3e-4,
                                                              "epoch": step / 1000})))
                if step % 200 == 0 and rank == 3:
                    batch.append(lab(fx.deepspeed_overflow(0, 65536, 32768)))
                    for line in ["Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
                                 "    main()", "RuntimeError: transient dataloader error (retrying)"]:
                        batch.append(lab(line))
            out.write("\n".join(batch) + "\n")
            written += len(batch)
    return written


def _kind_lines(rnd: random.Random) -> dict[str, Callable[[int, int, datetime, str], str]]:
    """Line makers ``(rank, step, time, logging stamp) -> line``, one per kind, as in :func:`make_log`."""
    return {
        "python logging": lambda r, s, t, stamp: f"{stamp} - INFO - trainer.data - prefetched shard {rnd.randint(0, 9999)}",
        "print": lambda r, s, t, stamp: f"rank {r}: tokens seen so far {s * 4096 * 8}",
        "NCCL INFO": lambda r, s, t, stamp: fx.nccl_info(f"node{r // 4}", 4000 + r, 4100 + r, r % 4,
                                                          f"Channel {rnd.randint(0, 31):02d}/32 : {r} {(r + 1) % 8} via P2P/IPC"),
        "step line": lambda r, s, t, stamp: (f"{stamp} - INFO - __main__ - step {s} loss 1.2345 lr 0.0003 grad_norm 0.9 "
                                             f"time 250.0ms (data 2.0ms forward 90.0ms backward 120.0ms allreduce 30.0ms "
                                             f"optimizer 8.0ms)"),
        "Megatron iteration": lambda r, s, t, stamp: fx.megatron_iteration(s, elapsed_ms=250.0, when=t),
        "DeepSpeed progress": lambda r, s, t, stamp: fx.deepspeed_logger(
            t, "INFO", "logging.py", 128, "log_dist",
            fx.deepspeed_log_dist(0, fx.deepspeed_progress(s, 0, [3e-4], [(0.9, 0.95)]))),
    }


KINDS = tuple(_kind_lines(random.Random()))


def make_kind_log(path: Path, kind: str, n_lines: int) -> None:
    """``n_lines`` lines of one kind, as in :func:`make_log` (8 ranks, ``srun -l``): the per-kind rates."""
    line = _kind_lines(random.Random(2))[kind]
    t = fx.T0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n_lines):
            rank, step = i % 8, i // 8 + 1
            if rank == 0:
                t += timedelta(milliseconds=250)
            stamp = t.strftime("%Y-%m-%d %H:%M:%S") + f",{t.microsecond // 1000:03d}"
            out.write(fx.srun_label(rank, 1, line(rank, step, t, stamp)) + "\n")


def bare_regex_loop(path: Path) -> float:
    """What the engine's regexes cost on their own: head layout match plus the combined trigger search."""
    from ingest._timestamps import _LAYOUTS
    from ingest.parsers import builtin_registry

    head = [lo.rx for lo in _LAYOUTS if lo.name == "iso"][0]
    label = re.compile(r" *(\d{1,6}): ")
    alts = "|".join(f"(?i:{t[4:]})" if t.startswith("(?i)") else f"(?:{t})"
                    for p in builtin_registry().parsers() for t in p.triggers)
    trig = re.compile(alts)
    t0 = time.process_time()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            for raw in chunk.split(b"\n"):
                text = raw.decode("utf-8", "replace")
                m = label.match(text)
                if m:
                    text = text[m.end():]
                head.match(text)
                trig.search(text)
    return time.process_time() - t0


def grep_floor(path: Path) -> float | None:
    if not shutil.which("grep"):
        return None
    t0 = time.perf_counter()
    subprocess.run(["grep", "-c", "", str(path)], check=True, capture_output=True)
    return time.perf_counter() - t0


def run_ingest_child(path: str, mode: str) -> dict[str, float]:
    """Runs in a fresh process so its peak memory is its own."""
    from ingest import IngestConfig, Ingestor, MemorySink, open_sink
    from ingest._allocator import keep_freed_memory

    if mode != "null-malloc-defaults":
        keep_freed_memory()  # as the ingest command does
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    class Null(MemorySink):
        # Takes several lines per item, as the embedded store does ("null-lines": one line per item,
        # as the network shippers take them; "null-malloc-defaults": glibc's default thresholds, as a
        # library call in someone else's process gets them).
        takes_chunks = mode != "null-lines"

        def write(self, lines):
            pass

    use_hs = None if mode != "re" else False
    store = tempfile.mkdtemp(prefix="bench-ingest-")
    try:
        if mode == "store":
            factory = open_sink("local", "bench", data_dir=store)
        else:
            factory = lambda node, rank: Null()  # noqa: E731
        # "null"/"store": as a user runs it (the compiled lane when built); the others: the Python engine alone.
        config = IngestConfig(job="bench", use_hyperscan=use_hs, plain_fast_path=mode != "general",
                              native=None if mode in ("null", "null-lines", "null-malloc-defaults", "store") else False)
        t0, c0 = time.perf_counter(), time.process_time()
        s = Ingestor(config, factory).run([path])
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"seconds": dt, "cpu_seconds": cpu, "lines": s.lines, "events": sum(s.events.values()),
                "matcher": s.matcher + (" + compiled lane" if s.fast_lane else ""),
                "skipped": s.skipped_total, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0}
    finally:
        shutil.rmtree(store, ignore_errors=True)


def child(path: Path, mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", str(path), mode], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_ingest_child(*args.child)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "mixed.log"
        small = Path(tmp) / "mixed-small.log"
        n = make_log(big, args.lines)
        make_log(small, max(args.lines // 4, 1000))
        size_mb = big.stat().st_size / 1e6
        results: dict[str, object] = {"lines": n, "file_mb": round(size_mb, 1), "python": sys.version.split()[0]}
        g = grep_floor(big)
        if g:
            results["grep_c_lines_per_s"] = round(n / g)
        results["bare_regex_loop_lines_per_s"] = round(n / bare_regex_loop(big))
        for mode in ("null", "null-lines", "null-malloc-defaults", "python", "general", "store", "re"):
            r = child(big, mode)
            results[f"ingest_{mode}"] = {"lines_per_s": round(r["lines"] / r["cpu_seconds"]),
                                         "wall_lines_per_s": round(r["lines"] / r["seconds"]),
                                         "cpu_seconds": round(r["cpu_seconds"], 2),
                                         "events": r["events"], "matcher": r["matcher"], "page_faults": r["page_faults"],
                                         "peak_rss_mb": round(r["peak_rss_mb"], 1)}
        results["peak_rss_mb_quarter_input"] = round(child(small, "null")["peak_rss_mb"], 1)
        results["peak_rss_mb_quarter_input_store"] = round(child(small, "store")["peak_rss_mb"], 1)
        per_kind: dict[str, dict[str, float]] = {}
        for kind in KINDS:
            path = Path(tmp) / "kind.log"
            make_kind_log(path, kind, max(args.lines // 4, 2000))  # large enough that the lane's start-up is not the figure
            r = child(path, "null")
            per_kind[kind] = {"lines_per_s": round(r["lines"] / r["cpu_seconds"]),
                              "events_per_line": round(r["events"] / r["lines"], 2)}
        results["per_kind"] = per_kind
        results["goal_lines_per_s"] = 500_000
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"input: {results['lines']:,} lines, {results['file_mb']} MB, mixed real formats (8 ranks, srun -l)")
    if "grep_c_lines_per_s" in results:
        print(f"  grep -c (I/O floor)                 {results['grep_c_lines_per_s']:>12,} lines/s")
    print(f"  bare Python regex loop (baseline)    {results['bare_regex_loop_lines_per_s']:>12,} lines/s")
    for mode, label in (("null", "ingest, null sink"), ("null-lines", "ingest, null sink, a line per item"),
                        ("null-malloc-defaults", "the same, glibc's malloc defaults"),
                        ("python", "ingest, Python engine only, null sink"),
                        ("general", "ingest, general path only, null sink"),
                        ("store", "ingest → embedded store"), ("re", "ingest, re matching, null sink")):
        r = results[f"ingest_{mode}"]
        assert isinstance(r, dict)
        print(f"  {label:<36} {r['lines_per_s']:>12,} lines/s  ({r['cpu_seconds']} CPU s, wall "
              f"{r['wall_lines_per_s']:,} lines/s, {r['events']:,} events, {r['matcher']}, peak {r['peak_rss_mb']} MB, "
              f"{r['page_faults']:,} page faults)")
    for key, mode in (("peak_rss_mb_quarter_input", "null"), ("peak_rss_mb_quarter_input_store", "store")):
        print(f"  peak memory, {mode} sink, a quarter of the input: {results[key]} MB "
              f"(full input: {results[f'ingest_{mode}']['peak_rss_mb']} MB)")  # type: ignore[index]
    print("  per kind of line (a file of that kind alone, null sink):")
    for kind, r in results["per_kind"].items():  # type: ignore[attr-defined]
        print(f"    {kind:<22} {r['lines_per_s']:>10,} lines/s  ({r['events_per_line']} events per line)")
    print(f"  goal: {results['goal_lines_per_s']:,} lines/s on one core")


if __name__ == "__main__":
    main()
