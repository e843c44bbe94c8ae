"""The export thread's line encoder: its spliced fast path equals the general dict path, and one bad item costs nothing else."""

from __future__ import annotations

import logging

import orjson
import pytest

from jobtrace.events import decode, encode_lines
from jobtrace.identity import resolve_identity
from otel_instrumentation._recorder import _COLLECTIVE, _LOG, _METRIC, _SPAN, Recorder


@pytest.fixture
def rec():
    return Recorder(resolve_identity(job_id='job "quoted" é', rank=3, world_size=8, env={}))


def _general(rec, item):
    return encode_lines([rec.to_dict(item)])[0]


LOGS = [
    (_LOG, 1767225600.123456, "INFO", "train", "step %d loss %.4f", (7, 0.25), None, None, None),
    (_LOG, 1767225600.5, "WARNING", "deepspeed.engine", "no args", None, None, 0x1234, 12),
    (_LOG, 1767225600.5, "ERROR", "x", 'quotes " and \\ and \n newline, 日本語, emoji 🚀', None,
     "Traceback (most recent call last):\n  ValueError: boom", 2**64 - 1, 0),
    (_LOG, 1767225600.5, "Level 25", "custom.level", "%s", ({"a": 1},), None, None, None),
    (_LOG, 1767225600.5, "INFO", "bad", "%d items", ("not a number",), None, None, None),  # format error
    (_LOG, 1767225600.5, "INFO", "obj", 12345, None, None, None, None),  # non-str msg
    (_LOG, 1767225600.5, "INFO", "stepf", "float step", None, None, None, 3.0),  # non-int step
]
SPANS = [
    (_SPAN, 0xABC, None, "step", "step", 10, 25, 4, None),
    (_SPAN, 0xABD, 0xABC, "forward", "phase", 11, 20, 4, None),
    (_SPAN, 0xABE, 0xABD, "all_reduce", "collective", 12, 19, None,
     {"op": "all_reduce", "group": "default", "seq": 9, "bytes": 1 << 24, "group_size": 8, "async": False}),
    (_SPAN, 0xABF, None, "user span ü", "user", 1, 2, None, {"tags": {"x", "y"} and ["x"], "nested": {"k": [1, 2.5]}}),
    # A collective as the torch wrapper queues it: the group's [name, size, last seq], then seq, bytes, extra.
    (_COLLECTIVE, 0xAC0, 0xABD, "all_gather", 12, 19, 4, ["pg1", 8, 40], 9, 1 << 24, None),
    (_COLLECTIVE, 0xAC1, None, "broadcast", 12, 19, None, ["default", 2, 3], 3, 0, {"error": "RuntimeError: é"}),
]

METRICS = [
    (_METRIC, 1767225600123456789, 7, {"loss": 2.5, "lr": 1e-4, "tokens": 4096}, 0xABC),
    (_METRIC, 10, None, {"loss": float("nan"), "g": float("inf"), "h": -float("inf")}, None),
    (_METRIC, 10, 3, {"flag": True, "big": 2**70, "x": 1}, None),  # bool as int; an int JSON cannot hold
    (_METRIC, 10, 3, {"odd": object(), "s": "text"}, None),  # written as text by the general path
    (_METRIC, 10, 3.5, {"loss": 1.0}, None),  # non-int step
    (_METRIC, 10, 3, {1: 1.0}, None),  # non-str key
]


@pytest.mark.parametrize("item", METRICS, ids=lambda i: f"metric-{sorted(map(str, i[3]))}")
def test_metric_fast_path_bytes_equal_the_general_path(rec, item):
    """Byte for byte what the general path (a dict, scrubbed or an error event where JSON cannot hold it) writes."""
    line, general = rec.encode_batch([item])[0], rec._encode_general(item)
    if orjson.loads(general)["kind"] == "log":  # an error event saying why: stamped when written
        assert [orjson.loads(x) | {"ts": 0} for x in (line, general)] == [orjson.loads(general) | {"ts": 0}] * 2
    else:
        assert line == general


def test_metric_tensors_fast_path_equals_the_general_path(rec):
    torch = pytest.importorskip("torch", reason="tensor metric values need torch")
    values = {"loss": torch.tensor(0.25, requires_grad=True).detach(), "n": torch.tensor(3),
              "nan": torch.tensor(float("nan"))}
    expected = {"loss": 0.25, "n": 3, "nan": "NaN"}
    try:
        import numpy as np  # not a dependency: torch runs without it
    except ImportError:
        pass
    else:
        values["np"], expected["np"] = np.float32(0.5), 0.5
    item = (_METRIC, 10, 4, values, 0x1)
    line = rec.encode_batch([item])[0]
    assert line == _general(rec, item)
    assert orjson.loads(line)["metrics"] == expected


def test_tensor_metric_values_are_read_at_the_call_on_the_cpu_and_never_keep_a_graph(rec):
    torch = pytest.importorskip("torch", reason="tensor metric values need torch")
    items = []
    rec.emit = items.append
    w = torch.tensor(2.0, requires_grad=True)
    loss, acc, vec = w * 3, torch.tensor(1.0), torch.ones(3)
    meta = torch.ones((), device="meta") * w.to("meta")  # a device whose value is read later (like CUDA)
    rec.metrics(5, {"loss": loss, "acc": acc, "vec": vec, "meta": meta})
    acc += 41  # changed in place after the call: the value recorded is the one at the call
    (item,) = items
    values = item[3]
    assert (values["loss"], type(values["loss"]), values["acc"]) == (6.0, float, 1.0)
    assert values["vec"] is vec  # more than one element: kept, written as text by the export thread
    assert meta.requires_grad and not values["meta"].requires_grad and values["meta"].grad_fn is None
    ev = orjson.loads(rec.encode_batch(items)[0])
    assert (ev["metrics"]["loss"], ev["metrics"]["acc"], ev["metrics"]["vec"]) == (6.0, 1.0, str(vec))
    assert "meta" in ev["metrics"]["meta"]  # no value to read: its text, not a lost event


@pytest.mark.parametrize("item", LOGS + SPANS, ids=lambda i: f"{i[0]}-{i[3]}")
def test_fast_path_bytes_equal_the_general_path(rec, item):
    line = rec.encode_batch([item])[0]
    assert line == _general(rec, item)
    assert decode(line).job == 'job "quoted" é'
    if item[0] == _COLLECTIVE:
        ev = orjson.loads(line)
        assert (ev["name"], ev["cat"], ev["start"], ev["dur"]) == (item[3], "collective", 12, 7)
        assert ev["attrs"] == {"op": item[3], "group": item[7][0], "group_size": item[7][1], "seq": item[8],
                               "bytes": item[9], **(item[10] or {})}


def test_real_log_records_and_spans_round_trip(rec):
    items = []
    rec.emit = items.append
    log = logging.getLogger("enc.test")
    rec.log_record(log.makeRecord("enc.test", logging.INFO, __file__, 1, "value %s at %d", ("x", 3), None))
    with rec.span("outer", "user", step=2, key="v"), rec.span("inner", "phase"):
        rec.log_record(log.makeRecord("enc.test", logging.ERROR, __file__, 1, "inside", None, None))
    lines = rec.encode_batch(items)
    assert lines == [_general(rec, i) for i in items]
    events = [orjson.loads(x) for x in lines]
    assert [e["kind"] for e in events] == ["log", "log", "span", "span"]
    assert events[1]["span_id"] == events[2]["span_id"] and events[2]["parent_id"] == events[3]["span_id"]


def test_a_lone_surrogate_is_escaped_and_costs_no_other_event(rec):
    """A message holding a surrogateescape-decoded byte (an undecodable file name) must not lose the batch."""
    bad = (_LOG, 1767225600.5, "INFO", "io", "cannot open /data/caf\udce9.bin", None, None, None, 1)
    odd_attrs = (_SPAN, 0xA, None, "span", "user", 1, 2, None, {1: "int key", "s": "x\udcff"})
    good = LOGS[0]
    lines = rec.encode_batch([good, bad, odd_attrs, good])
    assert len(lines) == 4 and lines[0] == lines[3] == _general(rec, good)
    msg = orjson.loads(lines[1])["msg"]
    assert msg.startswith("cannot open /data/caf") and "\\udce9" in msg
    assert orjson.loads(lines[2])["attrs"] == {"1": "int key", "s": "x\\udcff"}


def test_an_item_that_cannot_be_encoded_becomes_an_error_event(rec):
    broken = (_LOG, "not a time", "INFO", "x", "m", None, None, None, None)
    (line,) = rec.encode_batch([broken])
    ev = orjson.loads(line)
    assert (ev["kind"], ev["level"], ev["logger"]) == ("log", "ERROR", "jobtrace.export")
    assert "could not be encoded" in ev["msg"] and ev["rank"] == 3


@pytest.mark.parametrize("msg,args,expected", [
    # One conversion and a repr'd tuple would format "successfully": the bad call was hidden.
    ("x %s", ([1], [2]), "'x %s' % ([1], [2]) (format error: not all arguments converted during string formatting)"),
    ("n=%d", ([1],), "'n=%d' % ([1],) (format error: %d format: a real number is required, not list)"),
    ("%(a)s", ({"b": [1]},), "'%(a)s' % {'b': [1]} (format error: 'a')"),
])
def test_a_bad_format_with_mutable_args_is_reported_like_one_with_immutable_args(rec, msg, args, expected):
    """The training thread formats mutable arguments at once; when that fails, the record says so as the
    export thread does for immutable ones (it used to re-apply the arguments' repr as the format argument)."""
    items = []
    rec.emit = items.append
    log = logging.getLogger("enc.test")
    rec.log_record(log.makeRecord("enc.test", logging.INFO, __file__, 1, msg, args, None))
    (line,) = rec.encode_batch(items)
    assert line == _general(rec, items[0])
    assert orjson.loads(line)["msg"] == expected


@pytest.mark.parametrize("kind", ["python", "native"])
def test_spans_logs_and_metrics_appended_directly_stay_bounded_and_all_arrive(tmp_path, kind):
    """Items skip ``emit`` only while the queue is short (the compiled recorder: it is its own queue, drained by the
    worker): a stalled sink still gets a bounded queue, a spill, every item."""
    import threading
    import time

    from shippers import BatchWorker

    release = threading.Event()

    class StalledSink:
        takes_chunks = False

        def __init__(self) -> None:
            self.lines: list[bytes] = []

        def write(self, lines):
            release.wait(10)
            self.lines.extend(lines)

        def flush(self):
            pass

        def close(self):
            pass

    ident = resolve_identity(job_id="bounded", rank=0, world_size=1, env={})
    if kind == "native":
        from tests.compiled import need_native

        rec = need_native().NativeRecorder(ident)
    else:
        rec = Recorder(ident)
    sink = StalledSink()
    worker = BatchWorker(rec.encode_batch, [sink], max_queue=300, batch_size=50, flush_interval_s=0.01,
                         spill_path=str(tmp_path / "spill.jsonl"))
    rec.bind(worker)
    log = logging.getLogger("bounded.test")
    peak = 0
    for i in range(400):
        with rec.span("step", "step", step=i), rec.span("forward", "phase"):
            rec.log_record(log.makeRecord("bounded.test", logging.INFO, __file__, 1, "i=%d", (i,), None))
        rec.metrics(i, {"loss": 0.5})
        peak = max(peak, worker.queued + getattr(rec, "pending", 0))
        if i == 10:
            time.sleep(0.1)  # the exporter now holds a batch and waits on the stalled sink
    assert peak <= 300 + 1
    assert worker.stats.spilled > 0
    release.set()
    worker.shutdown()
    events = [orjson.loads(x) for x in sink.lines]
    kinds = [e["kind"] for e in events]
    assert len(kinds) == worker.stats.exported == 400 * 4 and worker.stats.encode_errors == 0
    assert kinds.count("span") == 800 and kinds.count("log") == 400 and kinds.count("metric") == 400
    assert sorted(e["msg"] for e in events if e["kind"] == "log") == sorted(f"i={i}" for i in range(400))


class TestTemplatesFollowTheFieldTable:
    """The fast path's line templates are built from jobtrace.events.FIELDS, not written out."""

    def test_each_fast_line_writes_its_keys_in_the_tables_order(self, rec):
        from jobtrace.events import FIELDS

        order = [f.key for f in FIELDS]
        items = [(_LOG, 1.5, "INFO", "l", "m", None, "trace", 0x1, 3), SPANS[2], SPANS[4],
                 (_METRIC, 10, 3, {"x": 1.0}, 0x2)]
        for item in items:
            line = rec.encode_batch([item])[0]
            keys = list(orjson.loads(line))  # orjson keeps the order the line has
            kind = orjson.loads(line)["kind"]
            assert keys == [k for k in order if k in keys], kind
            assert all(kind in f.kinds for f in FIELDS if f.key in keys)

    def test_the_templates_are_what_the_table_builds(self):
        from otel_instrumentation import _recorder as r

        assert r._LOG_LINE == b'{"ts":%d,"kind":"log",%b%b,"level":%b,"logger":%b,"msg":%b%b%b}\n'
        assert r._SPAN_LINE == b'{"ts":%d,"kind":"span",%b,"span_id":"%016x"%b%b,"start":%d,"dur":%d%b%b}\n'
        assert r._METRIC_LINE == b'{"ts":%d,"kind":"metric",%b%b,"metrics":%b%b}\n'

    def test_a_table_in_another_order_builds_another_template(self):
        """Reordered rows reorder the template's keys and slots: the table, not the code, decides."""
        import dataclasses

        from jobtrace.events import FIELDS
        from otel_instrumentation._recorder import line_template

        parts = {"ts": "int", "kind": "kind", **dict.fromkeys(("job", "trace_id", "rank", "local_rank", "world", "node",
                                                                 "pid", "v"), "identity"),
                 "metrics": "json", "step": "optional", "span_id": "optional"}
        assert line_template("metric", parts) == (b'{"ts":%d,"kind":"metric",%b%b,"metrics":%b%b}\n',
                                                  ("ts", "job", "span_id", "metrics", "step"))
        keys = [f.key for f in FIELDS]
        moved = list(FIELDS)
        moved.insert(keys.index("span_id"), moved.pop(keys.index("metrics")))  # metrics before span_id
        assert line_template("metric", parts, tuple(moved)) == (b'{"ts":%d,"kind":"metric",%b,"metrics":%b%b%b}\n',
                                                                ("ts", "job", "metrics", "span_id", "step"))
        # A key the table does not let the kind carry, and identity keys not in one run, are refused.
        with pytest.raises(ValueError, match="no"):
            line_template("metric", {**parts, "level": "json"})
        split = list(FIELDS)
        split.insert(keys.index("pid"), split.pop(keys.index("span_id")))
        with pytest.raises(ValueError, match="one run"):
            line_template("metric", parts, tuple(split))
        renamed = tuple(dataclasses.replace(f, key="when") if f.key == "ts" else f for f in FIELDS)
        with pytest.raises(ValueError, match="no"):
            line_template("metric", parts, renamed)

    def test_the_encoder_refuses_a_template_whose_slots_it_does_not_fill_in_that_order(self):
        from otel_instrumentation._recorder import _fast_line

        parts = {"ts": "int", "kind": "kind", **dict.fromkeys(("job", "trace_id", "rank", "local_rank", "world", "node",
                                                                 "pid", "v"), "identity"), "metrics": "json"}
        assert _fast_line("metric", parts, ("ts", "job", "metrics"), "enc").startswith(b'{"ts":%d')
        with pytest.raises(RuntimeError, match="enc gives them as"):
            _fast_line("metric", parts, ("ts", "metrics", "job"), "enc")
