"""Launcher prefixes that say which rank or host wrote a line of an interleaved file.

* ``srun -l`` (``--label``): ``" 3: "``, the task id (= global rank) right-aligned.
* pdsh (the DeepSpeed multi-node launcher): ``"worker-1: "``, the host name.
* torchrun ``--tee``/``--redirects``: ``"[default3]:"`` (role name and local rank), and
  torch's own ``"[rank3]:"`` on C++ log lines and Python tracebacks since torch 2.2.
* Open MPI's ``mpirun --tag-output``: ``"[1,3]<stdout>:"`` (job and global rank), after
  ``--timestamp-output``'s ``"Fri Aug 11 12:31:45 2023"`` where given (kept, before the text).

srun and pdsh prefixes cannot be told from ordinary text line by line (``"RuntimeError: x"``
looks like a host), so the mode is decided once per file from a sample of its first
lines; the bracketed torchrun forms are unambiguous and are always recognised.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["PrefixMode", "Prefix", "detect_mode", "make_prefix", "may_have_prefix", "split_prefix"]

_SRUN: Final = re.compile(r" *(\d{1,6}): ")
_PDSH: Final = re.compile(r"([A-Za-z0-9][\w.-]{0,127}): ")
_TORCHRUN: Final = re.compile(r"\[([A-Za-z_][\w-]{0,63}?)(\d{1,6})\]: ?")
_MPIRUN: Final = re.compile(r"((?:[A-Z][a-z]{2} ){2}[ \d]\d \d\d:\d\d:\d\d \d{4})?\[\d{1,9},(\d{1,6})\]<std(?:out|err|diag)>: ?")
_MPIRUN_WITHIN: Final = 48
"""mpirun's tag ends within this many characters of the line's start (after a timestamp of 24)."""
_NOT_HOSTS: Final = frozenset(
    {"INFO", "WARNING", "WARN", "ERROR", "DEBUG", "CRITICAL", "FATAL", "Traceback", "Note", "NOTE", "Warning",
     "Error", "Exception", "File", "Failures", "Root", "time", "host", "rank", "exitcode", "error_file", "traceback"}
)


class PrefixMode:
    NONE: Final = "none"
    SRUN: Final = "srun"
    PDSH: Final = "pdsh"


@dataclass(slots=True, frozen=True)
class Prefix:
    """Who wrote a line, as far as its prefixes say."""

    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    role: str | None = None


def detect_mode(sample: Iterable[str], threshold: float = 0.6) -> str:
    """``srun``, ``pdsh`` or ``none`` for a file, from its first non-blank lines."""
    lines = [s for s in sample if s.strip()]
    if len(lines) < 2:
        return PrefixMode.NONE
    srun = sum(1 for s in lines if _SRUN.match(s))
    if srun >= threshold * len(lines):
        return PrefixMode.SRUN
    hosts: Counter[str] = Counter()
    for s in lines:
        m = _PDSH.match(s)
        if m:
            hosts[m.group(1)] += 1
    total = sum(hosts.values())
    if total >= threshold * len(lines) and 0 < len(hosts) <= 512:
        bad = sum(n for h, n in hosts.items() if h in _NOT_HOSTS or h.endswith(("Error", "Exception", "Warning")))
        if bad * 2 < total:
            return PrefixMode.PDSH
    return PrefixMode.NONE


_INTERNED: dict[tuple[str | None, int | None, int | None, str | None], Prefix] = {}
_INTERNED_MAX: Final = 65536


def make_prefix(host: str | None, rank: int | None, local_rank: int | None, role: str | None) -> Prefix:
    """One shared :class:`Prefix` per value: a file has a few writers and many lines, and creating a frozen
    dataclass per line (and comparing it field by field in the stream look-up) costs more than this look-up."""
    key = (host, rank, local_rank, role)
    pfx = _INTERNED.get(key)
    if pfx is None:
        if len(_INTERNED) >= _INTERNED_MAX:
            _INTERNED.clear()
        pfx = _INTERNED[key] = Prefix(host, rank, local_rank, role)
    return pfx


def may_have_prefix(text: str) -> bool:
    """Whether a line may start with a prefix that every mode reads (torchrun's, mpirun's tag)."""
    return text[:1] == "[" or "]<std" in text[:_MPIRUN_WITHIN]


def split_prefix(text: str, mode: str) -> tuple[Prefix | None, str]:
    """The launcher prefix of ``text`` (or ``None``) and the rest of the line."""
    host = None
    rank = None
    if "]<std" in text[:_MPIRUN_WITHIN]:
        mp = _MPIRUN.match(text)
        if mp:
            rest = text[mp.end():]
            return make_prefix(None, int(mp.group(2)), None, None), (f"{mp.group(1)} {rest}" if mp.group(1) else rest)
    if mode == PrefixMode.SRUN:
        m = _SRUN.match(text)
        if m:
            rank = int(m.group(1))
            text = text[m.end():]
    elif mode == PrefixMode.PDSH:
        m = _PDSH.match(text)
        if m and m.group(1) not in _NOT_HOSTS:
            host = m.group(1)
            text = text[m.end():]
    if text[:1] == "[":
        m2 = _TORCHRUN.match(text)
        if m2:
            role, n = m2.group(1), int(m2.group(2))
            text = text[m2.end():]
            if role.lower() == "rank":
                rank = n
                return make_prefix(host, rank, None, None), text
            return make_prefix(host, rank, n, role), text
    if host is None and rank is None:
        return None, text
    return make_prefix(host, rank, None, None), text
