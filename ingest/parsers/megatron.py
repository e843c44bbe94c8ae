"""Megatron-LM: iteration lines, timer tables and straggler-detector lines.

Formats (NVIDIA/Megatron-LM):

* ``megatron/training/training.py::training_log``: one line per log interval, printed by
  the last rank, fields joined by ``" | "``: ``iteration {:8d}/{:8d}``, ``consumed
  samples``, ``elapsed time per iteration (ms)``, ``throughput per GPU (TFLOP/s/GPU)``,
  ``learning rate``, ``global batch size``, one ``{key}: {:.6E}`` per loss (omitted when
  the average is NaN), ``loss scale``, ``grad norm``, ``num zeros``, ``params norm``,
  ``number of skipped iterations``, ``number of nan iterations``; since 2024 prefixed
  with ``[%Y-%m-%d %H:%M:%S]`` (later ``.%f``).
* ``megatron/core/timers.py::Timers.log``: ``(min, max) time across ranks (ms):`` /
  ``max time across ranks (ms):`` then ``"    {name padded with dots}: ({min:.2f}, {max:.2f})"``,
  or ``times across ranks (ms):`` then ``"  {name}:"`` and ``"     rank {:2d}: {:.2f}"``.
* ``megatron/core/utils.py::StragglerDetector.report``: ``[date] | MnRtt/Rnk: 3453.08ms/8 |
  MxRtt/Rnk: ... | MnEtpt/Rnk: 296.02TF/0 | MxEtpt/Rnk: ...`` and ``^^^^ Bottom N Ranks with
  lowest  Etpt(TF): v/r, ...``.

What they become: a step span per iteration line (its elapsed time, ending at the
line), a metric event with everything numeric, and, from an all-ranks timer table,
phase and collective spans for every rank, so compute and collective wait per rank
are visible although only one rank prints.
"""

from __future__ import annotations

import re
from typing import Any, Final

from .._types import FEED_MORE, FEED_REJECT, Line, PartialEvent
from ._util import collective_op, layout_spans, metric_value, new_span_id, number, step_span

__all__ = ["MegatronParser"]

_ITER: Final = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")
_KEYS: Final = {
    "consumed samples": "consumed_samples",
    "skipped samples": "skipped_samples",
    "elapsed time per iteration (ms)": "iter_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "energy per GPU (J/iter/GPU)": "energy_j_per_gpu",
    "power per GPU (W/GPU)": "power_w_per_gpu",
    "learning rate": "lr",
    "decoupled learning rate": "decoupled_lr",
    "global batch size": "global_batch_size",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "num zeros": "num_zeros",
    "params norm": "params_norm",
    "number of skipped iterations": "skipped_iters",
    "number of nan iterations": "nan_iters",
}
_STRAGGLER: Final = re.compile(r"(Mn|Mx)(\w+?)/Rnk: ([-\d.]+)([A-Za-z%]*)/(-?\d+)")
_TOPBOTTOM: Final = re.compile(r"\^\^\^\^ (Bottom|Top) +\d+ Ranks with (?:lowest|highest) +Etpt\(TF\):(.*)")
_TIMER_HEAD: Final = re.compile(r"(\(min, max\) time|max time|times) across ranks \(ms\):\s*$")
_MINMAX: Final = re.compile(r" {4}(\S.*?) \.*: \(([^,]+), ([^)]+)\)\s*$")
_MAX: Final = re.compile(r" {4}(\S.*?) \.*: (\S+)\s*$")
_ALL_NAME: Final = re.compile(r"  (\S[^:]*):\s*$")
_ALL_RANK: Final = re.compile(r" {5}rank +(\d+): (\S+)\s*$")
_STRAGGLER_NAMES: Final = {"Rtt": "rtt_ms", "Pwr": "power_w", "Tmp": "temp_c", "Utl": "util_pct", "Clk": "clock_mhz",
                           "DRtt": "data_rtt_ms", "Etpt": "etpt_tflops"}

# Timer names of megatron/training/training.py::training_log (timing_log_level 1 and 2).
_DATA_TIMERS: Final = {"batch-generator"}
_COLLECTIVE_TIMERS: Final = {
    "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync", "params-all-gather",
    "forward-recv", "forward-send", "backward-recv", "backward-send", "forward-send-forward-recv",
    "forward-send-backward-recv", "backward-send-forward-recv", "backward-send-backward-recv",
    "forward-backward-send-forward-backward-recv",
}


def _metric_name(key: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", key.strip()).strip("_").lower() or "value"


class MegatronParser:
    name = "megatron"
    sync_points = True  # its step ends are moments all ranks share (clock alignment)
    triggers = (r"iteration\s+\d+/\s*\d+ \|", r"/Rnk: ", r"\^\^\^\^ (?:Bottom|Top) ", r"time[s]? across ranks \(ms\):")

    def sync_step(self, text: str) -> int | None:
        m = _ITER.search(text)
        return int(m.group(1)) if m else None

    def parse(self, line: Line) -> list[PartialEvent] | _TimerBlock | None:
        text = line.text
        m = _ITER.search(text)
        if m:
            return self._iteration(line, text, int(m.group(1)), int(m.group(2)), m.end())
        h = _TIMER_HEAD.search(text)
        if h:
            return _TimerBlock(self, line, h.group(1))
        if "/Rnk: " in text:
            return self._straggler(text)
        tb = _TOPBOTTOM.search(text)
        if tb:
            out: list[PartialEvent] = []
            for item in tb.group(2).split(","):
                value, _, rank = item.strip().partition("/")
                v, r = number(value), number(rank)
                if v is not None and r is not None and r >= 0:
                    out.append({"kind": "metric", "route_rank": int(r), "metrics": {"etpt_tflops": metric_value(v)}})
            return out or None
        return None

    def _iteration(self, line: Line, text: str, it: int, total: int, at: int) -> list[PartialEvent]:
        metrics: dict[str, Any] = {"train_iters": float(total)}
        losses: list[tuple[str, Any]] = []
        # ``key: value`` fields between "|" (a field without ":" is not one); split, not a regex: this
        # runs for every iteration line, the most frequent line of a Megatron log.
        for field in text[at:].split("|"):
            key, colon, raw = field.partition(":")
            key = key.strip()
            if not colon or not key:
                continue
            value = number(raw)
            if value is None:
                continue
            name = _KEYS.get(key)
            if name is None:
                name = _metric_name(key)
                if "loss" in key and "scale" not in key:
                    losses.append((name, metric_value(value)))
            metrics[name] = metric_value(value)
        if losses:
            metrics.setdefault("loss", losses[0][1])
        elif metrics.get("nan_iters", 0) not in (0, 0.0):
            # training_log drops a loss whose average is NaN and counts a NaN iteration instead.
            metrics["loss"] = "NaN"
        iter_ms = metrics.get("iter_ms")
        batch = metrics.get("global_batch_size")
        if isinstance(iter_ms, float) and iter_ms > 0 and isinstance(batch, float):
            metrics["samples_per_s"] = round(batch / (iter_ms / 1000.0), 3)
        state = line.stream.state(self.name)
        state["iteration"] = it
        state["iter_ms"] = iter_ms
        events: list[PartialEvent] = [{"kind": "metric", "step": it, "metrics": metrics}]
        if isinstance(iter_ms, float) and iter_ms > 0:
            span = step_span(it, 0, int(iter_ms * 1e6), source="megatron")
            del span["ts"], span["start"]
            span["sync"] = True
            state["step_span"] = span["span_id"]
            events.append(span)
        return events

    def _straggler(self, text: str) -> list[PartialEvent] | None:
        metrics: dict[str, Any] = {}
        for mm in _STRAGGLER.finditer(text):
            kind, what, value, _unit, rank = mm.groups()
            base = _STRAGGLER_NAMES.get(what, _metric_name(what))
            side = "min" if kind == "Mn" else "max"
            v = number(value)
            if v is None:
                continue
            metrics[f"straggler_{side}_{base}"] = metric_value(v)
            metrics[f"straggler_{side}_{base}_rank"] = float(int(rank))
        if not metrics:
            return None
        return [{"kind": "metric", "metrics": metrics}]

    def timer_events(self, line: Line, mode: str, rows: dict[str, Any], end_line: Line) -> list[PartialEvent]:
        state = line.stream.state(self.name)
        step = state.get("iteration")
        if mode != "times":
            metrics = {}
            for name, value in rows.items():
                lo, hi = value if isinstance(value, tuple) else (None, value)
                if lo is not None:
                    metrics[f"timer_min_ms/{name}"] = metric_value(lo)
                metrics[f"timer_max_ms/{name}"] = metric_value(hi)
            return [{"kind": "metric", "step": step, "metrics": metrics}] if metrics else []
        # An all-ranks table: per rank, the phases and collectives of the last iteration.
        if step is None:
            return []
        iter_ms = state.get("iter_ms")
        per_rank: dict[int, list[tuple[str, str, int, dict[str, Any] | None]]] = {}
        names = set(rows)
        split_compute = bool({"forward-compute", "backward-compute"} & names)
        for name, ranks in rows.items():
            for rank, ms in ranks.items():
                dur = int(ms * 1e6)
                part: tuple[str, str, int, dict[str, Any] | None]
                if name in _DATA_TIMERS:
                    part = ("data", "phase", dur, None)
                elif name in _COLLECTIVE_TIMERS:
                    op = collective_op(name)
                    part = (name, "collective", dur, {"op": op, "group": "default", "seq": step, "source": "megatron-timers"})
                elif name == "forward-backward":
                    if split_compute:
                        continue
                    part = ("forward-backward", "phase", dur, None)
                elif name == "forward-compute":
                    part = ("forward", "phase", dur, None)
                elif name == "backward-compute":
                    part = ("backward", "phase", dur, None)
                elif name == "optimizer":
                    part = ("optimizer", "phase", dur, None)
                else:
                    continue  # sub-timers (optimizer-*) are inside the ones above
                per_rank.setdefault(rank, []).append(part)
        out: list[PartialEvent] = []
        order = {"data": 0, "forward": 1, "forward-backward": 1, "backward": 2, "optimizer": 4}
        for rank, parts in sorted(per_rank.items()):
            parts.sort(key=lambda p: order.get(p[0], 3))
            total = sum(p[2] for p in parts)
            step_ns = int(iter_ms * 1e6) if isinstance(iter_ms, float) and iter_ms > 0 else total
            own = rank == line.stream.rank and not line.stream.rank_guessed
            parent = state.get("step_span") if own else new_span_id()
            for ev in layout_spans(step, 0, parts, parent):
                ev["route_rank"] = rank
                ev["dt"] = ev["ts"]
                del ev["ts"]
                ev["start_dt"] = ev.pop("start")
                out.append(ev)
            if not own:
                span = step_span(step, 0, max(step_ns, total), parent, source="megatron-timers")
                del span["ts"], span["start"]
                span["route_rank"] = rank
                out.append(span)
        return out


class _TimerBlock:
    """The rows under a Megatron timer header, until the first line that is not a row."""

    def __init__(self, parser: MegatronParser, line: Line, head: str) -> None:
        self.parser = parser
        self.line = line
        self.last = line
        self.mode = "times" if head == "times" else ("max" if head == "max time" else "minmax")
        self.rows: dict[str, Any] = {}
        self.current: str | None = None

    def feed(self, text: str, line: Line) -> int:
        if self.mode == "minmax":
            m = _MINMAX.match(text)
            if m:
                lo, hi = number(m.group(2)), number(m.group(3))
                if lo is not None and hi is not None:
                    self.rows[m.group(1)] = (lo, hi)
                    self.last = line
                    return FEED_MORE
            return FEED_REJECT
        if self.mode == "max":
            m = _MAX.match(text)
            if m and number(m.group(2)) is not None:
                self.rows[m.group(1)] = number(m.group(2))
                self.last = line
                return FEED_MORE
            return FEED_REJECT
        r = _ALL_RANK.match(text)
        if r and self.current is not None:
            v = number(r.group(2))
            if v is not None:
                self.rows.setdefault(self.current, {})[int(r.group(1))] = v
                self.last = line
                return FEED_MORE
        n = _ALL_NAME.match(text)
        if n:
            self.current = n.group(1)
            self.last = line
            return FEED_MORE
        return FEED_REJECT

    def finish(self) -> list[PartialEvent]:
        events = self.parser.timer_events(self.line, self.mode, self.rows, self.last)
        head = self.line.raw
        return [{"kind": "log", "level": self.line.level or "INFO", "logger": self.line.logger or "megatron.core.timers",
                 "msg": head + "".join(f"\n    {k}: {v}" for k, v in self.rows.items())}] + events
