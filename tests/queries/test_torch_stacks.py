"""Real DistributedDataParallel and FSDP2 jobs (gloo, CPU, torchrun) with no tracing code but ``init_tracing``
around their collectives: the reducer's bucketed all-reduces and FSDP's all-gathers and reduce-scatters
are recorded through the process groups, and the slow and the hung rank are named from them.

The jobs are the demo's (``jobtrace demo --ddp`` / ``--fsdp``): DDP averages the gradients in its C++
reducer during ``backward()``, FSDP2 gathers and scatters the sharded weights below Python.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

from jobtrace.demo import DemoConfig, run_job
from otel_instrumentation import native_hooks
from otel_instrumentation._collectives import hooks_supported
from queries import AnalysisConfig, analyze, load_local

pytestmark = [pytest.mark.torchjob,
              pytest.mark.skipif(not hooks_supported(), reason="this torch has no process-group hooks")]

GRAD_BYTES = 4 * (64 * 256 + 256 + 256 * 256 + 256 + 256 + 1)
"""The demo model's gradients (hidden 256), in bytes: what one step's buckets add up to."""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("torch-stacks")


def run(store, name, **kw):
    cfg = DemoConfig(job_id=name, data_dir=str(store), steps=kw.pop("steps", 16), **kw)
    rc = run_job(cfg)
    hung = cfg.hang_rank is not None
    return rc, analyze(load_local(store, name), AnalysisConfig(stall_s=cfg.stall_s if hung else 300.0))


def collectives(store, name):
    out = []
    for path in (store / name).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e.get("cat") == "collective":
                out.append(e)
    return out


def problems(report):
    return sorted({(f.kind, tuple(f.ranks)) for f in report.findings if f.severity in ("error", "warning")})


@pytest.fixture(scope="module", params=["1", "0"], ids=["compiled-hooks", "python-hooks"])
def hooks(request):
    """The DDP jobs run under the compiled process-group hooks (CI builds them) and under the Python ones."""
    if request.param == "1" and native_hooks.built_path() is None:
        pytest.skip(reason="the compiled hooks are not built (python -m otel_instrumentation.native_hooks)")
    saved = os.environ.get("JOBTRACE_NATIVE_HOOKS")
    os.environ["JOBTRACE_NATIVE_HOOKS"] = request.param
    yield request.param
    if saved is None:
        os.environ.pop("JOBTRACE_NATIVE_HOOKS", None)
    else:
        os.environ["JOBTRACE_NATIVE_HOOKS"] = saved


@pytest.fixture(scope="module")
def ddp_slow(store, hooks):
    return run(store, f"ddp-slow-{hooks}", ranks=4, wrap="ddp", slow_ranks=[2], slow_ms=40)


@pytest.fixture(scope="module")
def ddp_hang(store, hooks):
    return run(store, f"ddp-hang-{hooks}", ranks=4, wrap="ddp", hang_rank=1, hang_step=6)


@pytest.fixture(scope="module")
def fsdp_slow(store):
    return run(store, "fsdp-slow", ranks=4, wrap="fsdp", slow_ranks=[1], slow_ms=40)


@pytest.fixture(scope="module")
def fsdp_hang(store):
    return run(store, "fsdp-hang", ranks=4, wrap="fsdp", hang_rank=3, hang_step=6)


class TestDDP:
    def test_the_reducers_bucketed_all_reduces_are_recorded_in_backward(self, store, ddp_slow, hooks):
        rc, _ = ddp_slow
        assert rc == 0
        spans = [e for e in collectives(store, f"ddp-slow-{hooks}") if e["name"] == "all_reduce" and e.get("step") == 5]
        by_rank: dict[int, list[dict]] = {}
        for e in spans:
            by_rank.setdefault(e["rank"], []).append(e)
        assert sorted(by_rank) == [0, 1, 2, 3]
        for rank, own in by_rank.items():
            assert len(own) >= 2, rank  # more than one bucket (bucket_cap_mb=0.1)
            assert sum(e["attrs"]["bytes"] for e in own) == GRAD_BYTES  # the buckets cover every gradient once
        seqs = {rank: sorted(e["attrs"]["seq"] for e in own) for rank, own in by_rank.items()}
        assert len({tuple(s) for s in seqs.values()}) == 1  # the same sequence numbers on every rank

    def test_the_slow_rank_is_named_and_the_others_wait_in_all_reduce(self, ddp_slow):
        _, report = ddp_slow
        assert problems(report) == [("slow_rank", (2,))]
        f = next(f for f in report.findings if f.kind == "slow_rank")
        assert "waiting in all_reduce" in f.summary
        per_rank = {r.rank: r for r in report.per_rank}
        # the others wait for it (5x apart on an idle machine; 2x leaves room for a CPU hog on each core)
        assert all(per_rank[r].collective_ms > 2 * per_rank[2].collective_ms for r in (0, 1, 3))
        assert report.breakdown["comm_share"] > 0.2

    def test_the_hung_rank_never_joined_the_reducers_all_reduce(self, ddp_hang):
        rc, report = ddp_hang
        assert rc == -1  # stopped by the demo once it stalled
        assert [f.ranks for f in report.findings if f.kind == "stalled_rank"] == [[1]]
        wave = report.collectives["waves"][0]
        assert wave["op"] == "all_reduce" and wave["waiting"] == [0, 2, 3] and wave["missing"] == [1]
        assert 0 < wave["bytes"] < GRAD_BYTES  # one of the reducer's buckets, not a hand-made flat tensor
        assert not [f for f in report.findings if f.kind == "divergence"]


class TestFSDP:
    def test_all_gathers_and_reduce_scatters_are_recorded(self, store, fsdp_slow):
        rc, _ = fsdp_slow
        assert rc == 0
        names = {e["name"] for e in collectives(store, "fsdp-slow") if e.get("step") == 5}
        assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= names

    def test_the_slow_rank_is_named(self, fsdp_slow):
        _, report = fsdp_slow
        assert problems(report) == [("slow_rank", (1,))]

    def test_the_hung_rank_never_joined_the_all_gather(self, fsdp_hang):
        rc, report = fsdp_hang
        assert rc == -1
        assert [f.ranks for f in report.findings if f.kind == "stalled_rank"] == [[3]]
        wave = report.collectives["waves"][0]
        assert wave["op"] == "all_gather_into_tensor" and wave["waiting"] == [0, 1, 2] and wave["missing"] == [3]
