"""Each rank's metrics, kept from its events: the numbers a scrape or a push reports.

The ranks already record everything a monitoring board needs, as events: step spans, collective spans,
the metrics the job logs (loss, learning rate, grad norm, samples/s, the memory hook's RSS and CUDA
counters, DeepSpeed's loss scale and skipped steps) and heartbeats. :class:`RankMetrics` folds a rank's
events into its latest values, a step-time histogram and a few counters, so that exposing them costs
the training process nothing: the events are read where they were written (:mod:`metrics._exporter`).

Labels stay few: ``job``, ``rank``, ``node``, ``local_rank``. A step number is a value
(``jobtrace_step``), never a label: one series per step would grow without bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["COUNTERS", "FLOPS_INPUTS", "GAUGES", "STEP_BUCKETS", "RankMetrics"]

GAUGES: Final[dict[str, tuple[str, str]]] = {
    "loss": ("jobtrace_loss", "The rank's last logged training loss."),
    "grad_norm": ("jobtrace_grad_norm", "The last logged global gradient norm."),
    "lr": ("jobtrace_learning_rate", "The last logged learning rate."),
    "learning_rate": ("jobtrace_learning_rate", "The last logged learning rate."),
    "loss_scale": ("jobtrace_loss_scale", "The mixed-precision loss scale (DeepSpeed, fp16)."),
    "samples_per_s": ("jobtrace_samples_per_second", "Training throughput in samples a second, as logged."),
    "tokens_per_s": ("jobtrace_tokens_per_second", "Training throughput in tokens a second, as logged."),
    "tflops": ("jobtrace_tflops", "Achieved model TFLOP/s, as logged."),
    "mfu": ("jobtrace_mfu_ratio", "Model FLOPs utilisation (0-1), as logged."),
    "rss_bytes": ("jobtrace_host_rss_bytes", "The rank's resident host memory."),
    "cuda_allocated_bytes": ("jobtrace_cuda_allocated_bytes", "CUDA memory held by tensors."),
    "cuda_reserved_bytes": ("jobtrace_cuda_reserved_bytes", "CUDA memory reserved by the caching allocator."),
    "cuda_max_allocated_bytes": ("jobtrace_cuda_peak_allocated_bytes", "Peak CUDA memory held by tensors."),
}
"""A metric the job logs (its name in the events) -> the gauge it becomes, and the gauge's help."""

FLOPS_INPUTS: Final = ("flops_per_step", "peak_flops")
"""What a job logs so that MFU is derived (``oi.log_metrics(flops_per_step=6 * params * tokens, peak_flops=...)``,
once is enough): achieved FLOP/s is ``flops_per_step`` over the step time, MFU that over ``peak_flops`` (the
rank's device's peak, e.g. 989e12 for an H100's dense BF16)."""

COUNTERS: Final[dict[str, tuple[str, str]]] = {
    "skipped_steps": ("jobtrace_skipped_steps", "Steps whose update was skipped (fp16 overflow), as counted by the engine."),
}
"""Running counts the job reports (monotonic within a run) -> counters."""

STEP_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, math.inf)
"""Step-time histogram buckets in seconds: the heatmap's rows."""


@dataclass
class RankMetrics:
    """One rank of one job."""

    job: str
    rank: int
    node: str = ""
    local_rank: int | None = None
    last_event_ns: int = 0
    step: int | None = None
    steps_total: int = 0
    step_seconds: float | None = None
    collective_seconds: float | None = None
    """The last step's time inside collectives (synchronous ones: what the step waited)."""
    values: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=lambda: [0] * len(STEP_BUCKETS))
    step_sum: float = 0.0
    stopped: bool = False
    """The rank ended cleanly (its ``jobtrace.lifecycle`` stop record): its heartbeat age is no longer a concern."""
    exemplars: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per histogram bucket, its latest step: ``trace_id`` and ``span_id`` (the trace to open), value, time."""
    _comm_ns: dict[int, int] = field(default_factory=dict)

    def derived(self) -> dict[str, float]:
        """The gauges computed from what the job logged: TFLOP/s and MFU from ``flops_per_step`` (and
        ``peak_flops``) over the last step's time, unless the job logged them itself."""
        out: dict[str, float] = {}
        flops, peak = self.values.get("flops_per_step"), self.values.get("peak_flops")
        if flops and self.step_seconds:
            achieved = flops / self.step_seconds
            if "tflops" not in self.values:
                out["tflops"] = achieved / 1e12
            if peak and "mfu" not in self.values:
                out["mfu"] = achieved / peak
        return out

    def labels(self) -> dict[str, str]:
        out = {"job": self.job, "rank": str(self.rank), "node": self.node}
        if self.local_rank is not None:
            out["local_rank"] = str(self.local_rank)
        return out

    def feed(self, e: dict[str, Any]) -> None:
        """One event of this rank."""
        ts = int(e.get("ts") or 0)
        self.last_event_ns = max(self.last_event_ns, ts)
        self.node = e.get("node") or self.node
        if isinstance(e.get("local_rank"), int):
            self.local_rank = e["local_rank"]
        kind = e.get("kind")
        if kind == "span":
            self._span(e)
        elif kind == "log" and e.get("logger") == "jobtrace.lifecycle" and e.get("msg") == "stop":
            self.stopped = True
        elif kind == "metric":
            for name, value in (e.get("metrics") or {}).items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if name in GAUGES or name in FLOPS_INPUTS:
                    self.values[name] = float(value)
                elif name in COUNTERS:
                    self.counters[name] = max(self.counters.get(name, 0.0), float(value))

    def _span(self, e: dict[str, Any]) -> None:
        step, dur = e.get("step"), int(e.get("dur") or 0)
        cat = e.get("cat")
        if cat == "collective" and isinstance(step, int) and not (e.get("attrs") or {}).get("async"):
            if step == self.step:  # after its step's span: the compiled hooks' records follow it in a batch
                self.collective_seconds = (self.collective_seconds or 0.0) + dur / 1e9
            elif self.step is None or step > self.step:
                self._comm_ns[step] = self._comm_ns.get(step, 0) + dur
        elif cat == "step" and isinstance(step, int):
            seconds = dur / 1e9
            self.step, self.step_seconds = step, seconds
            self.collective_seconds = self._comm_ns.pop(step, 0) / 1e9
            for old in [s for s in self._comm_ns if s < step]:
                del self._comm_ns[old]
            self.steps_total += 1
            self.step_sum += seconds
            for i, bound in enumerate(STEP_BUCKETS):
                if seconds <= bound:
                    self.buckets[i] += 1
                    if e.get("trace_id") and e.get("span_id"):
                        self.exemplars[i] = {"trace_id": str(e["trace_id"]), "span_id": str(e["span_id"]),
                                             "value": seconds, "ts": int(e.get("ts") or 0) / 1e9}
                    break
