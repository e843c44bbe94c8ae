"""The demo job's step with and without jobtrace, in alternating blocks of steps of one job.

    torchrun --standalone --nproc-per-node 4 benchmarks/demo_blocks.py --out DIR [--blocks 150] [--block-steps 10]

Run by ``bench_overhead.py``. Separate runs of a 4-rank job on 2 cores differ by
±10 % in step time whatever tracing does (which rank gets which core, what the
neighbours on the machine do), which hides a 1 % effect. Here one job alternates
blocks of steps traced and plain, every rank switching at the same step, and the
order within each pair of blocks alternates too, so slow drifts of the machine hit
both sides alike; the figure is the median over block pairs of the difference.

Traced: ``oi.step``/``oi.phase``/``oi.log_metrics``, the log record captured, the
console line with its trace context, the all-reduce recorded (through the process group's
hooks where torch has them: plain blocks take the hooks off; else the wrapped function).
``--wrap ddp`` trains the model under DistributedDataParallel, whose reducer all-reduces the
gradients in buckets during ``backward()``. Plain: the same training
code without any of that, in the same processes. The step is the demo's
(``jobtrace.demo.train``) without fault injection.

Measured per block: the training thread's CPU per step and the median step wall time.
The export thread works on its own clock (once a second), so its CPU is read from its
own clock over the whole run and divided by the traced steps (plain blocks give it
nothing to do).

Each rank writes ``DIR/rank<N>.json``: the (plain, traced) pairs of (thread CPU µs per
step, median step wall µs), the export thread's CPU µs per traced step, and the
process CPU per step of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import otel_instrumentation as oi
from jobtrace.demo.train import average_gradients, make_model
from otel_instrumentation._logging import JobtraceHandler, TraceContextFormatter

log = logging.getLogger("demo.train")


def null_span(*_a: Any, **_k: Any) -> contextlib.nullcontext[None]:
    """What ``oi.step``/``oi.phase`` stand in for in plain steps."""
    return contextlib.nullcontext()


class LoggingSwitch:
    """What ``init_tracing`` changed in ``logging`` (the root handler, the console's trace context), undone
    and redone between traced and plain steps. Built after ``init_tracing``."""

    def __init__(self) -> None:
        self.root = logging.getLogger()
        self.traced = list(self.root.handlers)
        self.plain = [h for h in self.traced if not isinstance(h, JobtraceHandler)]
        self.consoles = [(h, h.formatter, h.formatter._inner) for h in self.plain
                         if isinstance(h.formatter, TraceContextFormatter)]

    def set(self, log: bool, console: bool) -> None:
        self.root.handlers[:] = self.traced if log else self.plain
        for h, with_context, inner in self.consoles:
            h.setFormatter(with_context if console else inner)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--blocks", type=int, default=150, help="block pairs")
    p.add_argument("--block-steps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--parts", default="spans,metrics,log,console,collective",
                   help="what traced blocks turn on (to see what each part costs)")
    p.add_argument("--flush-interval", type=float, default=1.0, help="the export thread's period (init_tracing's)")
    p.add_argument("--wrap", choices=("none", "ddp"), default="none", help="average gradients by hand or with DDP")
    args = p.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tracing = oi.init_tracing(flush_interval_s=args.flush_interval)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    switch = LoggingSwitch()  # what the one line changed, to undo and redo between blocks
    traced_all_reduce = dist.all_reduce
    plain_all_reduce: Callable[..., Any] = getattr(dist.all_reduce, "__jobtrace_wrapped__", dist.all_reduce)

    torch.manual_seed(1234 + rank)
    torch.set_num_threads(1)
    model = make_model(args.hidden)
    if args.wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    else:
        for prm in model.parameters():
            dist.broadcast(prm.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hooks = tracing.collectives if tracing.collectives is not None and tracing.collectives.mode == "hooks" else None

    parts = set(args.parts.split(","))

    def block(traced: bool, first: int) -> tuple[float, float, float]:
        on = parts if traced else set()
        switch.set(log="log" in on, console="console" in on)
        step, phase = (oi.step, oi.phase) if "spans" in on else (null_span, null_span)
        metrics = oi.log_metrics if "metrics" in on else (lambda *a, **k: None)
        all_reduce = traced_all_reduce if "collective" in on else plain_all_reduce
        if hooks is not None:
            hooks.set_enabled("collective" in on)
        dist.barrier()  # every rank starts the block together
        walls = []
        faults0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        cpu0 = time.thread_time()
        for i in range(first, first + args.block_steps):
            t0 = time.perf_counter()
            with step(i):
                with phase("data"):
                    x = torch.randn(args.batch, 64)
                    y = x[:, :1] * 0.5 + 0.1 * torch.randn(args.batch, 1)
                with phase("forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with phase("backward"):
                    opt.zero_grad()
                    loss.backward()  # type: ignore[no-untyped-call]
                with phase("optimizer"):
                    if args.wrap == "ddp":  # averaged in backward() by the reducer
                        grad_norm = float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())
                    else:
                        grad_norm = average_gradients(model, world, all_reduce)
                    opt.step()
            elapsed = time.perf_counter() - t0
            metrics(i, loss=loss, lr=0.01, grad_norm=grad_norm, samples_per_s=args.batch / elapsed)
            log.info("step %d loss %.4f grad_norm %.3f", i, loss.item(), grad_norm)
            walls.append(time.perf_counter() - t0)  # the whole iteration, as the next step sees it
        cpu = (time.thread_time() - cpu0) / args.block_steps * 1e6
        faults = (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults0) / args.block_steps
        return cpu, statistics.median(walls) * 1e6, faults

    block(True, 0)
    block(False, 0)  # warm-up of both paths
    tracing.force_flush(60)
    exporter = next(t for t in threading.enumerate() if t.name == "jobtrace-export")
    export_clock = time.pthread_getcpuclockid(exporter.ident)  # type: ignore[arg-type]
    beat = next(t for t in threading.enumerate() if t.name == "jobtrace-heartbeat")
    beat_clock = time.pthread_getcpuclockid(beat.ident)  # type: ignore[arg-type]
    export0, process0, beat0 = time.clock_gettime(export_clock), time.process_time(), time.clock_gettime(beat_clock)
    pairs = []
    for b in range(1, args.blocks + 1):
        order = (False, True) if b % 2 else (True, False)
        got = {traced: block(traced, b * 2 * args.block_steps + k * args.block_steps)
               for k, traced in enumerate(order)}
        pairs.append((got[False], got[True]))
    tracing.force_flush(60)
    steps = 2 * args.blocks * args.block_steps
    export_us = (time.clock_gettime(export_clock) - export0) / (steps / 2) * 1e6
    beat_us = (time.clock_gettime(beat_clock) - beat0) / (steps / 2) * 1e6  # compiled hooks: drained here
    process_us = (time.process_time() - process0) / steps * 1e6
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "pairs": pairs, "export_us_per_traced_step": export_us,
                   "beat_us_per_traced_step": beat_us, "compiled_hooks": bool(getattr(hooks, "compiled", False)),
                   "process_cpu_us_per_step": process_us}, fh)


if __name__ == "__main__":
    main()
