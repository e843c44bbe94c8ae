"""A 2-rank DeepSpeed job on CPU (gloo) for test_integrations.py: the engine's backward and step only.

``init_tracing()`` is the script's only line of tracing and runs before DeepSpeed is imported. Two
micro-batches per optimizer step (``gradient_accumulation_steps``): 8 engine steps, 4 optimizer steps.
"""

import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing(console=False)

import deepspeed  # noqa: E402
import torch  # noqa: E402

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "steps_per_print": 100,
          "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.05, "warmup_num_steps": 4}}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
y = x[:, :2].sum(dim=1, keepdim=True) * 0.5
for i in range(8):
    batch = slice(8 * i, 8 * i + 8)
    loss = torch.nn.functional.mse_loss(engine(x[batch]), y[batch])
    engine.backward(loss)
    engine.step()
print(f"auto_steps={t.auto_steps.steps} on={t.auto_steps.enabled} collectives={t.collectives.mode} "
      f"global_steps={engine.global_steps}", flush=True)
