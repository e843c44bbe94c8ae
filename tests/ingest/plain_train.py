"""A data-parallel training script that knows nothing of jobtrace: plain logging and print.

Run under torchrun (gloo, CPU). ``--slow-rank R`` sleeps ``--slow-ms`` in R's forward
pass, so the other ranks wait for it in the gradient all-reduce. Each rank logs one
line per step with its own timing breakdown, the way hand-written loops often do.
"""

import argparse
import logging
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-ms", type=float, default=40.0)
args = p.parse_args()

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("train")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
for prm in model.parameters():
    dist.broadcast(prm.data, src=0)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
print(f"rank {rank} of {world} ready", flush=True)
for step in range(args.steps):
    t0 = time.perf_counter()
    x = torch.randn(16, 32)
    y = x[:, :1] * 0.5
    t1 = time.perf_counter()
    if rank == args.slow_rank:
        time.sleep(args.slow_ms / 1000)
    loss = torch.nn.functional.mse_loss(model(x), y)
    t2 = time.perf_counter()
    opt.zero_grad()
    loss.backward()
    t3 = time.perf_counter()
    grads = torch.cat([q.grad.flatten() for q in model.parameters()])
    dist.all_reduce(grads)
    grads /= world
    t4 = time.perf_counter()
    off = 0
    for q in model.parameters():
        q.grad.copy_(grads[off:off + q.numel()].view_as(q))
        off += q.numel()
    opt.step()
    t5 = time.perf_counter()
    ms = lambda a, b: (b - a) * 1000
    log.info("step %d loss %.4f lr %g grad_norm %.3f time %.1fms (data %.1fms forward %.1fms backward %.1fms "
             "allreduce %.1fms optimizer %.1fms)", step, float(loss), 0.01, float(grads.norm()), ms(t0, t5),
             ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t4, t5))
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
