"""A 2-rank gloo Hugging Face Trainer job (a tiny GPT-2, random init, random tokens) for test_integrations.py.

The script adds no callback and marks no step: ``init_tracing()`` is its only line of tracing, and it
runs before ``transformers`` is imported.
"""

import os
import sys

sys.path.insert(0, os.environ["JOBTRACE_ROOT"])
import otel_instrumentation as oi

t = oi.init_tracing(console=False)

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=os.environ["OUT_DIR"], max_steps=6, per_device_train_batch_size=2, logging_steps=1,
                         report_to=[], use_cpu=True, ddp_backend="gloo", save_strategy="no", disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
print(f"auto_steps={t.auto_steps.steps} on={t.auto_steps.enabled} collectives={t.collectives.mode}", flush=True)
