"""One id per run where the launcher gives none: a nonce the ranks agree on through the job's own store.

Bare ``torchrun`` (static rendezvous: ``TORCHELASTIC_RUN_ID=none``), the DeepSpeed launcher and ranks
started by hand with ``MASTER_ADDR``/``MASTER_PORT`` name no run, so every rank derives the job id from
``MASTER_ADDR:MASTER_PORT:world`` (``jobtrace.identity``), and two runs on port 29500 would write into
one job. Each of these launches already has, or is about to have, a TCPStore at that address that lives
exactly as long as the run, and the nonce is put there:

* **torchrun's agent store** (``TORCHELASTIC_USE_AGENT_STORE=True``) is served before any worker starts:
  the first rank to ask puts a random nonce there (``compare_set``, so exactly one wins) and every rank
  reads the same one. A restart of the workers inside the same torchrun keeps the store, and so the id.
* **Everywhere else, rank 0 serves the store early.** torch's ``env://`` rendezvous makes rank 0 the
  TCPStore server at ``MASTER_ADDR:MASTER_PORT`` with ``multi_tenant=True``, which reuses a server this
  process already runs on that port. So rank 0 starts that server in ``init_tracing`` and puts its nonce
  there; the other ranks connect as clients (retrying until rank 0 is up, as they would in
  ``init_process_group``) and read it; ``init_process_group`` later finds the same server. The store is
  kept for the life of the process, so a late rank can still read the nonce.

Where neither can be had (no ``MASTER_PORT``, a port taken by something else), the derived id stays and
its warning says so.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

__all__ = ["run_nonce"]

_KEY = "jobtrace/run_nonce"
_kept: list[Any] = []  # rank 0's early store: torch's rendezvous reuses its server, the other ranks read it


def run_nonce(env: Mapping[str, str], rank: int, timeout_s: float = 30.0) -> str | None:
    """The run's nonce, from torchrun's agent store or the store rank 0 serves; ``None`` where there is none."""
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port or not port.isdigit():
        return None
    try:
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("true", "1"):
            store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)  # type: ignore[attr-defined]
            value = store.compare_set(_KEY, "", secrets.token_hex(4))
        elif rank == 0:
            store = dist.TCPStore(host, int(port), is_master=True, multi_tenant=True,  # type: ignore[attr-defined]
                                  wait_for_workers=False, timeout=timeout)
            value = store.compare_set(_KEY, "", secrets.token_hex(4))
            _kept.append(store)
        else:
            store = dist.TCPStore(host, int(port), is_master=False,  # type: ignore[attr-defined]
                                  wait_for_workers=False, timeout=timeout)
            value = store.get(_KEY)
    except Exception:  # noqa: BLE001 - no store after all: the derived id stays
        return None
    nonce = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return nonce if nonce.isalnum() and 0 < len(nonce) <= 16 else None
