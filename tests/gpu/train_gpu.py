"""A DDP job for the GPU check (tests/gpu/check.py): NCCL on CUDA, or gloo on CPU for a dry run with --cpu.

One line of tracing (``init_tracing``); a wide MLP so that a step takes milliseconds on an H100;
``--slow-rank`` sleeps before its forward pass, ``--hang-rank`` stops there at ``--hang-step``.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-ms", type=float, default=30)
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--hang-step", type=int, default=20)
p.add_argument("--cpu", action="store_true")
args = p.parse_args()

t = oi.init_tracing(console=False)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

local = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device("cpu") if args.cpu else torch.device("cuda", local)
if not args.cpu:
    torch.cuda.set_device(device)
dist.init_process_group("gloo" if args.cpu else "nccl")
rank = dist.get_rank()
torch.manual_seed(0)
h = args.hidden
model = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                            torch.nn.Linear(h, 1)).to(device)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if args.cpu else [local])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, h, device=device)
y = torch.randn(64, 1, device=device)
for i in range(args.steps):
    if rank == args.slow_rank:
        time.sleep(args.slow_ms / 1000)
    if rank == args.hang_rank and i == args.hang_step:
        while True:
            time.sleep(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    oi.log_metrics(loss=loss)
if not args.cpu:
    torch.cuda.synchronize()
print(f"rank {rank}: collectives={t.collectives.mode if t.collectives else None} "
      f"auto_steps={t.auto_steps.steps if t.auto_steps else None}", flush=True)
dist.destroy_process_group()
t.shutdown()
