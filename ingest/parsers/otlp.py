"""OpenTelemetry spans as OTLP JSON: NVIDIA NeMo Lens and NVRx jobs, ours, any OTel-traced trainer.

Two places hand them over one JSON document per line, in the OTLP/JSON encoding (hex ids, 64-bit
integers as strings, ``{"stringValue": …}`` attribute values):

* the OpenTelemetry Collector's ``file`` exporter (NeMo Lens ships ``otel-collector-file.yaml`` for it):
  one ``{"resourceSpans": […]}`` per line;
* Jaeger's query API v3 (``GET /api/v3/traces/{id}``, ``GET /api/v3/traces?query.…``): one
  ``{"result": {"resourceSpans": […]}}``, saved as a file.

Each span becomes a span event of the rank its resource names (``dl.rank``, ``nv.dl.rank`` or
``jobtrace.rank``: :data:`jobtrace.events.DL_IDENTITY`), on the node ``host.name`` names. Its step is
``dl.iteration`` (or ``jobtrace.step``), else its parent's. Its category is ``jobtrace.category`` where we
wrote the span; otherwise a span with an iteration is the **step** unless its parent carries the same
iteration (then it is a **phase** of it: Lens tags ``forward_backward`` and ``optimizer`` spans too); a
span whose parent is not in view is a step only if its name says so (``step``, ``iter``). A step span's
``dl.loss``, ``dl.grad_norm``, ``dl.learning_rate``… become the step's metrics under our names.
The span's own trace id is kept as ``otel.trace_id``: Lens gives each rank its own trace. Our own
exporter's ``jobtrace.*`` attributes lose their prefix, so that a collective read back from Jaeger has
its group, sequence number and size again.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from jobtrace.events import DL_IDENTITY, DL_METRICS, SpanCategory

from .._types import Line, PartialEvent, Skip
from ._util import metric_value

__all__ = ["OtlpSpanParser"]

_METRIC_OF: Final = {dl: ours for ours, dl in DL_METRICS.items() if ours != "learning_rate"}
_STEP_KEYS: Final = ("dl.iteration", "jobtrace.step")
_DROP: Final = frozenset({*_STEP_KEYS, *_METRIC_OF, "jobtrace.category", "jobtrace.rank", "jobtrace.node"})
_OURS: Final = "jobtrace."  # our exporter's prefix for an event's own attributes (seq, group, bytes…): taken off
_CATEGORIES: Final = frozenset({SpanCategory.STEP, SpanCategory.PHASE, SpanCategory.COLLECTIVE, SpanCategory.USER})
_REMEMBER: Final = 200_000  # spans per stream whose step and iteration are kept for their children


def any_value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain value (64-bit integers arrive as strings)."""
    if not isinstance(v, dict) or not v:
        return None
    (kind, raw), = list(v.items())[:1]
    if kind == "intValue":
        try:
            return int(raw)
        except (TypeError, ValueError):
            return None
    if kind == "doubleValue":
        return float(raw) if isinstance(raw, (int, float)) else metric_from_text(raw)
    if kind == "arrayValue":
        return [any_value(x) for x in (raw or {}).get("values") or []]
    if kind == "kvlistValue":
        return attributes((raw or {}).get("values"))
    return raw  # stringValue, boolValue, bytesValue (base64 text)


def metric_from_text(raw: Any) -> float | None:
    """OTLP/JSON writes non-finite doubles as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def attributes(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    return {a["key"]: any_value(a.get("value")) for a in items if isinstance(a, dict) and isinstance(a.get("key"), str)}


def _first(attrs: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((attrs[k] for k in keys if attrs.get(k) is not None), None)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class OtlpSpanParser:
    """One OTLP/JSON document per line (see the module docstring)."""

    name = "otlp"
    triggers = ('"resourceSpans"',)

    def parse(self, line: Line) -> list[PartialEvent] | Skip | None:
        try:
            doc = orjson.loads(line.raw)
        except orjson.JSONDecodeError:
            return None  # a log line that mentions resourceSpans: kept as it is
        if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
            doc = doc["result"]
        batches = doc.get("resourceSpans") if isinstance(doc, dict) else None
        if not isinstance(batches, list):
            return None
        seen = line.stream.state(self.name)  # span id -> (step, iteration-tagged) for children in later lines
        spans: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (span, its resource's identity)
        for batch in batches:
            if not isinstance(batch, dict):
                continue
            res = attributes((batch.get("resource") or {}).get("attributes"))
            who = {key: _first(res, names) for key, names in DL_IDENTITY.items()}
            for scope in batch.get("scopeSpans") or batch.get("instrumentationLibrarySpans") or []:
                for span in (scope or {}).get("spans") or []:
                    if isinstance(span, dict):
                        spans.append((span, who))
        # The line's own spans first, so that a parent in the same batch is known to its children.
        for span, _ in spans:
            attrs = span["attrs"] = attributes(span.get("attributes"))
            step = span["step"] = _int(_first(attrs, _STEP_KEYS))
            if isinstance(span.get("spanId"), str) and step is not None:
                seen[span["spanId"]] = (step, True)
        events: list[PartialEvent] = []
        skipped = 0
        for span, who in spans:
            ev = self._event(span, who, seen)
            if ev is None:
                skipped += 1
                continue
            events.extend(ev)
        if len(seen) > _REMEMBER:
            seen.clear()
        if not events:
            return Skip(f"OTLP document with {skipped} span(s) without times") if skipped else Skip("empty OTLP document")
        # The line itself is not kept (a whole batch of spans); one log line says what it held, on the rank of
        # its first span, so that no stream writes under a rank it does not have.
        note: PartialEvent = {"kind": "log", "level": "INFO", "logger": "otlp", "ts": max(e["ts"] for e in events),
                              "msg": f"OTLP spans read: {len(spans) - skipped}"
                              + (f", {skipped} without times" if skipped else "")}
        note.update({k: events[0][k] for k in ("route_rank", "route_node") if k in events[0]})
        events.append(note)
        return events

    @staticmethod
    def _event(span: dict[str, Any], who: dict[str, Any], seen: dict[str, tuple[int | None, bool]]
               ) -> list[PartialEvent] | None:
        start, end = _int(span.get("startTimeUnixNano")), _int(span.get("endTimeUnixNano"))
        if start is None or end is None or start <= 0:
            return None
        attrs: dict[str, Any] = span["attrs"]
        sid, parent = span.get("spanId"), span.get("parentSpanId") or None
        step: int | None = span["step"]  # read once, in the first pass
        up = seen.get(parent) if isinstance(parent, str) else None
        cat = attrs.get("jobtrace.category")
        if cat not in _CATEGORIES:
            name = str(span.get("name", "")).lower()
            if step is None:
                cat = SpanCategory.USER
            elif up is not None:
                cat = SpanCategory.PHASE if up[1] and up[0] == step else SpanCategory.STEP
            else:
                cat = SpanCategory.STEP if ("step" in name or "iter" in name) else SpanCategory.PHASE
        if step is None and up is not None:
            step = up[0]
        if isinstance(sid, str) and sid not in seen:
            seen[sid] = (step, False)
        kept = {(k[len(_OURS):] if k.startswith(_OURS) else k): v for k, v in attrs.items()
                if k not in _DROP and v is not None}
        if isinstance(span.get("traceId"), str):
            kept["otel.trace_id"] = span["traceId"]
        status = span.get("status") or {}
        if status.get("code") in (2, "STATUS_CODE_ERROR"):
            kept["error"] = str(status.get("message") or "error")[:500]
        ev: PartialEvent = {"kind": "span", "name": str(span.get("name") or "span")[:200], "cat": cat,
                            "start": start, "dur": max(0, end - start), "ts": max(end, start)}
        if isinstance(sid, str):
            ev["span_id"] = sid
        if isinstance(parent, str):
            ev["parent_id"] = parent
        if step is not None:
            ev["step"] = step
        if kept:
            ev["attrs"] = kept
        out = [ev]
        metrics = {ours: metric_value(v if isinstance(v, float) else float(v)) for dl, ours in _METRIC_OF.items()
                   if isinstance((v := attrs.get(dl)), (int, float)) and not isinstance(v, bool)}
        if metrics and cat == SpanCategory.STEP:
            out.append({"kind": "metric", "step": step, "ts": ev["ts"], "metrics": metrics})
        rank = _int(who.get("rank"))
        for e in out:
            if rank is not None:
                e["route_rank"] = rank
                if who.get("node"):
                    e["route_node"] = str(who["node"])
        return out
