"""A 2-rank Lightning job (``strategy="ddp"`` on CPU, under torchrun) for test_integrations.py.

The script adds no callback and marks no step: ``init_tracing()`` is its only line of tracing, and it
runs before Lightning is imported.
"""

import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing(console=False)

import lightning.pytorch as L  # noqa: E402
import torch  # noqa: E402


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3)


L.seed_everything(0, verbose=False)  # the same weights on every run: the test is deterministic
x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
y = x[:, :2].sum(dim=1, keepdim=True) * 0.5  # learnable: a healthy job's loss falls
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regression(), data)
print(f"auto_steps={t.auto_steps.steps} on={t.auto_steps.enabled} collectives={t.collectives.mode}", flush=True)
