"""A plain DDP training script, as a user writes one: torch, ``logging``, no jobtrace.

Run by ``tests/jobs/run_jobs.py`` under ``torchrun`` (gloo, CPU). It logs the way hand-written
loops commonly do (Python's default ``logging`` format with time, one line per step with the
loss and the step's time split into data / forward / backward-with-all-reduce / optimizer, in
the style of nanoGPT's and timm's loggers), and has one fault injected by ``--fault``:

* ``slow_rank``    rank ``--rank`` computes slower on every step (its forward is longer);
* ``slow_episode`` rank ``--rank`` is slow for steps 12–19 only;
* ``hang``         rank ``--rank`` logs "entering data reload" at step 10 and never joins again;
                   the others time out in the next all-reduce (gloo's timeout, ``--timeout-s``);
* ``crash``        rank ``--rank`` raises at step 10;
* ``mismatch``     rank ``--rank`` calls all_gather where the others call all_reduce at step 10;
* ``nan``          rank ``--rank``'s input becomes NaN at step 10 (its loss, then every rank's after the
                   gradients are averaged);
* ``spike``        every rank's targets are scaled up for step 15 only: the loss jumps, then recovers;
* ``slow_data``    rank ``--rank``'s data loading takes 120 ms more on every step;
* ``healthy``      nothing (``run_jobs.py`` may keep the machine busy meanwhile).

The script knows nothing of the analysis: what it logs is what such a loop logs whatever fails.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger("train")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="healthy")
    p.add_argument("--rank", type=int, default=1, help="the rank the fault is injected on")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--timeout-s", type=float, default=20.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    gen = torch.Generator().manual_seed(rank)
    me = rank == args.rank
    log.info("rank %d of %d: starting %d steps", rank, world, args.steps)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(256, 256, generator=gen)
        y = x.sum(dim=1, keepdim=True) / 16.0
        time.sleep(0.002)  # reading a batch
        if me and args.fault == "slow_data":
            time.sleep(0.12)
        if args.fault == "spike" and step == 15:
            y = y * 40.0
        if me and args.fault == "nan" and step >= 10:
            x = x * float("nan")
        if me and args.fault == "hang" and step == 10:
            log.info("step %d: entering data reload", step)
            time.sleep(10 * args.timeout_s)
        if me and args.fault == "crash" and step == 10:
            raise RuntimeError(f"corrupt sample in shard {rank} at step {step}")
        if me and args.fault == "mismatch" and step == 10:
            out = [torch.zeros(4) for _ in range(world)]
            dist.all_gather(out, torch.ones(4))
        t1 = time.perf_counter()
        pred = model(x)
        if me and (args.fault == "slow_rank" or (args.fault == "slow_episode" and 12 <= step < 20)):
            time.sleep(0.1)  # a slower device: its forward takes longer
        loss = nn.functional.mse_loss(pred, y)
        t2 = time.perf_counter()
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here: a rank waits for the slowest
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        log.info("step %d/%d | loss %.4f | time %.1fms | data %.1fms | fwd %.1fms | bwd %.1fms | opt %.1fms",
                 step, args.steps, loss.item(), (t4 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                 (t3 - t2) * 1e3, (t4 - t3) * 1e3)
    log.info("rank %d: done", rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
