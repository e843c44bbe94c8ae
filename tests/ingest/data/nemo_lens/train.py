"""Two ranks instrumented with NeMo Lens as its README and semconv show: a job span, per-step spans with
dl.iteration, forward_backward and optimizer spans under them, dl.loss/dl.grad_norm/dl.learning_rate on the
step span. The ranks meet once per step inside the optimizer span (a socket exchange standing in for the
gradient all-reduce: no torch in this Python), so a slow rank holds the other back as in a real job.
With SLOW_RANK=r, rank r's forward_backward is 40 ms slower from iteration 10.

Run (Python 3.12, nemo-lens from its repository on PYTHONPATH, opentelemetry-sdk and the OTLP exporters):
RANK=0|1 WORLD_SIZE=2 PEER_PORT=29777 NEMO_LENS_ENABLED=1 NEMO_LENS_EXPORT_STRATEGY=all_ranks
NEMO_LENS_SPAN_GROUPS=per_step NEMO_LENS_RUN_ID=… NEMO_LENS_METRICS_ENABLED=0 OTEL_SERVICE_NAME=megatron
OTEL_EXPORTER_OTLP_ENDPOINT=<jaeger's OTLP/HTTP> OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf python train.py
"""

import math
import os
import random
import socket
import time

from nemo.lens import NemoLensConfig, managed_span, setup_telemetry
from nemo.lens import semconv as sc

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
port = int(os.environ["PEER_PORT"])
if rank == 0:
    peer, _ = socket.create_server(("127.0.0.1", port)).accept()
else:
    for _ in range(200):
        try:
            peer = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            time.sleep(0.05)
handle = setup_telemetry(NemoLensConfig.from_env(), rank=rank, world_size=world)
random.seed(rank)
try:
    with managed_span("job", "train.job"):
        for i in range(30):
            with managed_span("step", "train.step", **{sc.DL_ITERATION: i}) as span:
                with managed_span("forward_backward", "forward_backward", **{sc.DL_ITERATION: i}):
                    time.sleep(0.02 + random.random() * 0.002 + (0.04 if rank == slow_rank and i >= 10 else 0))
                with managed_span("optimizer", "optimizer", **{sc.DL_ITERATION: i}):
                    peer.sendall(b"g")  # both wait here for the slower one
                    peer.recv(1)
                    time.sleep(0.005)
                loss = 2.0 * math.exp(-i / 20) + random.random() * 0.01
                if span:
                    span.set_attribute(sc.DL_LOSS, loss)
                    span.set_attribute(sc.DL_GRAD_NORM, 1.0 / (i + 1))
                    span.set_attribute(sc.DL_LEARNING_RATE, 1e-3)
finally:
    handle.shutdown()
