"""Training loops that log with plain ``logging``/``print``: ``step 12 loss 0.41 lr 1e-4 time 52.1ms``.

A line counts as a step line when it names a step (``step``, ``iter``, ``iteration``,
``global_step``) with a number. Every ``key value`` / ``key=value`` / ``key: value``
pair after that is read: known metric names (loss, lr, grad_norm, loss_scale,
throughput…) become a metric event; durations (a unit ``ms``/``s``/``us``, or a key
ending in ``_ms``/``_s``/``_time``) of known phases become phase spans (``data``,
``forward``, ``backward``, ``optimizer``) or collective spans (``allreduce``,
``all_gather``, ``comm``, ``sync``…); the step's own duration (``time``,
``step_time``, ``elapsed``…) or, failing that, the time since the stream's previous
step line makes the step span.

A step line is logged after the step's synchronising all-reduce, so its timestamp is
a moment shared by all ranks: it is marked as a clock-alignment point.
"""

from __future__ import annotations

import re
from typing import Any, Final

from .._types import Line, PartialEvent
from ._util import collective_op, layout_spans, metric_value, step_span

__all__ = ["GenericStepParser", "step_line_events"]

# Linear on any line (issue 20): no two quantifiers here can match the same text, so a failed match
# gives back at most one run. A key starts only where a run of key characters starts (the look-behind;
# leading ``-./`` as in ``--lr`` are skipped, not part of it), and a number's digits are read one way.
_STEP: Final = re.compile(r"(?i)\b(global_step|step|iter|iteration)\b\s*(?:[=:#]\s*)?\[?(\d+)(?:\s*/\s*\d+)?")
_PAIR: Final = re.compile(
    r"(?<![\w./-])[-./]*(?P<key>[A-Za-z_][\w./-]*)(?:=|:?\s+)\[?"
    r"(?P<val>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf|Infinity)"
    r"\s?(?P<unit>ms|s|us|µs|sec|secs|seconds|msec)?(?![\w.])")
_METRICS: Final = {
    "loss": "loss", "train_loss": "loss", "lm_loss": "loss", "lr": "lr", "learning_rate": "lr",
    "grad_norm": "grad_norm", "gradnorm": "grad_norm", "grad-norm": "grad_norm", "loss_scale": "loss_scale",
    "scale": "loss_scale", "ppl": "ppl", "perplexity": "ppl", "acc": "accuracy", "accuracy": "accuracy",
    "tokens_per_s": "tokens_per_s", "tokens/s": "tokens_per_s", "tok/s": "tokens_per_s", "tps": "tokens_per_s",
    "samples_per_s": "samples_per_s", "samples/s": "samples_per_s", "throughput": "samples_per_s",
    "epoch": "epoch", "mfu": "mfu", "memory": "memory_gb", "mem": "memory_gb",
}
_PHASES: Final = {
    "data": "data", "dataloader": "data", "data_time": "data", "load": "data", "data_wait": "data",
    "forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward",
    "optimizer": "optimizer", "optim": "optimizer", "opt": "optimizer", "update": "optimizer",
    "checkpoint": "checkpoint", "eval": "eval",
}
_COLLECTIVES: Final = ("allreduce", "all_reduce", "all-reduce", "comm", "communication", "sync", "all_gather", "allgather",
                       "reduce_scatter", "barrier", "broadcast", "alltoall", "all_to_all", "grad_sync")
_STEP_TIME: Final = {"time", "step_time", "iter_time", "elapsed", "duration", "dt", "took", "step_dur", "total"}
_UNIT_NS: Final = {"ms": 1e6, "msec": 1e6, "s": 1e9, "sec": 1e9, "secs": 1e9, "seconds": 1e9, "us": 1e3, "µs": 1e3}


def _duration_key(key: str, unit: str | None) -> tuple[str, float] | None:
    """(base name, ns per unit) when ``key value[unit]`` is a duration."""
    k = key.lower()
    for suffix, scale in (("_ms", 1e6), ("_s", 1e9), ("_sec", 1e9), ("_us", 1e3), ("_time", 1e9)):
        if k.endswith(suffix):
            base = k[: -len(suffix)]
            return base, _UNIT_NS.get(unit or "", scale) if unit else scale
    if unit:
        return k, _UNIT_NS[unit]
    return None


_METRIC: Final = "metric"
_STEP_DUR: Final = "step"
_PHASE: Final = "phase"
_COLLECTIVE: Final = "collective"
_DURATION_METRIC: Final = "duration"
_ROLES: dict[tuple[str, str | None], tuple[str | None, str, float]] = {}
_ROLES_MAX: Final = 4096


def _role(key: str, unit: str | None) -> tuple[str | None, str, float]:
    """What ``key value[unit]`` of a step line is: ``(role, name, ns per unit)``; role ``None``: nothing.

    A log repeats the same few keys on every step line, so the answer is cached: this
    runs for every pair of every step line, the most frequent parsed line of a log.
    """
    hit = _ROLES.get((key, unit))
    if hit is not None:
        return hit
    res: tuple[str | None, str, float] = (None, "", 0.0)
    name = _METRICS.get(key.lower())
    if name is not None and not unit:
        res = (_METRIC, name, 0.0)
    else:
        dkey = _duration_key(key, unit)
        if dkey is not None:
            base, scale = dkey
            if base in _STEP_TIME or base in ("step", "iter", "iteration"):
                res = (_STEP_DUR, "", scale)
            elif base in _PHASES:
                res = (_PHASE, _PHASES[base], scale)
            elif any(c in base for c in _COLLECTIVES):
                res = (_COLLECTIVE, collective_op(base), scale)
            else:
                res = (_DURATION_METRIC, f"{base}_ms", scale)
    if len(_ROLES) >= _ROLES_MAX:
        _ROLES.clear()
    _ROLES[(key, unit)] = res
    return res


class GenericStepParser:
    name = "generic-step"
    sync_points = True  # its step ends are moments all ranks share (clock alignment)
    triggers = (r"(?i)\b(?:global_step|step|iter|iteration)\b\s*(?:[=:#]\s*)?\[?\d",)

    def sync_step(self, text: str) -> int | None:
        m = _STEP.search(text)
        return int(m.group(2)) if m and _PAIR.search(text, m.end()) else None

    def parse(self, line: Line) -> list[PartialEvent] | None:
        m = _STEP.search(line.text)
        if not m:
            return None
        return step_line_events(line, self.name, int(m.group(2)), m.end())


def step_line_events(line: Line, state_key: str, step: int, pos: int,
                     step_ns: int | None = None) -> list[PartialEvent] | None:
    """The events of a step line whose step is known and whose ``key value`` pairs start at ``pos``.

    Shared by the parsers whose lines differ only in how they name the step (``step 12``, mmengine's
    ``Epoch(train) [1][200/735]``): the pairs, their roles and the step span are read one way.
    ``step_ns`` is the step's duration where the caller knows it (a pair of its lines means it).
    """
    text = line.text
    metrics: dict[str, Any] = {}
    phases: list[tuple[str, str, int, dict[str, Any] | None]] = []
    for key, raw, unit in _PAIR.findall(text, pos):
        value = float(raw)  # the pattern admits only what float() reads (digits, exponent, nan, inf)
        role, name, scale = _role(key, unit or None)
        if role == _METRIC:
            metrics[name] = metric_value(value)
            continue
        if role is None:
            continue
        ns = int(value * scale) if value == value and abs(value) < 1e12 else None
        if ns is None or ns < 0:
            continue
        if role == _STEP_DUR:
            step_ns = ns
        elif role == _PHASE:
            phases.append((name, "phase", ns, None))
        elif role == _COLLECTIVE:
            phases.append((name, "collective", ns, {"op": name, "group": "default", "seq": step, "source": "log"}))
        else:
            metrics[name] = round(ns / 1e6, 6)
    if not metrics and not phases and step_ns is None:
        return None
    state = line.stream.state(state_key)
    events: list[PartialEvent] = []
    if metrics:
        events.append({"kind": "metric", "step": step, "metrics": metrics})
    if step_ns is None and phases:
        step_ns = sum(p[2] for p in phases)
    if step_ns is None:
        prev_step, prev_ts = state.get("step"), state.get("ts")
        if line.ts is not None and prev_ts is not None and prev_step is not None and step > prev_step:
            step_ns = (line.ts - prev_ts) // (step - prev_step)
    if line.ts is not None:
        state["step"], state["ts"] = step, line.ts
    if step_ns is not None and step_ns > 0:
        span = step_span(step, 0, step_ns, source="log")
        del span["ts"], span["start"]
        span["sync"] = True
        events.append(span)
        if phases:
            for ev in layout_spans(step, 0, phases, span["span_id"]):
                ev["dt"] = ev.pop("ts")
                ev["start_dt"] = ev.pop("start")
                events.append(ev)
    return events
