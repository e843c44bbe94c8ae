"""The torch.distributed wrappers (`JOBTRACE_COLLECTIVES=wrap`, a torch without process-group hooks), in-process
on a real one-rank gloo group: what each collective's span says."""

from __future__ import annotations

import socket

import orjson
import pytest

from jobtrace.identity import resolve_identity
from otel_instrumentation._recorder import Recorder

torch = pytest.importorskip("torch", reason="the collectives are torch.distributed's")
dist = pytest.importorskip("torch.distributed", reason="a torch build without distributed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["python", "native"])
def traced(request):
    """A recorder whose items land in a list (the compiled one: its buffer), with the real collectives wrapped."""
    from otel_instrumentation._torch import instrument_torch, uninstrument_torch

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in this test process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    items: list[tuple] = []
    ident = resolve_identity(job_id="coll", rank=0, world_size=1, env={})
    if request.param == "native":
        from tests.compiled import need_native

        rec: Recorder = need_native().NativeRecorder(ident)
    else:
        rec = Recorder(ident, emit=items.append)
    assert instrument_torch(rec, "wrap") is not None  # the Python wrappers (torch without process-group hooks)
    try:
        yield rec, items
    finally:
        uninstrument_torch()
        dist.destroy_process_group()


def _spans(rec: Recorder, items: list[tuple]) -> list[dict]:
    if hasattr(rec, "drain"):  # the compiled recorder wrote the lines itself
        return [orjson.loads(line) for line in rec.drain()[0].splitlines()]
    return [orjson.loads(line) for line in rec.encode_batch(items)]


def test_each_collective_is_a_span_with_op_group_sequence_and_bytes(traced):
    rec, items = traced
    t = torch.ones(1000)
    with rec.span("step", "step", step=7) as step, rec.span("optimizer", "phase") as phase:
        assert rec.in_collective is None
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        gathered = [torch.empty(250, dtype=torch.float64)]
        dist.all_gather(gathered, torch.ones(250, dtype=torch.float64))
    assert rec.in_collective is None
    colls = [e for e in _spans(rec, items) if e["cat"] == "collective"]
    assert [(e["name"], e["attrs"]["seq"], e["attrs"]["bytes"]) for e in colls] == [
        ("all_reduce", 1, 4000), ("broadcast", 2, 4000), ("all_gather", 3, 2000)]
    for e in colls:
        assert e["attrs"]["op"] == e["name"] and e["attrs"]["group"] == "default" and e["attrs"]["group_size"] == 1
        assert e["parent_id"] == f"{phase.span_id:016x}" and e["step"] == 7 and e["dur"] >= 0
        assert "async" not in e["attrs"] and "error" not in e["attrs"]
    assert step.span_id != phase.span_id


def test_a_group_passed_by_position_counts_its_own_sequence(traced):
    rec, items = traced
    group = dist.new_group([0])
    t = torch.ones(8)
    dist.all_reduce(t)
    dist.all_reduce(t, dist.ReduceOp.SUM, group)  # the group as a positional argument
    dist.all_reduce(t, group=group)
    colls = [e["attrs"] for e in _spans(rec, items) if e["cat"] == "collective"]
    assert [(a["group"] == "default", a["seq"]) for a in colls] == [(True, 1), (False, 1), (False, 2)]
    assert colls[1]["group"] == colls[2]["group"] == str(group.group_name)


def test_an_async_collective_says_so(traced):
    rec, items = traced
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    (e,) = _spans(rec, items)
    assert e["attrs"]["async"] is True and e["attrs"]["bytes"] == 16


def test_a_failing_collective_is_recorded_with_its_error_and_still_raises(traced):
    rec, items = traced
    with pytest.raises((TypeError, RuntimeError, ValueError)) as info:
        dist.all_reduce("not a tensor")  # type: ignore[arg-type]
    assert rec.in_collective is None
    (e,) = _spans(rec, items)
    assert e["name"] == "all_reduce" and e["attrs"]["bytes"] == 0
    assert e["attrs"]["error"].startswith(type(info.value).__name__)


def test_while_blocked_the_recorder_says_in_which_collective(traced):
    """What the heartbeat thread reports for a rank stuck inside a collective."""
    from otel_instrumentation._torch import wrap_collective

    rec, items = traced
    seen = []

    def blocked(tensor):
        seen.append(rec.in_collective)

    wrapper = wrap_collective(blocked, "all_reduce", rec, dist)
    wrapper(torch.ones(2))
    wrapper(torch.ones(3))
    assert [(op, group, seq, nbytes) for op, group, seq, _t0, nbytes in seen] == [
        ("all_reduce", "default", 1, 8), ("all_reduce", "default", 2, 12)]
    assert rec.in_collective is None and len(_spans(rec, items)) == 2
