"""Verdicts on a running job, from the events as they arrive: ``jobtrace watch``.

``trace-job`` reads a finished job whole; a hung job is killed by NCCL's watchdog 10 to 30 minutes
in, and by then the hung ranks' state is gone. The watcher keeps, per rank, only what its rules need
(the latest heartbeat, the last collective it completed per group, its recent steps, losses and
logs), fed by a source that returns new events (:class:`queries._tail.LocalTail` for the embedded
store), and evaluates the rules after every batch:

* **hang**: ranks of a group have waited in the same collective (group, seq) for ``hang_after``
  seconds by their heartbeats, while a member of the group neither waits in it nor completed it:
  that rank is the culprit, with what it is doing (its open span, last logs, the stacks its
  heartbeat thread recorded). Every member waiting, none missing: the network or a rank that left.
* **silent**: a rank that sent nothing, not even a heartbeat, for ``silent_after`` seconds (its
  process frozen, or its main thread holding the GIL: heartbeats stop with it); **rank_died**
  when its process is gone (this host's ranks) or it reported an uncaught exception or a signal.
* **straggler**: over the last ``window`` steps, a rank whose compute (step time less collective
  wait) is ``slow_factor`` times the median rank's, for 15 s on end (a busy machine deschedules a
  healthy rank for a few steps now and then: measured by ``benchmarks/bench_live.py``).
* **nan_loss**, **loss_spike** (``spike_factor`` times the median of the last ``window`` losses)
  and **grad_explosion** (the same for the grad norm), per rank.

Nodes' clocks differ: the offset of each node from the lowest rank's is estimated as the events arrive,
from the moments ranks leave the same collective (as ``trace-job`` does), and every "how long ago" of a
rank (its silence, its heartbeat's age, its wait) is measured on that reference clock, so a node whose
clock is behind is not taken for silent, nor one ahead for busy.

Each alert fires once, when its condition first holds, with its evidence, and resolves when the
condition clears (a hang that ends, a rank that speaks again); its key says which condition it is,
so a flapping condition is one alert that fires and resolves, not a stream.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ._clocks import APPLY_NS, offsets_from_ends
from ._model import span_list

_CLOCK_INSTANCES = 512  # collectives kept for the clock estimate (the newest: a drifting clock is followed)

__all__ = ["Alert", "LiveConfig", "LiveState"]


@dataclass(frozen=True)
class LiveConfig:
    hang_after_s: float = 8.0
    """A wait in one collective this long, with a member of the group outside it, is a hang."""
    silent_after_s: float = 12.0
    """Nothing from a rank (heartbeats included) this long: it is silent."""
    window: int = 10
    """Steps (and losses) the straggler and spike rules look back over."""
    slow_factor: float = 2.0
    min_slow_ms: float = 5.0
    """A straggler's compute must also be this much above the median's: milliseconds of noise are not one."""
    spike_factor: float = 10.0
    hold_s: dict[str, float] = field(default_factory=lambda: {"straggler": 15.0})
    """Seconds a condition of these kinds must hold before it fires (a pending alert), like a rule's ``for``."""
    nan_grace_s: float = 3.0
    """Seconds a NaN grad norm waits for the NaN loss that caused it (another rank's line may be on its way)."""
    local_host: str | None = None
    """This machine's name: a silent rank here whose process is gone has died (elsewhere it is only silent)."""

    def is_local(self, node: str) -> bool:
        """Whether ``node`` is this machine: the same name, or the same short name (SLURM names nodes ``gpu-12``
        where the host calls itself ``gpu-12.cluster.local``)."""
        if not self.local_host or not node:
            return False
        return node == self.local_host or node.split(".", 1)[0] == self.local_host.split(".", 1)[0]


@dataclass
class Alert:
    """One condition of the job, from when it began to when it cleared."""

    key: str
    kind: str
    severity: str
    summary: str
    ranks: list[int]
    evidence: dict[str, Any] = field(default_factory=dict)
    started_ns: int = 0
    resolved_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "severity": self.severity, "summary": self.summary,
                "ranks": self.ranks, "evidence": self.evidence, "started_ns": self.started_ns,
                "resolved_ns": self.resolved_ns}


@dataclass
class _Rank:
    rank: int
    node: str = ""
    pid: int | None = None
    world: int | None = None
    last_ts: int = 0
    last_progress: int = 0
    arrived: int = 0  # when its newest events reached the watcher (the watcher's clock)
    beat: dict[str, Any] | None = None
    beat_ts: int = 0
    step: int | None = None
    stopped: bool = False
    failure: str | None = None
    terminated: int | None = None  # when it reported a SIGTERM/SIGINT (a launcher tearing the job down)
    done: dict[str, int] = field(default_factory=dict)  # group -> the highest seq completed
    sizes: dict[str, int] = field(default_factory=dict)  # group -> its size
    steps: dict[int, list[int]] = field(default_factory=dict)  # step -> [step ns, collective ns]
    losses: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    norms: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=3))
    scene: str | None = None  # the last stack dump its heartbeat thread recorded
    slurm: str | None = None  # its SLURM step (<job>.<step>), where SLURM started it
    nan_loss: tuple[int | None, str] | None = None  # the first non-finite loss: (step, what)
    nan_norm: tuple[int | None, str] | None = None  # the first non-finite grad norm
    spike: tuple[int | None, float, float] | None = None
    explosion: tuple[int | None, float, float] | None = None


class LiveState:
    """The ranks' state, fed with events (:meth:`feed`), judged at a moment (:meth:`evaluate`)."""

    def __init__(self, cfg: LiveConfig | None = None) -> None:
        self.cfg = cfg or LiveConfig()
        self.ranks: dict[int, _Rank] = {}
        self.active: dict[str, Alert] = {}
        self.fired = 0
        self.history: list[Alert] = []
        """Every alert that fired, in order (resolved ones too)."""
        self.updated: list[Alert] = []
        """The firing alerts whose ranks' scene (stacks, Flight Recorder) arrived at the last evaluation: a
        hang is named before the stall's scene is recorded (8 s against 10), so it comes as an update."""
        self.events = 0
        self.clocks: dict[str, Any] = {}
        """Per-node clock offsets from the reference node (the lowest rank's), estimated live from the moments
        ranks leave the same collective (:func:`._clocks.offsets_from_ends`): ``reference``, ``offsets_ms``,
        ``applied`` (2 ms and more: every "how long ago" of that node's ranks is measured on the reference clock)."""
        self._ends: dict[tuple[str, int], dict[str, list[int]]] = {}  # recent collectives: node -> end stamps
        self._offsets: dict[str, int] = {}  # node -> ns, the applied ones
        self._fed: set[int] = set()  # ranks with events since the last evaluation
        self._nan_seen: int | None = None  # when a non-finite grad norm was first seen
        self._pending: dict[str, int] = {}  # alerts that must hold a while (LiveConfig.hold_s): since when

    # ---- feeding ---------------------------------------------------------------------------------
    def feed(self, events: list[dict[str, Any]]) -> None:
        for e in sorted(events, key=lambda e: e.get("ts") or 0):
            rank = e.get("rank")
            if not isinstance(rank, int):
                continue
            self.events += 1
            r = self.ranks.get(rank)
            if r is None:
                r = self.ranks[rank] = _Rank(rank)
            self._fed.add(rank)
            ts = int(e["ts"])
            r.node = e.get("node") or r.node
            r.pid = e.get("pid") or r.pid
            r.world = e.get("world") or r.world
            r.last_ts = max(r.last_ts, ts)
            kind = e.get("kind")
            if kind == "heartbeat":
                if ts >= r.beat_ts:
                    r.beat, r.beat_ts = e.get("attrs") or {}, ts
                    r.slurm = r.beat.get("slurm_step") or r.slurm
                continue
            if e.get("step") is not None:
                r.step = e["step"]
            if kind == "span":
                self._span(r, e, ts)
            elif kind == "metric":
                self._metric(r, e)
            elif kind == "log":
                self._log(r, e, ts)

    def _span(self, r: _Rank, e: dict[str, Any], ts: int) -> None:
        attrs = e.get("attrs") or {}
        cat = e.get("cat")
        if cat == "collective":
            if attrs.get("error"):
                return  # a collective that failed (its peer gone) is no progress
            group, seq = str(attrs.get("group") or "default"), attrs.get("seq")
            if isinstance(seq, int):
                r.done[group] = max(r.done.get(group, 0), seq)
                if not attrs.get("async") and (attrs.get("group_size") or 2) > 1:
                    self._ends.setdefault((group, seq), {}).setdefault(r.node, []).append(ts)
                    if len(self._ends) > _CLOCK_INSTANCES:
                        del self._ends[next(iter(self._ends))]
            if attrs.get("group_size"):
                r.sizes[group] = int(attrs["group_size"])
            step = e.get("step")
            if step is not None and not attrs.get("async"):
                r.steps.setdefault(step, [0, 0])[1] += int(e.get("dur") or 0)
        elif cat == "step" and e.get("step") is not None:
            r.steps.setdefault(e["step"], [0, 0])[0] = int(e.get("dur") or 0)
            if len(r.steps) > 4 * self.cfg.window:
                for old in sorted(r.steps)[: len(r.steps) - 2 * self.cfg.window]:
                    del r.steps[old]
        r.last_progress = max(r.last_progress, ts)

    def _metric(self, r: _Rank, e: dict[str, Any]) -> None:
        m = e.get("metrics") or {}
        step = e.get("step")
        for key, series, kind in (("loss", r.losses, "loss"), ("grad_norm", r.norms, "grad norm")):
            value = m.get(key)
            if value is None:
                continue
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            if not math.isfinite(value):
                if key == "loss" and r.nan_loss is None:
                    r.nan_loss = (step, f"{kind} {value}")
                elif key == "grad_norm" and r.nan_norm is None:
                    r.nan_norm = (step, f"{kind} {value}")
                continue
            if len(series) >= self.cfg.window:
                recent = statistics.median(list(series)[-self.cfg.window:])
                if recent > 0 and value > self.cfg.spike_factor * recent:
                    if key == "loss":
                        r.spike = (step, value, recent)
                    else:
                        r.explosion = (step, value, recent)
                elif recent > 0 and value < 2 * recent:
                    if key == "loss":
                        r.spike = None
                    else:
                        r.explosion = None
            series.append(value)
        r.last_progress = max(r.last_progress, int(e["ts"]))

    def _log(self, r: _Rank, e: dict[str, Any], ts: int) -> None:
        logger, msg = e.get("logger") or "", e.get("msg") or ""
        if logger == "jobtrace.lifecycle" and msg == "stop":
            r.stopped = True
            return
        if logger.startswith("jobtrace"):
            if msg.startswith("no progress for") and e.get("exc"):
                r.scene = str(e["exc"])
            elif msg.startswith("uncaught exception"):
                r.failure = msg + (f": {str(e['exc']).strip().splitlines()[-1]}" if e.get("exc") else "")
            elif msg.startswith("received SIG"):  # stopped from outside: a consequence, unless nothing else died
                r.terminated = ts
            return
        r.logs.append(" ".join(x for x in (e.get("level") or "", f"{logger}:" if logger else "", msg) if x)[:300])
        r.last_progress = max(r.last_progress, ts)

    # ---- judging ---------------------------------------------------------------------------------
    def evaluate(self, now_ns: int) -> tuple[list[Alert], list[Alert]]:
        """The alerts that began and those that cleared since the last call, at ``now_ns``."""
        self._estimate_clocks()
        for rank in self._fed:
            self.ranks[rank].arrived = now_ns
        self._fed.clear()
        current: dict[str, Alert] = {}
        for alert in self._hangs(now_ns) + self._silences(now_ns) + self._stragglers() + self._health(now_ns):
            current.setdefault(alert.key, alert)
        # A condition that must hold a while before it fires (a straggler: a busy machine deschedules a rank for
        # a few steps now and then); until then it is pending, and one evaluation without it starts it over.
        for key in [k for k in self._pending if k not in current]:
            del self._pending[key]
        for key, alert in list(current.items()):
            hold = self.cfg.hold_s.get(alert.kind, 0.0)
            if hold and key not in self.active:
                since = self._pending.setdefault(key, now_ns)
                if now_ns - since < hold * 1e9:
                    del current[key]
        fired = [a for k, a in current.items() if k not in self.active]
        cleared = [a for k, a in self.active.items() if k not in current]
        for a in fired:
            a.started_ns = now_ns
            self.active[a.key] = a
        for a in cleared:
            a.resolved_ns = now_ns
            del self.active[a.key]
        self.updated = []
        for k, a in current.items():  # still firing: keep the first summary, refresh the evidence
            if k in self.active and self.active[k] is not a:
                old = self.active[k]
                if _scenes(a.evidence) != _scenes(old.evidence):
                    self.updated.append(old)
                old.evidence = {**old.evidence, **a.evidence}  # what the watcher added from outside stays
        self.fired += len(fired)
        self.history += fired
        return fired, cleared

    def _estimate_clocks(self) -> None:
        if not self.ranks or len({r.node for r in self.ranks.values()}) < 2:
            return
        reference = self.ranks[min(self.ranks)].node
        found = offsets_from_ends(self._ends.values(), reference)
        self._offsets = {n: o["offset_ns"] for n, o in found.items() if abs(o["offset_ns"]) >= APPLY_NS}
        self.clocks = {"reference": reference,
                       "offsets_ms": {n: round(o["offset_ns"] / 1e6, 3) for n, o in sorted(found.items())},
                       "points": {n: o["points"] for n, o in sorted(found.items())}, "applied": sorted(self._offsets)}

    def _ref(self, r: _Rank, ts: int) -> int:
        """A stamp of ``r``'s on the reference node's clock (the watcher's "now" is compared with these)."""
        return ts - self._offsets.get(r.node, 0)

    def finished(self, now_ns: int) -> bool:
        """Every rank of the job has stopped, failed, or gone silent with its process gone."""
        if not self.ranks:
            return False
        world = max((r.world or 0) for r in self.ranks.values()) or len(self.ranks)
        after = self.cfg.silent_after_s * 1e9
        ended = sum(1 for r in self.ranks.values() if r.stopped or r.failure is not None or r.terminated is not None
                    or (now_ns - self._ref(r, r.last_ts) >= after and self._process_gone(r)))
        return len(self.ranks) >= world and ended >= world

    def _members(self, group: str) -> set[int]:
        if group == "default":
            world = max((r.world or 0) for r in self.ranks.values())
            if world:
                return set(range(world))
        return {r.rank for r in self.ranks.values() if group in r.done or group in r.sizes
                or (r.beat or {}).get("in_group") == group}

    def _hangs(self, now: int) -> list[Alert]:
        after = self.cfg.hang_after_s * 1e9
        waiting: dict[str, dict[int, dict[str, Any]]] = {}  # every rank in a collective now, however long
        for r in self.ranks.values():
            b = r.beat
            if not b or not b.get("in_op") or r.stopped or r.beat_ts < r.last_progress:
                continue
            age = (b.get("op_age_ms") or 0) * 1_000_000 + (now - self._ref(r, r.beat_ts))
            waiting.setdefault(str(b.get("in_group") or "default"), {})[r.rank] = {**b, "age_ns": age}
        out = []
        for group, ranks in waiting.items():
            long = {k: w for k, w in ranks.items() if w["age_ns"] >= after}
            if not long:
                continue
            seq = Counter(w.get("in_seq") for w in long.values()).most_common(1)[0][0]
            at = {k: w for k, w in ranks.items() if w.get("in_seq") == seq}  # the late-comers to it as well
            op = Counter(w.get("in_op") for w in at.values()).most_common(1)[0][0]
            members = self._members(group) | set(at)
            missing = sorted(m for m in members - set(at)
                             if m not in self.ranks or self.ranks[m].done.get(group, 0) < (seq or 0))
            wait_s = max(w["age_ns"] for w in at.values()) / 1e9
            where = f"{op} #{seq} (group {group})"
            if missing:
                from ._flight_recorder import flight_recorder_summary

                doing = {m: self._doing(m, now) for m in missing}
                # the waiting ranks' own Flight Recorder dumps show the collective in flight, seq for seq
                recorded = {k: fr for k in sorted(at) if k in self.ranks
                            and (fr := flight_recorder_summary(self.ranks[k].scene)) is not None}
                text = "; ".join(f"rank {m}: {d['summary']}" for m, d in doing.items())
                out.append(Alert(f"hang:{group}:{seq}", "hang", "critical",
                                 f"hang: ranks {span_list(sorted(at))} have waited {wait_s:.0f}s in {where}; "
                                 f"never joined: rank {span_list(missing)} ({text})",
                                 missing, {"group": group, "seq": seq, "op": op, "waiting": sorted(at),
                                           "missing": missing, "doing": doing,
                                           **({"waiting_flight_recorder": recorded} if recorded else {}),
                                           **({"clocks": self.clocks} if self._offsets else {})}))
            elif len(at) >= len(members) > 1:
                out.append(Alert(f"hang:{group}:{seq}", "hang", "critical",
                                 f"hang: every rank of group {group} has waited {wait_s:.0f}s in {where}, none "
                                 "outside it (suspect the network or a rank that left the group)",
                                 sorted(at), {"group": group, "seq": seq, "op": op, "waiting": sorted(at)}))
        return out

    def _doing(self, rank: int, now: int) -> dict[str, Any]:
        r = self.ranks.get(rank)
        if r is None:
            return {"summary": "nothing heard from it"}
        b = r.beat or {}
        parts = []
        beat_age = now - self._ref(r, r.beat_ts)
        if b.get("in_span"):
            age = (b.get("span_age_ms") or 0) / 1e3 + beat_age / 1e9
            parts.append(f"in {b.get('in_cat') or 'span'} '{b['in_span']}' for {age:.0f}s")
        if b.get("last_op"):
            parts.append(f"last completed {b['last_op']} #{b.get('last_seq')} (group {b.get('last_group')})")
        if r.beat_ts and beat_age > 5e9:  # its heartbeat thread stopped too: frozen, or the GIL held
            parts.append(f"no heartbeat for {beat_age / 1e9:.0f}s")
        if r.step is not None:
            parts.append(f"at step {r.step}")
        from ._flight_recorder import flight_recorder_summary

        return {"summary": ", ".join(parts) or "no heartbeat yet", "last_logs": list(r.logs),
                "stacks": r.scene, "flight_recorder": flight_recorder_summary(r.scene),
                "heartbeat_age_s": round(beat_age / 1e9, 1) if r.beat_ts else None}

    def _silences(self, now: int) -> list[Alert]:
        out = []
        after = self.cfg.silent_after_s * 1e9
        torn = [self._ref(r, r.terminated) for r in self.ranks.values() if r.terminated is not None]
        teardown = min(torn) if torn else None
        for r in self.ranks.values():
            if r.stopped or r.terminated is not None:
                continue
            gone = self._process_gone(r)
            last = self._ref(r, r.last_ts)
            if r.failure is None and ((teardown is not None and (gone or teardown - last > 2e9))
                                      or (gone and now - last > 2e9)):
                # The launcher is stopping the job, and this rank had gone quiet before: it is why.
                why = ("its process is gone" if gone or teardown is None else
                       f"nothing from it for {(teardown - last) / 1e9:.0f}s before the launcher stopped the others")
                out.append(Alert(f"died:{r.rank}", "rank_died", "critical",
                                 f"rank {r.rank} on {r.node} died at step {r.step}: {why} (no exit record: killed, or "
                                 "crashed in native code)", [r.rank],
                                 {"last_logs": list(r.logs), "step": r.step, "stacks": r.scene}))
                continue
            if r.failure is not None:
                out.append(Alert(f"died:{r.rank}", "rank_died", "critical",
                                 f"rank {r.rank} on {r.node} died: {r.failure}", [r.rank],
                                 {"failure": r.failure, "last_logs": list(r.logs), "step": r.step}))
                continue
            # Silent by its stamps on the reference clock, and by the watcher's own: nothing has arrived either.
            # (Until a node's offset is known, a clock far behind makes a fresh rank look old by its stamps.)
            quiet = min(now - last, now - r.arrived) if r.arrived else now - last
            if quiet < after:
                continue
            kind = "rank_died" if gone else "silent"
            what = "its process is gone" if gone else "not even a heartbeat (frozen, or its main thread holds the GIL)"
            out.append(Alert(f"{'died' if gone else 'silent'}:{r.rank}", kind, "critical",
                             f"rank {r.rank} on {r.node} {'died' if gone else 'is silent'}: nothing for "
                             f"{quiet / 1e9:.0f}s at step {r.step}; {what}", [r.rank],
                             {"quiet_s": round(quiet / 1e9, 1), "last_logs": list(r.logs), "step": r.step,
                              "stacks": r.scene}))
        return out

    def _process_gone(self, r: _Rank) -> bool:
        if r.pid is None or not self.cfg.is_local(r.node):
            return False
        return not os.path.exists(f"/proc/{r.pid}")

    def _stragglers(self) -> list[Alert]:
        cfg = self.cfg
        compute: dict[int, float] = {}
        for r in self.ranks.values():
            recent = [s for _, s in sorted(r.steps.items()) if s[0] > 0][-cfg.window:]
            if len(recent) >= cfg.window // 2 and not r.stopped:
                compute[r.rank] = statistics.median(max(s[0] - s[1], 0) for s in recent)
        if len(compute) < 2:
            return []
        ref = statistics.median(compute.values())
        out = []
        for rank, c in compute.items():
            if ref > 0 and c >= cfg.slow_factor * ref and (c - ref) / 1e6 >= cfg.min_slow_ms:
                out.append(Alert(f"straggler:{rank}", "straggler", "warning",
                                 f"straggler: rank {rank} on {self.ranks[rank].node} computes {c / ref:.1f}x the "
                                 f"median rank over its last {cfg.window} steps ({c / 1e6:.1f} ms vs {ref / 1e6:.1f} ms "
                                 "per step); the others wait for it", [rank],
                                 {"compute_ms": round(c / 1e6, 3), "median_ms": round(ref / 1e6, 3)}))
        return out

    def _health(self, now: int) -> list[Alert]:
        out = []
        # One alert for the job: the gradient all-reduce spreads one rank's NaN to every rank's grad norm (the
        # same step) and loss (the next). The culprit is the first rank whose own loss went non-finite; only
        # where no loss did, the first grad norm.
        if any(r.nan_loss or r.nan_norm for r in self.ranks.values()):
            # Ranks write once a second each and may be steps apart: the rank whose loss began it may not have
            # shipped its line yet when the others' NaNs arrive. Wait a few seconds, then judge by step.
            self._nan_seen = self._nan_seen or now
        waited = self._nan_seen is not None and now - self._nan_seen >= self.cfg.nan_grace_s * 1e9
        for attr in ("nan_loss", "nan_norm"):
            nans = {r.rank: getattr(r, attr) for r in self.ranks.values() if getattr(r, attr) is not None}
            if not nans or not waited:
                continue
            steps = [s for s, _ in nans.values() if s is not None]
            first = min(steps) if steps else None
            culprits = sorted(k for k, (s, _) in nans.items() if s == first)
            every = {r.rank: min(x[0] for x in (r.nan_loss, r.nan_norm) if x is not None and x[0] is not None)
                     for r in self.ranks.values() if (r.nan_loss or r.nan_norm) and
                     any(x is not None and x[0] is not None for x in (r.nan_loss, r.nan_norm))}
            others = sorted(set(every) - set(culprits))
            out.append(Alert("nan", "nan_loss", "critical",
                             f"non-finite {nans[culprits[0]][1]} first on rank {span_list(culprits)} at step {first}"
                             + (f"; then NaN/Inf on ranks {span_list(others)}" if others else ""), culprits,
                             {"step": first, "first_nan_step": every}))
            break
        for r in self.ranks.values():
            if r.spike is not None:
                step, value, recent = r.spike
                out.append(Alert(f"loss_spike:{r.rank}", "loss_spike", "warning",
                                 f"rank {r.rank}: loss spiked to {value:.4g} at step {step} ({value / recent:.0f}x "
                                 f"the median of its last {self.cfg.window}: {recent:.4g})", [r.rank],
                                 {"step": step, "loss": value, "median": recent}))
            if r.explosion is not None:
                step, value, recent = r.explosion
                out.append(Alert(f"grad_explosion:{r.rank}", "grad_explosion", "warning",
                                 f"rank {r.rank}: grad norm {value:.4g} at step {step} ({value / recent:.0f}x the "
                                 f"median of its last {self.cfg.window}: {recent:.4g})", [r.rank],
                                 {"step": step, "grad_norm": value, "median": recent}))
        return out


def _scenes(evidence: dict[str, Any]) -> tuple[tuple[str, bool], ...]:
    """Which ranks of an alert's evidence have their stall scene: when it changes, the alert is worth showing again."""
    doing = evidence.get("doing") or {}
    return (tuple(sorted((str(rank), bool(d.get("stacks"))) for rank, d in doing.items() if isinstance(d, dict)))
            + tuple(sorted((f"fr{rank}", True) for rank in evidence.get("waiting_flight_recorder") or {})))
