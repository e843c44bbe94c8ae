"""What a failure line says: its kind, the rank and host it names, and its facts.

One table (:data:`SIGNATURES`) of the failure messages that PyTorch, NCCL, gloo, the CUDA
caching allocator, torchelastic, the DeepSpeed launcher, Horovod and the Linux kernel
print, each written from the format in the source that prints it, in the order they are
tried: the most specific first, so a traceback's last line ``RuntimeError: CUDA out of
memory…`` is an OOM and not only an exception. :func:`classify` reads one log message
(and the attributes the ingest parsers gave it) and returns a :class:`Failure`, or
``None`` for anything else, which is nearly every line of a log: the patterns are
anchored on phrases no healthy run prints.

Pure text in, plain data out: no store, no SQL, so the rules can be checked line by line
(``tests/queries/test_failures.py``) and by the corpus of real logs (``tests/corpus``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["CAUSE_RANK", "Failure", "SIGNATURES", "Signature", "classify", "PREFILTER"]


@dataclass
class Failure:
    """One failure line, read: what it is, who it names, what it says."""

    kind: str
    facts: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    """The global rank the message itself names (``[Rank 3]``, ``rank 3 (local_rank: 3)``), if any."""
    local_rank: int | None = None
    host: str | None = None
    """The host the message names (an NCCL ``host:pid:tid`` head, a torchelastic summary's ``host``)."""


@dataclass(frozen=True)
class Signature:
    kind: str
    pattern: re.Pattern[str]
    facts: Callable[[re.Match[str]], dict[str, Any]] = lambda m: {}


def _ints(m: re.Match[str], **names: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, group in names.items():
        value = m.group(group)
        if value is not None:
            out[key] = int(value.replace(",", ""))
    return out


def _groups(m: re.Match[str]) -> dict[str, Any]:
    return {k: v for k, v in m.groupdict().items() if v is not None}


_WORK: Final = re.compile(r"(\w+(?:\(ms\))?)=([^,)]+)")


def _watchdog(m: re.Match[str]) -> dict[str, Any]:
    work = dict(_WORK.findall(m.group("work") or ""))
    facts: dict[str, Any] = {"op": work.get("OpType", "").strip() or None}
    for src, dst in (("SeqNum", "seq"), ("NumelIn", "numel_in"), ("NumelOut", "numel_out"),
                     ("Timeout(ms)", "timeout_ms")):
        try:
            facts[dst] = int(work[src])
        except (KeyError, ValueError):
            pass
    if m.group("ran"):
        facts["ran_ms"] = int(m.group("ran"))
    return {k: v for k, v in facts.items() if v is not None}


_SEQ_OF: Final = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\((?:SequenceNumber=(\d+))?")


def _mismatch(m: re.Match[str]) -> dict[str, Any]:
    """The ranks a ProcessGroupWrapper report names; where both sequence numbers show, the one behind."""
    end = len(m.string.rstrip())
    # a number the line ends in may be cut short (a pasted excerpt, a capped line): not compared
    named = [(int(x.group(1)), int(x.group(2)) if x.group(2) and x.end() < end else None)
             for x in _SEQ_OF.finditer(m.string)]
    facts: dict[str, Any] = {"running": {str(r): seq for r, seq in named}}
    seqs = {seq for _, seq in named}
    if len(named) == 2 and None not in seqs and len(seqs) == 2:
        facts["culprits"] = [min(named, key=lambda x: x[1] or 0)[0]]
    else:
        facts["culprits"] = sorted({r for r, _ in named})
    return facts


def _exit(m: re.Match[str]) -> dict[str, Any]:
    facts = _ints(m, exitcode="code")
    for key in ("pid", "local"):
        if m.groupdict().get(key):
            facts["local_rank" if key == "local" else key] = int(m.group(key))
    return facts


_HEX: Final = r"[0-9A-Fa-f]"

FRAME: Final = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
"""One frame of a Python traceback (a signature below, and the call sites a desync is told by)."""

SIGNATURES: Final[tuple[Signature, ...]] = (
    # c10/cuda/CUDACachingAllocator.cpp; NCCL's alloc.h ("Cuda failure 2 'out of memory'")
    Signature("cuda_oom", re.compile(
        r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|Cuda failure 2 '?out of memory"
        r"|CUBLAS_STATUS_ALLOC_FAILED")),
    # NVIDIA driver (dmesg), CUDA runtime errors that mean the device, IB completion errors in NCCL's net plugins
    Signature("hardware_fault", re.compile(r"NVRM: Xid \(PCI:(?P<pci>[\w:.]+)\): (?P<xid>\d+)"),
              lambda m: {"xid": int(m.group("xid")), "pci": m.group("pci")}),
    Signature("hardware_fault", re.compile(
        r"(?P<error>uncorrectable ECC error|an illegal memory access was encountered|GPU has fallen off the bus"
        r"|unspecified launch failure|CUDA error: unknown error|NVLink (?:error|fatal)"
        r"|Got completion (?:from peer \S+ )?with (?:error|status=) ?(?P<ib>\d+))"),
        lambda m: {"error": m.group("error")} | ({"ib_error": int(m.group("ib"))} if m.group("ib") else {})),
    # torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL)
    Signature("collective_mismatch", re.compile(
        r"Detected mismatch between collectives on ranks\. Rank \d+ is running collective"), _mismatch),
    # Megatron / c10d desync report
    Signature("collective_mismatch", re.compile(
        r"\[(?P<a>\d+)\] finished collective #(?P<seq>\d+), but didn't join collective #(?P<next>\d+)"),
        lambda m: {"rank_a": int(m.group("a")), "seq": int(m.group("seq")), "next": int(m.group("next"))}),
    # gloo transport/tcp/pair.cc: the peer's process went away (it crashed, or was killed): a consequence
    Signature("peer_lost", re.compile(
        r"gloo/transport/tcp/pair\.cc:\d+\] Connection (?:closed|reset) by peer(?: \[(?P<peer>[^\]]+)\]:(?P<port>\d+))?"),
        lambda m: {"backend": "gloo"} | ({"peer": f"{m.group('peer')}:{m.group('port')}"} if m.group("peer") else {})),
    # ProcessGroupNCCL's heartbeat monitor; Horovod's stall inspector
    Signature("hang", re.compile(
        r"Heartbeat monitor timed out(?:.*?workMetaList_\.size\(\)=(?P<works>\d+))?"
        r"|watchdog got stuck for (?P<stuck>\d+) seconds"
        r"|submitted to be reduced, gathered or broadcasted by subset of ranks"),
        lambda m: _ints(m, stuck_s="stuck", outstanding_works="works")),
    # the stall inspector's list under "Stalled ranks:": "4: [horovod_allreduce.0, …]", the ranks not submitting
    Signature("hang", re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:)?(?P<stalled>\d+): \[horovod_(?P<op>[a-z_]+)"),
              lambda m: {"stalled_rank": int(m.group("stalled")), "op": m.group("op")}),
    # ProcessGroupNCCL.cpp WorkNCCL::checkTimeout
    Signature("collective_timeout", re.compile(
        r"(?:Watchdog caught|Caught) collective operation timeout: WorkNCCL\((?P<work>[^)]*\)?[^)]*)\)"
        r"(?: ran for (?P<ran>\d+) milliseconds)?"), _watchdog),
    # gloo transport/tcp/unbound_buffer.cc, pair.cc
    Signature("collective_timeout", re.compile(
        r"Timed out waiting (?P<ms>\d+)ms for (?P<what>send|recv|connect|\w+) operation"),
        lambda m: {"backend": "gloo", "timeout_ms": int(m.group("ms")), "waiting_for": m.group("what")}),
    Signature("collective_timeout", re.compile(r"\[Rank \d+\] .*?(?:Socket Timeout|timed out in|Timeout waiting for)")),
    # ProcessGroupNCCL::watchdogHandler: after a timeout or error, where each rank was
    Signature("collective_timeout", re.compile(
        r"(?:detected by watchdog at work|Timeout at NCCL work): (?P<work>\d+), last enqueued NCCL work: (?P<enq>-?\d+), "
        r"last completed NCCL work: (?P<done>-?\d+)"),
        lambda m: _ints(m, work="work", last_enqueued="enq", last_completed="done")),
    # NCCL's ncclResult_t strings (nccl.h.in), NCCLUtils.hpp's "NCCL error in:", the SIGBUS of a dying ncclGroupEnd
    Signature("nccl_error", re.compile(
        r"(?P<error>nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)Error"
        r"|NCCL error in:|NCCL Error \d+|unhandled (?:cuda|system) error|invalid usage, NCCL version"
        r"|NCCL failure|no algorithm/protocol available)")),
    Signature("nccl_error", re.compile(r"NCCL WARN (?P<warn>.*)"), lambda m: {"warn": m.group("warn")[:200]}),
    # the "Last error:" NCCL gives a DistBackendError, on the next line: "[Proxy Service 2] Failed to execute
    # operation Connect from rank 2, retcode 3"
    Signature("nccl_error", re.compile(r"\[Proxy Service \d+\] (?P<last>Failed to execute operation \w+.*)"),
              lambda m: {"last_error": m.group("last")[:200]}),
    Signature("nccl_error", re.compile(r"Caught signal (?P<sig>\d+) \((?P<name>Bus error[^)]*)"),
              lambda m: {"signal": int(m.group("sig")), "error": m.group("name")}),
    # torchelastic api.py "failed (exitcode: -9) local_rank: 3 (pid: 812917) of binary"
    Signature("process_exit", re.compile(
        r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"), _exit),
    # torchelastic ChildFailedError summary fields
    Signature("process_exit", re.compile(r"^\s*exitcode\s*: (?P<code>-?\d+) \(pid: (?P<pid>\d+)\)"), _exit),
    # DeepSpeed launcher's sigkill_handler; subprocess.CalledProcessError
    Signature("process_exit", re.compile(
        r"exits? with return code = (?P<code>-?\d+)|returned non-zero exit status (?P<code2>-?\d+)"),
        lambda m: {"exitcode": int(m.group("code") or m.group("code2"))}),
    # torchelastic's summary as the ingest parser words it
    Signature("process_exit", re.compile(r"exited with code (?P<code>-?\d+) \(pid (?P<pid>\d+)"), _exit),
    Signature("process_exit", re.compile(r"Signal (?P<sig>\d+) \((?P<name>SIG\w+)\) received by PID (?P<pid>\d+)"),
              lambda m: {"signal": m.group("name"), "exitcode": -int(m.group("sig")), "pid": int(m.group("pid"))}),
    # The kernel's OOM killer
    Signature("host_oom", re.compile(r"Out of memory: Killed process (?P<pid>\d+)|oom-kill:|invoked oom-killer"),
              lambda m: _ints(m, pid="pid")),
    # A traceback's frame, where an excerpt (or a rank's interleaved output) shows frames without their head
    Signature("python_exception", re.compile(r"^\s*" + FRAME.pattern),
              lambda m: {"site": f"{m.group('file').rsplit('/', 1)[-1]}:{m.group('line')} {m.group('func')}"}),
    # A traceback's last line (or one printed alone): ``SomeError: message``
    Signature("python_exception", re.compile(
        r"^(?:\w+\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Interrupt)|AssertionError|KeyboardInterrupt)"
        r"(?::\s*(?P<message>.*))?$"),
        lambda m: {"exception": m.group("type")} | ({"message": m.group("message")[:300]} if m.group("message")
                                                     else {})),
)

PREFILTER: Final = (
    r"out of memory|OutOfMemoryError|ALLOC_FAILED|Xid|ECC|illegal memory|fallen off|launch failure|unknown error"
    r"|NVLink|Got completion|mismatch between collectives|didn't join|Heartbeat monitor|got stuck|subset of ranks|: \[horovod_"
    r"|operation timeout|Timed out|timed out|Timeout waiting|detected by watchdog|Timeout at NCCL work|nccl\w*Error|NCCL|Proxy Service|unhandled"
    r"|Caught signal|exitcode|exited with|exit status|return code|received by PID|Killed process|oom-kill|Error|Exception"
    r"|Interrupt|File \"|by peer"
)
"""One regular expression that every line :func:`classify` can accept matches (the store scans with it)."""

CAUSE_RANK: Final[dict[str, int]] = {
    "cuda_oom": 0, "hardware_fault": 0, "collective_mismatch": 1, "nccl_error": 2, "python_exception": 3,
    "host_oom": 3, "hang": 4, "collective_timeout": 5, "peer_lost": 5, "process_exit": 6,
}
"""How likely a kind is the root cause rather than a consequence of another failure (lower: more).

A collective times out *because* a rank is elsewhere; a launcher reports an exit code *because*
a process failed; the others are where failures start. Among kinds of the same rank, the first
in time is the suspect.
"""

# The rank a message names: ``[Rank 3]``, ``[PG 0 (default_pg) Rank 3]``, ``[rank3]`` inside the text,
# ``Rank 3 is running``, "on rank0", NCCL's "Init COMPLETE … rank 59 nranks 64", ``GLOBAL_RANK: 3``.
_RANK_IN_TEXT: Final = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*?)?\b[Rr]ank ?(?P<r1>\d+)\]|\bon rank ?(?P<r2>\d+)\b|GLOBAL_RANK[=: ]+(?P<r3>\d+)"
    r"|\brank (?P<r4>\d+) nranks \d+|\bfrom rank (?P<r5>\d+)\b|^\[\d+,(?P<r6>\d+)\]<std(?:out|err)>:")
_NCCL_HEAD: Final = re.compile(r"(?:^|\s)(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
_SIGNAL_HOST: Final = re.compile(r"\[(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+) ?:\d+:\d+\] Caught signal")


_LEAD: Final = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s?)+")
"""The prefixes left on a line after ingest took one off: torchrun's ``[default3]:`` before torch's ``[rank3]:``."""


def message_rank(text: str) -> int | None:
    """The global rank ``text`` itself names, or ``None``.

    A ``[PG n … Rank r]`` prefix of a group other than 0 gives the rank *in that group*, which
    is not the global rank: it is not taken.
    """
    for m in _RANK_IN_TEXT.finditer(text):
        if m.group("r1") is not None:
            if m.group("pg") not in (None, "0"):
                continue
            return int(m.group("r1"))
        for g in ("r2", "r3", "r4", "r5", "r6"):
            if m.group(g) is not None:
                return int(m.group(g))
    return None


def classify(msg: str, attrs: Mapping[str, Any] | None = None, traceback: bool = False,
             nccl_warn: bool = False) -> Failure | None:
    """The failure ``msg`` reports, or ``None``.

    ``attrs``: what an ingest parser read from the same line; ``traceback``: the line is the end of a
    Python traceback (its ``exc``), so an exception even where the excerpt stops before its last line;
    ``nccl_warn``: the ingest's NCCL parser read the line as an ``NCCL WARN`` and kept only its message.
    """
    a = attrs or {}
    text = _LEAD.sub("", msg.strip())
    found: Failure | None = Failure("process_exit") if a.get("exit_code") is not None else None
    for sig in () if found else SIGNATURES:
        m = sig.pattern.search(text)
        if m:
            found = Failure(sig.kind, sig.facts(m))
            break
    if found is None and nccl_warn:
        found = Failure("nccl_error", {"warn": text[:200]})
    if found is None and (a.get("exc_type") or traceback) and not str(a.get("exc_type", "")).endswith("Warning"):
        found = Failure("python_exception", {"exception": a["exc_type"]} if a.get("exc_type") else {})
    if found is None:
        return None
    _refine(found, a)
    found.rank = message_rank(text)
    head = _NCCL_HEAD.search(text) or _SIGNAL_HOST.search(text)
    if head:
        found.host = head.group("host")
        if "dev" in head.groupdict():
            found.facts.setdefault("device", int(head.group("dev")))
    if a.get("nccl_host") and found.host is None:
        found.host = str(a["nccl_host"])
    if a.get("cuda_dev") is not None:  # the NCCL head the ingest parser read: which process and GPU
        found.facts.setdefault("device", int(a["cuda_dev"]))
    if a.get("nccl_pid") is not None:
        found.facts.setdefault("pid", int(a["nccl_pid"]))
    if a.get("host") and found.host is None:
        found.host = str(a["host"])
    if a.get("rank") is not None and found.rank is None:
        found.rank = int(a["rank"])
    if a.get("local_rank") is not None:
        found.local_rank = int(a["local_rank"])
    elif found.facts.get("local_rank") is not None:
        found.local_rank = int(found.facts["local_rank"])
    return found


def _refine(f: Failure, a: Mapping[str, Any]) -> None:
    """Facts the parsers read better than a pattern can (torchelastic, OOM sizes), and exit codes' meaning."""
    if f.kind == "cuda_oom":
        for key in ("gpu", "tried_bytes", "free_bytes", "total_bytes", "allocated_bytes", "reserved_bytes",
                    "reserved_unallocated_bytes", "process_in_use_bytes"):
            if a.get(key) is not None:
                f.facts[key] = a[key]
    if a.get("exit_code") is not None:
        f.kind = "process_exit"
        f.facts["exitcode"] = int(a["exit_code"])
        if a.get("signal"):
            f.facts["signal"] = a["signal"]
        if a.get("root_cause") is not None:
            f.facts["root_cause"] = bool(a["root_cause"])
    if f.kind == "process_exit" and f.facts.get("exitcode") == -9:
        f.kind = "host_oom"  # SIGKILL: the kernel's OOM killer, most often (or the scheduler)
        f.facts["likely"] = "host OOM killer (SIGKILL)"
    if f.kind == "python_exception":
        exc = str(f.facts.get("exception", ""))
        if exc == "ChildFailedError":  # torchelastic's exit summary, raised by the launcher: an exit, not a cause
            f.kind = "process_exit"
            return
        if exc in ("DistBackendError", "DistStoreError") or "timeout" in str(f.facts.get("message", "")).lower():
            f.kind = "collective_timeout" if "timeout" in str(f.facts.get("message", "")).lower() else "nccl_error"
