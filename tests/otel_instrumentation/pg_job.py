"""A 2-rank gloo job for tests/otel_instrumentation/test_group_hooks.py: collectives no tracing code wraps.

``all_reduce`` is imported before ``init_tracing`` (a wrapper of the module's functions would miss it);
rank 1 arrives 0.4 s late at an ``async_op=True`` all-reduce that rank 0 waits on only later; a
subgroup is made after tracing starts; a batch of point-to-point ops and a functional collective run.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import all_reduce  # bound before init_tracing

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing()
dist.init_process_group("gloo")
rank = dist.get_rank()
with oi.step(0):
    all_reduce(torch.ones(1000))  # 4,000 bytes
    if rank == 1:
        time.sleep(0.4)
    work = dist.all_reduce(torch.ones(10), async_op=True)
    time.sleep(0.05)
    work.wait()
    ops = [dist.P2POp(dist.isend, torch.ones(3), 1 - rank), dist.P2POp(dist.irecv, torch.ones(3), 1 - rank)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    sub = dist.new_group([0, 1])
    dist.broadcast(torch.ones(4), src=0, group=sub)
    funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
    dist.barrier()
print(f"mode={t.collectives.mode} errors={t.collectives.errors} compiled={int(getattr(t.collectives, 'compiled', 0))}",
      flush=True)
dist.destroy_process_group()
t.shutdown()
