"""Writes this rank's job id and TraceID (tests/otel_instrumentation/test_runid.py), under a launcher that names
no run; then forms the process group through ``env://`` as any job would, on the store rank 0 may already serve."""

import json
import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import torch
import torch.distributed as dist

import otel_instrumentation as oi

t = oi.init_tracing(console=False)
dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
out = os.path.join(os.environ["OUT_DIR"], f"rank{t.identity.rank}.json")
with open(out, "w") as fh:
    json.dump({"job": t.identity.job_id, "trace": t.identity.trace_id, "warnings": list(t.identity.warnings),
               "sum": x.item(), "launcher": t.identity.launcher}, fh)
dist.destroy_process_group()
t.shutdown()
