"""torch integration: every ``torch.distributed`` collective becomes a span, without user changes.

Where torch has process-group hooks (2.15 on), :mod:`._collectives` records every collective of
every group, DDP's and FSDP's included, timed to completion. Elsewhere the public collective
functions are wrapped in both ``torch.distributed`` and ``torch.distributed.distributed_c10d``
(libraries import them from either): each call records op, process group, group size, a
per-group sequence number (the same number on every rank for the same collective, which is what
lets the hang analysis match collectives across ranks), payload bytes and the time spent in the
call; for ``async_op=True`` the time is the launch only, and the span says ``async``; what
DDP's reducer and FSDP call from C++ is not seen. ``JOBTRACE_COLLECTIVES`` picks one
(``auto``, ``hooks``, ``wrap``). Either way :class:`CollectiveSource` says which collective the
rank is in, for the heartbeat thread, even when the main thread is blocked in C++.

Per step, where CUDA is initialised, ``torch.cuda`` memory counters are recorded
(they are host-side counters: no device sync); on every platform the process RSS, at
most once per ``memory_interval_s``: RSS needs a read of ``/proc``, a system call that
costs ~8 µs at the end of a step (cold caches after the step's kernels) where it costs
0.5 µs in a tight loop. Steps longer than the interval (every LLM step at the default
0.1 s) get a sample each; millisecond steps get one every few steps.
"""

from __future__ import annotations

import functools
import glob
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

from jobtrace.events import COLLECTIVE_OPS

from ._collectives import GroupHooks, hooks_supported
from ._recorder import _METRIC, TraceRecorder

__all__ = ["CollectiveSource", "instrument_torch", "uninstrument_torch", "memory_hook", "wrap_collective"]


class CollectiveSource(Protocol):
    """How collectives are being recorded: process-group hooks, or wrapped Python functions."""

    mode: str
    """``hooks`` or ``wrap``."""

    @property
    def compiled(self) -> bool:
        """Whether records wait in compiled hooks until :meth:`drain` (the export thread drains them)."""

    def waiting(self) -> tuple[str, str, int | None, int, int] | None:
        """``(op, group, seq, t0_ns, bytes)`` of the collective the rank is in (the oldest outstanding)."""

    def drain(self) -> int:
        """Emit the records the compiled hooks hold; how many (0 where there are none)."""

    def uninstall(self) -> None: ...


_PATCHED: dict[tuple[Any, str], Callable[..., Any]] = {}
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _payload_bytes(obj: Any) -> int:
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(o) for o in obj)
    return 0


def _describe(dist: Any, group: Any) -> tuple[str, int]:
    """A process group's ``(name, size)``, looked up once per group."""
    try:
        size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        name = getattr(group, "group_name", None) or ("default" if group is None else f"pg{id(group):x}")
    except Exception:  # noqa: BLE001 - an uninitialised group still gets recorded
        size, name = -1, "default" if group is None else "unknown"
    return str(name), size


def wrap_collective(fn: Callable[..., Any], op: str, rec: TraceRecorder, dist: Any) -> Callable[..., Any]:
    """``fn`` recorded on every call, by ``rec`` (the compiled recorder's wrapper is compiled too).

    ``rec`` is given what it needs to know of ``torch.distributed``: a group's name and size
    (asked once per group), what a positional process group is an instance of, and how to
    size a payload without ``nbytes`` of its own.
    """
    return rec.wrap_collective(fn, op, functools.partial(_describe, dist), getattr(dist, "ProcessGroup", ()),
                               _payload_bytes)


class _Wrapped:
    """Collectives recorded by wrapping the Python functions (a torch without process-group hooks)."""

    mode = "wrap"
    compiled = False

    def __init__(self, rec: TraceRecorder) -> None:
        self._rec = rec

    def drain(self) -> int:
        return 0

    def waiting(self) -> tuple[str, str, int | None, int, int] | None:
        return self._rec.in_collective

    def uninstall(self) -> None:
        uninstrument_torch()


def instrument_torch(rec: TraceRecorder, mode: str = "auto") -> CollectiveSource | None:
    """Record torch.distributed collectives (``mode``: ``auto``, ``hooks`` or ``wrap``); None when
    torch.distributed is not available, or ``hooks`` was asked of a torch without them."""
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
    except Exception:  # noqa: BLE001 - no torch, or a build without distributed
        return None
    if not dist.is_available():
        return None
    if mode in ("auto", "hooks") and hooks_supported():
        hooks = GroupHooks(rec)
        hooks.install()
        return hooks
    if mode == "hooks":
        return None
    _wrap_functions(rec, dist, c10d)
    return _Wrapped(rec)


def _wrap_functions(rec: TraceRecorder, dist: Any, c10d: Any) -> None:
    for op in COLLECTIVE_OPS:
        original = getattr(c10d, op, None) or getattr(dist, op, None)
        if original is None:
            continue
        original = getattr(original, "__jobtrace_wrapped__", original)
        wrapper = wrap_collective(original, op, rec, dist)
        for module in (dist, c10d):
            if hasattr(module, op):
                _PATCHED.setdefault((module, op), getattr(module, op))
                setattr(module, op, wrapper)


def uninstrument_torch() -> None:
    for (module, op), original in _PATCHED.items():
        setattr(module, op, getattr(original, "__jobtrace_wrapped__", original))
    _PATCHED.clear()


_GPU_NODES = ("kfd", "dxg", "nvhost-ctrl-gpu", "nvgpu")


def _gpu_device_present() -> bool:
    """Whether this machine shows a GPU device node, read from ``/dev`` only: NVIDIA's (``nvidia0``…),
    AMD's (``kfd``), WSL2's (``dxg``), Jetson's (``nvhost-ctrl-gpu``, ``nvgpu``).

    Asking torch (``torch.cuda.is_available()``) would initialise the CUDA driver in this process,
    which breaks CUDA in children it forks later; a device node is what the driver needs anyway.
    Where there is no ``/dev`` to read (not Linux), a GPU is assumed.
    """
    if sys.platform != "linux" or not os.path.isdir("/dev"):
        return True
    return any(os.path.exists(f"/dev/{name}") for name in _GPU_NODES) or bool(glob.glob("/dev/nvidia[0-9]*"))


def memory_hook(rec: TraceRecorder, interval_s: float = 0.1, cuda: Any = None) -> Callable[[int | None], None] | None:
    """A step-end hook recording CUDA memory counters (when initialised) and host RSS (rate-limited).

    ``cuda``: the ``torch.cuda`` module (the default); the seam a test without a GPU uses. With the
    compiled recorder, which reads RSS itself, None when there is no CUDA to read either.
    """
    if cuda is None:
        try:
            import torch

            # A CPU-only build, or a machine without a GPU, can never initialise CUDA: skip the check each
            # step (a Python call).
            gpu_build = torch.version.cuda or getattr(torch.version, "hip", None)
            cuda = torch.cuda if gpu_build and _gpu_device_present() else None
        except Exception:  # noqa: BLE001
            cuda = None
    statm_fd: int | None = None
    if not rec.sample_rss(interval_s, _PAGE):  # the compiled recorder reads RSS itself
        try:
            # Kept open and read with pread: reopening /proc/self/statm costs ~30 µs a step.
            statm_fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            pass
    if statm_fd is None and cuda is None:
        return None
    interval_ns = int(interval_s * 1e9)
    next_rss_ns = 0

    def hook(step: int | None) -> None:
        nonlocal next_rss_ns
        values: dict[str, Any] = {}
        now = rec.last_progress_ns  # the step's end, just set by the span: no clock read
        if statm_fd is not None and now >= next_rss_ns:
            next_rss_ns = now + interval_ns
            values["rss_bytes"] = int(os.pread(statm_fd, 128, 0).split()[1]) * _PAGE
        if cuda is not None and cuda.is_initialized():
            dev = cuda.current_device()
            values["cuda_allocated_bytes"] = cuda.memory_allocated(dev)
            values["cuda_reserved_bytes"] = cuda.memory_reserved(dev)
            values["cuda_max_allocated_bytes"] = cuda.max_memory_allocated(dev)
        if values:  # plain ints: straight to the queue, without the user path's tensor checks
            rec.emit((_METRIC, now, step, values, rec.root_span_id))

    return hook
