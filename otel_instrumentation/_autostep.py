"""Steps and phases from the training loop's own calls, for scripts that mark none.

Most training code never calls ``oi.step``: a Hugging Face ``Trainer``, a Lightning loop or a
plain script only steps an optimizer. A step is what happens between two optimizer steps, so:

* **step boundaries** are the global optimizer step hooks (``torch.optim``'s, for every optimizer
  the job makes): step ``k`` runs from the end of optimizer step ``k - 1`` (from the first data,
  forward or backward call, for step 0) to the end of optimizer step ``k``. Where several
  optimizers step in one iteration, the first one that ever stepped marks the boundary; with
  gradient accumulation a step holds all its micro-batches;
* **data** is each ``next()`` of a ``DataLoader`` iterator (``_BaseDataLoaderIter.__next__``);
* **forward** is the outermost module call: global module hooks find the top-level module during
  the first step, then only that module keeps hooks (a transformer calls hundreds of modules a
  step; two hooks a step cost nothing);
* **backward** is ``torch.autograd.backward`` (what ``loss.backward()`` calls, as do Accelerate,
  Lightning and DeepSpeed);
* **optimizer** is the optimizer's step; where its closure runs forward and backward (LBFGS,
  Lightning's automatic optimization), those are phases of their own and the optimizer's phase is
  the time outside them.

Explicit marks win: the first ``oi.step`` the script ends (the recorder's step-end hooks say so),
or a step span open at an optimizer step, turns the automatic steps off for good; a phase the
script opens itself turns the automatic phases off. Spans are emitted whole at each step's end
(the training thread's span stack is the script's alone), each phase a child of its step, and
:meth:`AutoSteps.top` says which one is open, for heartbeats. Only the main thread counts.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from random import getrandbits
from time import time_ns
from typing import Any

from jobtrace.events import SpanCategory

from ._recorder import _SPAN, TraceRecorder

__all__ = ["AutoSteps"]

_STEP = SpanCategory.STEP
_PHASE = SpanCategory.PHASE


class AutoSteps:
    """Installs the hooks of the module docstring on ``torch`` and emits a step's spans at its end."""

    def __init__(self, rec: TraceRecorder) -> None:
        self._rec = rec
        self._main = threading.main_thread().ident
        self.enabled = True
        self.phases_enabled = True
        self.steps = 0
        """Steps emitted."""
        self._k = 0
        self._start: int | None = None  # the open step's start
        self._sid = 0
        self._phases: list[tuple[str, int, int]] = []
        self._open: tuple[str, str, int] | None = None  # the open phase (name, cat, start), for heartbeats
        self._boundary: Any = None  # the optimizer whose steps end steps
        self._depth = 0  # module call depth on the main thread
        self._tops: dict[int, Any] = {}  # top-level modules seen while the global hooks are on
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self._undo: list[Callable[[], None]] = []
        self._user_steps = False
        self._carry = False  # the step in progress began at a boundary and no call of it came yet
        self._opt_seg: int | None = None  # the optimizer phase's running segment (its start)
        self._opt_paused = False  # a closure's forward/backward interrupted it

    # ---- installing ---------------------------------------------------------------------------
    def install(self) -> None:
        import torch
        import torch.nn.modules.module as modules
        import torch.optim.optimizer as optim
        from torch.utils.data import dataloader

        self._handles += [optim.register_optimizer_step_pre_hook(self._opt_pre),
                          optim.register_optimizer_step_post_hook(self._opt_post)]
        self._module_handles += [modules.register_module_forward_pre_hook(self._fwd_pre),
                                 modules.register_module_forward_hook(self._fwd_post, always_call=True)]
        original_backward = getattr(torch.autograd.backward, "__jobtrace_wrapped__", torch.autograd.backward)

        @functools.wraps(original_backward)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._main or not self.enabled:
                return original_backward(*args, **kwargs)
            t0 = self._enter("backward")
            try:
                return original_backward(*args, **kwargs)
            finally:
                self._leave("backward", t0)

        backward.__jobtrace_wrapped__ = original_backward  # type: ignore[attr-defined]
        torch.autograd.backward = backward
        self._undo.append(lambda: setattr(torch.autograd, "backward", original_backward))

        base = dataloader._BaseDataLoaderIter  # noqa: SLF001 - every DataLoader iterator's next()
        original_next = getattr(base.__next__, "__jobtrace_wrapped__", base.__next__)

        @functools.wraps(original_next)
        def next_batch(it: Any) -> Any:
            if threading.get_ident() != self._main or not self.enabled:
                return original_next(it)
            t0 = self._enter("data")
            try:
                return original_next(it)
            finally:
                self._leave("data", t0)

        next_batch.__jobtrace_wrapped__ = original_next  # type: ignore[attr-defined]
        base.__next__ = next_batch  # type: ignore[method-assign, assignment]
        self._undo.append(lambda: setattr(base, "__next__", original_next))
        self._rec.step_end_hooks.append(self._user_step_ended)

    def uninstall(self) -> None:
        self.enabled = False
        for h in self._handles + self._module_handles:
            h.remove()
        self._handles.clear()
        self._module_handles.clear()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if self._user_step_ended in self._rec.step_end_hooks:
            self._rec.step_end_hooks.remove(self._user_step_ended)

    # ---- phases ----------------------------------------------------------------------------------
    def _enter(self, name: str) -> int:
        t0 = time_ns()
        top = self._rec.top()
        if top is not None and top[1] in (_PHASE, _STEP):  # the script marks its own: theirs win
            self.phases_enabled = False
            if top[1] == _STEP:
                self._give_way()
                return t0
        if self._start is None:
            self._begin(t0)
        elif self._carry:  # the first call of a step that began at the last boundary: events are its from here
            self._carry = False
            self._rec.step = self._k
        if self._opt_seg is not None:  # forward/backward in an optimizer's closure (LBFGS, Lightning): a pause
            self._record("optimizer", self._opt_seg, t0)
            self._opt_seg = None
            self._opt_paused = True
        if self._open is None:
            self._open = (name, _PHASE, t0)
        return t0

    def _leave(self, name: str, t0: int) -> None:
        if self._open is not None and self._open[0] == name and self._open[2] == t0:
            self._open = None
            t1 = time_ns()
            self._record(name, t0, t1)
            if self._opt_paused:  # back in the optimizer's step
                self._opt_seg = t1
                self._opt_paused = False

    def _record(self, name: str, t0: int, t1: int) -> None:
        if self.phases_enabled and self.enabled and t1 > t0:
            self._phases.append((name, t0, t1))

    def _fwd_pre(self, module: Any, _args: Any) -> None:
        if not self.enabled or threading.get_ident() != self._main:
            return
        self._depth += 1
        if self._depth == 1:
            self._tops.setdefault(id(module), module)
            self._fwd_t0 = self._enter("forward")

    def _fwd_post(self, module: Any, _args: Any, _out: Any) -> None:
        if not self.enabled or threading.get_ident() != self._main or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._leave("forward", self._fwd_t0)

    def _narrow(self) -> None:
        """After the first step: module hooks on the top-level modules only, none on the rest."""
        for h in self._module_handles:
            h.remove()
        self._module_handles = []
        for module in self._tops.values():
            self._module_handles += [module.register_forward_pre_hook(self._fwd_pre),
                                     module.register_forward_hook(self._fwd_post, always_call=True)]

    # ---- steps ----------------------------------------------------------------------------------
    def _begin(self, t0: int) -> None:
        self._start = t0
        self._sid = getrandbits(64) or 1
        self._rec.step = self._k

    def _opt_pre(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not self.enabled or threading.get_ident() != self._main:
            return
        if self._boundary is None:
            self._boundary = optimizer
        self._enter("optimizer")
        if self._open is not None and self._open[0] == "optimizer":  # kept apart: a closure may pause it
            self._opt_seg = self._open[2]
            self._open = None

    def _opt_post(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not self.enabled or threading.get_ident() != self._main:
            return
        if self._opt_seg is not None:
            self._record("optimizer", self._opt_seg, time_ns())
        self._opt_seg = None
        self._opt_paused = False
        if optimizer is not self._boundary:
            return
        rec = self._rec
        if self._user_steps or rec.current_step_span_id() not in (None, rec.root_span_id):
            self._give_way()
            return
        end = time_ns()
        start = self._start if self._start is not None else end
        k, sid, parent = self._k, self._sid, rec.root_span_id
        for name, t0, t1 in self._phases:
            rec.emit((_SPAN, getrandbits(64) or 1, sid, name, _PHASE, t0, t1, k, None))
        rec.emit((_SPAN, sid, parent, "step", _STEP, start, end, k, {"auto": True}))
        self._phases = []
        self.steps += 1
        rec.last_progress_ns = end
        for hook in list(rec.step_end_hooks):
            if hook != self._user_step_ended:
                hook(k)
        if self.steps == 1:
            self._narrow()
        # The next step runs from here to the next optimizer step; what the loop does before its first data,
        # forward or backward call (the "step k loss" line, a scheduler step) still carries step k.
        self._k = k + 1
        self._start = end
        self._sid = getrandbits(64) or 1
        self._carry = True

    def _user_step_ended(self, _step: int | None) -> None:
        """The recorder's step-end hook: a step span of the script's own ended."""
        self._user_steps = True
        if self.enabled:
            self._give_way()

    def _give_way(self) -> None:
        """The script marks its own steps: stop for good, and drop the step in progress."""
        self.enabled = False
        self._phases = []
        self._open = None
        self._opt_seg = None
        self._start = None
        for h in self._handles + self._module_handles:
            h.remove()
        self._handles.clear()
        self._module_handles.clear()

    # ---- for the heartbeat thread ---------------------------------------------------------------
    def top(self) -> tuple[str, str, int] | None:
        """The open automatic phase, else the open step, as ``(name, cat, start_ns)``."""
        if not self.enabled:
            return None
        phase = self._open
        if phase is not None:
            return phase
        seg = self._opt_seg
        if seg is not None:
            return ("optimizer", _PHASE, seg)
        start = self._start
        return None if start is None else ("step", _STEP, start)
