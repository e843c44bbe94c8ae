"""OpenMMLab's mmengine runner (mmdet, mmseg, xtuner…): its ``LogProcessor`` training lines.

Format (open-mmlab/mmengine ``runner/log_processor.py``, as open-mmlab/mmaction2's logging guide and
the xtuner excerpt in ``tests/corpus/health`` show it)::

    10/30 22:18:02 - mmengine - INFO - Epoch(train) [1][200/735]  lr: 1.9870e-04  eta: 2:46:39  time: 2.8906  data_time: 0.0042  memory: 10762  loss: 2.7522  grad_norm: 3.0608
    08/21 02:58:41 - mmengine - INFO - Iter(train) [  10/1000]  lr: 1.0000e-02  ...  loss: 1.7388

``Epoch(train) [e][i/n]`` counts iterations within an epoch: the step is ``(e - 1) * n + i``, so steps keep
rising across epochs. ``Iter(train) [i/n]`` is the step itself. The ``key: value`` pairs after the prefix are
read as the generic step parser reads them (``time``, in seconds, is the step's duration, ``data_time``
its data phase, ``loss``/``grad_norm``/``lr`` metrics). Validation and test lines (``Epoch(val)``) are not steps.
"""

from __future__ import annotations

import re
from typing import Final

from .._types import Line, PartialEvent
from .generic import step_line_events

__all__ = ["MmengineParser"]

_TIME: Final = re.compile(r"\btime: (\d+(?:\.\d+)?)(?![\w.])")  # seconds; mmengine writes no unit

_PREFIX: Final = re.compile(r"\b(?:Epoch\(train\)\s*\[\s*(\d+)\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]"
                            r"|Iter\(train\)\s*\[\s*(\d+)\s*/\s*\d+\s*\])")


class MmengineParser:
    name = "mmengine"
    triggers = (r"(?:Epoch|Iter)\(train\)\s*\[",)

    def parse(self, line: Line) -> list[PartialEvent] | None:
        m = _PREFIX.search(line.text)
        if not m:
            return None
        if m.group(4) is not None:
            step = int(m.group(4))
        else:
            epoch, i, n = int(m.group(1)), int(m.group(2)), int(m.group(3))
            step = max(epoch - 1, 0) * n + i
        t = _TIME.search(line.text, m.end())
        step_ns = int(float(t.group(1)) * 1e9) if t else None
        return step_line_events(line, self.name, step, m.end(), step_ns)
