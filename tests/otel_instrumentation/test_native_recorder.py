"""The compiled recorder (``jobtrace_native``) writes what the Python recorder writes, byte for byte.

Both are driven with the same items and the same calls; their lines must be equal (span ids
and clock readings mapped to placeholders where the two recorders draw their own).
"""

from __future__ import annotations

import logging
import math
import os
import struct
import sys
import threading

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobtrace.identity import resolve_identity
from otel_instrumentation._recorder import _LOG, _METRIC, _SPAN, Recorder
from otel_instrumentation._setup import make_recorder
from tests.compiled import need_native

from .test_encoding import LOGS, METRICS, SPANS

NativeRecorder = need_native().NativeRecorder

IDENT = resolve_identity(job_id='job "quoted" é', rank=3, world_size=8, env={})
log = logging.getLogger("native.test")


def drained(rec) -> list[bytes]:
    data, n, errors = rec.drain()
    lines = data.splitlines(keepends=True)
    assert (len(lines), errors) == (n, 0) and rec.pending == 0
    return lines


def same_but_clock(a: bytes, b: bytes) -> bool:
    """Equal, or both the error event the general path writes (stamped when written)."""
    if a == b:
        return True
    ea, eb = orjson.loads(a), orjson.loads(b)
    return ea.get("logger") == "jobtrace.export" and ea | {"ts": 0} == eb | {"ts": 0}


@pytest.mark.parametrize("item", LOGS + SPANS + METRICS, ids=lambda i: f"{i[0]}-{str(i[3])[:20]}")
def test_every_queued_item_is_written_as_the_python_encoder_writes_it(item):
    nat = NativeRecorder(IDENT)
    nat.emit(item)
    (line,) = drained(nat)
    assert same_but_clock(line, Recorder(IDENT).encode_batch([item])[0])


def _bits_to_float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.floats(), st.integers(0, 2**64 - 1).map(_bits_to_float),
                 st.sampled_from([1e-5, 9.999999e-6, 1e16, 1e16 - 2, 5e-324, -0.0, 1e-7, 123456.789e10,
                                  562949953421312.2])),
       st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))
def test_metric_numbers_are_written_as_orjson_writes_them(x, step):
    item = (_METRIC, 1767225600123456789, step, {"x": x, "n": 7, "flag": False}, 0xABC)
    nat = NativeRecorder(IDENT)
    nat.emit(item)
    (line,) = drained(nat)
    assert line == Recorder(IDENT).encode_batch([item])[0]
    if math.isfinite(x):
        assert orjson.loads(line)["metrics"]["x"] == x


def test_drains_that_reuse_their_buffers_write_each_batch_alone():
    """The queue and text buffers are kept from one drain to the next: batches of different sizes, with
    and without log records (which the drain writes in a second buffer), and after a batch larger
    than what is kept, each give exactly their own lines."""
    nat, ref = NativeRecorder(IDENT), Recorder(IDENT)
    spans_and_metrics = SPANS + METRICS
    rounds = [LOGS + SPANS + METRICS, spans_and_metrics, spans_and_metrics * 40, LOGS[:1], [], spans_and_metrics * 6000,
              LOGS + spans_and_metrics]
    for items in rounds:
        for item in items:
            nat.emit(item)
        got = drained(nat)
        want = ref.encode_batch(list(items))
        assert len(got) == len(want) and all(same_but_clock(a, b) for a, b in zip(got, want))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=())), st.text(max_size=30),
       st.one_of(st.none(), st.text(max_size=200)), st.lists(st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=5), max_size=3))
def test_log_text_of_any_kind_is_written_as_the_python_encoder_writes_it(msg, logger, exc, args):
    """Control characters, quotes, non-ASCII, lone surrogates, format strings that fail: the same line."""
    fmt = msg + " %s" * len(args)
    item = (_LOG, 1767225600.5, "INFO", logger, fmt, tuple(args) or None, exc, 0x12, 4)
    nat = NativeRecorder(IDENT)
    nat.emit(item)
    (line,) = drained(nat)
    assert same_but_clock(line, Recorder(IDENT).encode_batch([item])[0])


def normalised(lines: list[bytes]) -> list[dict]:
    """Events with span ids numbered in order of appearance and clock readings zeroed."""
    ids: dict[str, int] = {}
    out = []
    for line in lines:
        ev = orjson.loads(line)
        for k in ("span_id", "parent_id"):
            if k in ev:
                ev[k] = ids.setdefault(ev[k], len(ids))
        for k in ("ts", "start", "dur"):
            ev.pop(k, None)
        out.append(ev)
    return out


def scenario(rec) -> dict:
    """The calls a training script makes, common and odd; returns what the recorder answered on the way."""
    seen: dict = {}
    rec.root_span_id = 0xFEED
    rec.log_record(log.makeRecord("native.test", logging.INFO, __file__, 1, "before %s %d", ("x", 1), None))
    seen["top before"] = rec.top()
    with rec.span("step", "step", step=5) as st_:
        with rec.span("forward", "phase"):
            seen["top"] = rec.top()[:2]
            seen["inner is current"] = rec.current_span_id() != st_.span_id
            seen["step span"] = rec.current_step_span_id() == st_.span_id
            rec.log_record(log.makeRecord("native.test", logging.WARNING, __file__, 1, "loss %.4f", (0.25,), None))
            mutable = [1, 2]
            rec.log_record(log.makeRecord("native.test", logging.INFO, __file__, 1, "list %s", (mutable,), None))
            mutable.append(3)  # formatted at the call: the line says [1, 2]
            try:
                raise ValueError("boom")
            except ValueError:
                rec.log_record(log.makeRecord("native.test", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()))
            rec.log_record(log.makeRecord("jobtrace.export", logging.WARNING, __file__, 1, "not recorded", None, None))
        rec.metrics(None, {"loss": 0.5, "lr": 3e-6, "nan": float("nan"), "n": 3, "ok": True})
        rec.metrics(None, {"text": "abc", "big": 2**70})  # written by the Python encoder
        rec.metrics(9, {"x": 1.0})
        with rec.span("backward", "phase", note="attrs", n=[1, 2]):
            pass
        with pytest.raises(KeyError), rec.span("optimizer", "phase"):
            raise KeyError("k")
        with rec.span("data", "phase", step=77):  # its own step, not the step span's
            pass
        with rec.span("caf\udce9", "user"):  # not valid UTF-8: the Python encoder escapes it
            pass

        def other_thread() -> None:
            with rec.span("loader", "user"):
                seen["other thread"] = rec.current_span_id() not in (st_.span_id, None)
                rec.log_record(log.makeRecord("native.test", logging.INFO, __file__, 1, "from a thread", None, None))

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    with rec.span("step", "step", step=3.5):  # not an int: written by the general path
        pass
    rec.heartbeat({"progress_age_ms": 1})
    rec.emit((_SPAN, 0xA1, 0xA0, "otel span", "user", 1, 2, 6, {"k": "v"}))
    seen["top after"] = rec.top()
    seen["step after"] = rec.step
    return seen


def test_the_same_calls_give_the_same_events_and_answers():
    items: list[tuple] = []
    py = Recorder(IDENT, emit=items.append)
    nat = NativeRecorder(IDENT)
    seen_py, seen_nat = scenario(py), scenario(nat)
    assert seen_py == seen_nat
    assert seen_nat["top"] == ("forward", "phase") and seen_nat["other thread"] and seen_nat["step span"]
    py_events, nat_events = normalised(py.encode_batch(items)), normalised(drained(nat))
    assert nat_events == py_events
    msgs = [e.get("msg") for e in nat_events if e["kind"] == "log"]
    assert msgs == ["before x 1", "loss 0.2500", "list [1, 2]", "failed", "from a thread"]
    spans = {e["name"]: e for e in nat_events if e["kind"] == "span"}
    assert spans["optimizer"]["attrs"] == {"error": "KeyError: 'k'"} and spans["data"]["step"] == 77
    assert spans["backward"]["attrs"] == {"note": "attrs", "n": [1, 2]} and spans["forward"]["step"] == 5
    assert spans["caf\\udce9"]["cat"] == "user" and spans["loader"]["parent_id"] == spans["step"]["parent_id"] == 0
    assert [e["metrics"] for e in nat_events if e["kind"] == "metric"][:2] == [
        {"loss": 0.5, "lr": 3e-6, "nan": "NaN", "n": 3, "ok": 1}, {"text": "abc", "big": float(2**70)}]


def test_a_cpu_tensor_metric_is_read_at_the_call():
    torch = pytest.importorskip("torch", reason="tensor metric values need torch")
    nat = NativeRecorder(IDENT)
    acc = torch.tensor(1.0)
    vec = torch.ones(3)
    nat.metrics(2, {"loss": torch.tensor(2.0, requires_grad=True) * 3, "acc": acc})
    nat.metrics(2, {"vec": vec})  # more than one element: the Python path writes its text
    acc += 41
    first, second = (orjson.loads(x) for x in drained(nat))
    assert first["metrics"] == {"loss": 6.0, "acc": 1.0} and second["metrics"] == {"vec": str(vec)}


@pytest.mark.parametrize("kind", [Recorder, NativeRecorder])
def test_a_forked_childs_lines_carry_its_own_pid(kind):
    rec = kind(IDENT, emit=(items := []).append) if kind is Recorder else kind(IDENT)
    from dataclasses import replace

    rec.set_identity(replace(IDENT, pid=IDENT.pid + 1))
    rec.log_record(log.makeRecord("native.test", logging.INFO, __file__, 1, "child", None, None))
    with rec.span("s", "user"):
        pass
    lines = rec.encode_batch(items) if kind is Recorder else drained(rec)
    assert [orjson.loads(x)["pid"] for x in lines] == [IDENT.pid + 1] * 2


def test_the_compiled_recorder_is_the_default_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv("JOBTRACE_NATIVE", raising=False)
    assert type(make_recorder(IDENT)) is NativeRecorder
    monkeypatch.setenv("JOBTRACE_NATIVE", "0")
    assert type(make_recorder(IDENT)) is Recorder


def test_a_forked_child_exports_only_its_own_events(tmp_path):
    """The parent's queued events stay the parent's; the child's go to its own file with its pid."""
    if not hasattr(os, "fork"):
        pytest.skip(reason="needs os.fork")
    from shippers import BatchWorker, LocalStoreSink

    nat = NativeRecorder(resolve_identity(job_id="forked", rank=0, world_size=1, env={}))
    worker = BatchWorker(nat.encode_batch, [LocalStoreSink(str(tmp_path), "forked", "n", 0, os.getpid())],
                         flush_interval_s=30)
    nat.bind(worker)
    with nat.span("parent", "user"):
        pass
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            from dataclasses import replace

            nat.set_identity(replace(nat.identity, pid=os.getpid(), forked=True))
            child = BatchWorker(nat.encode_batch, [LocalStoreSink(str(tmp_path), "forked", "n", 0, os.getpid())])
            nat.bind(child)
            with nat.span("child", "user"):
                pass
            child.shutdown()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    worker.shutdown()
    by_pid = {}
    for path in (tmp_path / "forked").glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            ev = orjson.loads(line)
            by_pid.setdefault(ev["pid"], []).append(ev["name"])
    assert by_pid == {os.getpid(): ["parent"], pid: ["child"]}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="host RSS is read from /proc")
@pytest.mark.parametrize("interval_s,expected", [(0.0, [0, 1, 2]), (3600.0, [0])])
def test_host_rss_is_read_at_step_ends_at_most_once_per_interval(interval_s, expected):
    """The compiled recorder samples RSS itself (memory_hook's rule: the first step end at or after each deadline)."""
    from otel_instrumentation._torch import memory_hook

    nat = NativeRecorder(IDENT)
    nat.root_span_id = 0xFEED
    hook = memory_hook(nat, interval_s)  # reads CUDA counters only, where torch has CUDA (it is not initialised)
    if hook is not None:
        nat.step_end_hooks.append(hook)
    for i in range(3):
        with nat.span("step", "step", step=i), nat.span("forward", "phase"):
            pass
    rss = [orjson.loads(x) for x in drained(nat) if b'"metric"' in x]
    assert [e["step"] for e in rss] == expected
    page = os.sysconf("SC_PAGE_SIZE")
    statm = int(open("/proc/self/statm").read().split()[1]) * page
    for e in rss:
        assert e["span_id"] == f"{0xFEED:016x}" and 0.5 * statm < e["metrics"]["rss_bytes"] < 2 * statm


def _protocol_members() -> set[str]:
    from otel_instrumentation._recorder import TraceRecorder

    names = set(TraceRecorder.__annotations__)
    names |= {k for k, v in vars(TraceRecorder).items() if not k.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


@pytest.mark.parametrize("kind", ["python", "native"])
def test_both_recorders_have_every_member_of_the_protocol(kind):
    """What Tracing, the bridges and the torch hooks call exists on either recorder, none probed for."""
    rec = Recorder(IDENT) if kind == "python" else NativeRecorder(IDENT)
    members = _protocol_members()
    assert {"pending", "wrap_collective", "sample_rss", "entry_points", "new_span", "log_record"} <= members
    assert [m for m in sorted(members) if not hasattr(rec, m)] == []
    assert isinstance(rec.pending, int) and isinstance(rec.sample_rss(0.1, 4096), bool)


def test_the_compiled_hot_path_is_the_cores_methods_declared_on_the_class_not_methods_swapped():
    """Each hot member is a compiled method of the core itself (one C call), and it is an attribute the class
    declares, never an instance value hiding a method of the class."""
    nat = NativeRecorder(IDENT)
    hot = ("new_span", "log_record", "metrics", "emit", "current_span_id", "current_step_span_id", "top",
           "sample_rss", "drain")
    for name in hot:
        member = getattr(nat, name)
        assert type(member).__name__ == "builtin_function_or_method" and member.__self__ is nat._core, name
        assert name in NativeRecorder.__annotations__, name
    for cls in (Recorder, NativeRecorder):
        rec = cls(IDENT)
        shadowed = [k for k in vars(rec) if callable(vars(type(rec)).get(k)) or
                    any(callable(vars(base).get(k)) for base in type(rec).__mro__)]
        assert shadowed == [], (cls.__name__, shadowed)
