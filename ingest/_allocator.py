"""Keep freed memory in the process while the ingest command runs.

The ingest reads a file a megabyte at a time and the compiled lane hands back several
megabytes of event lines per chunk; each of those buffers is freed a moment later.
With glibc's default thresholds, buffers that size are mapped and unmapped (or the heap
top trimmed) every time, so each new one costs its pages anew: a page fault and the
zeroing of 4 KiB per page, about 13,000 faults per 20 MB of log, and in a virtual
machine each fault is dear (``benchmarks/bench_ingest.py`` prints the rate with and
without). Raising the two thresholds lets the same memory serve chunk after chunk; the
peak memory does not change (the buffers exist at the same time either way).

Only the ``ingest`` command calls this: a library call must not change the allocator
of a process it is merely part of (a training job following its own logs, say).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
_MMAP_THRESHOLD: Final = 32 << 20  # glibc's largest (64-bit): chunks and their outputs stay on the heap
_TRIM_THRESHOLD: Final = 64 << 20  # freed memory kept at the heap top before it is given back


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc only: musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    del gnu_get_libc_version
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
