"""DeepSpeed: progress, timers, throughput, loss scaling and launcher messages.

Formats (microsoft/DeepSpeed):

* ``deepspeed/utils/logging.py``: the logger's format ``[%(asctime)s] [%(levelname)s]
  [%(filename)s:%(lineno)d:%(funcName)s] %(message)s`` (parsed as the line head) and
  ``log_dist``'s ``[Rank {}] {message}``.
* ``deepspeed/runtime/engine.py::_report_progress``: ``step={step}, skipped={n}, lr={lr}, mom={mom}``.
* ``deepspeed/utils/timer.py::SynchronizedWallClockTimer.log``: ``time (ms) | {name}: {:.2f} | ...``
  with the engine's timers ``fwd``/``bwd``/``bwd_inner``/``bwd_allreduce``/``step`` (and
  their ``_microstep`` variants), and ``ThroughputTimer.stop``:
  ``epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={},
  MemAllocated={}GB, MaxMemAllocated={}GB``.
* ``deepspeed/runtime/fp16/loss_scaler.py`` and ``fused_optimizer.py``: ``[deepspeed] OVERFLOW!
  Rank {} Skipping step. Attempted loss scale: {}, reducing to {}``, ``... but hysteresis is {}.
  Reducing hysteresis to {}``, ``Overflow detected. Skipping step. Attempted loss scale: {},
  reducing to {}``, ``Reducing/Increasing dynamic loss scale from {} to {}``.
* ``deepspeed/launcher/launch.py``: ``process {pid} spawned with command: {cmd}`` and
  ``{cmd} exits with return code = {code}``.

Step spans come from consecutive ``step=`` lines of a stream (the time between them
divided by the steps between them); a global timer line adds the step's phases
(forward, backward, the gradient all-reduce as a collective, the optimizer step).
"""

from __future__ import annotations

import re
from typing import Any, Final

from .._types import Line, PartialEvent
from ._util import layout_spans, metric_value, number, step_span

__all__ = ["DeepSpeedParser"]

_RANK: Final = re.compile(r"\[Rank (-?\d+)\] ")
_PROGRESS: Final = re.compile(r"step=(\d+), skipped=(\d+), lr=\[?([^\],]*)[^,]*(?:\])?, mom=")
_TIMERS: Final = re.compile(r"time \(ms\)((?: \| [\w.-]+: [-\d.]+(?: \([^)]*\))?)+)")
_TIMER_ITEM: Final = re.compile(r"(?<![\w.-])([\w.-]+): ([-\d.]+)")  # a name from where it starts: linear
_THROUGHPUT: Final = re.compile(
    r"epoch=(\d+)/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=([^,]+), CurrSamplesPerSec=([^,]+)"
    r"(?:, MemAllocated=([\d.]+)GB, MaxMemAllocated=([\d.]+)GB)?")
_OVERFLOW: Final = re.compile(
    r"(?:OVERFLOW! Rank (-?\d+) Skipping step\.|overflow! Skipping step\.|Overflow detected\. Skipping step\.)"
    r"(?: Attempted loss scale: ([\d.e+-]+), (?:reducing to ([\d.e+-]+)|but hysteresis is (\d+)))?")
_SCALE: Final = re.compile(r"(Reducing|Increasing) dynamic loss scale from ([\d.e+-]+) to ([\d.e+-]+)")
_EXIT: Final = re.compile(r"exits with return code = (-?\d+)")
_SPAWN: Final = re.compile(r"process (\d+) spawned with command: (.*)")


class DeepSpeedParser:
    name = "deepspeed"
    sync_points = True  # its step ends are moments all ranks share (clock alignment)
    triggers = (r"step=\d+, skipped=", r"time \(ms\) \|", r"RunningAvgSamplesPerSec=", r"Skipping step",
                r"dynamic loss scale from", r"exits with return code = ", r"spawned with command: ")

    def sync_step(self, text: str) -> int | None:
        m = _PROGRESS.search(text)
        return int(m.group(1)) if m else None

    def parse(self, line: Line) -> list[PartialEvent] | None:
        text = line.text
        route: dict[str, Any] = {}
        rm = _RANK.match(text)
        if rm:
            text = text[rm.end():]
            if line.stream.rank_guessed and int(rm.group(1)) >= 0:
                route["route_rank"] = int(rm.group(1))
        state = line.stream.state(self.name + str(route.get("route_rank", "")))
        m = _PROGRESS.search(text)
        if m:
            return self._progress(line, state, int(m.group(1)), int(m.group(2)), m.group(3), route)
        t = _TIMERS.search(text)
        if t:
            return self._timers(line, state, t.group(1), route)
        m = _THROUGHPUT.search(text)
        if m:
            metrics: dict[str, float | str | None] = {
                "epoch": float(m.group(1)), "micro_step": float(m.group(2)),
                "avg_samples_per_s": metric_value(number(m.group(4))),
                "samples_per_s": metric_value(number(m.group(5)))}
            if m.group(6):
                metrics["mem_allocated_gb"] = number(m.group(6))  # [\d.]+ admits "1.2.3": None, not a raise
                metrics["max_mem_allocated_gb"] = number(m.group(7))
            return [{"kind": "metric", "step": int(m.group(3)), "metrics": {k: v for k, v in metrics.items() if v is not None}}
                    | route]
        m = _OVERFLOW.search(text)
        if m:
            metrics = {"overflow": 1.0}
            for key, group in (("attempted_loss_scale", 2), ("loss_scale", 3), ("hysteresis", 4)):
                value = number(m.group(group) or "")  # the pattern also admits "-" or "e": not a number
                if value is not None:
                    metrics[key] = metric_value(value)
            step = state.get("step")
            ev: dict[str, Any] = {"kind": "metric", "metrics": metrics} | route
            if step is not None:
                ev["step"] = step
            return [ev, {"kind": "log", "level": "WARNING", "logger": line.logger or "deepspeed", "msg": line.text} | route]
        m = _SCALE.search(text)
        if m and number(m.group(3)) is not None:
            ev = {"kind": "metric", "metrics": {"loss_scale": metric_value(number(m.group(3)))}} | route
            if state.get("step") is not None:
                ev["step"] = state["step"]
            return [ev]
        m = _EXIT.search(text)
        if m:
            return [{"kind": "log", "level": line.level or "ERROR", "logger": line.logger or "deepspeed.launcher",
                     "msg": line.text, "attrs": {"exit_code": int(m.group(1))}} | route]
        m = _SPAWN.match(text)
        if m:
            return [{"kind": "log", "level": line.level or "INFO", "logger": line.logger or "deepspeed.launcher",
                     "msg": line.text, "attrs": {"child_pid": int(m.group(1))}} | route]
        return None

    def _progress(self, line: Line, state: dict[str, Any], step: int, skipped: int, lr: str,
                  route: dict[str, Any]) -> list[PartialEvent]:
        metrics: dict[str, Any] = {"skipped_steps": float(skipped)}
        lr_v = number(lr.strip(" []"))
        if lr_v is not None:
            metrics["lr"] = metric_value(lr_v)
        events: list[PartialEvent] = [{"kind": "metric", "step": step, "metrics": metrics} | route]
        prev_step, prev_ts = state.get("step"), state.get("ts")
        if line.ts is not None and prev_ts is not None and prev_step is not None and step > prev_step:
            dur = (line.ts - prev_ts) // (step - prev_step)
            if dur > 0:
                span = step_span(step, line.ts, dur, source="deepspeed") | route
                span["sync"] = True
                state["span"] = span["span_id"]
                events.append(span)
        state["step"], state["ts"] = step, line.ts
        state["timed"] = False
        return events

    def _timers(self, line: Line, state: dict[str, Any], body: str, route: dict[str, Any]) -> list[PartialEvent]:
        values = {k: float(v) for k, v in _TIMER_ITEM.findall(body) if number(v) is not None}
        metrics = {f"timer_ms/{k}": metric_value(v) for k, v in values.items()}
        step = state.get("step")
        events: list[PartialEvent] = []
        if "fwd" in values or "bwd" in values or "step" in values:  # the global (per optimizer step) timers
            if step is None or state.get("timed"):
                step = (step if step is not None else state.get("timer_step", -1)) + 1
                state["timer_step"] = step
                own_span = None
            else:
                own_span = state.get("span")
            state["timed"] = True
            ms = 1e6
            allreduce = values.get("bwd_allreduce", 0.0)
            backward = values.get("bwd_inner", max(values.get("bwd", 0.0) - allreduce, 0.0))
            parts: list[tuple[str, str, int, dict[str, Any] | None]] = [
                ("forward", "phase", int(values.get("fwd", 0.0) * ms), None),
                ("backward", "phase", int(backward * ms), None),
                ("all_reduce", "collective", int(allreduce * ms),
                 {"op": "all_reduce", "group": "default", "seq": step, "source": "deepspeed-timers"}),
                ("optimizer", "phase", int(values.get("step", 0.0) * ms), None),
            ]
            if own_span is None:
                total = sum(p[2] for p in parts)
                if total > 0 and line.ts is not None:
                    span = step_span(step, line.ts, total, source="deepspeed-timers") | route
                    own_span = span["span_id"]
                    events.append(span)
            if line.ts is not None:
                events += [ev | route for ev in layout_spans(step, line.ts, parts, own_span)]
        ev: dict[str, Any] = {"kind": "metric", "metrics": metrics} | route
        if step is not None:
            ev["step"] = step
        return [ev] + events
