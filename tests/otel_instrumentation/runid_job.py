"""Writes this rank's job id and TraceID (tests/otel_instrumentation/test_runid.py), under bare torchrun."""

import json
import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing(console=False)
out = os.path.join(os.environ["OUT_DIR"], f"rank{t.identity.rank}.json")
with open(out, "w") as fh:
    json.dump({"job": t.identity.job_id, "trace": t.identity.trace_id, "warnings": list(t.identity.warnings)}, fh)
t.shutdown()
