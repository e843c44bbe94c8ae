"""Hugging Face Trainer: the metric dicts it prints and its tqdm progress bar.

Formats (huggingface/transformers, tqdm/tqdm):

* ``src/transformers/trainer_callback.py::ProgressCallback.on_log``:
  ``self.training_bar.write(str(logs))`` (and ``PrinterCallback.on_log``: ``print(logs)``), a
  Python dict such as ``{'loss': 2.3456, 'grad_norm': 1.23, 'learning_rate': 4.5e-05,
  'epoch': 0.01}``; since 4.46 floats are pre-formatted with ``f"{v:.4g}"`` so values are
  strings (``{'loss': '2.346', ...}``). ``Trainer.train`` ends with ``train_runtime``,
  ``train_samples_per_second``, ``train_steps_per_second``, ``train_loss``; evaluation
  logs ``eval_*`` keys.
* ``tqdm/std.py::tqdm.format_meter``: ``{desc}: {percentage:3.0f}%|{bar}| {n}/{total}
  [{elapsed}<{remaining}, {rate:5.2f}it/s{postfix}]`` (``s/it`` when slower than one per
  second); each refresh is a ``\\r``-separated segment in a file.

The dicts carry no step number: the step is the training bar's count at the time
(else the count of loss dicts so far). Step spans come from the bar: every new count
is a step whose duration is the bar's rate; their timestamps are estimated (marked
``est``) unless the line has one, since tqdm prints elapsed time only to the second.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Final

from .._types import Line, PartialEvent, Skip
from ._util import metric_value, number, step_span

__all__ = ["HuggingFaceParser"]

_DICT_HEAD: Final = re.compile(r"\{'[A-Za-z_][\w/.-]*': ")  # the dict runs from here to the line's last "}"
_PAIR: Final = re.compile(r"'([A-Za-z_][\w/.-]*)': '?([^,'}]+)'?")
# The description before the bar (``Training:  45%|…``) is cut from the text in front of the match
# (:func:`_bar_desc`): as a lazy group of the pattern it made every search quadratic (issue 20).
_BAR: Final = re.compile(
    r"(?<!\d)(?P<pct>\d+)%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) "
    r"\[(?P<el>[\d:]+)<(?P<rem>[\d:?]+), +(?P<rate>[\d.?]+)(?P<unit>it/s|s/it)(?P<post>[^\]]*)\]")
_KEYS: Final = {"learning_rate": "lr", "train_samples_per_second": "train_samples_per_s",
                "train_steps_per_second": "train_steps_per_s"}
_MAX_JUMP: Final = 10_000


def _seconds(text: str) -> float | None:
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    total = 0
    for p in parts:
        total = total * 60 + p
    return float(total)


def _bar_desc(text: str, start: int) -> str | None:
    """The description of a bar that starts at ``start``: the text before it, back to the last ``|`` or
    line break, when that ends in ``": "`` and blanks (``Training:  45%|``); else ``None``."""
    seg = max(text.rfind("|", 0, start), text.rfind("\r", 0, start), text.rfind("\n", 0, start)) + 1
    pre = text[seg:start]
    kept = pre.rstrip()
    if kept.endswith(":") and pre[len(kept):len(kept) + 1] == " ":
        return kept[:-1]
    return None


class HuggingFaceParser:
    name = "huggingface"
    triggers = (r"\{'[A-Za-z_][A-Za-z0-9_/.-]*': ", r"\| \d+/\d+ \[[0-9:]+<")

    def parse(self, line: Line) -> list[PartialEvent] | Skip | None:
        text = line.text
        if "{'" in text:
            head = _DICT_HEAD.search(text)
            end = text.rfind("}") if head else -1
            if head and end >= head.end():
                return self._metrics(line, text[head.start():end + 1])
        m = _BAR.search(text)
        if m:
            return self._bar(line, m, _bar_desc(text, m.start()))
        return None

    def _metrics(self, line: Line, blob: str) -> list[PartialEvent] | None:
        try:
            raw = ast.literal_eval(blob) if len(blob) < 65536 else None
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            raw = None
        if not isinstance(raw, dict):
            raw = dict(_PAIR.findall(blob))
        metrics: dict[str, Any] = {}
        for key, value in raw.items():
            if not isinstance(key, str):
                continue
            v = value if isinstance(value, (int, float)) and not isinstance(value, bool) else number(str(value))
            if v is None:
                continue
            metrics[_KEYS.get(key, key)] = metric_value(float(v))
        if not metrics:
            return None
        state = line.stream.state(self.name)
        if "loss" in metrics:
            state["dicts"] = state.get("dicts", 0) + 1
        step = state.get("n")
        ev: dict[str, Any] = {"kind": "metric", "metrics": metrics}
        if step is None and state.get("dicts"):
            step = state["dicts"]
            ev["attrs"] = {"step_estimated": True}
        if step is not None:
            ev["step"] = step
        return [ev]

    def _bar(self, line: Line, m: re.Match[str], desc: str | None) -> list[PartialEvent] | Skip:
        state = line.stream.state(self.name)
        n, total = int(m.group("n")), int(m.group("total"))
        key = (desc or "", total)
        bar = state.get("bar")
        if bar is None or (key == bar and n < state.get("n", 0)):
            state["bar"] = bar = key
            state["n"] = n
            state["el"] = _seconds(m.group("el"))
            return Skip("progress bar start") if n == 0 else []
        if key != bar:
            return Skip("progress of another bar (evaluation)")
        prev = state.get("n", 0)
        if n <= prev:
            return Skip("progress bar refresh without a new step")
        rate = number(m.group("rate")) if m.group("rate") != "?" else None
        per_step_s: float | None = None
        if rate and rate > 0:
            per_step_s = rate if m.group("unit") == "s/it" else 1.0 / rate
        else:
            el, prev_el = _seconds(m.group("el")), state.get("el")
            if el is not None and prev_el is not None and el > prev_el:
                per_step_s = (el - prev_el) / (n - prev)
        state["n"], state["el"] = n, _seconds(m.group("el"))
        events: list[PartialEvent] = []
        if per_step_s is not None and per_step_s > 0:
            dur = int(per_step_s * 1e9)
            first = max(prev + 1, n - _MAX_JUMP + 1)
            for step in range(first, n + 1):
                span = step_span(step, 0, dur, source="tqdm")
                del span["ts"], span["start"]
                span["dt"] = -(n - step) * dur
                events.append(span)
        events.append({"kind": "metric", "step": n, "metrics": {"progress": float(n), "progress_total": float(total)}})
        return events
