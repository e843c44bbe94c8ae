"""Guardrails in the training loop: act on a NaN or an exploding gradient before the optimizer applies it.

    oi.guard(grad_norm_max=1.0, on="clip", nan="stop", checkpoint=save)

At every optimizer step (torch's global step pre-hook, for every optimizer the job makes) the guard
takes the norm of the gradients the optimizer is about to apply and whether any is NaN/Inf. The
decision is the job's, not one rank's: one small all-reduce (MAX) of ``[non-finite, norm, rank]``
over the default process group makes every rank see the worst rank's values, so every rank takes
the same action at the same step (a decision on rank 0 alone lets another rank's spike poison the
next all-reduce). Then, for a NaN (``nan=``) or a norm above ``grad_norm_max`` (``on=``):

* ``clip``: every gradient scaled by ``grad_norm_max / norm`` (the worst rank's norm);
* ``skip``: the gradients dropped (``grad = None``), so the step changes nothing;
* ``pause``: wait until ``pause_file`` (written by the guard, with the reason) is removed, or the rank gets
  SIGUSR1 (``scancel --signal=USR1 <job>``, ``pkill -USR1 -f train.py``); then the step is skipped, since
  its gradients are what made the guard pause (a grad norm the user accepts: raise ``grad_norm_max``);
* ``stop``: ``checkpoint(step)`` if given, then exit with :data:`GUARD_EXIT` and the reason.

Each action is recorded (a ``jobtrace.guard`` warning and a ``guard`` metric at the step) with the
step and, where the script gives them (``oi.guard(..., batch_ids=lambda: ...)``), the batch's
sample ids, so a bad batch can be found again. The norm is the one ``clip_grad_norm_`` computes
(the 2-norm of the per-parameter norms), over this rank's gradients: after DDP's all-reduce they are
the job's; with sharded gradients (FSDP) each rank has its shard and the MAX is a lower bound.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, Final

from jobtrace.errors import ConfigError

from ._recorder import TraceRecorder

__all__ = ["GUARD_EXIT", "Guard"]

GUARD_EXIT: Final = 65
"""The exit status of a job the guard stopped (EX_DATAERR: the training data went bad)."""

_ACTIONS = ("clip", "skip", "pause", "stop")
log = logging.getLogger("jobtrace.guard")


class Guard:
    """Installed by ``oi.guard(...)``; :meth:`remove` takes it off."""

    def __init__(self, rec: TraceRecorder, *, grad_norm_max: float | None = None, on: str = "clip",
                 nan: str | None = "stop", checkpoint: Callable[[int | None], Any] | None = None,
                 pause_file: str | None = None, batch_ids: Callable[[], Any] | None = None,
                 poll_s: float = 0.5, on_stop: Callable[[], Any] | None = None) -> None:
        if on not in _ACTIONS or (nan is not None and nan not in _ACTIONS):
            raise ConfigError(f"guard: on={on!r}, nan={nan!r}: use one of {', '.join(_ACTIONS)}")
        if grad_norm_max is not None and not grad_norm_max > 0:
            raise ConfigError(f"guard: grad_norm_max={grad_norm_max!r} must be above 0")
        if on == "clip" and grad_norm_max is None:
            on = "skip"
        if nan == "clip":
            raise ConfigError("guard: a NaN cannot be clipped: use nan='skip', 'pause' or 'stop'")
        self._rec = rec
        self.grad_norm_max = grad_norm_max
        self.on, self.nan = on, nan
        self.checkpoint, self.batch_ids = checkpoint, batch_ids
        self.pause_file = pause_file or os.path.abspath(f"jobtrace-pause-{rec.identity.job_id}")
        self.poll_s = poll_s
        self._on_stop = on_stop  # tracing's shutdown: the reason reaches the store before the exit
        self.actions: list[dict[str, Any]] = []
        """What the guard did, in order: ``{"step", "action", "reason", "norm", "rank"}``."""
        self._handle: Any = None

    def install(self) -> Guard:
        import torch.optim.optimizer as optim

        self._handle = optim.register_optimizer_step_pre_hook(self._pre)
        return self

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # ---- at every optimizer step ------------------------------------------------------------------
    def _pre(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        import torch

        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        rank = self._rec.identity.rank
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads]))
        bad = not bool(torch.isfinite(norm))
        over = self.grad_norm_max is not None and not bad and float(norm) > self.grad_norm_max
        flags = torch.tensor([float(bad), 0.0 if bad else float(norm), float(rank if bad else -1),
                              float(rank if over else -1)], device=grads[0].device)
        self._all_ranks_max(flags)
        any_bad, worst, bad_rank, over_rank = (float(x) for x in flags.tolist())
        step = self._rec.step
        if any_bad and self.nan is not None:
            self._act(self.nan, step, f"non-finite gradients (rank {int(bad_rank)})", params, None, int(bad_rank))
        elif self.grad_norm_max is not None and worst > self.grad_norm_max:
            self._act(self.on, step, f"grad norm {worst:.4g} > {self.grad_norm_max:g} (rank {int(over_rank)})",
                      params, worst, int(over_rank))

    @staticmethod
    def _all_ranks_max(flags: Any) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)

    def _act(self, action: str, step: int | None, reason: str, params: list[Any], norm: float | None,
             culprit: int) -> None:
        record: dict[str, Any] = {"step": step, "action": action, "reason": reason, "norm": norm, "rank": culprit}
        if self.batch_ids is not None:
            try:
                record["batch_ids"] = self.batch_ids()
            except Exception as exc:  # noqa: BLE001 - the guard acts whatever the ids do
                record["batch_ids"] = f"unavailable: {type(exc).__name__}"
        self.actions.append(record)
        log.warning("guard at step %s: %s: %s%s", step, reason, action,
                    f" (batch {record['batch_ids']})" if "batch_ids" in record else "")
        self._rec.metrics(step, {"guard": action, "guard_rank": culprit})
        if action == "clip" and norm:
            scale = self.grad_norm_max / norm  # type: ignore[operator]
            for p in params:
                p.grad.mul_(scale)
        elif action == "skip":  # no gradient: the optimizer leaves the parameter, its momentum and decay alone
            for p in params:
                p.grad = None
        elif action == "pause":
            self._pause(step, reason)
            for p in params:
                p.grad = None
        elif action == "stop":
            self._stop(step, reason)

    def _pause(self, step: int | None, reason: str) -> None:
        import signal
        import threading

        with open(self.pause_file, "w") as fh:
            fh.write(f"jobtrace guard paused the job at step {step}: {reason}\n"
                     "remove this file (or send the ranks SIGUSR1) to go on\n")
        log.warning("guard: paused at step %s; remove %s or send SIGUSR1 to go on", step, self.pause_file)
        resumed = threading.Event()
        previous = None
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread only
            previous = signal.signal(signal.SIGUSR1, lambda *_: resumed.set())
        try:
            while os.path.exists(self.pause_file) and not resumed.wait(self.poll_s):
                pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGUSR1, previous)
        how = "SIGUSR1" if resumed.is_set() else "the pause file removed"
        if resumed.is_set():
            try:
                os.remove(self.pause_file)  # the ranks that wait on the file go on too
            except FileNotFoundError:
                pass
        log.warning("guard: resumed at step %s (%s); this step's update is skipped", step, how)

    def _stop(self, step: int | None, reason: str) -> None:
        if self.checkpoint is not None:
            self.checkpoint(step)
        message = f"jobtrace guard stopped the job at step {step}: {reason}"
        log.critical(message)
        if self._on_stop is not None:
            self._on_stop()
        print(message, file=sys.stderr, flush=True)
        raise SystemExit(GUARD_EXIT)
