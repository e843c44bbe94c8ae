"""Every collective of every process group, recorded through c10d's own hooks (torch 2.15 on).

Most collectives of a real job never pass through the Python ``torch.distributed`` functions:
DDP's reducer calls its process group from C++, FSDP2 issues its all-gathers and
reduce-scatters below Python, and a script may have imported ``all_reduce`` before
``init_tracing`` ran. ``ProcessGroup.register_pre_hook``/``register_post_hook`` sit where every
one of them passes, whatever called it, so this module attaches one pair to each process group
as c10d registers it (``_register_pg_in_world``, wrapped) and to every group already there.

Why these hooks, measured against the alternatives (docs/tracing.md, "Collectives"):

* the Flight Recorder ring buffer (on by default for gloo in torch 2.15) records every op, but
  its gloo entries carry no completion time, and reading 2,000 entries as JSON costs ~100 ms:
  a dump for a hang, not a per-step source;
* DDP comm hooks see only DDP's gradient buckets, and a job may register one of its own;
* ``_register_on_completion_hook`` is NCCL's alone; where the group is NCCL it gives the
  device-measured duration, and this module uses it there (below).

Where the compiled hooks are built for this torch (:mod:`.native_hooks`), groups timed on the host
(gloo) get those instead: the same records, kept in C++ without the GIL and drained by the export
thread before each batch and by the heartbeat thread (:meth:`GroupHooks.drain`); a record's step is then the step whose end followed its issue
(the recorder's step-end hooks), or the step in progress, and it nests under the job's root span;
a collective issued on the training thread (the one that called ``init_tracing``) asks the recorder
for its step and span, as the Python hooks do, and nests where it was issued.

What a record says:

* ``op``, ``group`` (``default`` for the world group, else c10d's group name, the same on every
  rank), ``group_size``, ``ranks`` (the group's global ranks, compactly: ``0-7``, ``0-56/8``) and
  ``seq``: this group's own count of collectives, so that the same collective has the same
  number on every rank. c10d's own sequence number also counts point-to-point ops, which only
  their two ranks issue; so ``send``/``recv`` carry ``p2p_seq`` and ``peer`` instead, and no
  ``seq``.
* the span starts when the op is issued (the pre-hook) and ends when the work completes: on
  gloo, when its future completes (for ``async_op=True`` work and DDP's buckets too, which
  Python never waits for); on NCCL, the duration is the device's (CUDA events, read by the
  watchdog thread off the training thread), not the host's time around an enqueue, which
  measures nothing there: those spans say ``timing: device``.
* work that gives no completion (a backend without futures) is kept with its issue time
  only and ``async: true``, which keeps it out of wait statistics.

The hooks never raise into the training job: a failure is counted and the op goes unrecorded.
While work is outstanding, :meth:`GroupHooks.waiting` names the oldest, which the heartbeat
thread reports as the collective the rank is in.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections import deque
from collections.abc import Callable
from random import getrandbits
from time import time_ns
from typing import Any

from ._recorder import _COLLECTIVE, TraceRecorder

__all__ = ["GroupHooks", "hooks_supported", "ranks_text"]

_HOOK_ID = 0x6A74  # "jt": the id our pre/post hooks are registered under on each group

_OPS: dict[str, str] = {
    "ALLREDUCE": "all_reduce", "ALLREDUCE_COALESCED": "all_reduce", "BROADCAST": "broadcast",
    "ALLGATHER": "all_gather", "ALLGATHER_COALESCED": "all_gather", "ALLGATHER_BASE": "all_gather_into_tensor",
    "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather_into_tensor", "REDUCE_SCATTER": "reduce_scatter",
    "REDUCE_SCATTER_BASE": "reduce_scatter_tensor", "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor",
    "REDUCE": "reduce", "GATHER": "gather", "SCATTER": "scatter", "ALLTOALL": "all_to_all",
    "ALLTOALL_BASE": "all_to_all_single", "BARRIER": "barrier", "SEND": "send", "RECV": "recv",
}
"""c10d's hook op names as the event model's (``jobtrace.events.COLLECTIVE_OPS``)."""
_P2P = frozenset({"send", "recv"})
_SKIP = frozenset({"SPLIT", "NEW_WINDOW", "UNKNOWN"})  # group management, not communication


def hooks_supported() -> bool:
    """Whether this torch has process-group hooks and the one place every group is registered."""
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
    except Exception:  # noqa: BLE001 - no torch, or a build without distributed
        return False
    return (dist.is_available() and hasattr(dist.ProcessGroup, "register_pre_hook")
            and hasattr(c10d, "_register_pg_in_world"))


def ranks_text(ranks: list[int]) -> str:
    """Global ranks compactly: ``0-7``, ``0-56/8`` (evenly spaced), else runs: ``0-3,8-11``."""
    if not ranks:
        return ""
    if len(ranks) > 2:
        step = ranks[1] - ranks[0]
        if step > 1 and all(b - a == step for a, b in zip(ranks, ranks[1:])):
            return f"{ranks[0]}-{ranks[-1]}/{step}"
    runs: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(runs)


class _Group:
    """What the hooks know of one process group. Its name and ranks are read at its first op: c10d
    registers a group (where it is hooked) before it makes it the default group or maps its ranks."""

    __slots__ = ("pg", "name", "size", "state", "extra", "seq", "p2p_seq", "issued", "device_timed", "by_work_seq",
                 "resolved", "hooks", "native")

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.name = ""
        self.size = 0
        self.state: list[Any] = ["", 0, None]  # the recorder's group state in a _COLLECTIVE item
        self.extra: dict[str, Any] = {}  # every record's attributes (the group's ranks), never changed
        self.seq = 0
        self.p2p_seq = 0
        self.issued: dict[int, tuple[Any, ...]] = {}  # op_id -> what the pre-hook saw
        self.device_timed = False
        self.by_work_seq: dict[int, tuple[Any, ...]] = {}  # NCCL: the work's sequence number -> its record
        self.resolved = False
        self.hooks: tuple[Callable[[Any], None], Callable[[Any], None]] | None = None  # (pre, post) registered
        self.native: int | None = None  # its index among the compiled hooks' groups, where they record it

    def resolve(self, dist: Any, c10d: Any) -> None:
        pg = self.pg
        try:
            is_world = pg is c10d._get_default_group()  # noqa: SLF001
        except Exception:  # noqa: BLE001 - no default group (yet)
            is_world = False
        try:
            ranks = list(dist.get_process_group_ranks(pg))
        except Exception:  # noqa: BLE001 - a group without a rank table
            ranks = []
        self.name = "default" if is_world else str(getattr(pg, "group_name", "") or f"pg{id(pg):x}")
        self.size = len(ranks) or int(pg.size())
        self.state[:2] = [self.name, self.size]
        if ranks:
            self.extra = {"ranks": ranks_text(ranks)}
        self.resolved = True


class GroupHooks:
    """Records every collective of every process group of this process (see the module docstring)."""

    mode = "hooks"

    def __init__(self, rec: TraceRecorder, *, device_timing: bool = True, native: bool = True) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from . import native_hooks

        self._rec = rec
        self._dist: Any = dist
        self._c10d: Any = c10d
        self._device_timing = device_timing
        self._groups: dict[int, _Group] = {}
        self._lock = threading.Lock()
        self._outstanding: dict[int, tuple[str, str, int | None, int, int]] = {}  # record id -> heartbeat tuple
        self.last_done: tuple[str, str, int | None, int] | None = None
        """The last completed collective: ``(op, group, seq, end_ns)``."""
        self.errors = 0
        """Hook calls that failed (the op went unrecorded; training went on)."""
        self._original: Callable[..., Any] | None = None
        self._native: Any = native_hooks.load() if native else None
        """The compiled hooks' module, where built (see :mod:`.native_hooks`)."""
        self._native_groups: list[_Group] = []
        self._step_ends: deque[tuple[int, int]] = deque(maxlen=16_384)  # (end ns, step), for drained records
        self._drain_lock = threading.Lock()
        self._destroy: tuple[Callable[..., Any], list[Any]] | None = None
        if self._native is not None:
            import torch._C._distributed_c10d as c10d_c

            names = getattr(getattr(c10d_c, "HookOpName", None), "__members__", None) or {}
            self._op_names = {int(v): k for k, v in names.items()}
            self._ops = {code: _OPS.get(name, name.lower()) for code, name in self._op_names.items()}
            rec.step_end_hooks.append(self._step_ended)
            current = rec.current_span_id
            self._native.set_context_fn(lambda: (rec.step, current()))  # asked on this (the training) thread

    @property
    def compiled(self) -> bool:
        """Whether the compiled hooks record this process's host-timed groups."""
        return self._native is not None

    # ---- attaching ------------------------------------------------------------------------
    def install(self) -> None:
        """Attach to every group there is, and to each group c10d registers from now on."""
        c10d = self._c10d
        original = getattr(c10d._register_pg_in_world, "__jobtrace_wrapped__", c10d._register_pg_in_world)  # noqa: SLF001
        self._original = original

        @functools.wraps(original)
        def register(pg: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(pg, *args, **kwargs)
            self.attach(pg)
            return out

        register.__jobtrace_wrapped__ = original  # type: ignore[attr-defined]
        setattr(c10d, "_register_pg_in_world", register)  # noqa: B010 - the one place every group passes
        for pg in list(c10d._world.pg_map):  # noqa: SLF001 - groups made before init_tracing
            self.attach(pg)
        if self._native is not None:
            self._wrap_destroy()

    def _wrap_destroy(self) -> None:
        """Drain the compiled hooks' records while c10d still knows their groups (names, ranks): the last
        moment is the script's ``destroy_process_group``."""
        c10d, dist = self._c10d, self._dist
        original = getattr(c10d.destroy_process_group, "__jobtrace_wrapped__", c10d.destroy_process_group)

        @functools.wraps(original)
        def destroy(*args: Any, **kwargs: Any) -> Any:
            self.resolve_groups()
            self.drain()
            return original(*args, **kwargs)

        destroy.__jobtrace_wrapped__ = original  # type: ignore[attr-defined]
        self._destroy = (original, [m for m in (c10d, dist) if getattr(m, "destroy_process_group", None) is original])
        for module in self._destroy[1]:
            setattr(module, "destroy_process_group", destroy)  # noqa: B010

    def resolve_groups(self) -> None:
        """Read the compiled hooks' groups' names and ranks, where c10d has them by now: once the world group
        is made and the group's ranks are mapped (c10d registers a group before either)."""
        c10d = self._c10d
        for group in self._native_groups:
            if group.resolved:
                continue
            try:
                if c10d.is_initialized() and group.pg in c10d._world.pg_group_ranks:  # noqa: SLF001
                    group.resolve(self._dist, c10d)
            except Exception:  # noqa: BLE001
                self.errors += 1

    def uninstall(self) -> None:
        if self._original is not None:
            setattr(self._c10d, "_register_pg_in_world", self._original)  # noqa: B010
            self._original = None
        if self._destroy is not None:
            for module in self._destroy[1]:
                setattr(module, "destroy_process_group", self._destroy[0])  # noqa: B010
            self._destroy = None
        self.set_enabled(False)
        self.drain()
        if self._native is not None:
            self._native.set_context_fn(None)
        if self._step_ended in self._rec.step_end_hooks:
            self._rec.step_end_hooks.remove(self._step_ended)
        self._groups.clear()

    def set_enabled(self, on: bool) -> None:
        """Take the hooks off every group (nothing is recorded, nothing is paid) or put them back."""
        for group in self._groups.values():
            if group.native is not None:
                try:
                    if on:
                        self._native.attach(group.pg, group.native, _HOOK_ID)
                    else:
                        self._native.detach(group.pg, _HOOK_ID)
                except Exception:  # noqa: BLE001, S110 - a destroyed group has no hooks left
                    pass
                continue
            if on:
                self._register(group)
                continue
            for unregister in (group.pg.unregister_pre_hook, group.pg.unregister_post_hook):
                try:
                    unregister(_HOOK_ID)
                except Exception:  # noqa: BLE001, S110 - a destroyed group has no hooks left
                    pass

    def _register(self, group: _Group) -> bool:
        assert group.hooks is not None
        try:
            group.pg.register_pre_hook(_HOOK_ID, group.hooks[0])
            group.pg.register_post_hook(_HOOK_ID, group.hooks[1])
        except Exception:  # noqa: BLE001 - the group keeps working, unrecorded
            self.errors += 1
            return False
        return True

    def attach(self, pg: Any) -> None:
        """Hook ``pg`` once; a group that cannot take hooks (a replaced backend) is left unrecorded."""
        key = id(pg)
        if key in self._groups:
            return
        group = _Group(pg)
        backend = _backend_name(pg)
        if self._native is not None and "nccl" not in backend:
            try:
                self._native.attach(pg, len(self._native_groups), _HOOK_ID)
                group.native = len(self._native_groups)
                self._native_groups.append(group)
                self._groups[key] = group
                return
            except Exception:  # noqa: BLE001 - not a ProcessGroup the compiled hooks take: the Python ones
                group.native = None
        group.hooks = (functools.partial(self._pre, group), functools.partial(self._post, group))
        if not self._register(group):
            return
        if self._device_timing and "nccl" in backend:
            try:
                pg._enable_collectives_timing()  # noqa: SLF001 - CUDA events around each op (TORCH_NCCL_ENABLE_TIMING)
                pg._register_on_completion_hook(functools.partial(self._completed, group))  # noqa: SLF001
                group.device_timed = True
            except Exception:  # noqa: BLE001 - an NCCL without completion hooks: host completion below
                group.device_timed = False
        self._groups[key] = group

    # ---- the hooks (training thread, autograd threads) -------------------------------------
    def _pre(self, group: _Group, args: Any) -> None:
        try:
            name = args.name.name
            if name in _SKIP:
                return
            t0 = time_ns()
            if not group.resolved:
                group.resolve(self._dist, self._c10d)
            op = _OPS.get(name, name.lower())
            nbytes = 0
            for t in args.input_tensors:
                nbytes += t.nbytes
            rec = self._rec
            if op in _P2P:
                group.p2p_seq += 1
                seq, extra = None, {**group.extra, "p2p_seq": group.p2p_seq}
                if args.root >= 0:
                    extra["peer"] = args.root
            else:
                group.seq += 1
                seq, extra = group.seq, group.extra
            group.issued[args.op_id] = (op, t0, nbytes, seq, extra, rec.current_span_id(), rec.step)
        except Exception:  # noqa: BLE001 - never into the training job
            self.errors += 1

    def _post(self, group: _Group, args: Any) -> None:
        try:
            issued = group.issued.pop(args.op_id, None)
            if issued is None:
                return
            op, t0, nbytes, seq, extra, parent, step = issued
            sid = getrandbits(64) or 1
            record = (sid, parent, op, t0, step, seq, nbytes, extra)
            work = args.work
            with self._lock:
                self._outstanding[sid] = (op, group.name, seq, t0, nbytes)
            if work is not None and group.device_timed:
                try:
                    group.by_work_seq[work._get_sequence_number()] = record  # noqa: SLF001 - WorkInfo.seq's match
                    return
                except Exception:  # noqa: BLE001, S110 - a work without one: timed on the host below
                    pass
            future = None
            if work is not None:
                try:
                    future = work.get_future()
                except Exception:  # noqa: BLE001 - a backend without futures
                    future = None
            if future is None:
                self._finish(group, record, time_ns(), {"async": True})
            else:
                future.add_done_callback(functools.partial(self._future_done, group, record))
        except Exception:  # noqa: BLE001
            self.errors += 1

    # ---- completion (a backend's thread) ------------------------------------------------------
    def _future_done(self, group: _Group, record: tuple[Any, ...], future: Any) -> None:
        try:
            t1 = time_ns()
            failed = None
            try:
                future.value()
            except Exception as exc:  # noqa: BLE001 - the collective failed: say so on its span
                failed = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            self._finish(group, record, t1, failed)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _completed(self, group: _Group, info: Any) -> None:
        """NCCL's completion hook (the watchdog thread): the device-measured duration of a work."""
        try:
            record = group.by_work_seq.pop(int(info.seq), None)
            if record is None:
                return
            device_ns = _as_ns(info.active_duration)
            t0 = record[3]
            if device_ns is None or device_ns < 0:
                self._finish(group, record, _as_ns(info.time_finished) or time_ns(), {"timing": "detected"})
            else:
                self._finish(group, record, t0 + device_ns, {"timing": "device"})
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _finish(self, group: _Group, record: tuple[Any, ...], t1: int, more: dict[str, Any] | None) -> None:
        sid, parent, op, t0, step, seq, nbytes, extra = record
        if more:
            extra = {**extra, **more}
        with self._lock:
            self._outstanding.pop(sid, None)
            self.last_done = (op, group.name, seq, t1)
        rec = self._rec
        rec.emit((_COLLECTIVE, sid, parent, op, t0, max(t1, t0), step, group.state, seq, nbytes, extra or None))
        if t1 > rec.last_progress_ns and not (more and "error" in more):  # a failed one is no progress
            rec.last_progress_ns = t1

    # ---- the compiled hooks' records (heartbeat thread) ---------------------------------------
    def _step_ended(self, step: int | None) -> None:
        if type(step) is int:
            self._step_ends.append((time_ns(), step))
        if self._native_groups and not self._native_groups[-1].resolved:  # groups made meanwhile (main thread)
            self.resolve_groups()

    def drain(self) -> int:
        """Turn what the compiled hooks recorded since the last call into the recorder's items; how many."""
        native = self._native
        if native is None:
            return 0
        with self._drain_lock:
            try:
                got = native.drain()
            except Exception:  # noqa: BLE001
                self.errors += 1
                return 0
            if not got:
                return 0
            self.resolve_groups()
            ends: list[tuple[int, int]] | None = None  # copied once, where a record needs its step by time
            times: list[int] = []
            rec = self._rec
            emit = rec.emit
            root = getattr(rec, "root_span_id", None)
            groups = self._native_groups
            ops = self._ops
            last: tuple[Any, ...] | None = None
            for code, index, t0, t1, seq, p2p_seq, peer, nbytes, step, parent, async_only, error, asked in got:
                try:
                    group = groups[index]
                    if not group.resolved:  # a group that ran collectives before c10d mapped it: as it stands
                        group.resolve(self._dist, self._c10d)
                    op = ops.get(code, "unknown")
                    if op in _P2P:
                        extra = {**group.extra, "p2p_seq": p2p_seq}
                        if peer >= 0:
                            extra["peer"] = peer
                        seq = None
                    else:
                        extra = group.extra
                    if step is None and not asked:  # issued off the training thread: the step by time
                        if ends is None:
                            ends = list(self._step_ends)
                            times = [e[0] for e in ends]
                        i = bisect.bisect_left(times, t0)
                        step = ends[i][1] if i < len(ends) else rec.step
                    if async_only or error:
                        extra = {**extra, **({"async": True} if async_only else {"error": error})}
                    emit((_COLLECTIVE, getrandbits(64) or 1, parent or root, op, t0, t1, step, group.state, seq, nbytes,
                          extra or None))
                    if not error:
                        last = (op, group.name, seq, t1)
                except Exception:  # noqa: BLE001
                    self.errors += 1
            if last is not None:
                with self._lock:
                    self.last_done = last
                if last[3] > rec.last_progress_ns:
                    rec.last_progress_ns = last[3]
            return len(got)

    # ---- for the heartbeat thread ------------------------------------------------------------
    def waiting(self) -> tuple[str, str, int | None, int, int] | None:
        """``(op, group, seq, t0_ns, bytes)`` of the oldest collective issued and not completed (drains the
        compiled hooks' records first, so that the heartbeat's "last done" is theirs too)."""
        native = None
        if self._native is not None:
            self.drain()
            try:
                oldest = self._native.oldest()
            except Exception:  # noqa: BLE001
                oldest = None
            if oldest is not None:
                code, index, seq, t0, nbytes = oldest
                group = self._native_groups[index]
                if not group.resolved:
                    group.resolve(self._dist, self._c10d)
                name = self._op_names.get(code, "UNKNOWN")
                native = (_OPS.get(name, name.lower()), group.name, None if seq < 0 else seq, t0, nbytes)
        with self._lock:
            waits = list(self._outstanding.values()) + ([native] if native is not None else [])
        return min(waits, key=lambda w: w[3]) if waits else None


def _backend_name(pg: Any) -> str:
    try:
        return str(pg._get_backend_name()).lower()  # noqa: SLF001
    except Exception:  # noqa: BLE001
        return ""


def _as_ns(value: Any) -> int | None:
    """A WorkInfo time or duration (a ``datetime``, ``timedelta`` or number of ns) in nanoseconds."""
    if value is None:
        return None
    if hasattr(value, "total_seconds") and not hasattr(value, "timestamp"):
        return int(value.total_seconds() * 1e9)
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1e9)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
