"""Failures read from the logs: OOMs, timeouts, NCCL and hardware errors, exits and exceptions.

A crashed or hung job says what happened in text: the CUDA allocator's OOM message, the
NCCL watchdog's timeout line, an ``NCCL WARN``, a torchelastic ``ChildFailedError``
summary, a traceback. :mod:`queries._signatures` reads each such line; this module finds
them in the job (one scan of the log events with one regular expression, then the few
matching lines in Python), groups them into findings and tells the cause from its
consequences:

* one finding per kind of failure (and per exception type), naming every rank and host
  that reported it, so "ranks 0–6 timed out in ALLREDUCE SeqNum 1532" is one line;
* the **root cause** is the failure most likely to start others (:data:`CAUSE_RANK`: an OOM
  or a hardware fault before an NCCL error, before an exception, before a timeout, before
  an exit code), the earliest in time among equals. The others are its consequences,
  reported with ``severity="warning"`` and ``details["consequence_of"]``;
* when ranks time out in a collective and a rank of the job is known that did not, that
  rank never arrived: a ``hang`` finding names it as the culprit (what torchrun's own
  "Root Cause", the first process to exit, gets wrong), with the timeouts as evidence;
  the watchdog's "last enqueued NCCL work" says the same where it is printed: a rank
  whose last enqueued work is before the timed-out one never issued it.

A rank is the one the message names (``[Rank 3]``), else its stream's when the log said it
(``rank_est`` false), else unknown: a finding then lists no rank and says ``rank ?``.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Final

from ._model import AnalysisContext, EventRef, Finding, as_json, rows
from ._signatures import CAUSE_RANK, FRAME, PREFILTER, Failure, classify
from ._text import count, fold, template
from ._text import ranks as ranks_text

__all__ = ["analyze_failures"]

_RANK_LOGGER: Final = re.compile(r"\[?rank(\d+)\]?")

_MAX_LINES: Final = 20_000
"""Failure lines read from one job at most (a log that repeats one error a million times says it once)."""


@dataclass
class _Seen:
    """One failure line of the job, read, with where it was written."""

    failure: Failure
    rank: int | None
    node: str | None
    ts: int
    step: int | None
    span_id: str | None
    msg: str
    stream_rank: int


def analyze_failures(ctx: AnalysisContext) -> list[Finding]:
    """Findings for every failure the logs report, the root cause first."""
    seen = _read(ctx)
    if not seen:
        return []
    every = seen
    typed = {s.stream_rank for s in seen if s.failure.kind != "python_exception" or "exception" in s.failure.facts}
    # a frame or an untyped traceback of a stream whose error line is there too (an exception, a timeout, a lost
    # peer) belongs to that error
    seen = [s for s in seen if not (s.failure.kind == "python_exception" and "exception" not in s.failure.facts
                                    and s.stream_rank in typed)]
    groups: dict[tuple[str, str], list[_Seen]] = defaultdict(list)
    for s in seen:
        sub = str(s.failure.facts.get("exception", "")) if s.failure.kind == "python_exception" else ""
        groups[(s.failure.kind, sub)].append(s)
    findings = [_finding(kind, items) for (kind, _), items in groups.items()]
    failed = {s.rank for s in seen if s.rank is not None and CAUSE_RANK.get(s.failure.kind, 9) <= CAUSE_RANK["host_oom"]}
    culprit = _never_arrived(ctx, groups)
    if culprit is not None and not set(culprit.ranks) & failed:  # a rank that crashed did not hang: its error says why
        findings.append(culprit)
    desync = _timeout_mismatch(groups.get(("collective_timeout", ""), []))
    if desync is None:
        desync = _site_mismatch(ctx, seen, every)
    if desync is not None:
        findings.append(desync)
    findings.sort(key=lambda f: (CAUSE_RANK.get(f.kind, 9) if f.kind != "hang" or not f.details.get("never_arrived")
                                 else -1, f.time_range[0] if f.time_range else 0))
    root = findings[0]
    root.details["root_cause"] = True
    for f in findings[1:]:
        f.severity = "warning"
        f.details["consequence_of"] = root.kind
        f.summary = f"{f.summary} (likely a consequence of the {root.kind.replace('_', ' ')})"
    for f in findings:
        for r in f.ranks:
            if r in ctx.by_rank:
                ctx.mark(r, "failed")
    return findings[: ctx.cfg.max_findings_per_kind * 2]


def _read(ctx: AnalysisContext) -> list[_Seen]:
    known = {r["rank"]: not r.get("rank_est") for r in ctx.ranks}
    nodes = {r["rank"]: r["node"] for r in ctx.ranks}
    lines = rows(
        ctx.con,
        """SELECT rank, coalesce(rank_est, false) AS rank_est, logger, node, ts, step, span_id, msg, attrs, contains(exc, 'Traceback (most recent call last)') AS tb,
                  logger = 'nccl' AND level = 'WARNING' AS nccl_warn,
                  CASE WHEN contains(CAST(attrs AS VARCHAR), '"exit_code"') THEN exc END AS summary_exc FROM events
           WHERE kind = 'log' AND msg IS NOT NULL AND NOT starts_with(coalesce(logger, ''), 'jobtrace')
             AND (regexp_matches(msg, $pattern) OR contains(exc, 'Traceback (most recent call last)')
                  OR (logger = 'nccl' AND level = 'WARNING'))
           ORDER BY ts, rank LIMIT $limit""",
        {"pattern": PREFILTER, "limit": _MAX_LINES},
    )
    out = []
    for row in lines:
        f = classify(row["msg"], as_json(row["attrs"]), bool(row["tb"]), bool(row["nccl_warn"]))
        if f is None:
            continue
        if f.rank is None:  # "2024-11-20 14:37:16 [rank3]: …": the head layouts read "[rank3]" as a logger
            m = _RANK_LOGGER.fullmatch(row["logger"] or "")
            f.rank = int(m.group(1)) if m else None
        rank = f.rank if f.rank is not None else (None if row["rank_est"] else row["rank"])
        node = f.host or (row["node"] if row["node"] not in (None, "", "unknown") else None)
        if f.rank is not None and f.host is None and rank != row["rank"]:
            node = nodes.get(rank) if known.get(rank) else None
        out.append(_Seen(f, rank, node, int(row["ts"]), row["step"], row["span_id"], row["msg"], row["rank"]))
        inner = _summary_cause(row["summary_exc"])
        if inner is not None:  # the exit's own traceback, in torchelastic's summary, says why it exited
            cause, line = inner
            out.append(_Seen(cause, rank, node, int(row["ts"]), row["step"], row["span_id"], line, row["rank"]))
    # where every worker of the job was one agent's, a local rank is the rank
    if any(s.rank is None and s.failure.local_rank is not None for s in out) and _one_node(ctx, out):
        for s in out:
            if s.rank is None and s.failure.local_rank is not None:
                s.rank = s.failure.local_rank
    if any(s.rank is None and s.node and "device" in s.failure.facts for s in out):
        by_device = _device_ranks(ctx)
        for s in out:
            if s.rank is None and s.node:
                s.rank = by_device.get((s.node, s.failure.facts.get("pid"), s.failure.facts.get("device")))
    return out


_WORLD: Final = re.compile(r"\b(data|pipeline|tensor) parallel size: (\d+)|\bworld[_ ]size[=: ]+(\d+)", re.I)
_SIGTERM: Final = re.compile(r"Sending process (\d+) closing signal")


def _one_node(ctx: AnalysisContext, seen: list[_Seen]) -> bool:
    """Whether one launcher agent ran every worker of the job: the world size the log states (Megatron's and
    ColossalAI's data x pipeline x tensor parallel sizes, a ``world_size``) equals the workers that agent
    stopped (torchelastic's "Sending process P closing signal") plus those whose exit it reported."""
    found = rows(ctx.con, """SELECT msg FROM events WHERE kind = 'log' AND msg IS NOT NULL
                             AND regexp_matches(msg, $pattern) LIMIT 10000""",
                 {"pattern": r"(?i)parallel size: \d|world[_ ]size|closing signal"})
    worlds: set[int] = set()
    sizes: dict[str, int] = {}  # the parallel sizes, often on two wrapped lines: data x pipeline x tensor
    pids = {int(s.failure.facts["pid"]) for s in seen if "pid" in s.failure.facts and s.failure.local_rank is not None}
    for row in found:
        for m in _WORLD.finditer(row["msg"]):
            if m.group(1):
                sizes.setdefault(m.group(1).lower(), int(m.group(2)))
            else:
                worlds.add(int(m.group(3)))
        pids.update(int(p) for p in _SIGTERM.findall(row["msg"]))
    if "data" in sizes:
        worlds.add(sizes["data"] * sizes.get("pipeline", 1) * sizes.get("tensor", 1))
    return len(worlds) == 1 and worlds == {len(pids)}


def _summary_cause(exc: str | None) -> tuple[Failure, str] | None:
    """The failure a torchelastic summary's ``traceback`` field reports (and its line), where it is one traceback.

    A child's exit is the consequence; its traceback (recorded with ``@record``) often says the cause, a
    desync or an NCCL error, which outranks the exit. A summary's root-cause entry holds the whole block
    (every failure's traceback): only a single traceback is read, so no rank is given another's error.
    """
    if not exc or exc.count("Traceback (most recent call last)") != 1:
        return None
    for line in reversed(exc.splitlines()):
        f = classify(line.strip())
        if f is not None and f.kind not in ("process_exit", "host_oom", "python_exception"):
            return f, line.strip()
    return None


_DEVICE_RANK: Final = re.compile(
    # NCCL's "comm 0x… rank 1 nranks 2 cudaDev 1 … Init COMPLETE" and "Destroyed comm 0x… rank 4" (the head
    # gives host, pid and, where the line does not, the GPU)
    r"\bcomm 0x[0-9a-fA-F]+ rank (?P<rank>\d+)(?: nranks \d+ cudaDev (?P<dev>\d+))?"
    # nccl-tests' device table: " Rank  1 Group  0 Pid 1896106 on noodle-4090-0 device  1 [0x34] …"
    r"|^\s*Rank +(?P<rank2>\d+) Group +\d+ Pid +(?P<pid>\d+) on (?P<host>\S+) device +(?P<dev2>\d+)")


def _device_ranks(ctx: AnalysisContext) -> dict[tuple[str, int | None, int | None], int]:
    """(host, pid, GPU) -> global rank, from the lines where NCCL or nccl-tests say which rank drives which GPU.

    An NCCL error's head names host, process and GPU, not the rank; a process driving several GPUs
    (nccl-tests ``-g 2``) has one rank per GPU.
    """
    found = rows(ctx.con, """SELECT msg, attrs FROM events WHERE kind = 'log' AND msg IS NOT NULL
                             AND regexp_matches(msg, $pattern) LIMIT 100000""",
                 {"pattern": r"comm 0x[0-9a-fA-F]+ rank \d+|Rank +\d+ Group +\d+ Pid"})
    out: dict[tuple[str, int | None, int | None], int] = {}
    for row in found:
        m = _DEVICE_RANK.search(row["msg"])
        if not m:
            continue
        if m.group("rank") is not None:
            a = as_json(row["attrs"])
            if a.get("nccl_host") is None:
                continue
            dev = m.group("dev") if m.group("dev") is not None else a.get("cuda_dev")
            if dev is None:
                continue
            key = (str(a["nccl_host"]), a.get("nccl_pid"), int(dev))
            out.setdefault(key, int(m.group("rank")))
        else:
            out.setdefault((m.group("host"), int(m.group("pid")), int(m.group("dev2"))), int(m.group("rank2")))
    return out


_TITLES: Final = {
    "cuda_oom": "CUDA out of memory", "hardware_fault": "hardware fault", "collective_mismatch": "collective mismatch",
    "hang": "hang", "collective_timeout": "collective timeout", "nccl_error": "NCCL error",
    "process_exit": "process exited with an error", "host_oom": "killed (SIGKILL; likely the host's OOM killer)",
    "python_exception": "Python exception", "peer_lost": "lost the connection to a peer (it likely crashed)",
}


def _finding(kind: str, items: list[_Seen]) -> Finding:
    ranks = sorted({s.rank for s in items if s.rank is not None})
    if kind == "collective_mismatch":
        ranks = _mismatch_culprits(items) or ranks
    also: list[int] = []
    hang_note = ""
    if kind == "hang":
        ranks, hang_note = _hang_culprits(items, ranks)
    if kind in ("process_exit", "host_oom"):
        # torchelastic's summary names its first observed failure the root cause; the other exits it lists
        # (often in the same second) are stated, but not as culprits
        root = sorted({s.rank for s in items if s.rank is not None and s.failure.facts.get("root_cause")})
        if root:
            ranks, also = root, [r for r in ranks if r not in root]
    nodes = sorted({s.node for s in items if s.node})
    unknown = any(s.rank is None for s in items)
    facts: dict[str, Any] = {}
    for s in items:
        for k, v in s.failure.facts.items():
            facts.setdefault(k, v)
    summary = _say_failure(_TITLES.get(kind, kind), ranks, unknown, nodes, _what(kind, facts), hang_note, also)
    steps = sorted({s.step for s in items if s.step is not None})
    # the same line from many ranks, once: "ranks 1-7: NCCL WARN …" (torchrun prints every rank's copy)
    evidence = fold([(s.rank, s.msg[:300]) for s in items])
    details: dict[str, Any] = {"facts": facts, "lines": len(items), "unknown_rank": unknown}
    if hang_note:
        details["reported_by"] = sorted({s.rank for s in items if s.rank is not None})
    if also:
        details["also_exited"] = also
    f = Finding(kind, "error", summary, ranks, nodes, steps[-1:], evidence, details)
    return f.cite([EventRef(s.stream_rank, s.ts, "log", s.step, s.span_id, kind) for s in items])


def _hang_culprits(items: list[_Seen], ranks: list[int]) -> tuple[list[int], str]:
    """Who a hang report blames: the ranks it names as stalled, else the one that enqueued least.

    Horovod's stall inspector lists the ranks that did not submit ("Stalled ranks: 4: […]"). Each
    ProcessGroupNCCL heartbeat monitor prints its outstanding works (``workMetaList_.size()``): a rank with
    fewer than the others stopped enqueuing collectives first. Where every rank reports the same number,
    all are equally stuck and the log names no culprit (an empty list: ``rank ?``).
    """
    stalled = sorted({int(s.failure.facts["stalled_rank"]) for s in items if "stalled_rank" in s.failure.facts})
    if stalled:
        return stalled, "named as stalled by the stall inspector"
    works = {s.rank: int(s.failure.facts["outstanding_works"]) for s in items
             if s.rank is not None and "outstanding_works" in s.failure.facts}
    if len(works) < 2:
        return ranks, ""
    fewest = min(works.values())
    if fewest == max(works.values()):
        return [], _say_all_wait(sorted(works), fewest)
    behind = sorted(r for r, n in works.items() if n == fewest)
    return behind, _say_behind(fewest, max(works.values()), len(behind))


@template
def _say_all_wait(ranks: list[int], works: int) -> str:
    verb = "waits" if len(set(ranks)) <= 1 else "all wait"
    return f"{ranks_text(ranks)} {verb} on {count(works, 'outstanding work')}: no rank is behind"


@template
def _say_behind(fewest: int, most: int, behind: int) -> str:
    return (f"{count(fewest, 'outstanding work')} against up to {most:,} on the others: "
            f"{'it' if behind == 1 else 'they'} stopped enqueuing first")


@template
def _say_failure(title: str, ranks: list[int], unknown: bool, nodes: list[str], what: str, note: str,
                 also: list[int]) -> str:
    who = ranks_text(ranks) if ranks else "rank ?"
    if ranks and unknown:
        who += " and rank ?"
    more = f" +{len(nodes) - 4} more" if len(nodes) > 4 else ""
    where = f" on {', '.join(nodes[:4])}{more}" if nodes else ""
    return (f"{title}: {who}{where}{what}" + (f" ({note})" if note else "")
            + (f" (first observed; {ranks_text(also)} exited too)" if also else ""))


def _what(kind: str, facts: dict[str, Any]) -> str:
    if kind == "collective_timeout":
        parts = [facts[k] if k == "op" else f"{k.replace('_', ' ')} {facts[k]}"
                 for k in ("op", "seq", "numel_in", "timeout_ms") if k in facts]
        return f" in {', '.join(str(p) for p in parts)}" if parts else ""
    if kind == "cuda_oom":
        sizes = [f"{k.removesuffix('_bytes')} {facts[k] / 2**30:.2f} GiB" for k in ("tried_bytes", "free_bytes",
                 "reserved_unallocated_bytes") if isinstance(facts.get(k), int)]
        gpu = f" (GPU {facts['gpu']})" if "gpu" in facts else ""
        return gpu + (": " + ", ".join(sizes) if sizes else "")
    if kind in ("process_exit", "host_oom"):
        code = facts.get("exitcode")
        return f": exit code {code}" + (f" ({facts['signal']})" if facts.get("signal") else "") if code is not None else ""
    if kind in ("python_exception", "nccl_error", "hardware_fault"):
        text = facts.get("exception") or facts.get("error") or facts.get("warn")
        msg = facts.get("message")
        return f": {text}" + (f": {str(msg)[:120]}" if msg else "") if text else ""
    return ""


def _mismatch_culprits(items: list[_Seen]) -> list[int]:
    """Ranks that a desync report puts outside their group: the one running something else, or behind."""
    odd: set[int] = set()
    pairs: list[set[int]] = []
    for s in items:
        f = s.failure.facts
        odd.update(int(r) for r in f.get("culprits", ()))
        if "rank_a" in f and "next" in f:
            odd.add(int(f["rank_a"]))
        if len(f.get("running", {})) == 2 and len(f.get("culprits", ())) == 2:
            pairs.append({int(r) for r in f["running"]})
    # ProcessGroupWrapper reports one pair a line ("Rank 0 is running …, but Rank 5 is running …"): the
    # rank that is in every pair reported is the odd one out
    common = set.intersection(*pairs) if len({frozenset(p) for p in pairs}) >= 2 else set()
    return sorted(common) if len(common) == 1 else sorted(odd)


def _timeout_mismatch(timeouts: list[_Seen]) -> Finding | None:
    """Ranks that timed out in *different* collectives: a sequence number, an op or a size not the others'.

    The watchdog prints each rank's own view of the work it waits in; where they disagree, the
    job's ranks called different collectives (a desync), and the odd ones out are its cause. The
    sequence number is compared first (a rank ahead or behind), then the op, then the size; a
    split with no majority names every side.
    """
    first: dict[int, _Seen] = {}
    for s in timeouts:
        if s.rank is not None and "seq" in s.failure.facts:
            first.setdefault(s.rank, s)
    if len(first) < 2:
        return None
    for key in ("seq", "op", "numel_in"):
        values = {r: s.failure.facts.get(key) for r, s in first.items()}
        if None in values.values() or len(set(values.values())) < 2:
            continue
        counts = Counter(values.values())
        top, n = counts.most_common(1)[0]
        odd = sorted(r for r, v in values.items() if v != top) if list(counts.values()).count(n) == 1 \
            else sorted(values)
        what = ", ".join(f"rank {r}: {_view(first[r].failure.facts)}" for r in sorted(first))
        f = Finding("collective_mismatch", "error", _say_timeout_mismatch(odd, key.replace("_", " "), what),
                    odd, sorted({host for r in odd if (host := first[r].node)}), [],
                    [first[r].msg[:300] for r in sorted(first)][:6], {"differs_in": key, "views": {
                        str(r): {k: first[r].failure.facts.get(k) for k in ("op", "seq", "numel_in")} for r in first}})
        return f.cite([EventRef(s.stream_rank, s.ts, "log", s.step, s.span_id, "collective_timeout")
                       for s in first.values()])
    return None


_LIBRARY: Final = re.compile(r"site-packages|dist-packages|^<frozen|/lib/python\d")


def _site_mismatch(ctx: AnalysisContext, seen: list[_Seen], every: list[_Seen]) -> Finding | None:
    """Ranks whose collective failed at another line of the training script than the others'.

    gloo prints the same timeout (or "Connection closed by peer") on every rank of a desynchronised
    job, whichever collective each called; their tracebacks still differ where the script called it
    (``loss.backward()`` on three ranks, ``all_gather`` on the fourth). The deepest frame outside the
    installed libraries is each rank's site; a minority site (fewer than half the ranks) among at least
    three ranks is the odd one out. A rank's traceback is its error's (``exc``), else its frame lines
    in ``every`` (a console whose nested prefixes kept the traceback from being joined).
    """
    failing = {s.rank for s in seen if s.rank is not None
               and s.failure.kind in ("collective_timeout", "peer_lost", "nccl_error")}
    if len(failing) < 3:
        return None
    found = rows(ctx.con, """SELECT rank, arg_min(exc, ts) AS exc FROM events
                             WHERE kind = 'log' AND contains(exc, 'Traceback (most recent call last)')
                               AND rank IN (SELECT unnest($ranks)) GROUP BY rank""", {"ranks": sorted(failing)})
    texts = {row["rank"]: row["exc"] or "" for row in found}
    frame_lines: dict[int, list[str]] = defaultdict(list)
    for s in every:
        if s.rank in failing and s.rank not in texts and "site" in s.failure.facts:
            frame_lines[s.rank].append(s.msg)
    texts |= {rank: "\n".join(lines) for rank, lines in frame_lines.items()}
    # the frames of the script, as a set: the lines of a console that share one millisecond do not keep
    # their order, so "the deepest frame" is read as "the frames that differ"
    sites: dict[int, frozenset[str]] = {}
    for rank, text in texts.items():
        frames = frozenset(f"{m.group('file').rsplit('/', 1)[-1]}:{m.group('line')} {m.group('func')}"
                           for m in FRAME.finditer(text) if not _LIBRARY.search(m.group("file")))
        if frames:
            sites[rank] = frames
    if len(sites) < 3:
        return None
    counts = Counter(sites.values())
    top, n = counts.most_common(1)[0]
    odd = sorted(r for r, site in sites.items() if site != top)
    if not odd or len(odd) * 2 >= len(sites) or list(counts.values()).count(n) > 1:
        return None
    where = "; ".join(f"rank {r} at {', '.join(sorted(sites[r] - top))}" for r in odd[:4])
    f = Finding("collective_mismatch", "error",
                _say_site_mismatch(odd, where, sorted(top - sites[odd[0]])), odd, [], [], [],
                {"differs_in": "call_site", "sites": {str(r): sorted(site) for r, site in sorted(sites.items())}})
    return f.cite([EventRef(s.stream_rank, s.ts, "log", s.step, s.span_id, s.failure.kind) for s in seen
                   if s.rank in sites][:20])


def _never_arrived(ctx: AnalysisContext, groups: dict[tuple[str, str], list[_Seen]]) -> Finding | None:
    """A rank the job knows that did not time out in the collective the others timed out in."""
    timeouts = groups.get(("collective_timeout", ""), [])
    timed_out = {s.rank for s in timeouts if s.rank is not None}
    if not timed_out:
        return None
    behind: set[int] = set()
    for s in timeouts:  # "detected by watchdog at work: N, last enqueued NCCL work: M"
        f = s.failure.facts
        if s.rank is not None and "last_enqueued" in f and f["last_enqueued"] < f.get("work", f["last_enqueued"]):
            behind.add(s.rank)
    known = {r["rank"] for r in ctx.ranks if not r.get("rank_est")}
    world = max((r["world"] or 0 for r in ctx.ranks), default=0)
    members = known | timed_out
    # a rank that lost its peers or raised is not silent: it arrived, and failed when the others went away
    reported = {s.rank for (kind, _), items in groups.items() if kind in ("peer_lost", "nccl_error", "python_exception")
                for s in items}
    missing = sorted(behind or (members - timed_out - reported))
    if not missing or (not behind and (len(missing) * 2 > len(members) or len(members) < 2)):
        return None
    first = min(timeouts, key=lambda s: s.ts)
    op = first.failure.facts.get("op")
    at = f" in {op}" + (f" SeqNum {first.failure.facts['seq']}" if "seq" in first.failure.facts else "") if op else ""
    last = {m: _last_line(ctx, m) for m in missing[:3]}
    doing = "; ".join(f"rank {m}'s last line: {txt[:160]}" for m, txt in last.items() if txt)
    nodes = sorted({r["node"] for r in ctx.ranks if r["rank"] in missing and r["node"] not in (None, "unknown")})
    summary = _say_never_arrived(missing, at, sorted(timed_out), doing)
    details = {"never_arrived": missing, "timed_out": sorted(timed_out), "world": world or None,
               "how": "last enqueued work before the timed-out one" if behind else "not among the ranks that timed out"}
    hang = Finding("hang", "error", summary, missing, nodes, [], [first.msg[:300]] + [t for t in last.values() if t],
                   details)
    return hang.cite([EventRef(s.stream_rank, s.ts, "log", s.step, s.span_id, "collective_timeout") for s in timeouts])


def _last_line(ctx: AnalysisContext, rank: int) -> str | None:
    out = rows(ctx.con, "SELECT msg FROM events WHERE rank = ? AND kind = 'log' AND msg IS NOT NULL "
                        "ORDER BY ts DESC LIMIT 1", [rank])
    return out[0]["msg"] if out else None


def _view(facts: dict[str, Any]) -> str:
    """``ALLREDUCE SeqNum 257 numel 1024``: what one rank's watchdog says it waited in, the parts it did say."""
    parts = [str(facts["op"])] if facts.get("op") is not None else []
    parts += [f"{label} {facts[key]}" for key, label in (("seq", "SeqNum"), ("numel_in", "numel"))
              if facts.get(key) is not None]
    return " ".join(parts) or "an unnamed collective"


@template
def _say_timeout_mismatch(odd: list[int], differs: str, views: str) -> str:
    return f"collective mismatch: {ranks_text(odd)} timed out in another collective ({differs} differs) than the others: {views}"


@template
def _say_site_mismatch(odd: list[int], where: str, others_at: list[str]) -> str:
    return (f"collective mismatch: {ranks_text(odd)} failed in a collective called from another line than the others' "
            f"({where}; the others at {', '.join(others_at) or 'an unknown line'})")


@template
def _say_never_arrived(missing: list[int], at: str, timed_out: list[int], doing: str) -> str:
    them = "it" if len(set(missing)) == 1 else "them"
    return (f"hang: {ranks_text(missing)} never arrived{at}; {ranks_text(timed_out)} timed out waiting for {them}"
            + (f" ({doing})" if doing else ""))
