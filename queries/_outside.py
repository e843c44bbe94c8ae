"""Evidence from outside a rank's process, gathered by the watcher on the rank's node when it alerts.

A rank that died or hung cannot say why; its node often can:

* **the kernel log** (:func:`kernel_evidence`): NVIDIA Xid events, GPU ECC and row-remapping errors,
  NVLink errors, a GPU fallen off the bus, the OOM killer, hung tasks, segfaults, PCIe AER and machine
  checks, over a window reaching :data:`KERNEL_WINDOW_S` (15 minutes) before the event: an NCCL timeout
  often surfaces about 10 minutes after its cause. Read from ``/dev/kmsg`` (stamps converted from the
  boot clock), else from ``journalctl -k``; where neither is readable (``kernel.dmesg_restrict``, a
  container) the evidence says so instead.
* **SLURM's view of the step** (:func:`slurm_evidence`): its state and exit code, from ``scontrol``
  (and ``sacct`` where accounting is on), for ranks that carry a SLURM step id.

Every pattern here is a plain scan with no nested quantifier (linear on any line).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._live import Alert, LiveState

__all__ = ["KERNEL_WINDOW_S", "KernelLine", "add_outside_evidence", "classify_kernel_line",
           "kernel_evidence", "native_stacks", "read_kernel_log", "slurm_evidence"]

KERNEL_WINDOW_S = 15 * 60
"""How far before the event the kernel log is read (at least 12 minutes: see the module docstring)."""

_XID = re.compile(r"NVRM: Xid \([^)]{0,64}\): (\d+)")
_XID_KINDS = {**dict.fromkeys((48, 63, 64, 92, 94, 95), "gpu_ecc"), **dict.fromkeys((74, 137), "nvlink"),
              **dict.fromkeys(range(144, 151), "nvlink"), 79: "gpu_lost"}
"""Xid numbers by what they are about (NVIDIA's Xid catalogue); any other Xid is ``gpu_xid``."""

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu_lost", re.compile(r"fallen off the bus")),
    ("gpu_ecc", re.compile(r"NVRM: .{0,200}(?:uncorrectable|double bit error|ECC error|Row Remapper)", re.I)),
    ("nvlink", re.compile(r"nvlink.{0,100}(?:fatal|error|fail)", re.I)),
    ("host_oom", re.compile(r"invoked oom-killer|Out of memory: Killed process|Memory cgroup out of memory"
                            r"|^oom-kill:|\boom-kill:constraint|oom_reaper: reaped process")),
    ("hung_task", re.compile(r"blocked for more than \d+ seconds|\btask:\S+ +state:D\b")),
    ("segfault", re.compile(r"\bsegfault at [0-9a-f]+ ip ")),
    ("pcie", re.compile(r"\bAER: |PCIe Bus Error")),
    ("hardware", re.compile(r"\[Hardware Error\]|\bEDAC \S+: \d+ (?:UE|CE) |Machine check events logged")),
)

_PID = re.compile(r"(?:Killed process |reaped process |\bpid[=:] ?|\w\[)(\d+)")


def classify_kernel_line(text: str) -> str | None:
    """What a kernel message is evidence of (``gpu_xid``, ``gpu_ecc``, ``nvlink``, ``gpu_lost``, ``host_oom``,
    ``hung_task``, ``segfault``, ``pcie``, ``hardware``), or None for an ordinary line."""
    m = _XID.search(text)
    if m is not None:
        return _XID_KINDS.get(int(m.group(1)), "gpu_xid")
    for kind, pattern in _RULES:
        if pattern.search(text):
            return kind
    return None


@dataclass(frozen=True, slots=True)
class KernelLine:
    ts_ns: int
    kind: str
    text: str
    pid: int | None = None
    """The process the line names (the one killed, the Xid's), where it names one."""


def _line(ts_ns: int, text: str) -> KernelLine | None:
    kind = classify_kernel_line(text)
    if kind is None:
        return None
    m = _PID.search(text)
    return KernelLine(ts_ns, kind, text[:1000], int(m.group(1)) if m else None)


def _kmsg(since_ns: int, until_ns: int, path: str) -> list[KernelLine]:
    """Flagged records of ``/dev/kmsg`` (``prio,seq,usec,flags;text``; one record a read) in the window."""
    boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    out: list[KernelLine] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                record = os.read(fd, 16384)
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # overwritten while reading: the next read gives the next record
            if not record:
                break
            head, _, body = record.partition(b";")
            fields = head.split(b",")
            if len(fields) < 3:
                continue
            ts = boot_ns + int(fields[2]) * 1000
            if not since_ns <= ts <= until_ns:
                continue
            line = _line(ts, body.split(b"\n", 1)[0].decode("utf-8", "replace"))
            if line is not None:
                out.append(line)
    finally:
        os.close(fd)
    return out


def _journal(since_ns: int, until_ns: int) -> list[KernelLine]:
    """The same from the journal (``journalctl -k -o short-unix``): where ``/dev/kmsg`` is not readable."""
    run = subprocess.run(["journalctl", "-k", "-q", "--no-pager", "-o", "short-unix", f"--since=@{since_ns // 10**9}",
                          f"--until=@{until_ns // 10**9 + 1}"], capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        raise OSError(run.stderr.strip()[:200] or f"journalctl exited {run.returncode}")
    out: list[KernelLine] = []
    for raw in run.stdout.splitlines():
        stamp, _, rest = raw.partition(" ")
        try:
            ts = int(float(stamp) * 1e9)
        except ValueError:
            continue
        line = _line(ts, rest.partition(": ")[2] or rest)
        if line is not None:
            out.append(line)
    return out


def read_kernel_log(since_ns: int, until_ns: int, *, path: str = "/dev/kmsg") -> list[KernelLine]:
    """This node's flagged kernel lines between the two moments. Raises OSError where none is readable."""
    try:
        return _kmsg(since_ns, until_ns, path)
    except OSError as kmsg_error:
        if shutil.which("journalctl") is None:
            raise
        try:
            return _journal(since_ns, until_ns)
        except (OSError, subprocess.SubprocessError) as journal_error:
            raise OSError(f"{path}: {kmsg_error.strerror or kmsg_error}; journalctl: {journal_error}") from None


def kernel_evidence(event_ns: int, pids: set[int], *, window_s: float = KERNEL_WINDOW_S, limit: int = 40,
                    path: str = "/dev/kmsg") -> dict[str, Any]:
    """The kernel's flagged lines from ``window_s`` before ``event_ns`` until now: those naming one of ``pids``
    first, then the latest others, at most ``limit``; or why the log could not be read."""
    since = event_ns - int(window_s * 1e9)
    until = time.time_ns()
    evidence: dict[str, Any] = {"window_s": window_s, "lines": []}
    try:
        lines = read_kernel_log(since, until, path=path)
    except OSError as exc:
        evidence["error"] = f"the kernel log is not readable here ({exc})"
        return evidence
    ours = [x for x in lines if x.pid in pids]
    others = [x for x in lines if x.pid not in pids]
    chosen = sorted(ours[-limit:] + others[-max(0, limit - len(ours)):], key=lambda x: x.ts_ns)
    evidence["lines"] = [{**asdict(x), "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(x.ts_ns / 1e9))}
                         for x in chosen]
    evidence["kinds"] = sorted({x.kind for x in chosen})
    evidence["about_ranks_pids"] = sorted({x.pid for x in ours if x.pid is not None})
    return evidence


_SCONTROL_FIELDS = ("JobId", "StepId", "JobState", "State", "ExitCode", "Reason", "DerivedExitCode", "NodeList")


def slurm_evidence(step: str) -> dict[str, Any]:
    """What SLURM says of ``step`` (``<job>.<step>``) and its job: ``{"id", "step", "job", "sacct"}`` (state,
    exit code, reason; ``sacct`` where accounting is on); a part that could not be read has ``error``."""
    job = step.split(".", 1)[0]
    evidence: dict[str, Any] = {"id": step}
    if shutil.which("scontrol") is None:
        evidence["error"] = "scontrol is not installed here"
        return evidence
    for what, args in (("step", ["show", "step", step]), ("job", ["show", "job", job])):
        try:
            run = subprocess.run(["scontrol", "-o", *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:
            evidence[what] = {"error": str(exc)[:200]}
            continue
        if run.returncode != 0 or not run.stdout.strip():
            evidence[what] = {"error": (run.stderr.strip() or "not known to slurmctld (ended)")[:200]}
            continue
        pairs = dict(re.findall(r"(\w+)=(\S*)", run.stdout))
        evidence[what] = {k: pairs[k] for k in _SCONTROL_FIELDS if k in pairs}
    if shutil.which("sacct") is not None:
        try:
            run = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,State,ExitCode"], capture_output=True,
                                 text=True, timeout=20)
            if run.returncode == 0 and run.stdout.strip():
                evidence["sacct"] = [dict(zip(("JobID", "State", "ExitCode"), row.split("|"), strict=False))
                                     for row in run.stdout.strip().splitlines()]
        except (OSError, subprocess.SubprocessError):
            pass
    return evidence


def native_stacks(pid: int) -> str:
    """A process's stacks as py-spy reads them from outside, native frames too (the NCCL or gloo call it is stuck
    in). From the watcher, not the rank: a frozen rank cannot run anything, and a process may not ptrace its
    parent where Yama's scope is 1."""
    try:
        out = subprocess.run(["py-spy", "dump", "--pid", str(pid), "--native"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {type(exc).__name__}"
    return (out.stdout or out.stderr).strip()[-6000:]


def add_outside_evidence(alert: Alert, state: LiveState, *, kernel_window_s: float = KERNEL_WINDOW_S) -> None:
    """For a hang, a silent or a dead rank: what its node says. Native stacks of a hung or silent rank here
    (where py-spy is installed), this node's kernel log around the event when a rank here is concerned, and
    SLURM's state of the ranks' steps. Evidence already gathered for the same alert is not gathered again."""
    if alert.kind not in ("hang", "silent", "rank_died"):
        return
    here = [state.ranks[r] for r in alert.ranks if r in state.ranks and state.cfg.is_local(state.ranks[r].node)]
    if alert.kind != "rank_died" and shutil.which("py-spy"):
        stacks = {r.rank: native_stacks(r.pid) for r in here if r.pid is not None}
        if stacks:
            alert.evidence["native_stacks"] = stacks
    if here:
        event = min(r.last_ts for r in here) or time.time_ns()
        alert.evidence["kernel"] = {"node": state.cfg.local_host,
                                    **kernel_evidence(event, {r.pid for r in here if r.pid is not None},
                                                      window_s=kernel_window_s)}
    steps = sorted({step for r in alert.ranks if r in state.ranks and (step := state.ranks[r].slurm)}
                   # a rank that died before its first heartbeat: its job's other ranks run in the same step(s)
                   or {step for r in state.ranks.values() if (step := r.slurm)})
    if steps:
        alert.evidence["slurm"] = [slurm_evidence(step) for step in steps]
