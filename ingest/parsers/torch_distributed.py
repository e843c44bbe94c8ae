"""PyTorch and NCCL failure evidence: tracebacks, torchelastic summaries, NCCL lines, watchdog timeouts, OOM.

Formats:

* Python tracebacks (``traceback.format_exception``): ``Traceback (most recent call
  last):``, indented ``  File "...", line N, in f`` frames and source lines, chained
  with ``During handling of the above exception, another exception occurred:`` or
  ``The above exception was the direct cause of the following exception:``, ending in
  ``ExceptionType: message``. One event per traceback (``exc`` holds the text).
* torchelastic (``torch/distributed/elastic/multiprocessing/errors/__init__.py``,
  ``ChildFailedError.format_msg`` with ``_MSG_FORMAT_TEMPLATE`` / ``_FAILURE_FORMAT_TEMPLATE``):
  a ``=`` border, ``{name} FAILED``, ``Failures:``, ``Root Cause (first observed failure):``
  and per failure ``[idx]:`` with ``time``, ``host``, ``rank (local_rank: )``, ``exitcode
  (pid: )``, ``error_file``, ``traceback``.
* NCCL (``NVIDIA/nccl`` ``src/debug.cc::ncclDebugLogV``): ``{host}:{pid}:{tid} [{dev}] NCCL
  INFO {msg}`` and ``... [{dev}] {file}:{line} ({func}) NCCL WARN {msg}`` (older: no file).
* ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp::WorkNCCL::checkTimeout``: ``{logPrefix}
  Watchdog caught collective operation timeout: WorkNCCL(SeqNum={}, OpType={}, NumelIn={},
  NumelOut={}, Timeout(ms)={}) ran for {} milliseconds before timing out.`` where the
  prefix is ``[Rank r] `` or ``[PG ID i PG GUID g(desc) Rank r] ``.
* ``c10/cuda/CUDACachingAllocator.cpp``: ``CUDA out of memory. Tried to allocate {size}. GPU
  {d} has a total capacity of {size} of which {size} is free. ...`` (and the pre-2.1
  ``(GPU 0; {size} total capacity; {size} already allocated; {size} free; ...)``).
"""

from __future__ import annotations

import re
from typing import Any, Final

from .._timestamps import torch_elastic_time
from .._types import FEED_DONE, FEED_MORE, FEED_REJECT, Line, PartialEvent
from ._util import collective_op

__all__ = ["ElasticFailureParser", "NcclParser", "OomParser", "TracebackParser", "WatchdogParser"]

_MAX_BLOCK_LINES: Final = 2000
_MAX_BLOCK_CHARS: Final = 256 * 1024
_SIZE: Final = re.compile(r"(?<![\d.])([\d.]+) ?(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB|bytes)")
_UNITS: Final = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
                 "KB": 1000, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _bytes(text: str | None) -> int | None:
    if not text:
        return None
    m = _SIZE.search(text)
    if not m:
        return None
    try:
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    except (ValueError, KeyError):
        return None


# ---- CUDA out of memory -----------------------------------------------------------
# An amount is read from where its digits start, and its unit starts with a letter: ``[\d.]+ ?\w+`` let the
# two runs trade digits and took cubic time on a long run of digits (issue 20).
_AMOUNT: Final = r"(?<![\d.])[\d.]+ ?[A-Za-z]\w*"
_OOM_NEW: Final = re.compile(
    rf"(?:CUDA )?[Oo]ut of memory\. Tried to allocate (?P<tried>{_AMOUNT})\. GPU (?P<gpu>\d+) has a total "
    rf"capac(?:i)?ty of (?P<total>{_AMOUNT}) of which (?P<free>{_AMOUNT}) is free\.(?P<rest>.*)")
_OOM_OLD: Final = re.compile(
    rf"CUDA out of memory\. Tried to allocate (?P<tried>{_AMOUNT}) \(GPU (?P<gpu>\d+); (?P<total>{_AMOUNT}) "
    rf"total capacity; (?P<alloc>{_AMOUNT}) already allocated; (?P<free>{_AMOUNT}) free;(?P<rest>.*)")
_OOM_ALLOC: Final = re.compile(rf"Of the allocated memory (?P<alloc>{_AMOUNT}) is allocated by PyTorch")
_OOM_RES: Final = re.compile(rf"(?P<res>{_AMOUNT}) is reserved by PyTorch but unallocated")
_OOM_PROC: Final = re.compile(rf"(?:Process (?P<pid>\d+) has|this process has) (?P<use>{_AMOUNT}) memory in use")
_OOM_OLD_RES: Final = re.compile(rf"(?P<res>{_AMOUNT}) reserved in total by PyTorch")


def oom_attrs(text: str) -> dict[str, Any] | None:
    """What a CUDA OOM message says, in bytes; ``None`` if ``text`` is not one."""
    m = _OOM_NEW.search(text) or _OOM_OLD.search(text)
    if not m:
        if "out of memory" in text and ("CUDA" in text or "OutOfMemoryError" in text):
            return {"oom": True}
        return None
    g = m.groupdict()
    attrs: dict[str, Any] = {"oom": True, "gpu": int(g["gpu"]), "tried_bytes": _bytes(g["tried"]),
                             "total_bytes": _bytes(g["total"]), "free_bytes": _bytes(g["free"])}
    rest = g.get("rest") or ""
    if g.get("alloc"):
        attrs["allocated_bytes"] = _bytes(g["alloc"])
    a = _OOM_ALLOC.search(rest)
    if a:
        attrs["allocated_bytes"] = _bytes(a.group("alloc"))
    r = _OOM_RES.search(rest) or _OOM_OLD_RES.search(rest)
    if r:
        attrs["reserved_bytes" if "in total" in r.group(0) else "reserved_unallocated_bytes"] = _bytes(r.group("res"))
    p = _OOM_PROC.search(rest)
    if p:
        attrs["process_in_use_bytes"] = _bytes(p.group("use"))
        if p.group("pid"):
            attrs["process_pid"] = int(p.group("pid"))
    return {k: v for k, v in attrs.items() if v is not None}


class OomParser:
    name = "cuda-oom"
    triggers = (r"[Oo]ut of memory",)

    def parse(self, line: Line) -> list[PartialEvent] | None:
        attrs = oom_attrs(line.text)
        if attrs is None:
            return None
        return [{"kind": "log", "level": "ERROR", "logger": line.logger or "torch.cuda", "msg": line.text, "attrs": attrs}]


# ---- Python tracebacks ------------------------------------------------------------
_CHAIN: Final = ("During handling of the above exception", "The above exception was the direct cause")
# An exception's name: dotted words up to ``:`` or the end, whose last part has a capital after the first
# character (``ValueError``, ``torch.OutOfMemoryError``). The capital is looked for after the match: in
# the pattern, two runs that could both take it made a long line quadratic (issue 20).
_EXC_LINE: Final = re.compile(r"([A-Za-z_][\w.]*)(?::|$)")
_EXC_CAPITAL: Final = re.compile(r"[A-Z]")


class _Traceback:
    def __init__(self, line: Line) -> None:
        self.line = line
        self.lines = [line.raw]
        self.chars = len(line.raw)
        self.state = "frames"  # frames → exception (last line seen) → maybe chained

    def feed(self, text: str, line: Line) -> int:
        if len(self.lines) >= _MAX_BLOCK_LINES or self.chars >= _MAX_BLOCK_CHARS:
            return FEED_REJECT
        if self.state == "frames":
            if text.startswith((" ", "\t")) or text.strip() == "" or text.startswith("Traceback (most recent"):
                self._add(text)
                return FEED_MORE
            if text.startswith(_CHAIN):
                self._add(text)
                return FEED_MORE
            self._add(text)  # the exception line
            self.state = "after"
            return FEED_MORE
        # After the exception line: a chained traceback may follow after a blank line.
        if text.strip() == "":
            self.state = "blank"
            self._add(text)
            return FEED_MORE
        if self.state == "blank" and text.startswith(_CHAIN):
            self._add(text)
            self.state = "frames"
            return FEED_MORE
        if self.state == "blank" and text.startswith("Traceback (most recent"):
            self._add(text)
            self.state = "frames"
            return FEED_MORE
        return FEED_REJECT

    def _add(self, text: str) -> None:
        self.lines.append(text)
        self.chars += len(text) + 1

    def finish(self) -> list[PartialEvent]:
        while self.lines and self.lines[-1].strip() == "":
            self.lines.pop()
        last = self.lines[-1] if self.lines else ""
        exc_type = None
        m = _EXC_LINE.match(last.strip())
        if m and _EXC_CAPITAL.search(m.group(1), max(1, m.group(1).rfind(".") + 1)):
            exc_type = m.group(1)
        attrs: dict[str, Any] = {"lines": len(self.lines)}
        if exc_type:
            attrs["exc_type"] = exc_type
        oom = oom_attrs(last)
        if oom:
            attrs.update(oom)
        if "Watchdog caught collective operation timeout" in last or "DistBackendError" in last:
            attrs["collective_timeout"] = True
        return [{"kind": "log", "level": "ERROR", "logger": self.line.logger or "python", "msg": last.strip(),
                 "exc": "\n".join(self.lines)[:_MAX_BLOCK_CHARS], "attrs": attrs}]


class TracebackParser:
    name = "traceback"
    triggers = (r"Traceback \(most recent call last\):",)

    def parse(self, line: Line) -> _Traceback | None:
        if not line.text.startswith("Traceback (most recent call last):"):
            return None
        return _Traceback(line)


# ---- torchelastic failure summary -------------------------------------------------
_FIELD: Final = re.compile(r"  (time|host|rank|exitcode|error_file|traceback) *: ?(.*)")
_RANKF: Final = re.compile(r"(-?\d+) \(local_rank: (-?\d+)\)")
_EXITF: Final = re.compile(r"(-?\d+) \(pid: (\d+)\)(?:\s*\((\w+)\))?")


_STD_PREFIX: Final = re.compile(r"^(?:stderr|stdout): ")
"""A harness's stream label before each line of the summary (accelerate's ``accelerate test``)."""


class _ElasticSummary:
    def __init__(self, parser: ElasticFailureParser, line: Line, cut: bool = False) -> None:
        self.parser = parser
        self.line = line
        self.lines = [line.raw]
        self.title: str | None = None
        self.section = "start"
        self.failures: list[dict[str, Any]] = []
        self.root: dict[str, Any] | None = None
        self.current: dict[str, Any] | None = None
        self.key: str | None = None
        self.cut = cut
        if cut:  # started inside the summary: its first line is a section or a failure's header
            self.title = "torchelastic failure summary"
            self._section_line(_STD_PREFIX.sub("", line.raw.strip()))

    def feed(self, text: str, line: Line) -> int:
        if len(self.lines) >= _MAX_BLOCK_LINES:
            return FEED_REJECT
        text = _STD_PREFIX.sub("", text)
        if self.title is None:
            if text.rstrip().endswith(" FAILED"):
                self.title = text.strip()
                self.lines.append(text)
                return FEED_MORE
            return FEED_REJECT
        self.lines.append(text)
        s = text.rstrip()
        if s and set(s) == {"="}:
            return FEED_DONE
        if s and set(s) == {"-"}:
            return FEED_MORE
        if self._section_line(s):
            return FEED_MORE
        m = _FIELD.match(text)
        if m and self.current is not None:
            self.key = m.group(1)
            self.current[self.key] = m.group(2).strip()
            return FEED_MORE
        if self.current is not None and self.key == "traceback" and text.startswith("  "):
            self.current["traceback"] += "\n" + text[2:]
        return FEED_MORE

    def _section_line(self, s: str) -> bool:
        """Read a section heading or a failure's ``[N]:`` header; whether ``s`` was one."""
        if s == "Failures:":
            self.section = "failures"
        elif s.startswith("Root Cause"):
            self.section = "root"
        elif re.fullmatch(r"\[\d+\]:", s):
            self.current = {"root": self.section == "root"}
            self.failures.append(self.current)
            self.key = None
        else:
            return False
        return True

    def finish(self) -> list[PartialEvent]:
        if self.title is None or (self.cut and not any("exitcode" in f for f in self.failures)):
            return [{"kind": "log", "msg": self.line.raw}]
        tz = self.parser.tz
        events: list[PartialEvent] = []
        text = "\n".join(self.lines)
        for f in self.failures:
            rank = local = exitcode = pid = None
            rm = _RANKF.match(f.get("rank", ""))
            if rm:
                rank, local = int(rm.group(1)), int(rm.group(2))
            em = _EXITF.match(f.get("exitcode", ""))
            signal = None
            if em:
                exitcode, pid, signal = int(em.group(1)), int(em.group(2)), em.group(3)
            attrs = {"title": self.title, "root_cause": f["root"], "rank": rank, "local_rank": local,
                     "host": f.get("host"), "exit_code": exitcode, "pid": pid, "signal": signal,
                     "error_file": f.get("error_file"), "failure_time": f.get("time")}
            attrs = {k: v for k, v in attrs.items() if v is not None}
            what = "root cause" if f["root"] else "also failed"
            msg = (f"{self.title}: {what}: rank {rank} (local_rank {local}) on host {f.get('host')} "
                   f"exited with code {exitcode} (pid {pid}{', ' + signal if signal else ''})")
            ev: dict[str, Any] = {"kind": "log", "level": "ERROR", "logger": "torch.distributed.elastic", "msg": msg,
                                  "attrs": attrs, "exc": text if f["root"] else f.get("traceback")}
            ts = torch_elastic_time(f.get("time", ""), tz) if tz is not None else None
            if ts is not None:
                ev["ts"] = ts
            if rank is not None:
                ev["route_rank"] = rank
            if f.get("host"):
                ev["route_node"] = f["host"]
            events.append(ev)
        if not events:
            events.append({"kind": "log", "level": "ERROR", "logger": "torch.distributed.elastic", "msg": self.title,
                           "exc": text})
        return events


_CUT_START: Final = re.compile(r"(?:Failures:|Root Cause \(first observed failure\):)")


class ElasticFailureParser:
    """torchelastic's ``ChildFailedError`` summary, from its ``====`` rule, or from a section of it.

    A log pasted into an issue, or the tail of a console, often starts inside the summary: the block
    is read from its next ``Failures:`` or ``Root Cause (first observed failure):``, under the title
    "torchelastic failure summary".
    """

    name = "torchelastic"
    # (a cut block that starts at a failure's "[N]:" header is read from its next section: a "[N]:" trigger
    # would send every torchrun-prefixed line, "[default0]:", through a regular-expression check)
    triggers = (r"={20}", r"Failures:", r"Root Cause \(first observed failure\)")

    def __init__(self) -> None:
        self.tz: Any = None  # set by the engine: the zone of the failure times

    def parse(self, line: Line) -> _ElasticSummary | None:
        s = _STD_PREFIX.sub("", line.raw.strip())
        if s and set(s) == {"="}:
            return _ElasticSummary(self, line)
        if _CUT_START.fullmatch(s):
            return _ElasticSummary(self, line, cut=True)
        return None


# ---- NCCL debug lines -------------------------------------------------------------
_NCCL: Final = re.compile(
    r"(?<![\w.-])(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] (?:(?P<file>[\w./-]+):(?P<line>\d+) "
    r"(?:\((?P<func>[^)]*)\) )?)?NCCL (?P<lvl>INFO|WARN|TRACE|CALL|ABORT) ?(?P<msg>.*)")


class NcclParser:
    name = "nccl"
    triggers = (r"\] NCCL (?:INFO|WARN|TRACE|ABORT)", r"\) NCCL WARN", r"\d NCCL WARN")

    def parse(self, line: Line) -> list[PartialEvent] | None:
        m = _NCCL.search(line.text)
        if not m:
            return None
        host, pid, tid, dev, file, lineno, lvl, msg = m.group("host", "pid", "tid", "dev", "file", "line", "lvl", "msg")
        attrs: dict[str, Any] = {"nccl_host": host, "nccl_pid": int(pid), "tid": int(tid), "cuda_dev": int(dev)}
        if file:
            attrs["src"] = f"{file}:{lineno}"
        level = "WARNING" if lvl in ("WARN", "ABORT") else ("DEBUG" if lvl in ("TRACE", "CALL") else "INFO")
        return [{"kind": "log", "level": level, "logger": "nccl", "msg": msg, "attrs": attrs}]


# ---- ProcessGroupNCCL watchdog ------------------------------------------------------
_WATCHDOG: Final = re.compile(
    r"(?:\[(?:PG (?:ID )?(?P<pg>\d+) (?:PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))? )?)?Rank (?P<rank>\d+)\]\s*)?"
    r"(?:Watchdog caught|Caught) collective operation timeout: WorkNCCL\((?P<work>.*?)\) ran for (?P<ms>\d+) "
    r"milliseconds before timing out")
_WORK: Final = re.compile(r"(?<!\w)(\w+(?:\(ms\))?)=([^,]+)")  # a key from where it starts: linear


class WatchdogParser:
    name = "nccl-watchdog"
    triggers = (r"ollective operation timeout: ",)

    def parse(self, line: Line) -> list[PartialEvent] | None:
        m = _WATCHDOG.search(line.text)
        if not m:
            return None
        work = dict(_WORK.findall(m.group("work")))
        op_raw = work.get("OpType", "UNKNOWN").strip()
        op = collective_op(op_raw)
        elapsed_ms = int(m.group("ms"))
        group = m.group("desc") or (f"pg{m.group('pg')}" if m.group("pg") else "default")
        if group == "default_pg":
            group = "default"
        attrs: dict[str, Any] = {"op": op, "op_type": op_raw, "group": group, "elapsed_ms": elapsed_ms,
                                 "timed_out": True}
        for src, dst in (("SeqNum", "seq"), ("NumelIn", "numel_in"), ("NumelOut", "numel_out"), ("Timeout(ms)", "timeout_ms")):
            try:
                attrs[dst] = int(work[src])
            except (KeyError, ValueError):
                pass
        if m.group("rank"):
            attrs["group_rank"] = int(m.group("rank"))
        dur = elapsed_ms * 1_000_000
        span_attrs = {k: attrs[k] for k in ("op", "group", "seq", "timed_out") if k in attrs}
        route: dict[str, Any] = {}
        if line.stream.rank_guessed and m.group("rank") and m.group("pg") in (None, "0"):
            route["route_rank"] = int(m.group("rank"))  # the default group's rank is the global rank
        events: list[dict[str, Any]] = [
            {"kind": "log", "level": "ERROR", "logger": line.logger or "torch.distributed", "msg": line.text, "attrs": attrs},
            {"kind": "span", "cat": "collective", "name": op, "dur": dur, "attrs": span_attrs},
            {"kind": "heartbeat", "attrs": {"in_op": op, "in_group": group, "in_seq": attrs.get("seq"),
                                            "span_age_ms": elapsed_ms, "source": "nccl-watchdog"}},
        ]
        return [ev | route for ev in events]
