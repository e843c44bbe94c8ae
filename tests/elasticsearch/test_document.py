"""The canonical event ↔ ECS document mapping (no server)."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kibana._document import (
    data_stream_name,
    doc_id,
    from_document,
    iso_ns,
    parse_iso_ns,
    stream_type,
    to_document,
    validate_namespace,
)

BASE = {"ts": 1_767_225_600_123_456_789, "job": "j", "trace_id": "ab" * 16, "rank": 3, "local_rank": 1,
        "world": 8, "node": "n1", "pid": 42, "v": 1}


def roundtrip(event):
    _, doc = to_document(event, "default", doc_id_=doc_id(orjson.dumps(event)))
    return from_document(orjson.loads(orjson.dumps(doc)))


class TestTimestamps:
    def test_nanoseconds_survive_the_rfc3339_form(self):
        """date_nanos keeps nine fraction digits; the integer comes back exactly."""
        ts = 1_767_225_600_123_456_789
        assert "2026-01-01T00:00:00.123456789Z" == iso_ns(ts)
        assert ts == parse_iso_ns(iso_ns(ts))

    @given(st.integers(min_value=0, max_value=(2**63 - 1) // 4))
    def test_any_time_from_1970_round_trips(self, ts):
        """Every timestamp date_nanos can hold comes back as the same integer."""
        assert ts == parse_iso_ns(iso_ns(ts))

    def test_other_rfc3339_forms_and_epoch_millis_are_read(self):
        """Documents written by other tools still load."""
        assert 1_767_225_600_500_000_000 == parse_iso_ns("2026-01-01T01:00:00.5+01:00")
        assert 1_767_225_600_000_000_000 == parse_iso_ns("2026-01-01T00:00:00Z")
        assert 1_767_225_600_000_000_000 == parse_iso_ns(1_767_225_600_000)

    def test_a_non_integer_timestamp_is_refused(self):
        """The sender dead-letters such a line with this reason."""
        with pytest.raises(ValueError, match="integer nanoseconds"):
            to_document({**BASE, "ts": "yesterday", "kind": "log"}, "default")


class TestMapping:
    def test_a_log_record_uses_ecs_fields(self):
        """message, log.level, trace.id, span.id, host.name, process.pid: the ECS names."""
        ev = {**BASE, "kind": "log", "span_id": "cd" * 8, "level": "ERROR", "logger": "train", "msg": "boom",
              "exc": "Traceback...", "step": 7}
        type_, doc = to_document(ev, "prod", doc_id_="X")
        assert "logs" == type_
        assert {"@timestamp": "2026-01-01T00:00:00.123456789Z", "message": "boom", "log": {"level": "ERROR", "logger": "train"},
                "error": {"stack_trace": "Traceback..."}, "trace": {"id": "ab" * 16}, "span": {"id": "cd" * 8},
                "host": {"name": "n1"}, "process": {"pid": 42},
                "jobtrace": {"kind": "log", "job": "j", "rank": 3, "local_rank": 1, "world_size": 8, "step": 7,
                             "schema_version": 1},
                "event": {"kind": "event", "dataset": "jobtrace", "id": "X"},
                "service": {"name": "jobtrace"}, "ecs": {"version": "8.11.0"},
                "data_stream": {"type": "logs", "dataset": "jobtrace", "namespace": "prod"}} == doc

    def test_a_collective_span_has_typed_collective_fields_and_duration_in_ns(self):
        """event.duration is nanoseconds (ECS); op, bytes, seq are typed; a failure sets event.outcome."""
        ev = {**BASE, "kind": "span", "span_id": "01" * 8, "parent_id": "02" * 8, "name": "all_reduce",
              "cat": "collective", "start": BASE["ts"] - 5000, "dur": 5000, "step": 2,
              "attrs": {"op": "all_reduce", "group": "default", "group_size": 8, "seq": 9, "bytes": 1024,
                        "error": "DistBackendError: NCCL timeout", "custom": [1, 2]}}
        type_, doc = to_document(ev, "default")
        assert "traces" == type_
        assert {"op": "all_reduce", "group": "default", "group_size": 8, "seq": 9, "bytes": 1024,
                "error": "DistBackendError: NCCL timeout"} == doc["jobtrace"]["collective"]
        assert {"custom": [1, 2]} == doc["jobtrace"]["attrs"]
        assert 5000 == doc["event"]["duration"] and "failure" == doc["event"]["outcome"]
        assert ev == roundtrip(ev)

    def test_step_spans_and_metrics_go_to_the_metrics_stream_other_spans_to_traces(self):
        """Retention: per-step summaries live as long as the metrics."""
        assert "metrics" == stream_type({"kind": "span", "cat": "step"})
        assert "metrics" == stream_type({"kind": "metric"})
        assert "traces" == stream_type({"kind": "span", "cat": "phase"})
        assert "logs" == stream_type({"kind": "heartbeat"})
        assert "metrics-jobtrace-default" == data_stream_name("metrics", "default")

    def test_nan_loss_becomes_a_keyword_not_a_rejected_number(self):
        """Numeric fields refuse NaN: it goes to jobtrace.nonfinite.loss and comes back as "NaN"."""
        ev = {**BASE, "kind": "metric", "step": 3, "metrics": {"loss": "NaN", "grad_norm": "Infinity", "lr": 0.1,
                                                               "rss_bytes": 123, "note": "warmup"}}
        _, doc = to_document(ev, "default")
        jt = doc["jobtrace"]
        assert {"lr": 0.1, "rss_bytes": 123} == jt["metrics"]
        assert {"loss": "NaN", "grad_norm": "Infinity"} == jt["nonfinite"]
        assert {"note": "warmup"} == jt["metrics_text"]
        assert ev == roundtrip(ev)

    def test_metric_names_that_are_not_field_names_are_kept_verbatim(self):
        """A dot would make an object path; the exact names survive in jobtrace.raw."""
        ev = {**BASE, "kind": "metric", "metrics": {"train.loss": 1.5, "": 2, "ok": None}}
        _, doc = to_document(ev, "default")
        assert {"train_loss": 1.5, "m": 2} == doc["jobtrace"]["metrics"]
        assert ev == roundtrip(ev)

    def test_heartbeat_attributes_are_typed(self):
        ev = {**BASE, "kind": "heartbeat", "step": 4, "attrs": {"progress_age_ms": 61000, "in_span": "forward",
                                                               "in_cat": "phase", "in_op": "all_reduce",
                                                               "in_group": "default", "in_seq": 5}}
        _, doc = to_document(ev, "default")
        assert 61000 == doc["jobtrace"]["heartbeat"]["progress_age_ms"] and "attrs" not in doc["jobtrace"]
        assert ev == roundtrip(ev)

    def test_an_attribute_of_an_unexpected_type_is_kept_unindexed_instead_of_rejected(self):
        """bytes="lots" would fail the long mapping; it stays in jobtrace.attrs."""
        ev = {**BASE, "kind": "span", "cat": "collective", "name": "x", "start": 1, "dur": 1,
              "attrs": {"op": "x", "bytes": "lots", "seq": True}}
        _, doc = to_document(ev, "default")
        assert {"op": "x"} == doc["jobtrace"]["collective"]
        assert {"bytes": "lots", "seq": True} == doc["jobtrace"]["attrs"]
        assert ev == roundtrip(ev)

    def test_keys_of_a_newer_schema_are_kept(self):
        ev = {**BASE, "kind": "log", "msg": "m", "future": {"x": 1}}
        assert ev == roundtrip(ev)

    def test_ids_are_deterministic_and_differ_per_line(self):
        """A replayed line gets the same _id (409, not a duplicate)."""
        a, b = b'{"ts":1,"kind":"log"}\n', b'{"ts":2,"kind":"log"}\n'
        assert doc_id(a) == doc_id(a) == doc_id(a.rstrip(b"\n"))
        assert doc_id(a) != doc_id(b) and 20 == len(doc_id(a))

    def test_namespaces_follow_the_data_stream_naming_rules(self):
        assert "prod_1" == validate_namespace("prod_1")
        for bad in ("with-dash", "Upper", "", "x" * 101, "a b", "a*"):
            with pytest.raises(ValueError):
                validate_namespace(bad)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=20),
                         st.floats(allow_nan=False, allow_infinity=False))
metric_values = st.one_of(st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False),
                          st.sampled_from(["NaN", "Infinity", "-Infinity"]), st.text(max_size=10))
names = st.text(min_size=1, max_size=12)


@st.composite
def events(draw):
    kind = draw(st.sampled_from(["log", "span", "metric", "heartbeat"]))
    ev = {"ts": draw(st.integers(0, 2**62)), "kind": kind, "job": draw(st.text(max_size=30)),
          "trace_id": draw(st.text("0123456789abcdef", min_size=32, max_size=32)),
          "rank": draw(st.integers(0, 100_000)), "local_rank": draw(st.integers(0, 64)),
          "world": draw(st.integers(1, 100_000)), "node": draw(st.text(max_size=20)),
          "pid": draw(st.integers(1, 2**31)), "v": 1}
    if draw(st.booleans()):
        ev["span_id"] = draw(st.text("0123456789abcdef", min_size=16, max_size=16))
    if draw(st.booleans()):
        ev["step"] = draw(st.integers(0, 2**40))
    if kind == "log":
        ev.update(level=draw(st.sampled_from(["INFO", "WARNING", "ERROR"])), logger=draw(st.text(max_size=20)),
                  msg=draw(st.text(max_size=200)))
        if draw(st.booleans()):
            ev["exc"] = draw(st.text(max_size=200))
    elif kind == "span":
        cat = draw(st.sampled_from(["step", "phase", "collective", "user"]))
        ev.update(name=draw(st.text(max_size=20)), cat=cat, start=draw(st.integers(0, 2**62)),
                  dur=draw(st.integers(0, 2**40)))
        if draw(st.booleans()):
            ev["parent_id"] = draw(st.text("0123456789abcdef", min_size=16, max_size=16))
        if draw(st.booleans()):
            ev["attrs"] = draw(st.dictionaries(st.sampled_from(["op", "group", "seq", "bytes", "async", "error", "x"]),
                                               json_scalars, max_size=5))
    elif kind == "metric":
        ev["metrics"] = draw(st.dictionaries(names, metric_values, max_size=6))
    else:
        ev["attrs"] = draw(st.dictionaries(st.sampled_from(["progress_age_ms", "in_span", "in_op", "in_seq", "y"]),
                                           json_scalars, max_size=5))
    if draw(st.booleans()):
        ev["est"] = True
    return ev


@settings(max_examples=300, deadline=None)
@given(events())
def test_every_canonical_event_round_trips_through_a_document(ev):
    """Whatever a rank records comes back from the document unchanged (what trace-job relies on)."""
    back = roundtrip(ev)
    if "attrs" in ev:  # JSON object equality: key order is not part of the event
        assert ev["attrs"] == back["attrs"]
    for value in (ev.get("metrics") or {}).values():
        assert not (isinstance(value, float) and math.isnan(value))
    assert ev == back
