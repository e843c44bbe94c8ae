"""The demo's training script: a small data-parallel MLP on synthetic data, one line of tracing.

Run by ``jobtrace demo`` under torchrun (gloo, CPU). Faults are injected on purpose:

* ``--slow-rank`` sleeps ``--slow-ms`` in every forward pass (a straggler);
* ``--stall-rank`` sleeps ``--stall-s`` once, in the forward pass of ``--stall-step``;
* ``--data-rank`` sleeps ``--data-ms`` in every data phase (a slow data loader);
* ``--hang-rank`` stops forever in the forward pass at ``--hang-step`` (the others then
  block in all_reduce); ``--freeze-rank`` does the same holding the GIL (a C sleep that never
  lets go of it: its heartbeat thread stops too), ``--kill-rank`` sends itself SIGKILL there and
  ``--oom-rank`` asks for a 4 PiB tensor (the CPU allocator's out-of-memory error, uncaught);
  ``--inject-log`` appends the moment of each (JSON lines) to a file, written before the fault;
* ``--mismatch-rank`` calls all_gather where the others call all_reduce at
  ``--mismatch-step`` (the job hangs in mismatched collectives);
* ``--nan-step`` makes ``--nan-rank``'s loss NaN from that step;
* ``--leak-rank`` keeps ``--leak-mb`` of new memory every step from ``--leak-step``;
* ``--regress-step`` makes every rank's ``--regress-phase`` (backward by default) ``--regress-ms``
  slower from that step (a regression for golden-run comparison);
* ``--device-ms`` makes every rank's forward pass wait that long each step, as a host waits on its
  GPU's kernels: a steady phase, against which a small regression is measurable;
* ``--noise-step`` adds ``--label-noise`` (standard deviations) of noise to the targets from that
  step, as a corrupted data shard does: the loss curve departs and stays up.

``--fr-dump-dir`` writes this rank's PyTorch Flight Recorder buffer there every second
(``fr_trace_rank_<rank>``), the way a dump-on-timeout would leave it.

``--wrap none`` (the default) averages the gradients with an explicit ``dist.all_reduce`` of
one flat tensor; ``--wrap ddp`` wraps the model in ``DistributedDataParallel``, whose C++
reducer all-reduces them in buckets during ``backward()``; ``--wrap fsdp`` shards it with
FSDP2's ``fully_shard`` (all-gathers in forward and backward, reduce-scatters in backward).
Either way no tracing code surrounds a collective: jobtrace sees them through the process
group (``otel_instrumentation._collectives``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

import otel_instrumentation as oi

log = logging.getLogger("demo.train")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-rank", type=int, action="append", default=[])
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--hang-step", type=int, default=8)
    p.add_argument("--freeze-rank", type=int, default=None)
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--oom-rank", type=int, default=None)
    p.add_argument("--inject-log", default=None)
    p.add_argument("--nan-step", type=int, default=None)
    p.add_argument("--nan-rank", type=int, default=0)
    p.add_argument("--stall-rank", type=int, default=None)
    p.add_argument("--stall-step", type=int, default=5)
    p.add_argument("--stall-s", type=float, default=1.5)
    p.add_argument("--data-rank", type=int, action="append", default=[])
    p.add_argument("--data-ms", type=float, default=30.0)
    p.add_argument("--mismatch-rank", type=int, default=None)
    p.add_argument("--mismatch-step", type=int, default=5)
    p.add_argument("--leak-rank", type=int, action="append", default=[])
    p.add_argument("--leak-step", type=int, default=4)
    p.add_argument("--leak-mb", type=float, default=16.0)
    p.add_argument("--regress-step", type=int, default=None)
    p.add_argument("--regress-ms", type=float, default=25.0)
    p.add_argument("--regress-phase", choices=("data", "forward", "backward"), default="backward")
    p.add_argument("--device-ms", type=float, default=0.0)
    p.add_argument("--noise-step", type=int, default=None)
    p.add_argument("--label-noise", type=float, default=0.5)
    p.add_argument("--fr-dump-dir", default=None)
    p.add_argument("--ranks-per-node", type=int, default=0, help="simulate nodes: node = rank // N")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--wrap", choices=("none", "ddp", "fsdp"), default="none",
                   help="how gradients are averaged: by hand, DistributedDataParallel or FSDP2")
    p.add_argument("--no-marks", action="store_true",
                   help="no oi.step/oi.phase: steps and phases come from the optimizer, module and backward hooks")
    return p.parse_args(argv)


def _dump_flight_recorder(directory: str, rank: int) -> None:
    """Write the Flight Recorder buffer every second (a stand-in for dump-on-timeout on CPU).

    Dumping stops at the first signal (the job being stopped): a rank blocked in a
    collective cannot run a Python handler, but CPython writes every signal to the
    wakeup fd at once. Without that, a dump written during teardown would show the
    waiting ranks' collective as finished (it fails once the hung rank exits), which is
    not what a watchdog's dump at the timeout shows.
    """
    import select
    import signal
    import threading

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd)  # main thread only: main() calls this

    def loop() -> None:
        from torch._C._distributed_c10d import _dump_fr_trace

        path = os.path.join(directory, f"fr_trace_rank_{rank}")
        while not select.select([read_fd], [], [], 1.0)[0]:
            try:
                data = _dump_fr_trace()
                with open(path + ".tmp", "wb") as fh:
                    fh.write(data)
                os.replace(path + ".tmp", path)
            except Exception as exc:  # noqa: BLE001 - the demo keeps training without dumps
                log.warning("flight recorder dump failed: %s", exc)
                return

    os.makedirs(directory, exist_ok=True)
    threading.Thread(target=loop, name="fr-dump", daemon=True).start()


def make_model(hidden: int) -> torch.nn.Module:
    """The demo's MLP (also what ``benchmarks/bench_overhead.py`` times)."""
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    """The gradient ``backward()`` just computed: every parameter of the model takes part in the loss."""
    assert p.grad is not None
    return p.grad


def _inject(args: argparse.Namespace, rank: int, step: int) -> None:
    """The hang, freeze or kill of ``rank`` at ``step``, its moment written first (``--inject-log``)."""
    kind = ("hang" if rank == args.hang_rank else "freeze" if rank == args.freeze_rank
            else "kill" if rank == args.kill_rank else "oom")
    log.warning("rank %d: injected %s at step %d", rank, kind, step)
    if args.inject_log:
        import json

        with open(args.inject_log, "a") as fh:
            fh.write(json.dumps({"rank": rank, "kind": kind, "step": step, "ts": time.time_ns()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    if kind == "oom":  # the allocator's own error, uncaught: the rank dies of it
        torch.empty(2**50)
    if kind == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "freeze":
        import ctypes

        ctypes.PyDLL(None).sleep(10**6)  # PyDLL keeps the GIL through the call: no Python thread runs
    while True:
        time.sleep(1)


def _unmarked(*_a: object) -> contextlib.nullcontext[None]:
    """What ``oi.step``/``oi.phase`` stand in for under ``--no-marks``."""
    return contextlib.nullcontext()


def _local(t: torch.Tensor) -> torch.Tensor:
    """A tensor's own shard (FSDP2's parameters are DTensors), or the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def average_gradients(model: torch.nn.Module, world: int, reduce: Callable[[torch.Tensor], object]) -> float:
    """Average the gradients over the ranks with one collective on one flat tensor (DDP does it in buckets, the
    collective is the same); returns the gradient norm."""
    grads = torch.cat([_grad(p).flatten() for p in model.parameters()])
    reduce(grads)
    grads /= world
    offset = 0
    for p in model.parameters():
        n = p.numel()
        _grad(p).copy_(grads[offset:offset + n].view_as(p))
        offset += n
    return float(grads.norm())


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    node = f"node{rank // args.ranks_per_node}" if args.ranks_per_node else None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    oi.init_tracing(node=node, model="demo-mlp", config={"hidden": args.hidden, "batch": args.batch, "wrap": args.wrap})

    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("DEMO_PG_TIMEOUT", "600"))))
    world = dist.get_world_size()
    torch.manual_seed(1234 + rank)
    torch.set_num_threads(1)
    model = make_model(args.hidden)
    # the model's training FLOPs a step: 6 per parameter per sample (forward 2, backward 4), the usual estimate
    flops_per_step = 6 * sum(p.numel() for p in model.parameters()) * args.batch
    if args.wrap == "ddp":
        # Small buckets, so that one backward pass all-reduces in several (a real model has many).
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    elif args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(1234)  # FSDP2 shards the weights as they are: the same on every rank
        model = make_model(args.hidden)
        for layer in model.children():
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        # Start from identical weights on every rank, as DDP would.
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    log.info("rank %d of %d ready", rank, world)
    if args.fr_dump_dir:
        _dump_flight_recorder(args.fr_dump_dir, rank)
    leaked: list[torch.Tensor] = []
    step, phase = (_unmarked, _unmarked) if args.no_marks else (oi.step, oi.phase)

    regressed = _regression(args)
    for i in range(args.steps):
        t0 = time.perf_counter()
        with step(i):
            with phase("data"):
                if rank in args.data_rank:
                    time.sleep(args.data_ms / 1000)
                regressed("data", i)
                x = torch.randn(args.batch, 64)
                y = x[:, :1] * 0.5 + 0.1 * torch.randn(args.batch, 1)
                if args.noise_step is not None and i >= args.noise_step:
                    y = y + args.label_noise * torch.randn(args.batch, 1)
            with phase("forward"):
                if args.device_ms:
                    time.sleep(args.device_ms / 1000)
                if i == args.hang_step and rank in (args.hang_rank, args.freeze_rank, args.kill_rank, args.oom_rank):
                    _inject(args, rank, i)
                if rank in args.slow_rank:
                    time.sleep(args.slow_ms / 1000)
                if rank == args.stall_rank and i == args.stall_step:
                    log.warning("rank %d: injected one-off stall of %.1fs at step %d", rank, args.stall_s, i)
                    time.sleep(args.stall_s)
                if rank in args.leak_rank and i >= args.leak_step:
                    leaked.append(torch.ones(int(args.leak_mb * 2**20) // 4))
                loss = torch.nn.functional.mse_loss(model(x), y)
                regressed("forward", i)
                if args.nan_step is not None and rank == args.nan_rank and i >= args.nan_step:
                    loss = loss * math.nan
            with phase("backward"):
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                regressed("backward", i)
            with phase("optimizer"):
                if args.wrap == "none":
                    reduce: Callable[[torch.Tensor], object] = dist.all_reduce
                    if rank == args.mismatch_rank and i == args.mismatch_step:
                        log.warning("rank %d: injected all_gather where the others all_reduce at step %d", rank, i)
                        reduce = lambda g: dist.all_gather([torch.empty_like(g) for _ in range(world)], g)  # noqa: E731
                    grad_norm = average_gradients(model, world, reduce)
                else:  # averaged already, inside backward()
                    grad_norm = float(torch.cat([_local(_grad(p)).flatten() for p in model.parameters()]).norm())
                opt.step()
        elapsed = time.perf_counter() - t0
        extra = {"flops_per_step": flops_per_step} if i == 0 else {}  # once: `jobtrace metrics` derives TFLOP/s
        oi.log_metrics(i, loss=loss, lr=0.01, grad_norm=grad_norm, samples_per_s=args.batch / elapsed, **extra)
        log.info("step %d loss %.4f grad_norm %.3f", i, loss.item(), grad_norm)

    dist.barrier()
    dist.destroy_process_group()
    log.info("rank %d done", rank)


def _regression(args: argparse.Namespace) -> Callable[[str, int], None]:
    """``regressed(phase, step)``: sleeps ``--regress-ms`` where ``--regress-phase`` is ``phase`` from ``--regress-step``."""

    def regressed(phase: str, i: int) -> None:
        if args.regress_step is not None and i >= args.regress_step and phase == args.regress_phase:
            time.sleep(args.regress_ms / 1000)

    return regressed


if __name__ == "__main__":
    main()
