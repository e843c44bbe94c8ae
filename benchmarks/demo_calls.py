"""What each tracing call costs inside the demo's step, where the model's kernels have just evicted the caches.

    torchrun --standalone --nproc-per-node 2 benchmarks/demo_calls.py [--steps 4000] [--export-steps 1000]

The per-record figures of ``bench_overhead.py`` are measured in tight loops with warm
caches; in a training step each call runs once, cold, and costs several times as much.
Here every call site of the demo's step is timed on its own (``perf_counter_ns`` around
it), even steps traced and odd steps plain (the same code with null context managers and
functions, the plain handlers), so both sides share the machine's drifts; the figure is
the median over steps of each side and their difference. A span's ``__enter__`` and
``__exit__`` are timed apart, the collective as the wrapper's time minus the collective's.

Then the export thread's share: ``--export-steps`` traced steps are queued with the
export thread parked, and one export of them is timed on this thread; again with the
encoder replaced by constant lines, which leaves what the queue, the items' memory and
the write cost without any encoding.

Rank 0 prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from demo_blocks import LoggingSwitch, null_span  # beside this script

import otel_instrumentation as oi
from jobtrace.demo.train import average_gradients, make_model
from otel_instrumentation._torch import wrap_collective

log = logging.getLogger("demo.train")
now = time.perf_counter_ns


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4000, help="timed steps, half traced")
    p.add_argument("--export-steps", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=open(os.devnull, "w"))  # noqa: SIM115
    # The collective is timed as the wrapper's time minus the collective's: the Python wrappers, not the process
    # group's hooks (whose cost bench_overhead.py --ddp gives as a share of a DDP step).
    os.environ.setdefault("JOBTRACE_COLLECTIVES", "wrap")
    tracing = oi.init_tracing()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(1234 + rank)
    torch.set_num_threads(1)
    model = make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    switch = LoggingSwitch()
    plain_all_reduce: Callable[..., Any] = dist.all_reduce.__jobtrace_wrapped__  # type: ignore[attr-defined]
    inner_ns = [0]

    def timed_all_reduce(*a: Any, **k: Any) -> Any:
        t = now()
        out = plain_all_reduce(*a, **k)
        inner_ns[0] = now() - t
        return out

    traced_all_reduce = wrap_collective(timed_all_reduce, "all_reduce", tracing.recorder, dist)
    times: dict[bool, dict[str, list[int]]] = {True: {}, False: {}}

    def step(i: int, traced: bool) -> None:
        switch.set(log=traced, console=traced)
        span, phase, metrics = (oi.step, oi.phase, oi.log_metrics) if traced else (null_span, null_span, null_span)
        all_reduce = traced_all_reduce if traced else timed_all_reduce
        t: dict[str, int] = {}

        def enter(name: str, cm: Any) -> Any:
            a = now()
            cm.__enter__()
            t[f"{name} enter"] = now() - a
            return cm

        def leave(name: str, cm: Any) -> None:
            a = now()
            cm.__exit__(None, None, None)
            t[f"{name} exit"] = now() - a

        s = enter("step", span(i))
        ph = enter("data", phase("data"))
        x = torch.randn(32, 64)
        y = x[:, :1] * 0.5 + 0.1 * torch.randn(32, 1)
        leave("data", ph)
        ph = enter("forward", phase("forward"))
        loss = torch.nn.functional.mse_loss(model(x), y)
        leave("forward", ph)
        ph = enter("backward", phase("backward"))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        leave("backward", ph)
        ph = enter("optimizer", phase("optimizer"))
        wrapper_ns = [0]

        def reduce(g: torch.Tensor) -> None:
            a = now()
            all_reduce(g)
            wrapper_ns[0] = now() - a

        grad_norm = average_gradients(model, world, reduce)
        opt.step()
        t["all_reduce record"] = wrapper_ns[0] - inner_ns[0]
        leave("optimizer", ph)
        leave("step", s)
        a = now()
        metrics(i, loss=loss, lr=0.01, grad_norm=grad_norm, samples_per_s=1000.0)
        t["log_metrics"] = now() - a
        a = now()
        log.info("step %d loss %.4f grad_norm %.3f", i, loss.item(), grad_norm)
        t["logger.info"] = now() - a
        for k, v in t.items():
            times[traced].setdefault(k, []).append(v)

    for i in range(200):  # warm-up of both paths
        step(i, i % 2 == 0)
    times = {True: {}, False: {}}
    for i in range(args.steps):
        step(i, i % 2 == 0)

    # The export thread's share: the events of some traced steps, exported on this thread as the export
    # thread does (encoded, written to the store, freed), with and without the encoding. The compiled
    # recorder wrote its lines at the calls: what is left is its drain and the write.
    rec, worker = tracing.recorder, tracing.worker
    calls, times = times, {True: {}, False: {}}  # the steps below are not timed call by call
    tracing.force_flush(60)
    export_us = {}
    if hasattr(rec, "drain"):
        with worker._export_lock:
            for i in range(args.export_steps):
                step(i, True)
            cpu = time.thread_time()
            data, n, _ = rec.drain()
            worker._write_chunk(data, n)
            del data
            export_us["export (drain, write)"] = (time.thread_time() - cpu) / args.export_steps * 1e6
    else:
        constant = [b"x" * 300 + b"\n"] * worker._batch_size
        for label, encoder in (("export, encoded", None), ("export, no encoding", lambda items: constant[:len(items)])):
            items: list[tuple[Any, ...]] = []
            rec.queue, rec.emit = None, items.append  # every item to this list instead of the queue
            for i in range(args.export_steps):
                step(i, True)
            rec.bind(worker)
            encode = worker._encode_batch
            if encoder is not None:
                worker._encode_batch = encoder
            n = worker._batch_size
            cpu = time.thread_time()
            while items:
                batch = items[:n]
                del items[:n]
                worker._export(batch)
                del batch
            export_us[label] = (time.thread_time() - cpu) / args.export_steps * 1e6
            worker._encode_batch = encode
    if rank == 0:
        total = 0.0
        print(f"{type(rec).__name__}, {world} ranks, {args.steps // 2} steps each side, medians per step (µs, wall of the call)")
        print(f"  {'call site':<20} {'traced':>8} {'plain':>8} {'adds':>8}")
        for k in calls[True]:
            tr, pl = statistics.median(calls[True][k]) / 1e3, statistics.median(calls[False][k]) / 1e3
            total += tr - pl
            print(f"  {k:<20} {tr:8.2f} {pl:8.2f} {tr - pl:+8.2f}")
        print(f"  {'training thread':<20} {'':8} {'':8} {total:+8.2f}")
        for label, us in export_us.items():
            print(f"  {label:<20} {us:8.2f} µs of CPU per traced step")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
