"""A 3-rank gloo job for test_guard.py whose ranks train models of their own (no gradient averaging), so that
only rank 1's gradients go bad at step 3: what the others do then is the guard's all-rank decision.

Each rank writes, per step, the checksum of its weights after the step (``ranks<r>.json``), and for ``stop``
the step its checkpoint callback was called with.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

p = argparse.ArgumentParser()
p.add_argument("--action", required=True)
p.add_argument("--fault", choices=("nan", "explode"), required=True)
args = p.parse_args()

t = oi.init_tracing(console=False)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
out = os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json")
record = {"sums": [], "checkpoint": None}


def save(step):
    record["checkpoint"] = step
    with open(out, "w") as fh:
        json.dump(record, fh)


kw = {"nan": args.action} if args.fault == "nan" else {"on": args.action, "grad_norm_max": 50.0}
guard = oi.guard(checkpoint=save, batch_ids=lambda: [rank * 100 + step], pause_file=os.environ.get("PAUSE_FILE"),
                 **kw)
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(6):
    with oi.step(step):
        x = torch.randn(16, 8)
        loss = (model(x) ** 2).mean()
        if rank == 1 and step == 3:
            loss = loss * (math.nan if args.fault == "nan" else 1e6)
        opt.zero_grad()
        loss.backward()
        opt.step()
    record["sums"].append(float(sum(p.detach().abs().sum() for p in model.parameters())))
    record["actions"] = guard.actions
    with open(out, "w") as fh:
        json.dump(record, fh)
dist.destroy_process_group()
t.shutdown()
