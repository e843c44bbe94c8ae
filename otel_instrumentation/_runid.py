"""One id per run where the launcher gives none: a nonce the ranks agree on through torchrun's own store.

Bare ``torchrun`` (static rendezvous: ``TORCHELASTIC_RUN_ID=none``) names no run, so every rank derives
the job id from ``MASTER_ADDR:MASTER_PORT:world`` (``jobtrace.identity``), and two runs on port 29500
would write into one job. But torchrun's agent already serves a TCPStore at that address before any
worker starts (``TORCHELASTIC_USE_AGENT_STORE=True``), and it lives as long as the run: the first rank
to ask puts a random nonce there (``compare_set``, so exactly one wins) and every rank reads the same
one. A restart of the workers inside the same torchrun keeps the store, and so the id; the next torchrun
starts a new store. Where there is no agent store (the DeepSpeed launcher, ``mpirun`` without a job id),
the derived id stays and its warning says so.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import timedelta

__all__ = ["run_nonce"]

_KEY = "jobtrace/run_nonce"


def run_nonce(env: Mapping[str, str], timeout_s: float = 30.0) -> str | None:
    """The run's nonce from torchrun's agent store, or ``None`` where there is none to ask."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() not in ("true", "1"):
        return None
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port or not port.isdigit():
        return None
    try:
        import torch.distributed as dist

        store = dist.TCPStore(host, int(port), is_master=False,  # type: ignore[attr-defined]
                              timeout=timedelta(seconds=timeout_s))
        mine = secrets.token_hex(4)
        value = store.compare_set(_KEY, "", mine)
    except Exception:  # noqa: BLE001 - no store after all: the derived id stays
        return None
    nonce = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return nonce if nonce.isalnum() and 0 < len(nonce) <= 16 else None
