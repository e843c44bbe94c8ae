"""A 2-rank DDP job with a DataLoader for tests/otel_instrumentation/test_autostep.py.

Rank 0 marks its steps and phases with ``oi.step``/``oi.phase``; rank 1 marks nothing, so its steps
and phases come from the optimizer, DataLoader, module and backward hooks. Both write, for each
step, the wall clock right after ``opt.step()`` returned: what an automatic step's end must match.
"""

import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(8 * 16, 32), torch.randn(8 * 16, 1))


def slow_collate(items):
    time.sleep(0.005)  # a loader that takes its time
    return torch.utils.data.default_collate(items)


loader = DataLoader(data, batch_size=16, collate_fn=slow_collate)
marked = rank == 0


def mark(kind, *args):
    return getattr(oi, kind)(*args) if marked else contextlib.nullcontext()


ends = []
it = iter(loader)
for i in range(8):
    with mark("step", i):
        with mark("phase", "data"):
            x, y = next(it)
        with mark("phase", "forward"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        with mark("phase", "backward"):
            opt.zero_grad()
            loss.backward()
        with mark("phase", "optimizer"):
            opt.step()
            ends.append(time.time_ns())
    time.sleep(0.01)  # the loop's own work between steps (logging, a scheduler)
dist.barrier()
with open(os.path.join(os.environ["JOBTRACE_DATA_DIR"], f"ends{rank}.json"), "w") as fh:
    json.dump({"ends": ends, "auto_steps": t.auto_steps.steps, "auto_on": t.auto_steps.enabled}, fh)
dist.destroy_process_group()
t.shutdown()
