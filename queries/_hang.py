"""Hangs and desyncs: the wavefront, the rank that never joined, collectives that do not match.

Every collective record carries its process group and a per-group sequence number that
is the same on every rank for the same call; heartbeats, sent by a thread that keeps
running while the main thread is blocked, carry the collective the rank is inside
(``in_op``/``in_group``/``in_seq``). Flight Recorder dumps, when ingested, contribute the
same two things under their own group names. From these alone:

* a rank is **stalled** when it made no progress for ``stall_s`` before the job's last
  event, **silent** when it sent nothing at all (not even a heartbeat) for that long;
* per group, the **wavefront** is the collective (sequence number) most stalled ranks
  wait in; a member of the group that neither waits in it nor completed it **never
  joined**: it is the culprit, and its open span, last logs and the stack dump its
  heartbeat thread took say what it did instead (PyTorch Flight Recorder's "missing
  ranks", NVRx's wavefront);
* ranks in the same collective slot with another op, another payload size or another
  sequence number are a **collective mismatch** (Flight Recorder's type/size checks),
  whether the job hung on it or not.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from ._model import AnalysisContext, EventRef, Finding, as_json, rows
from ._text import count, num, rank_on, template
from ._text import ranks as ranks_text

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["analyze_hang", "last_logs", "stack_dump"]

# Ops whose payload must be the same size on every rank.
_SAME_SIZE = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                        "reduce_scatter", "reduce_scatter_tensor", "barrier"})


def analyze_hang(ctx: AnalysisContext) -> tuple[list[Finding], dict[str, Any]]:
    """Collective mismatches, stalled and silent ranks, and the wavefront; the wavefront info for the report."""
    con, ranks, by_rank = ctx.con, ctx.ranks, ctx.by_rank
    findings = _completed_mismatches(ctx)
    thr = ctx.cfg.stall_s * 1e9
    expected = _expected_to_progress(ranks, thr, ctx.clock)
    silent = {r["rank"] for r in ranks if r["rank"] in expected and ctx.now(r) - r["last_ts"] >= thr
              and not r["stopped"]}
    stuck = {r["rank"] for r in ranks if r["rank"] in expected
             and (r["last_progress"] is None or ctx.now(r) - r["last_progress"] >= thr)}
    if not silent and not stuck:
        return findings, {}
    info = {r["rank"]: r for r in ranks}
    pending = _pending(con, info, stuck - silent)
    waves = _wavefronts(con, pending)
    primary = max(waves, key=lambda w: (len(w["waiting"]), not w["group"].startswith("fr:")), default=None)
    wave_txt = _wave_text(primary) if primary else ""
    culprits: dict[int, str] = {}  # rank -> why
    for w in waves:
        for rank in w["missing"]:
            culprits.setdefault(rank, "missing")
    for rank in sorted(silent):
        culprits.setdefault(rank, "silent")
    waiting = {r for w in waves for r in w["waiting"]}
    mismatched = {r for w in waves for r in w["mismatched"]}
    for rank in sorted(stuck - waiting - mismatched):
        culprits.setdefault(rank, "stuck")
    for w in waves:
        if w["mismatched"]:
            findings.append(_mismatch_finding(ctx, w, hung=True))
    for rank in sorted(culprits):
        if rank in mismatched:
            continue
        findings.append(_culprit_finding(ctx, info[rank], culprits[rank], rank in silent, waves, primary, wave_txt))
    if not culprits and not mismatched and primary:
        for rank in primary["waiting"]:
            ctx.mark(rank, "waiting")
        f = Finding("hang", "error", _say_hang_inside(wave_txt), primary["waiting"], sorted({by_rank[r].node for r in primary["waiting"]}),
                    details={"wavefront": wave_txt, "wave": primary})
        findings.append(f.cite(_beat_refs(pending, primary["waiting"])))
    for rank in waiting:
        ctx.mark(rank, "waiting")
    return findings, {"waves": waves, "wavefront": wave_txt, "stalled": sorted(stuck), "silent": sorted(silent)}


def _expected_to_progress(ranks: list[dict[str, Any]], thr: float, clock: dict[str, int]) -> set[int]:
    """Ranks whose quiet means something: they send heartbeats, or they made steps while the others went on.

    A stream with neither (a launcher's lines, a comms table, a warning, random bytes) never
    promised progress, so its end says nothing; nor does the end of a rank's steps when no
    other rank stepped for ``thr`` after it (the job ended, or its log was cut there).
    """
    def ref(ts: int, r: dict[str, Any]) -> int:  # a rank's stamp on the reference node's clock
        return ts - clock.get(r["node"], 0)

    last_step_span = max((ref(r["last_span_ts"], r) for r in ranks if r["last_span_ts"]), default=0)
    return {r["rank"] for r in ranks if r["beat_ts"] is not None
            or (r["last_step"] is not None and r["last_span_ts"] is not None
                and last_step_span - ref(r["last_progress"] or r["last_ts"], r) >= thr)}


def _pending(con: DuckDBPyConnection, info: dict[int, dict[str, Any]],
             stuck: set[int]) -> dict[int, list[dict[str, Any]]]:
    """Per stuck rank, the collectives its latest heartbeats (one per source) say it is inside."""
    if not stuck:
        return {}
    ids = ",".join(str(int(r)) for r in stuck)
    beats = rows(
        con,
        f"""SELECT rank, attrs, ts FROM (
                SELECT rank, attrs, ts, row_number() OVER (PARTITION BY rank, json_extract_string(attrs, '$.source'),
                       json_extract_string(attrs, '$.in_group') ORDER BY ts DESC) AS rn
                FROM events WHERE kind = 'heartbeat' AND rank IN ({ids}))
            WHERE rn = 1""",
    )
    latest_own: dict[int, int] = {}
    for b in beats:
        if as_json(b["attrs"]).get("source") is None:
            latest_own[b["rank"]] = max(latest_own.get(b["rank"], 0), b["ts"])
    # A collective that ended in an error (a peer's socket closed as the job was torn down) was
    # never left: the rank waited in it to the end, whatever heartbeat came after.
    failed = {(c["rank"], c["grp"], c["seq"]) for c in rows(
        con, f"SELECT rank, grp, seq FROM colls WHERE error IS NOT NULL AND rank IN ({ids})")}
    pending: dict[int, list[dict[str, Any]]] = {}
    for b in beats:
        a = as_json(b["attrs"])
        r = info[b["rank"]]
        if not a.get("in_op") or (r["last_progress"] is not None and b["ts"] < r["last_progress"]):
            continue
        grp = str(a.get("in_group") or "default")
        if (a.get("source") is None and b["ts"] < latest_own.get(b["rank"], 0)
                and (b["rank"], grp, a.get("in_seq")) not in failed):
            continue  # an older heartbeat of ours: the rank has left that collective since
        pending.setdefault(b["rank"], []).append({
            "op": a["in_op"], "grp": grp, "seq": a.get("in_seq"),
            "bytes": a.get("in_bytes"), "ts": b["ts"], "age_ms": a.get("op_age_ms")})
    return pending


def _wavefronts(con: DuckDBPyConnection, pending_lists: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per group with a waiting rank: the slot most wait in, who waits, who never joined, who mismatches."""
    if not pending_lists:
        return []
    groups = sorted({p["grp"] for ps in pending_lists.values() for p in ps})
    done = rows(
        con,
        "SELECT grp, rank, max(seq) AS seq, max(gsize) AS gsize FROM colls WHERE grp IN (SELECT unnest(?)) GROUP BY grp, rank",
        [groups],
    )
    members: dict[str, dict[int, int]] = {g: {} for g in groups}
    size: dict[str, int] = {g: 0 for g in groups}
    for d in done:
        members[d["grp"]][d["rank"]] = d["seq"] or 0
        size[d["grp"]] = max(size[d["grp"]], d["gsize"] or 0)
    waves = []
    for g in groups:
        in_g = {r: p for r, ps in pending_lists.items() for p in ps if p["grp"] == g}
        for r in in_g:
            members[g].setdefault(r, 0)
        seqs = Counter(p["seq"] for p in in_g.values())
        seq = max(seqs, key=lambda s: (seqs[s], -(s or 0)))
        at = {r: p for r, p in in_g.items() if p["seq"] == seq}
        ops = Counter(p["op"] for p in at.values())
        op = max(ops, key=lambda o: (ops[o], o))
        sizes = Counter(p["bytes"] for p in at.values() if p["op"] == op and p["bytes"] is not None)
        nbytes = max(sizes, key=lambda b: sizes[b]) if sizes else None
        mismatched: dict[int, str] = {}
        for r, p in in_g.items():
            if p["seq"] != seq or p["op"] != op:
                mismatched[r] = f"{p['op']} #{p['seq']}"
            elif nbytes is not None and p["bytes"] is not None and p["bytes"] != nbytes and op in _SAME_SIZE:
                mismatched[r] = f"{p['op']} #{p['seq']} with {p['bytes']} bytes"
        waiting = sorted(r for r in at if r not in mismatched)
        joined = set(at) | {r for r, s in members[g].items() if s >= (seq or 0)}
        missing = sorted(set(members[g]) - joined - set(mismatched))
        waves.append({
            "group": g, "seq": seq, "op": op, "bytes": nbytes, "waiting": waiting, "missing": missing,
            "mismatched": {int(r): v for r, v in sorted(mismatched.items())},
            "group_size": size[g] or len(members[g]), "members_seen": len(members[g]),
            "waiting_since_ms": max((p["age_ms"] or 0 for p in at.values()), default=0),
        })
    return waves


def _wave_text(w: dict[str, Any]) -> str:
    return _say_wave(w["waiting"], w["op"], w["seq"], w["group"], w["missing"], w["group_size"] - w["members_seen"])


@template
def _say_wave(waiting: list[int], op: str, seq: int, group: str, missing: list[int], unseen: int) -> str:
    verb = "waits" if len(set(waiting)) <= 1 else "wait"
    txt = f"{ranks_text(waiting)} {verb} in {op} #{seq} (group {group})"
    if missing:
        txt += f"; never joined: {ranks_text(missing)}"
    if unseen > 0:
        txt += f"; {count(unseen, 'member')} of the group recorded nothing in it"
    return txt


@template
def _say_hang_inside(wavefront: str) -> str:
    return f"job hung: {wavefront}, and no rank is outside it (suspect the network or a rank that left the group)"


def _doing(r: dict[str, Any]) -> str:
    beat = as_json(r["beat"])
    return _say_doing(beat.get("in_op"), beat.get("in_seq"), beat.get("in_group"), beat.get("in_cat"),
                      beat.get("in_span"), (beat.get("span_age_ms") or 0) / 1000, r["last_span_cat"], r["last_span"])


def _span_name(cat: str | None, name: str) -> str:
    """``phase 'backward'``; a span named for its category (a step span called "step") as ``a step``."""
    cat = cat or "span"
    return f"a {cat}" if name == cat else f"{cat} '{name}'"


@template
def _say_doing(op: str | None, seq: int | None, group: str | None, cat: str | None, span: str | None, age_s: float,
               last_cat: str | None, last_span: str | None) -> str:
    if op:
        return f"waiting in {op}" + (f" #{seq}" if seq is not None else "") + (f" (group {group})" if group else "")
    if span:
        return f"in {_span_name(cat, span)} for {num(age_s, '.1f')}s"
    if last_span:
        return f"last finished {_span_name(last_cat, last_span)}"
    return "no span recorded"


def _culprit_finding(ctx: AnalysisContext, r: dict[str, Any], why: str, is_silent: bool, waves: list[dict[str, Any]],
                     primary: dict[str, Any] | None, wave_txt: str) -> Finding:
    con = ctx.con
    rank = r["rank"]
    ctx.mark(rank, "silent" if is_silent else "stalled")
    quiet_s = (ctx.now(r) - (r["last_progress"] or r["last_ts"])) / 1e9
    doing = _doing(r)
    missed = [w for w in waves if rank in w["missing"]]
    never = f"{missed[0]['op']} #{missed[0]['seq']} (group {missed[0]['group']})" if missed else None
    summary = _say_stalled(rank, r["node"], is_silent, quiet_s, r["last_step"], doing, never, wave_txt)
    logs = last_logs(con, rank)
    stack = stack_dump(con, rank)
    evidence = []
    if r["last_span"]:
        step = r["last_step"]
        if r["last_span"] == r["last_span_cat"] and step is not None:  # a step span named "step": "step 9"
            evidence.append(f"last span: {r['last_span']} {step}")
        else:
            evidence.append(f"last span: {_span_name(r['last_span_cat'], r['last_span'])}"
                            + (f" (step {step})" if step is not None else ""))
    evidence += [line for line, _ in logs]
    if stack and not any("main thread stack" in line for line, _ in logs):
        evidence.append(f"stack dump ({stack['msg']}):\n{stack['exc'].rstrip()}")
    details = {"doing": doing, "quiet_s": round(quiet_s, 3), "last_step": r["last_step"], "wavefront": wave_txt,
               "why": why, "last_span": r["last_span"], "never_joined": [
                   {"group": w["group"], "seq": w["seq"], "op": w["op"]} for w in missed],
               "stack": stack["exc"] if stack else None, "wave": primary}
    f = Finding("stalled_rank", "error", summary, [rank], [r["node"]],
                [r["last_step"]] if r["last_step"] is not None else [], evidence, details)
    refs: list[EventRef] = []
    if r["last_span_ts"] is not None:
        refs.append(EventRef(rank, int(r["last_span_ts"]), "span", r["last_step"], r["last_span_id"], r["last_span"]))
    refs += [ref for _, ref in logs]
    if stack:
        refs.append(EventRef(rank, int(stack["ts"]), "log", stack["step"], stack["span_id"], "stack dump"))
    if r["beat_ts"] is not None:
        refs.append(EventRef(rank, int(r["beat_ts"]), "heartbeat", r["last_step"]))
    return f.cite(refs)


def _beat_refs(pending: dict[int, list[dict[str, Any]]], ranks: list[int]) -> list[EventRef]:
    return [EventRef(r, int(p["ts"]), "heartbeat") for r in ranks for p in pending.get(r, [])[:1]]


def _mismatch_finding(ctx: AnalysisContext, w: dict[str, Any], hung: bool) -> Finding:
    by_rank = ctx.by_rank
    culprits = sorted(w["mismatched"])
    for r in culprits:
        ctx.mark(r, "mismatch")
    summary = _say_mismatch(w["group"], w["seq"], w["waiting"], w["op"], w["bytes"], w["mismatched"], hung)
    f = Finding("collective_mismatch", "error", summary, culprits, sorted({by_rank[r].node for r in culprits}), [],
                [], {"group": w["group"], "seq": w["seq"], "expected_op": w["op"], "expected_bytes": w["bytes"],
                     "mismatched": {str(k): v for k, v in w["mismatched"].items()}, "majority": w["waiting"],
                     "hung": hung, "wavefront": _wave_text(w)})
    stacks = [stack_dump(ctx.con, r) for r in culprits[:3]]
    for r, s in zip(culprits, stacks):
        if s:
            f.evidence.append(f"rank {r} stack dump ({s['msg']}):\n{s['exc'].rstrip()}")
            f.cite([EventRef(r, int(s["ts"]), "log", s["step"], s["span_id"], "stack dump")])
    return f


def _completed_mismatches(ctx: AnalysisContext) -> list[Finding]:
    """Collectives that completed (or failed) with different ops or sizes in one (group, seq) slot."""
    con, cfg = ctx.con, ctx.cfg
    same = ",".join(repr(o) for o in sorted(_SAME_SIZE))
    # Cheap first pass (min/max per slot), lists only for the few slots that disagree.
    bad = rows(
        con,
        f"""WITH b AS (SELECT grp, seq FROM colls WHERE seq IS NOT NULL GROUP BY grp, seq
                       HAVING min(op) <> max(op) OR (min(op) IN ({same}) AND min(bytes) <> max(bytes))
                       ORDER BY min(ts) LIMIT {int(cfg.max_findings_per_kind)})
            SELECT grp, seq, list(rank ORDER BY rank) AS ranks, list(op ORDER BY rank) AS ops,
                   list(bytes ORDER BY rank) AS sizes, list(span_id ORDER BY rank) AS span_ids,
                   list(ts ORDER BY rank) AS tss, min(step) AS step
            FROM colls JOIN b USING (grp, seq) GROUP BY grp, seq ORDER BY min(ts)""",
    )
    out = []
    for b in bad:
        pairs = list(zip(b["ranks"], b["ops"], b["sizes"]))
        common = Counter((op, size) for _, op, size in pairs).most_common(1)[0][0]
        major = sorted(r for r, op, size in pairs if (op, size) == common)
        odd = {r: f"{op} #{b['seq']}" + (f" with {size} bytes" if op == common[0] else "")
               for r, op, size in pairs if (op, size) != common}
        w = {"group": b["grp"], "seq": b["seq"], "op": common[0], "bytes": common[1], "waiting": major,
             "missing": [], "mismatched": odd, "group_size": len(pairs), "members_seen": len(pairs)}
        f = _mismatch_finding(ctx, w, hung=False)
        if b["step"] is not None:
            f.steps = [b["step"]]
        refs = [EventRef(r, int(t), "span", b["step"], s, op) for r, op, s, t in
                zip(b["ranks"], b["ops"], b["span_ids"], b["tss"]) if r in odd][:10]
        out.append(f.cite(refs))
    return out


def last_logs(con: DuckDBPyConnection, rank: int, n: int = 5) -> list[tuple[str, EventRef]]:
    out = rows(
        con,
        """SELECT ts, level, logger, msg, exc, step, span_id FROM events WHERE rank = ? AND kind = 'log'
           ORDER BY ts DESC LIMIT ?""",
        [rank, n],
    )
    lines = []
    for row in reversed(out):
        head = " ".join(str(x) for x in (row["level"], row["logger"]) if x)
        line = f"last log: {head}: {row['msg']}" if head else f"last log: {row['msg']}"
        if row["exc"] and str(row["logger"]).startswith("jobtrace"):
            line += "\n" + row["exc"].rstrip()
        lines.append((line, EventRef(rank, int(row["ts"]), "log", row["step"], row["span_id"], row["logger"])))
    return lines


def stack_dump(con: DuckDBPyConnection, rank: int) -> dict[str, Any] | None:
    """The latest main-thread stack the heartbeat thread recorded for this rank."""
    out = rows(
        con,
        """SELECT ts, msg, exc, step, span_id FROM events WHERE rank = ? AND kind = 'log' AND logger = 'jobtrace'
           AND exc IS NOT NULL AND msg LIKE 'no progress for%' ORDER BY ts DESC LIMIT 1""",
        [rank],
    )
    return out[0] if out else None



@template
def _say_stalled(rank: int, node: str, silent: bool, quiet_s: float, last_step: int | None, activity: str,
                 never_joined: str | None, wave: str) -> str:
    how = "silent (no heartbeat or event)" if silent else "stalled (alive, no progress)"
    at = f" at step {last_step}" if last_step is not None else ""
    never = f"; it never joined {never_joined}" if never_joined else ""
    return f"{rank_on(rank, node)} {how} for {num(quiet_s, '.0f')}s{at}: {activity}{never}" + (f"; {wave}" if wave else "")


@template
def _say_mismatch(group: str, seq: int, waiting: list[int], op: str, size: int | None, mismatched: dict[int, str],
                  hung: bool) -> str:
    what = "; ".join(f"rank {r} in {v}" for r, v in sorted(mismatched.items())) or "another rank does not"
    verb = "calls" if len(set(waiting)) <= 1 else "call"
    sized = f" ({count(size, 'byte')})" if size is not None else ""
    return (f"collective mismatch in group {group} at #{seq}: {ranks_text(waiting)} {verb} {op}{sized}, but {what}"
            + ("; the job hangs there" if hung else ""))
