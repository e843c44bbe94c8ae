"""Helpers shared by the parsers: numbers as logged, span layout, collective names."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

__all__ = ["COLLECTIVE_ALIASES", "collective_op", "layout_spans", "metric_value", "new_span_id", "number",
           "set_span_id_counter", "span_id_counter", "SpanIds", "step_span", "using_span_ids"]

class SpanIds:
    """The count that one ingest's span ids are made from (the compiled lane continues the same count).

    Each :class:`ingest.Ingestor` owns one, so two ingests in one process share no state and
    an ingest's ids depend only on its input. Parsers reach it through :func:`new_span_id`
    while :func:`using_span_ids` has made it the current one.
    """

    __slots__ = ("next",)

    def __init__(self, start: int = 1) -> None:
        self.next = start

    @classmethod
    def for_inputs(cls, job: str, names: Iterable[str]) -> SpanIds:
        """A count whose ids depend only on the job and the inputs' file names.

        The same files ingested again give the same ids (so a repeated ingest repeats its lines
        exactly), while other files ingested into the same job start 2**32 ids apart, in one of
        65,536 places picked by a hash of the names, instead of all starting at 1 and colliding.
        """
        h = hashlib.blake2b(job.encode(), digest_size=2)
        for name in sorted(os.path.basename(n) for n in names):
            h.update(b"\0" + name.encode("utf-8", "surrogateescape"))
        return cls(int.from_bytes(h.digest(), "big") << 32 | 1)

    def new(self) -> str:
        n = self.next
        self.next = n + 1
        return f"{0x6a74 << 48 | n:016x}"


_current: ContextVar[SpanIds] = ContextVar("ingest_span_ids", default=SpanIds())  # noqa: B039 - one count for parsers called alone


@contextmanager
def using_span_ids(ids: SpanIds) -> Iterator[SpanIds]:
    """Make ``ids`` the count :func:`new_span_id` uses (in this thread or task) until the block ends."""
    token = _current.set(ids)
    try:
        yield ids
    finally:
        _current.reset(token)


def new_span_id() -> str:
    """A 64-bit span id (hex), unique within the current ingest (ingested spans need only be unique within a job)."""
    return _current.get().new()


def span_id_counter() -> int:
    """The number the current count's next span id is made from."""
    return _current.get().next


def set_span_id_counter(n: int) -> None:
    _current.get().next = n


def number(text: str) -> float | None:
    """A logged number (``1.5``, ``1.499998E-04``, ``nan``, ``inf``); ``None`` if it is not one."""
    try:
        return float(text.strip().rstrip(","))
    except (ValueError, AttributeError):
        return None


def metric_value(value: float | None) -> float | str | None:
    """A metric as stored: finite floats as they are, NaN/Inf as the strings the analysis reads."""
    if value is None:
        return None
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


COLLECTIVE_ALIASES: Final = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "all-reduce": "all_reduce", "reduce": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "all-gather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather", "allreduce_coalesced": "all_reduce", "coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor", "broadcast": "broadcast", "barrier": "barrier",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all_single",
    "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv", "recvanysource": "recv",
    "comm": "all_reduce", "communication": "all_reduce", "sync": "all_reduce", "grad_sync": "all_reduce",
}


def collective_op(name: str) -> str:
    """The canonical op for a collective name as logged (``ALLREDUCE``, ``bwd_allreduce``, ``all-grads-sync``)."""
    key = name.strip().lower()
    if key in COLLECTIVE_ALIASES:
        return COLLECTIVE_ALIASES[key]
    for token in ("reduce_scatter", "reduce-scatter", "all-gather", "all_gather", "allgather", "alltoall",
                  "all_to_all", "broadcast", "barrier", "allreduce", "all-reduce", "all_reduce"):
        if token in key:
            return COLLECTIVE_ALIASES.get(token, token.replace("-", "_"))
    if "send" in key:
        return "send"
    if "recv" in key:
        return "recv"
    return "all_reduce"


def step_span(step: int, end: int, dur: int, span_id: str | None = None, **attrs: Any) -> dict[str, Any]:
    dur = max(int(dur), 0)
    ev: dict[str, Any] = {"kind": "span", "cat": "step", "name": "step", "step": step, "ts": end,
                          "start": end - dur, "dur": dur, "span_id": span_id or new_span_id()}
    if attrs:
        ev["attrs"] = attrs
    return ev


def layout_spans(step: int, end: int, parts: Iterable[tuple[str, str, int, dict[str, Any] | None]],
                 parent: str | None) -> list[dict[str, Any]]:
    """Phase and collective spans laid end to end so that the last one ends at ``end``.

    ``parts`` is ``(name, cat, dur_ns, attrs)`` in the order they ran. Logs give
    durations, not start times, so this order is the only placement they support;
    the analysis uses the sums per step, which do not depend on it.
    """
    parts = [p for p in parts if p[2] > 0]
    t = end - sum(p[2] for p in parts)
    out = []
    for name, cat, dur, attrs in parts:
        ev: dict[str, Any] = {"kind": "span", "cat": cat, "name": name, "step": step, "start": t, "dur": dur,
                              "ts": t + dur, "span_id": new_span_id()}
        if parent:
            ev["parent_id"] = parent
        if attrs:
            ev["attrs"] = attrs
        out.append(ev)
        t += dur
    return out
