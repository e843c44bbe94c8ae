"""NVIDIA apex's mixed-precision loss scaling (``apex.amp``), which many pre-DeepSpeed fp16 jobs still use.

Formats, as real logs show them (NVIDIA/apex#834, Junjue-Wang/FactSeg#6, in ``tests/corpus/health``):

* ``apex/amp/scaler.py``: ``Gradient overflow.  Skipping step, loss scaler {id} reducing loss scale to {scale}``
  (two spaces after the full stop), printed once per process and overflowing step;
* ``Warning: NaN or Inf found in input tensor.``, printed before such skips when the inputs of the
  scaled loss are already non-finite.

Neither line says which step it is: the metric carries no step, and the analysis orders the skips by time
(``overflow_cascade``, ``loss_scale_collapse``). The warning becomes a log record that the health check
reads as a non-finite value (``nan_loss``).
"""

from __future__ import annotations

import re
from typing import Final

from .._types import Line, PartialEvent
from ._util import metric_value, number

__all__ = ["ApexParser"]

_SKIP: Final = re.compile(r"Gradient overflow\.\s+Skipping step, loss scaler (\d+) reducing loss scale to (\S+)")
_NONFINITE: Final = "NaN or Inf found in input tensor"


class ApexParser:
    name = "apex"
    triggers = (r"Gradient overflow\.\s+Skipping step", _NONFINITE)

    def parse(self, line: Line) -> list[PartialEvent] | None:
        text = line.text
        m = _SKIP.search(text)
        if m:
            metrics: dict[str, float | str | None] = {"overflow": 1.0}
            scale = number(m.group(2))
            if scale is not None:
                metrics["loss_scale"] = metric_value(scale)
            return [{"kind": "metric", "metrics": metrics},
                    {"kind": "log", "level": "WARNING", "logger": line.logger or "apex.amp", "msg": line.text}]
        if _NONFINITE in text:
            return [{"kind": "log", "level": "WARNING", "logger": line.logger or "apex.amp", "msg": line.text,
                     "attrs": {"nonfinite": True}}]
        return None
