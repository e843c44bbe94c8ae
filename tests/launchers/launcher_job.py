"""One rank of a 2-rank gloo job started by a real launcher (srun, sbatch, mpirun) for test_launchers.py.

The launcher's own variables are all jobtrace is given: the rank, world size and job id come from
them. torch's ``env://`` wants ``RANK``/``WORLD_SIZE``, which srun and mpirun do not set, so the
script passes jobtrace's reading of them on (as a user's script does with the launcher's).
"""

import json
import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing(console=False)
ident = t.identity

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['JT_PORT']}", rank=ident.rank,
                        world_size=ident.world_size)
with oi.step(0):
    dist.all_reduce(torch.ones(8))
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{ident.rank}.json"), "w") as fh:
    json.dump({"job": ident.job_id, "trace": ident.trace_id, "rank": ident.rank, "world": ident.world_size,
               "launcher": ident.launcher, "node": ident.node}, fh)
t.shutdown()
